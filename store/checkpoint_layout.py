"""How conversation threads (LangGraph checkpoints) are laid out in the living image.

Everything lives under ``root['checkpoints']``, a ``CheckpointTree``::

    CheckpointTree
     ├── threads: OOBTree  thread_id → ThreadRecord
     │    ├── namespaces: OOBTree  checkpoint_ns → OOBTree  checkpoint_id → CheckpointRecord
     │    ├── values:     OOBTree  (ns, version, channel) → stored channel value
     │    └── writes:     OOBTree  (ns, checkpoint_id, task_id, idx) → (channel, stored, path)
     └── runs:    OOBTree  run_id → OOTreeSet of (thread_id, ns, checkpoint_id)

Checkpoint ids are uuid6, so each namespace tree is ordered oldest → newest, and "latest" is
``maxKey()``. Versions are zero-padded counters that LangGraph advances once per step, so the
values of one put sort next to each other at the end of ``values``: a put rewrites one bucket
there, not one per channel (layout 1 keyed them by channel first; ``checkpoints-2`` re-keys).

Every value is stored as the saver's serde output ``(type, bytes)`` — never a
pickled live object — inline when small, in its own ``Payload`` record when larger, and in a
ZODB blob when larger still. Payloads are never changed once written, so copying a thread
shares them instead of duplicating them.

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

from store.schema import UpgradeStep

CHECKPOINTS_KEY = "checkpoints"

#: Serialized values up to this size stay inline in their BTree bucket; larger ones get their
#: own record, so rewriting a bucket does not rewrite its neighbours' payloads.
INLINE_LIMIT = 512

Typed = tuple[str, bytes]


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
    """One checkpoint: its serialized body (without channel values) and metadata."""

    def __init__(
        self,
        checkpoint: Typed,
        metadata: Typed,
        *,
        parent_id: str | None,
        run_id: str | None,
        versions: tuple[tuple[str, str], ...],
        size: int,
    ) -> None:
        self.checkpoint = checkpoint
        self.metadata = metadata
        self.parent_id = parent_id
        self.run_id = run_id
        # (channel, version) pairs this checkpoint reads from ``ThreadRecord.values``; kept
        # apart from the serialized body so pruning can find unused values without decoding.
        self.versions = versions
        self.size = size

    def copy(self, metadata: Typed) -> CheckpointRecord:
        return CheckpointRecord(
            self.checkpoint,
            metadata,
            parent_id=self.parent_id,
            run_id=self.run_id,
            versions=self.versions,
            size=self.size,
        )


class ThreadRecord(Persistent):
    """All checkpoints, channel values and pending writes of one conversation thread."""

    def __init__(self) -> None:
        self.created = time.time()
        self.namespaces = OOBTree()
        self.values = OOBTree()
        self.writes = OOBTree()

    def namespace(self, ns: str, *, create: bool = False) -> Any:
        tree = self.namespaces.get(ns)
        if tree is None and create:
            tree = self.namespaces[ns] = OOBTree()
        return tree

    def writes_of(self, ns: str, checkpoint_id: str) -> Any:
        """The (key, value) items of the pending writes of one checkpoint, in key order."""
        return self.writes.items(
            min=(ns, checkpoint_id), max=(ns, checkpoint_id + "\0"), excludemax=True
        )

    def drop_checkpoint(self, ns: str, checkpoint_id: str) -> CheckpointRecord | None:
        """Remove one checkpoint and its writes; its channel values are left to ``sweep``."""
        tree = self.namespaces.get(ns)
        record = tree.pop(checkpoint_id, None) if tree is not None else None
        for key in list(
            self.writes.keys(
                min=(ns, checkpoint_id), max=(ns, checkpoint_id + "\0"), excludemax=True
            )
        ):
            del self.writes[key]
        if tree is not None and not tree:
            del self.namespaces[ns]
        return record

    def sweep(self, ns: str) -> None:
        """Delete the channel values of ``ns`` that no remaining checkpoint refers to."""
        tree = self.namespaces.get(ns)
        used = {v for record in tree.values() for v in record.versions} if tree else set()
        for key in list(self.values.keys(min=(ns,), max=(ns + "\0",), excludemax=True)):
            if (key[2], key[1]) not in used:
                del self.values[key]

    def summary(self, thread_id: str) -> ThreadSummary:
        checkpoints, size, latest = 0, 0, None
        for tree in self.namespaces.values():
            checkpoints += len(tree)
            if tree:
                latest = max(latest or "", tree.maxKey())
            size += sum(len(r.checkpoint[1]) + len(r.metadata[1]) for r in tree.values())
        size += sum(stored_size(v) for v in self.values.values())
        writes = 0
        for (ns, checkpoint_id, _task, _idx), write in self.writes.items():
            tree = self.namespaces.get(ns)
            if tree is None or checkpoint_id not in tree:
                continue  # left by a saver that stored writes before their checkpoint
            writes += 1
            size += stored_size(write[1])
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
        for ns, checkpoints in thread.namespaces.items():
            for checkpoint_id, record in checkpoints.items():
                self.unindex_run(record.run_id, (thread_id, ns, checkpoint_id))
        del self.threads[thread_id]

    def delete_runs(self, run_ids: list[str]) -> None:
        touched: set[tuple[str, str]] = set()
        for run_id in run_ids:
            members = self.runs.pop(run_id, None)
            for thread_id, ns, checkpoint_id in list(members or ()):
                thread = self.threads.get(thread_id)
                if thread is not None:
                    thread.drop_checkpoint(ns, checkpoint_id)
                    touched.add((thread_id, ns))
        self._sweep(touched)

    def copy_thread(self, source: str, target: str, retag: Callable[[Typed], Typed]) -> None:
        """Copy ``source`` into ``target``; ``retag`` rewrites each checkpoint's metadata."""
        original = self.threads.get(source)
        if original is None:
            return
        copy = self.thread(target, create=True)
        copy.values.update(original.values)
        copy.writes.update(original.writes)
        for ns, checkpoints in original.namespaces.items():
            destination = copy.namespace(ns, create=True)
            for checkpoint_id, record in checkpoints.items():
                destination[checkpoint_id] = record.copy(retag(record.metadata))
                if record.run_id:
                    self.index_run(record.run_id, (target, ns, checkpoint_id))

    def trim(self, thread_ids: list[str] | None, keep: int) -> int:
        """Keep the newest ``keep`` checkpoints per namespace; returns how many were deleted."""
        deleted = 0
        touched: set[tuple[str, str]] = set()
        for thread_id in list(self.threads.keys()) if thread_ids is None else thread_ids:
            thread = self.threads.get(thread_id)
            if thread is None:
                continue
            for ns, checkpoints in list(thread.namespaces.items()):
                old = list(checkpoints.keys())[:-keep]
                for checkpoint_id in old:
                    record = thread.drop_checkpoint(ns, checkpoint_id)
                    if record is not None:
                        self.unindex_run(record.run_id, (thread_id, ns, checkpoint_id))
                        deleted += 1
                if old:
                    touched.add((thread_id, ns))
        self._sweep(touched)
        return deleted

    def _sweep(self, touched: set[tuple[str, str]]) -> None:
        for thread_id, ns in touched:
            thread = self.threads.get(thread_id)
            if thread is None:
                continue
            thread.sweep(ns)
            if not thread.namespaces:
                del self.threads[thread_id]


def value_key(ns: str, channel: str, version: str) -> tuple[str, str, str]:
    """The key of one channel value in ``ThreadRecord.values``."""
    return (ns, version, channel)


def _layout_1(root: Any) -> None:
    if CHECKPOINTS_KEY not in root:
        root[CHECKPOINTS_KEY] = CheckpointTree()


def _layout_2(root: Any) -> None:
    """Re-key every thread's values from (ns, channel, version) to ``value_key`` order.

    The stored values themselves are shared, not copied. Runs in one transaction, so a crash
    leaves the image on layout 1.
    """
    for thread in root[CHECKPOINTS_KEY].threads.values():
        old = thread.values
        thread.values = OOBTree()
        for (ns, channel, version), stored in old.items():
            thread.values[value_key(ns, channel, version)] = stored


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
)
