"""How conversation threads (LangGraph checkpoints) are laid out in the living image.

Everything lives under ``root['checkpoints']``, a ``CheckpointTree``::

    CheckpointTree
     ├── threads: OOBTree  thread_id → ThreadRecord
     │    └── namespaces: OOBTree  checkpoint_ns → OOBTree  checkpoint_id → CheckpointRecord
     │         CheckpointRecord: body, metadata, parent_id, run_id,
     │                           versions {channel: version}, values {channel: stored},
     │                           writes {(task_id, idx): (channel, stored, task_path)}
     └── runs:    OOBTree  run_id → OOTreeSet of (thread_id, ns, checkpoint_id)

Checkpoint ids are uuid6, so each namespace index is ordered oldest → newest, and "latest" is
``maxKey()``. A checkpoint is one record holding everything a read needs: a put writes that
record and the last bucket of its namespace tree (ids and references only), a put_writes
rewrites that record only.
(Layouts 1 and 2 kept values and writes in per-thread trees whose last buckets, a few KiB of
other checkpoints' data, every put and put_writes rewrote; ``checkpoints-3`` moves them in.)

Every value is stored as the saver's serde output ``(type, bytes)`` — never a pickled live
object — inline when small, in its own ``Payload`` record when larger, and in a ZODB blob when
larger still. A value a checkpoint did not change is the stored value of the checkpoint before:
inline ones are small enough to repeat, Payloads are shared by reference and never changed once
written, so copies and later checkpoints share them instead of duplicating them.

The classes here are pickled by module path: they must stay importable as
``store.checkpoint_layout`` for as long as images that hold them exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from BTrees.OOBTree import OOBTree, OOTreeSet
from persistent import Persistent
from ZODB.POSException import ConflictError

from store.schema import UpgradeStep

CHECKPOINTS_KEY = "checkpoints"

#: Serialized values up to this size stay inline in their checkpoint's record; larger ones get
#: their own record, shared by every later checkpoint that did not change them.
INLINE_LIMIT = 512

Typed = tuple[str, bytes]
#: One put_writes call, serialized: (task_id, task_path, [(idx, channel, typed value), ...])
TaskWrites = tuple[str, str, list[tuple[int, str, Typed]]]
#: The stored pending writes of one checkpoint: (task_id, idx) → (channel, stored, task_path)
Writes = dict[tuple[str, int], tuple[str, Any, str]]


class Payload(Persistent):
    """One serialized value too large to keep inline; in a ZODB blob when very large."""

    def __init__(self, typed: Typed, *, blob: bool = False) -> None:
        self.type = typed[0]
        self.size = len(typed[1])
        if blob:
            from ZODB.blob import Blob

            self.data = None
            self.blob = Blob()
            with self.blob.open("w") as handle:
                handle.write(typed[1])
        else:
            self.data = typed[1]
            self.blob = None

    def typed(self) -> Typed:
        if self.blob is not None:
            with self.blob.open("r") as handle:
                return self.type, handle.read()
        return self.type, self.data


def encode(typed: Typed, *, blob_threshold: int | None) -> Any:
    """The stored form of ``typed``: the tuple itself, a ``Payload``, or a blob ``Payload``."""
    size = len(typed[1])
    if size <= INLINE_LIMIT:
        return typed
    return Payload(typed, blob=blob_threshold is not None and size >= blob_threshold)


def decode(stored: Any) -> Typed:
    return stored.typed() if isinstance(stored, Payload) else stored


def stored_size(stored: Any) -> int:
    return stored.size if isinstance(stored, Payload) else len(stored[1])


def stored_type(stored: Any) -> str:
    return stored.type if isinstance(stored, Payload) else stored[0]


def add_writes(writes: Writes, task_writes: TaskWrites, encoder: Callable[[Typed], Any]) -> bool:
    """Add one put_writes call to ``writes``; returns whether anything changed.

    A task retried after a crash sends its regular writes again: the first ones stay. Special
    writes (negative idx: errors, interrupts, resumes) replace the earlier one.
    """
    task_id, task_path, encoded = task_writes
    changed = False
    for idx, channel, typed in encoded:
        if idx >= 0 and (task_id, idx) in writes:
            continue
        writes[(task_id, idx)] = (channel, encoder(typed), task_path)
        changed = True
    return changed


@dataclass(frozen=True)
class ThreadSummary:
    """What ``batos threads`` shows for one thread."""

    thread_id: str
    namespaces: int
    checkpoints: int
    writes: int
    bytes: int
    latest_id: str | None
    created: float


class CheckpointRecord(Persistent):
    """One checkpoint: its serialized body (without channel values), metadata, channel values
    and pending writes."""

    def __init__(
        self,
        checkpoint: Typed,
        metadata: Typed,
        *,
        parent_id: str | None,
        run_id: str | None,
        versions: dict[str, str],
        values: dict[str, Any],
        writes: Writes,
        size: int,
    ) -> None:
        self.checkpoint = checkpoint
        self.metadata = metadata
        self.parent_id = parent_id
        self.run_id = run_id
        # channel → version for every channel; ``values`` holds those that have a value
        self.versions = versions
        self.values = values
        self.writes = writes
        # bytes this checkpoint added: body, metadata and the values it changed
        self.size = size

    def copy(self, metadata: Typed) -> CheckpointRecord:
        return CheckpointRecord(
            self.checkpoint,
            metadata,
            parent_id=self.parent_id,
            run_id=self.run_id,
            versions=dict(self.versions),
            values=dict(self.values),
            writes=dict(self.writes),
            size=self.size,
        )

    def value_at(self, channel: str, version: str) -> tuple[bool, Any]:
        """(True, stored value or None when empty) if this checkpoint has ``channel`` at
        ``version``, else (False, None)."""
        if self.versions.get(channel) != version:
            return False, None
        return True, self.values.get(channel)

    def written_bytes(self) -> int:
        return sum(stored_size(write[1]) for write in self.writes.values())

    def _p_resolveConflict(self, old: Any, committed: Any, new: Any) -> Any:
        # Tasks of one step finish together and each stores its writes on the same record:
        # merge them instead of failing all but one. Anything else changed at once conflicts.
        if not all(isinstance(state, dict) for state in (old, committed, new)):
            raise ConflictError
        for name in set(old) | set(committed) | set(new):
            if name != "writes" and not old.get(name) == committed.get(name) == new.get(name):
                raise ConflictError
        before, merged = old["writes"], dict(committed["writes"])
        for key, write in new["writes"].items():
            if before.get(key) != write and (key not in merged or key[1] < 0):
                merged[key] = write
        return {**committed, "writes": merged}


class ThreadRecord(Persistent):
    """All checkpoints (with their values and pending writes) of one conversation thread."""

    def __init__(self) -> None:
        self.created = time.time()
        self.namespaces = OOBTree()

    def namespace(self, ns: str, *, create: bool = False) -> Any:
        index = self.namespaces.get(ns)
        if index is None and create:
            index = self.namespaces[ns] = OOBTree()
        return index

    def drop_checkpoint(self, ns: str, checkpoint_id: str) -> CheckpointRecord | None:
        """Remove one checkpoint; values it shares with others stay with them."""
        index = self.namespaces.get(ns)
        record = index.pop(checkpoint_id, None) if index is not None else None
        if index is not None and not index:
            del self.namespaces[ns]
        return record

    def summary(self, thread_id: str) -> ThreadSummary:
        checkpoints = writes = size = 0
        latest = None
        for index in self.namespaces.values():
            checkpoints += len(index)
            if index:
                latest = max(latest or "", index.maxKey())
            for record in index.values():
                writes += len(record.writes)
                size += record.size + record.written_bytes()
        return ThreadSummary(
            thread_id=thread_id,
            namespaces=len(self.namespaces),
            checkpoints=checkpoints,
            writes=writes,
            bytes=size,
            latest_id=latest,
            created=self.created,
        )


class CheckpointTree(Persistent):
    """The root of every conversation thread in the image."""

    def __init__(self) -> None:
        self.threads = OOBTree()
        self.runs = OOBTree()

    def thread(self, thread_id: str, *, create: bool = False) -> ThreadRecord | None:
        record = self.threads.get(thread_id)
        if record is None and create:
            record = self.threads[thread_id] = ThreadRecord()
        return record

    def index_run(self, run_id: str, entry: tuple[str, str, str]) -> None:
        members = self.runs.get(run_id)
        if members is None:
            members = self.runs[run_id] = OOTreeSet()
        members.add(entry)

    def unindex_run(self, run_id: str | None, entry: tuple[str, str, str]) -> None:
        if run_id is None:
            return
        members = self.runs.get(run_id)
        if members is not None:
            members.discard(entry)
            if not members:
                del self.runs[run_id]

    # -- whole-thread operations, each run inside one transaction by the saver -------------

    def delete_thread(self, thread_id: str) -> None:
        thread = self.threads.get(thread_id)
        if thread is None:
            return
        for ns, index in thread.namespaces.items():
            for checkpoint_id, record in index.items():
                self.unindex_run(record.run_id, (thread_id, ns, checkpoint_id))
        del self.threads[thread_id]

    def delete_runs(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            members = self.runs.pop(run_id, None)
            for thread_id, ns, checkpoint_id in list(members or ()):
                thread = self.threads.get(thread_id)
                if thread is not None:
                    thread.drop_checkpoint(ns, checkpoint_id)
                    if not thread.namespaces:
                        del self.threads[thread_id]

    def copy_thread(self, source: str, target: str, retag: Callable[[Typed], Typed]) -> None:
        """Copy ``source`` into ``target``; ``retag`` rewrites each checkpoint's metadata."""
        original = self.threads.get(source)
        if original is None:
            return
        copy = self.thread(target, create=True)
        for ns, index in original.namespaces.items():
            destination = copy.namespace(ns, create=True)
            for checkpoint_id, record in index.items():
                destination[checkpoint_id] = record.copy(retag(record.metadata))
                if record.run_id:
                    self.index_run(record.run_id, (target, ns, checkpoint_id))

    def trim(self, thread_ids: list[str] | None, keep: int) -> int:
        """Keep the newest ``keep`` checkpoints per namespace; returns how many were deleted."""
        deleted = 0
        for thread_id in list(self.threads.keys()) if thread_ids is None else thread_ids:
            thread = self.threads.get(thread_id)
            if thread is None:
                continue
            for ns, index in list(thread.namespaces.items()):
                for checkpoint_id in list(index.keys())[:-keep]:
                    record = thread.drop_checkpoint(ns, checkpoint_id)
                    if record is not None:
                        self.unindex_run(record.run_id, (thread_id, ns, checkpoint_id))
                        deleted += 1
        return deleted


def _layout_1(root: Any) -> None:
    if CHECKPOINTS_KEY not in root:
        root[CHECKPOINTS_KEY] = CheckpointTree()


def _layout_2(root: Any) -> None:
    """Re-key every thread's values from (ns, channel, version) to (ns, version, channel).

    The stored values themselves are shared, not copied. Runs in one transaction, so a crash
    leaves the image on layout 1.
    """
    for thread in root[CHECKPOINTS_KEY].threads.values():
        old = thread.values
        thread.values = OOBTree()
        for (ns, channel, version), stored in old.items():
            thread.values[(ns, version, channel)] = stored


def _layout_3(root: Any) -> None:
    """Move each checkpoint's values and pending writes into its record.

    Writes stored for a checkpoint that was never stored (a saver that wrote them before their
    checkpoint, whose put then failed) are dropped, and so is a thread that held only those.
    Runs in one transaction, so a crash leaves the image on layout 2.
    """
    threads = root[CHECKPOINTS_KEY].threads
    for thread_id, thread in list(threads.items()):
        values, writes = thread.values, thread.writes
        for ns, index in thread.namespaces.items():
            for checkpoint_id, record in index.items():
                record.versions = dict(record.versions)
                record.values = {}
                for channel, version in record.versions.items():
                    stored = values.get((ns, version, channel))
                    if stored is not None and stored_type(stored) != "empty":
                        record.values[channel] = stored
                record.writes = {
                    (task_id, idx): write
                    for (_ns, _id, task_id, idx), write in writes.items(
                        min=(ns, checkpoint_id), max=(ns, checkpoint_id + "\0"), excludemax=True
                    )
                }
        del thread.values, thread.writes
        if not thread.namespaces:
            del threads[thread_id]


CHECKPOINT_STEPS: tuple[UpgradeStep, ...] = (
    UpgradeStep(
        "checkpoints-1",
        "conversation threads of the LangGraph checkpointer (root['checkpoints'])",
        _layout_1,
    ),
    UpgradeStep(
        "checkpoints-2",
        "checkpoint values keyed (ns, version, channel), so a put touches one bucket",
        _layout_2,
    ),
    UpgradeStep(
        "checkpoints-3",
        "each checkpoint's values and pending writes in its own record, so a put writes one "
        "record and one bucket of ids",
        _layout_3,
    ),
)
