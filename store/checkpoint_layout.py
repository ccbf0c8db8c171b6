"""How conversation threads (LangGraph checkpoints) are laid out in the living image.

Everything lives under ``root['checkpoints']``, a ``CheckpointTree``::

    CheckpointTree
     ├── threads: OOBTree  thread_id → ThreadRecord
     │    └── namespaces: OOBTree  checkpoint_ns → CheckpointIndex
     │         CheckpointIndex: recent  the newest checkpoint_id → CheckpointRecord (its own state)
     │                          older   OOBTree  the rest (None until there are any)
     │         CheckpointRecord: body, metadata, parent_id, run_id,
     │                           versions {channel: version}, values {channel: stored},
     │                           writes {(task_id, idx): (channel, stored, task_path)}
     └── runs:    OOBTree  run_id → OOTreeSet of (thread_id, ns, checkpoint_id)

Checkpoint ids are uuid6, so each namespace index is ordered oldest → newest, and "latest" is
its largest id. A checkpoint is one record holding everything a read needs. A put writes that
record and the small bucket of its namespace's newest ids (ids and references only); every
``RECENT`` puts the older half of that bucket moves into the namespace's tree, so a put writes
that tree once in ``RECENT`` puts, however long the thread. A put_writes rewrites the record
only. A record's state is two msgpack documents (what it was stored with,
and its pending writes) and the ``Payload`` records they refer to: one string for ZODB to
pickle instead of a hundred small objects, each a Python call of ZODB's pickler.
(Layouts 1 and 2 kept values and writes in per-thread trees whose last buckets, a few KiB of
other checkpoints' data, every put and put_writes rewrote; ``checkpoints-3`` moves them in.
Records of layouts 1-3 are pickled attribute dicts: they are read as they are and rewritten in
the msgpack form when they next change; ``checkpoints-4`` adds the bucket of newest ids.)

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

import ormsgpack
from BTrees.OOBTree import OOBTree, OOTreeSet
from persistent import Persistent
from ZODB.POSException import ConflictError

from batos.errors import ImageCorruptError
from store.schema import UpgradeStep

CHECKPOINTS_KEY = "checkpoints"

#: Serialized values up to this size stay inline in their checkpoint's record; larger ones get
#: their own record, shared by every later checkpoint that did not change them.
INLINE_LIMIT = 512
#: Newest checkpoint ids a namespace keeps in its small bucket; when it holds twice as many,
#: all but these move into the namespace's tree (once in RECENT puts).
RECENT = 8
#: The version of a record's msgpack state (records of layouts 1-3 are pickled dicts).
RECORD_FORMAT = 1

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
    and pending writes.

    Stored as ``(RECORD_FORMAT, data, refs, writes, write_refs)``: ``data`` and ``writes`` are
    msgpack documents in which a value kept in a ``Payload`` is its position in ``refs`` or
    ``write_refs``. Everything but the writes is fixed when the record is made.
    """

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

    def __getstate__(self) -> Any:
        if "writes" not in vars(self):  # a record of layout 1 or 2, until layout 3 fills it
            return super().__getstate__()
        # Everything but the writes is fixed once the record is made: packed once, kept while
        # the record is in memory, so a put_writes packs only the writes.
        packed = getattr(self, "_v_packed", None)
        if packed is None:
            refs: list[Any] = []
            data = ormsgpack.packb(
                [
                    *self.checkpoint,
                    *self.metadata,
                    self.parent_id,
                    self.run_id,
                    self.size,
                    self.versions,
                    {channel: _out(stored, refs) for channel, stored in self.values.items()},
                ]
            )
            packed = self._v_packed = (data, tuple(refs))
        return RECORD_FORMAT, *packed, *_pack_writes(self.writes)

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):  # layouts 1-3: the attributes, pickled
            super().__setstate__(state)
            return
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == RECORD_FORMAT):
            raise _damaged(f"a state of format {_shape(state)}")
        _, data, refs, writes, write_refs = state
        fields = _unpack(data, "data")
        if not (isinstance(fields, list) and len(fields) == 9):
            raise _damaged(f"data {_shape(fields)}")
        c_type, c_bytes, m_type, m_bytes, parent_id, run_id, size, versions, values = fields
        if not (
            _is_typed(c_type, c_bytes)
            and _is_typed(m_type, m_bytes)
            and isinstance(parent_id, str | None)
            and isinstance(run_id, str | None)
            and type(size) is int
            and _is_str_map(versions)
            and isinstance(values, dict)
        ):
            raise _damaged("fields of the wrong types")
        vars(self).update(
            _v_packed=(data, refs),
            checkpoint=(c_type, c_bytes),
            metadata=(m_type, m_bytes),
            parent_id=parent_id,
            run_id=run_id,
            size=size,
            versions=versions,
            values={channel: _in(stored, refs) for channel, stored in values.items()},
            writes=_unpack_writes(writes, write_refs),
        )

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
        # Stored values arrive here as references to their records, equal when the same.
        fixed = [_fixed(state) for state in (old, committed, new)]
        if any(part is None for part in fixed) or not _same(fixed[1], fixed[2]):
            raise ConflictError
        if type(fixed[0]) is type(fixed[1]) and not _same(fixed[0], fixed[1]):
            raise ConflictError  # (a record of layout 3 rewritten by both: fixed parts differ)
        before, ours, theirs = (_state_writes(state) for state in (old, committed, new))
        merged = dict(ours)
        for key, write in theirs.items():
            if not _same(before.get(key), write) and (key not in merged or key[1] < 0):
                merged[key] = write
        if isinstance(committed, dict):
            return {**committed, "writes": merged}
        return (*committed[:3], *_pack_writes(merged))


def _out(stored: Any, refs: list[Any]) -> Any:
    """A stored value as msgpack holds it: an inline (type, bytes) as itself, anything else (a
    ``Payload``, or a reference to one in conflict resolution) as its position in ``refs``."""
    if isinstance(stored, tuple):
        return stored
    refs.append(stored)
    return len(refs) - 1


def _in(packed: Any, refs: Any) -> Any:
    if type(packed) is int:
        if not (isinstance(refs, tuple) and 0 <= packed < len(refs)):
            raise _damaged(f"a reference to value {packed} of {_shape(refs)}")
        return refs[packed]
    if isinstance(packed, list) and len(packed) == 2 and _is_typed(*packed):
        return packed[0], packed[1]
    raise _damaged(f"a stored value {_shape(packed)}")


def _pack_writes(writes: Writes) -> tuple[bytes, tuple[Any, ...]]:
    refs: list[Any] = []
    packed = ormsgpack.packb(
        [
            [task_id, idx, channel, path, _out(stored, refs)]
            for (task_id, idx), (channel, stored, path) in writes.items()
        ]
    )
    return packed, tuple(refs)


def _unpack_writes(packed: Any, refs: Any) -> Writes:
    rows = _unpack(packed, "writes")
    if not isinstance(rows, list):
        raise _damaged(f"writes {_shape(rows)}")
    writes: Writes = {}
    for row in rows:
        if not (
            isinstance(row, list)
            and len(row) == 5
            and isinstance(row[0], str)
            and type(row[1]) is int
            and isinstance(row[2], str)
            and isinstance(row[3], str)
        ):
            raise _damaged(f"a write {_shape(row)}")
        writes[(row[0], row[1])] = (row[2], _in(row[4], refs), row[3])
    return writes


def _unpack(packed: Any, what: str) -> Any:
    if not isinstance(packed, bytes):
        raise _damaged(f"{what} {_shape(packed)}")
    try:
        return ormsgpack.unpackb(packed)
    except ValueError as exc:
        raise _damaged(f"{what} that is not msgpack ({exc})") from exc


def _fixed(state: Any) -> Any:
    """What a record's state holds besides its writes, comparable across two states of one
    format; None for a state that is neither format."""
    if isinstance(state, dict):
        return {name: value for name, value in state.items() if name != "writes"}
    if isinstance(state, tuple) and len(state) == 5 and state[0] == RECORD_FORMAT:
        return state[:3]
    return None


def _state_writes(state: Any) -> Writes:
    return state["writes"] if isinstance(state, dict) else _unpack_writes(state[3], state[4])


def _is_typed(kind: Any, data: Any) -> bool:
    return isinstance(kind, str) and isinstance(data, bytes)


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _shape(value: Any) -> str:
    return f"of type {type(value).__name__}"


def _damaged(what: str) -> ImageCorruptError:
    return ImageCorruptError(
        f"a checkpoint record in the image is damaged: {what}",
        hint="run 'batos repair' on the image, or restore a backup; the thread's other "
        "checkpoints are unaffected",
    )


class CheckpointIndex(Persistent):
    """The checkpoints of one namespace of a thread by id, oldest → newest.

    The newest ids are the index's own state, the small bucket of ``recent`` ids: fewer than
    ``2 * RECENT`` of them (a merge may leave a few more), stored as one msgpack list and a
    tuple of references to their records. The rest live in ``older``, a tree. Every id of
    ``recent`` is larger than every id in ``older``: a put of a new (largest) id rewrites the
    bucket only, until it is full and all but its newest ``RECENT`` ids move into ``older``,
    and the latest checkpoint is found without reading ``older``.
    """

    def __init__(self) -> None:
        self._recent: dict[str, CheckpointRecord] = {}
        self.older: Any = None  # OOBTree once anything moves out of ``recent``

    def __getstate__(self) -> tuple[bytes, tuple[Any, ...], Any]:
        ids = sorted(self._recent)
        return ormsgpack.packb(ids), tuple(map(self._recent.__getitem__, ids)), self.older

    def __setstate__(self, state: Any) -> None:
        ids, refs, older = _index_state(state)
        vars(self).update(_recent=dict(zip(ids, refs, strict=True)), older=older)

    def get(self, checkpoint_id: str, default: Any = None) -> Any:
        record = self._recent.get(checkpoint_id)
        if record is None and self.older is not None:
            record = self.older.get(checkpoint_id)
        return default if record is None else record

    def __getitem__(self, checkpoint_id: str) -> CheckpointRecord:
        record = self.get(checkpoint_id)
        if record is None:
            raise KeyError(checkpoint_id)
        return record

    def __setitem__(self, checkpoint_id: str, record: CheckpointRecord) -> None:
        recent, older = self._recent, self.older
        if (recent and checkpoint_id >= min(recent)) or not older or checkpoint_id > older.maxKey():
            recent[checkpoint_id] = record
            self._p_changed = True
            if len(recent) >= 2 * RECENT:
                self._move_older(len(recent) - RECENT)
        else:  # an id older than the newest ones: a put of a past checkpoint
            older[checkpoint_id] = record

    def _move_older(self, count: int) -> None:
        if self.older is None:
            self.older = OOBTree()
        moved = sorted(self._recent)[:count]
        self.older.update(
            {checkpoint_id: self._recent.pop(checkpoint_id) for checkpoint_id in moved}
        )
        self._p_changed = True

    def pop(self, checkpoint_id: str, default: Any = None) -> Any:
        record = self._recent.pop(checkpoint_id, None)
        if record is not None:
            self._p_changed = True
        elif self.older is not None:
            record = self.older.pop(checkpoint_id, None)
        return default if record is None else record

    def __len__(self) -> int:
        return len(self._recent) + (len(self.older) if self.older is not None else 0)

    def __bool__(self) -> bool:
        return bool(self._recent) or bool(self.older)

    def maxKey(self) -> str:  # noqa: N802 (the name BTrees give it)
        """The newest checkpoint id; ValueError when there is none, as a BTree's."""
        if self._recent:
            return max(self._recent)
        if self.older:
            return self.older.maxKey()
        raise ValueError("empty checkpoint index")

    def keys(self, *, max: str | None = None, excludemax: bool = False) -> list[str]:  # noqa: A002
        """Checkpoint ids oldest → newest, those below (or up to) ``max`` when given."""
        return [key for key, _ in self.items(max=max, excludemax=excludemax)]

    def items(
        self,
        *,
        max: str | None = None,  # noqa: A002
        excludemax: bool = False,
    ) -> list[tuple[str, CheckpointRecord]]:
        items = sorted(self._recent.items())
        if max is not None:
            items = [item for item in items if item[0] < max or (item[0] == max and not excludemax)]
        if self.older:
            bounds: dict[str, Any] = {} if max is None else {"max": max, "excludemax": excludemax}
            items = list(self.older.items(**bounds)) + items
        return items

    def values(self) -> list[CheckpointRecord]:
        return [record for _, record in self.items()]

    def _p_resolveConflict(self, old: Any, committed: Any, new: Any) -> Any:
        # Puts of different checkpoints of one namespace at once (two processes on one thread)
        # merge, as in a BTree's bucket: each id takes the side that changed it. Both changing
        # one id conflicts, and so do ids added on one side and removed on the other: a removal
        # may be a move to ``older``, and an id added meanwhile could be older than those moved.
        states = [_index_state(state) for state in (old, committed, new)]
        maps = [dict(zip(ids, refs, strict=True)) for ids, refs, _ in states]
        added = [bool(m.keys() - maps[0].keys()) for m in maps[1:]]
        removed = [bool(maps[0].keys() - m.keys()) for m in maps[1:]]
        if (added[0] and removed[1]) or (removed[0] and added[1]):
            raise ConflictError
        merged = {}
        for checkpoint_id in set().union(*maps):
            value = _merge_3(*(m.get(checkpoint_id, _ABSENT) for m in maps))
            if value is not _ABSENT:
                merged[checkpoint_id] = value
        older = _merge_3(*(state[2] for state in states))
        ids = sorted(merged)
        return ormsgpack.packb(ids), tuple(merged[i] for i in ids), older


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or a == b
    except ValueError:  # ZODB's references to two different records refuse to compare
        return False


def _merge_3(old: Any, committed: Any, new: Any) -> Any:
    """The three-way merge of one value: the side that changed it, or ConflictError if both
    changed it differently."""
    if _same(committed, old):
        return new
    if _same(new, old) or _same(new, committed):
        return committed
    raise ConflictError


def _index_state(state: Any) -> tuple[list[str], tuple[Any, ...], Any]:
    if not (isinstance(state, tuple) and len(state) == 3):
        raise _damaged(f"a checkpoint index state {_shape(state)}")
    packed, refs, older = state
    ids = _unpack(packed, "checkpoint ids")
    if not (
        isinstance(ids, list)
        and all(isinstance(i, str) for i in ids)
        and isinstance(refs, tuple)
        and len(refs) == len(ids)
    ):
        raise _damaged("a checkpoint index whose ids and records do not match")
    return ids, refs, older


class ThreadRecord(Persistent):
    """All checkpoints (with their values and pending writes) of one conversation thread."""

    def __init__(self) -> None:
        self.created = time.time()
        self.namespaces = OOBTree()

    def namespace(self, ns: str, *, create: bool = False) -> Any:
        index = self.namespaces.get(ns)
        if index is None and create:
            index = self.namespaces[ns] = CheckpointIndex()
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


def _layout_4(root: Any) -> None:
    """Give each namespace its bucket of newest ids (``CheckpointIndex``).

    The namespace's tree stays as the index's ``older`` part, less its newest ``RECENT`` ids;
    records are shared, not copied, and keep their layout-3 form until they next change. Runs
    in one transaction, so a crash leaves the image on layout 3.
    """
    for thread in root[CHECKPOINTS_KEY].threads.values():
        for ns, tree in list(thread.namespaces.items()):
            index = CheckpointIndex()
            for checkpoint_id in list(tree.keys())[-RECENT:]:
                index[checkpoint_id] = tree.pop(checkpoint_id)
            if tree:
                index.older = tree
            thread.namespaces[ns] = index


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
    UpgradeStep(
        "checkpoints-4",
        "each namespace's newest checkpoint ids in a small bucket of their own, so a put "
        "rewrites that bucket and not its namespace's tree",
        _layout_4,
    ),
)
