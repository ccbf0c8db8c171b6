"""How conversation threads (LangGraph checkpoints) are laid out in the living image.

Everything lives under the image's ``layout.CHECKPOINTS`` key, a ``CheckpointTree``::

    CheckpointTree
     ├── threads: OOBTree  thread_id → ThreadRecord
     │    └── namespaces: OOBTree  checkpoint_ns → CheckpointIndex
     │         CheckpointIndex: the newest checkpoint ids and a reference to the newest record
     │                          older  OlderCheckpoints (an OOBTree)  checkpoint_id → record
     │         CheckpointRecord: checkpoint_id, body, metadata, parent_id, run_id,
     │                           versions {channel: version}, values {channel: stored},
     │                           writes {(task_id, idx): (channel, stored, task_path)},
     │                           previous (the record of the next older id)
     └── runs:    OOBTree  run_id → OOTreeSet of (thread_id, ns, checkpoint_id)

Checkpoint ids are uuid6, so each namespace index is ordered oldest → newest, and "latest" is
its largest id. A checkpoint is one record holding everything a read needs. A put writes that
record and its namespace's small bucket of newest ids, which refers to the newest record only
(the others are reached through each record's ``previous``); once in ``RECENT`` puts the
bucket's older ids move into the namespace's tree, so a put writes two small objects however
long the thread. A put_writes rewrites the record only. A record's state is two msgpack
documents (what it was stored with, and its pending writes) and the references it holds: a
few strings for ZODB to pickle instead of a hundred small objects, each a Python call of ZODB's
pickler, as is every reference.
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
``store.checkpoint.layout`` for as long as images that hold them exist.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast, overload

import ormsgpack
from BTrees.OOBTree import OOBTree, OOTreeSet
from persistent import Persistent
from ZODB.POSException import ConflictError

from batos.errors import ImageCorruptError
from store.core import layout
from store.core.layout import UpgradeStep

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
        # data holds the bytes whenever there is no blob
        return self.type, cast(bytes, self.data)


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
    #: The newest checkpoint of the root namespace (None when it has none).
    latest_id: str | None
    created: float


@dataclass(frozen=True)
class CheckpointHeader:
    """What ``batos threads ID`` shows of one checkpoint: all but its values and its writes'
    values, which can be megabytes each."""

    thread_id: str
    namespace: str
    checkpoint_id: str
    parent_id: str | None
    metadata: dict[str, Any]
    writes: int


class CheckpointRecord(Persistent):
    """One checkpoint: its serialized body (without channel values), metadata, channel values
    and pending writes.

    Stored as ``(RECORD_FORMAT, data, refs, writes, write_refs, previous)``: ``data`` and
    ``writes`` are msgpack documents in which a value kept in a ``Payload`` is its position in
    ``refs`` or ``write_refs``. Everything in ``data`` is fixed when the record is made.
    """

    #: The record of the next older checkpoint of its namespace, or None: the chain by which
    #: a ``CheckpointIndex`` reaches its newest records through one reference.
    previous: CheckpointRecord | None = None
    #: This checkpoint's id; None in records of layouts 1-3, which did not keep it.
    checkpoint_id: str | None = None

    def __init__(
        self,
        checkpoint: Typed,
        metadata: Typed,
        *,
        checkpoint_id: str | None,
        parent_id: str | None,
        run_id: str | None,
        versions: dict[str, str],
        values: dict[str, Any],
        writes: Writes,
        size: int,
    ) -> None:
        self.checkpoint_id = checkpoint_id
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
                    self.checkpoint_id,
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
        return RECORD_FORMAT, *packed, *_pack_writes(self.writes), self.previous

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, dict):  # layouts 1-3: the attributes, pickled
            super().__setstate__(state)
            return
        if not (isinstance(state, tuple) and len(state) == 6 and state[0] == RECORD_FORMAT):
            raise _damaged(f"a state of format {_shape(state)}")
        _, data, refs, writes, write_refs, previous = state
        if not isinstance(previous, CheckpointRecord | None):
            raise _damaged(f"a previous record {_shape(previous)}")
        fields = _unpack(data, "data")
        if not (isinstance(fields, list) and len(fields) == 10):
            raise _damaged(f"data {_shape(fields)}")
        (
            checkpoint_id,
            c_type,
            c_bytes,
            m_type,
            m_bytes,
            parent_id,
            run_id,
            size,
            versions,
            values,
        ) = fields
        if not (
            isinstance(checkpoint_id, str | None)
            and _is_typed(c_type, c_bytes)
            and _is_typed(m_type, m_bytes)
            and isinstance(parent_id, str | None)
            and isinstance(run_id, str | None)
            and type(size) is int
            and _is_str_map(versions)
            and isinstance(values, dict)
        ):
            raise _damaged("fields of the wrong types")
        self.__dict__.update(
            _v_packed=(data, refs),
            checkpoint_id=checkpoint_id,
            previous=previous,
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
            checkpoint_id=self.checkpoint_id,
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
        return (*committed[:3], *_pack_writes(merged), committed[5])


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
    if isinstance(state, tuple) and len(state) == 6 and state[0] == RECORD_FORMAT:
        return (*state[:3], state[5])
    return None


def _state_writes(state: Any) -> Writes:
    return state["writes"] if isinstance(state, dict) else _unpack_writes(state[3], state[4])


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or a == b
    except ValueError:  # ZODB's references to two different records refuse to compare
        return False


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


class OlderCheckpoints(OOBTree):
    """The tree of a namespace's older checkpoints: checkpoint_id → CheckpointRecord.

    Ids arrive in order, so every split of a leaf rewrites the node above it, and an OOBTree's
    nodes hold up to 250 children (its root 500): a tree of a few thousand checkpoints rewrote
    a node of a few hundred references every fifteen puts. Small internal nodes keep that
    rewrite small.
    """

    max_internal_size = 16


class CheckpointIndex(Persistent):
    """The checkpoints of one namespace of a thread by id, oldest → newest.

    The newest ids (fewer than ``2 * RECENT``) are the index's own state, the small bucket of
    recent ids: one msgpack list and one reference, to the newest record. Each record refers
    to the record of the next older id (``CheckpointRecord.previous``), so the index reaches
    every recent record through that chain and a put adds one reference to the image, not
    one per recent checkpoint (a reference costs ZODB's pickler three Python calls). When the
    bucket fills, all but its newest ``RECENT`` ids move into ``older``, a tree: every id of
    the bucket is larger than every id in ``older``, so a put of a new (largest) id writes
    the bucket and its record, the tree once in ``RECENT`` puts, and the latest checkpoint is
    found without reading the tree.

    Every record's ``previous`` is None or the live record of the next older id, also in
    ``older``: removing or replacing a record relinks the one after it, so a deleted record is
    never kept reachable. Two processes changing one namespace at once conflict and retry.
    """

    def __init__(self) -> None:
        self._ids: list[str] = []  # the recent ids, ascending
        self._newest: CheckpointRecord | None = None
        self.older: Any = None  # OOBTree once anything moves out of the bucket

    def __getstate__(self) -> tuple[bytes, Any, Any]:
        return ormsgpack.packb(self._ids), self._newest, self.older

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) == 3):
            raise _damaged(f"a checkpoint index state {_shape(state)}")
        packed, newest, older = state
        ids = _unpack(packed, "checkpoint ids")
        if not (
            isinstance(ids, list)
            and all(isinstance(i, str) for i in ids)
            and all(a < b for a, b in zip(ids, ids[1:], strict=False))
            and (newest is None) == (not ids)
        ):
            raise _damaged("a checkpoint index whose ids are out of order or miss their records")
        self.__dict__.update(_ids=ids, _newest=newest, older=older)

    # -- reading ---------------------------------------------------------------------------

    def get(self, checkpoint_id: str, default: Any = None) -> Any:
        ids = self._ids
        if ids and checkpoint_id >= ids[0]:
            if checkpoint_id == ids[-1]:
                return self._newest
            position = bisect_left(ids, checkpoint_id)
            if position < len(ids) and ids[position] == checkpoint_id:
                return self._recent()[position]
            return default
        return self.older.get(checkpoint_id, default) if self.older is not None else default

    def __getitem__(self, checkpoint_id: str) -> CheckpointRecord:
        record = self.get(checkpoint_id)
        if record is None:
            raise KeyError(checkpoint_id)
        return record

    def __len__(self) -> int:
        return len(self._ids) + (len(self.older) if self.older is not None else 0)

    def __bool__(self) -> bool:
        return bool(self._ids) or bool(self.older)

    def maxKey(self) -> str:
        """The newest checkpoint id; ValueError when there is none, as a BTree's."""
        if self._ids:
            return self._ids[-1]
        if self.older:
            return self.older.maxKey()
        raise ValueError("empty checkpoint index")

    def keys(self, *, max: str | None = None, excludemax: bool = False) -> list[str]:
        """Checkpoint ids oldest → newest, those below (or up to) ``max`` when given."""
        ids = _below(self._ids, max, excludemax)
        if self.older:
            bounds: dict[str, Any] = {} if max is None else {"max": max, "excludemax": excludemax}
            ids = list(self.older.keys(**bounds)) + ids
        return ids

    def items(self) -> list[tuple[str, CheckpointRecord]]:
        items = list(zip(self._ids, self._recent(), strict=True))
        return list(self.older.items()) + items if self.older else items

    def values(self) -> list[CheckpointRecord]:
        return [record for _, record in self.items()]

    def _recent(self) -> list[CheckpointRecord]:
        """The records of the recent ids, oldest first, found by walking from the newest."""
        ids = self._ids
        records: list[CheckpointRecord] = []
        record = self._newest
        for position in range(len(ids) - 1, -1, -1):
            if record is None or record.checkpoint_id not in (None, ids[position]):
                raise _damaged(f"the chain of newest checkpoints breaks at {ids[position]!r}")
            records.append(record)
            record = record.previous
        records.reverse()
        return records

    # -- writing ---------------------------------------------------------------------------

    def __setitem__(self, checkpoint_id: str, record: CheckpointRecord) -> None:
        ids, older = self._ids, self.older
        if (
            ids
            and checkpoint_id > ids[-1]
            or not ids
            and not (older and checkpoint_id <= older.maxKey())
        ):  # the usual put: a new newest checkpoint
            record.previous = self._newest
            ids.append(checkpoint_id)
            self._newest = record
        elif ids and checkpoint_id >= ids[0] or not (older and checkpoint_id <= older.maxKey()):
            # a put of a past id into the bucket: replace or insert, and relink after it
            records = self._recent()
            position = bisect_left(ids, checkpoint_id)
            if position < len(ids) and ids[position] == checkpoint_id:
                record.previous = records[position].previous
                records[position] = record
            else:
                record.previous = records[position - 1] if position else None
                ids.insert(position, checkpoint_id)
                records.insert(position, record)
            if position + 1 < len(records):
                records[position + 1].previous = record
            self._newest = records[-1]
        else:  # older than the bucket: into the tree, the next record pointing to it
            following = self._following(checkpoint_id)
            record.previous = None
            older[checkpoint_id] = record
            if following is not None and following.previous is not None:
                following.previous = record
            return
        self._p_changed = True
        if len(ids) >= 2 * RECENT:
            self._move_older(len(ids) - RECENT)

    def _move_older(self, count: int) -> None:
        if self.older is None:
            self.older = OlderCheckpoints()
        self.older.update(list(zip(self._ids[:count], self._recent()[:count], strict=True)))
        del self._ids[:count]
        self._p_changed = True

    def pop(self, checkpoint_id: str, default: Any = None) -> Any:
        """Remove one checkpoint's record and return it, relinking the record after it."""
        ids = self._ids
        if ids and checkpoint_id >= ids[0]:
            position = bisect_left(ids, checkpoint_id)
            if position == len(ids) or ids[position] != checkpoint_id:
                return default
            records = self._recent()
            record = records.pop(position)
            del ids[position]
            if position < len(records) and records[position].previous is record:
                records[position].previous = record.previous
            self._newest = records[-1] if records else None
            self._p_changed = True
            return record
        if self.older is None:
            return default
        following = self._following(checkpoint_id)
        record = self.older.pop(checkpoint_id, None)
        if record is None:
            return default
        if following is not None and following.previous is record:
            following.previous = record.previous
        return record

    def _following(self, checkpoint_id: str) -> CheckpointRecord | None:
        """The record of the next newer id than ``checkpoint_id`` (not itself), if any."""
        if self.older:
            for later in self.older.keys(min=checkpoint_id, excludemin=True):
                return self.older[later]
        return self._recent()[0] if self._ids else None


def _below(ids: list[str], most: str | None, exclude: bool) -> list[str]:
    if most is None:
        return list(ids)
    return ids[: (bisect_left if exclude else bisect_right)(ids, most)]


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
        # The root namespace's newest: the thread's state (get_state, a resumed chat); a
        # subgraph's checkpoint is newer while the subgraph runs, but no state of the thread.
        root = self.namespaces.get("")
        latest = root.maxKey() if root else None
        for index in self.namespaces.values():
            checkpoints += len(index)
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

    @overload
    def thread(self, thread_id: str, *, create: Literal[True]) -> ThreadRecord: ...
    @overload
    def thread(self, thread_id: str, *, create: bool = False) -> ThreadRecord | None: ...
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
    if layout.find(root, layout.CHECKPOINTS) is None:
        root[layout.CHECKPOINTS] = CheckpointTree()


def _layout_2(root: Any) -> None:
    """Re-key every thread's values from (ns, channel, version) to (ns, version, channel).

    The stored values themselves are shared, not copied. Runs in one transaction, so a crash
    leaves the image on layout 1.
    """
    for thread in layout.checkpoints(root).threads.values():
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
    threads = layout.checkpoints(root).threads
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

    The newest ``RECENT`` records of the namespace's tree go into the bucket (linked, so they
    are rewritten, in the new form), the rest into the index's ``older`` tree; records are
    shared, not copied, and those in the tree keep their layout-3 form until they next change.
    Runs in one transaction, so a crash leaves the image on layout 3.
    """
    for thread in layout.checkpoints(root).threads.values():
        for ns, tree in list(thread.namespaces.items()):
            index = CheckpointIndex()
            for checkpoint_id in list(tree.keys())[-RECENT:]:
                record = tree.pop(checkpoint_id)
                record.checkpoint_id = checkpoint_id
                index[checkpoint_id] = record
            if tree:
                index.older = OlderCheckpoints(tree)
            thread.namespaces[ns] = index


CHECKPOINT_STEPS: tuple[UpgradeStep, ...] = (
    UpgradeStep(
        "checkpoints-1",
        "conversation threads of the LangGraph checkpointer (the root's checkpoints key)",
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
