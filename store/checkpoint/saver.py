"""``ZODBSaver``: LangGraph checkpoints written into the living image, one transaction each.

Used by ``graph.compile(checkpointer=ZODBSaver(image))``; the application's runtime
(``batos.shell.runtime``) makes the one every entry point uses, ``langgraph dev`` included. Every
``put`` is one ZODB transaction, retried on write conflicts, so a crash leaves either the whole
checkpoint or none of it. A ``put_writes`` for a stored checkpoint is one transaction too; one for a
checkpoint not stored yet waits in memory (``store.checkpoint.parking``) and is stored by that
checkpoint's put, in its transaction, so nothing is ever written for a checkpoint that never
arrives, and a put_writes that finds nothing to store commits nothing. ZODB connections are not
thread-safe: every write of a saver goes through its one write connection, one at a time (writes of
one saver are serialized within a process; other processes' writes still merge or retry as
conflicts), so what a put wrote stays in that connection's cache for the next put and the get_tuple
after it. Reads borrow the write connection when it is free and otherwise a connection of a small
pool; async methods run the sync ones in the event loop's executor. The layout in the image is
described in ``store.checkpoint.layout``.

Errors::

    CheckpointError (BatosError, exit code 8)
     ├── CheckpointConfigError         no usable thread_id / checkpoint_id in the config
     ├── CheckpointNotFound            no such thread or checkpoint (``require``, a put's parent)
     ├── ThreadMovedOn                 a run that continues the latest checkpoint found a newer
     │                                 one stored first (another process's run); nothing written
     └── CheckpointSerializationError  a state value the serde cannot encode; nothing written
    TransactionFailed (ImageError)     conflicts outlasted every retry; nothing written
"""

from __future__ import annotations

import asyncio
import builtins
import heapq
import logging
import random
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import transaction
from langchain_core.runnables import RunnableConfig
from langgraph._internal._constants import NULL_TASK_ID  # a Command(update=...)'s task
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from transaction.interfaces import NoTransaction
from ZODB.Connection import Connection
from ZODB.interfaces import IBlobStorage

from batos import settings
from batos.errors import (
    CheckpointConfigError,
    CheckpointError,
    CheckpointNotFound,
    CheckpointSerializationError,
    ThreadMovedOn,
)
from store.checkpoint import effects, writers
from store.checkpoint.layout import (
    CHECKPOINT_STEPS,
    CheckpointHeader,
    CheckpointRecord,
    CheckpointTree,
    TaskWrites,
    ThreadSummary,
    Typed,
    add_writes,
    decode,
    encode,
)
from store.checkpoint.parking import ParkedWrites
from store.core import layout
from store.core.image import LivingImage, shown_uri
from store.core.schema import require
from store.core.transactions import Unchanged, note_text, run_in_transaction

__all__ = [
    "CheckpointConfigError",
    "CheckpointError",
    "CheckpointNotFound",
    "CheckpointSerializationError",
    "CheckpointHeader",
    "ThreadMovedOn",
    "ThreadSummary",
    "ZODBSaver",
]

log = logging.getLogger("batos.checkpointer")

T = TypeVar("T")

#: Connections the saver keeps open at most; more concurrent callers wait for one.
MAX_CONNECTIONS = 16
#: The configurable key of a config ``get_tuple`` gave for a namespace's latest checkpoint; its
#: value is that namespace (None in a config for a checkpoint named by id). LangGraph's loop
#: carries the config it started from into every put of its run, so a put that finds the key
#: continues what was the latest when the run read it, and must still continue the latest of
#: this process's own writing (``ThreadMovedOn`` otherwise). "__" keeps it out of the
#: checkpoint metadata LangGraph copies from configurable values.
LATEST_KEY = "__batos_continues_latest__"
#: The configurable key of a run whose caller read the thread first (``graph.mind.
#: refuse_if_busy``): the id of the latest root checkpoint it saw ("" for none). The run's
#: first put must continue that one: a run that started in between (another process's) was
#: not seen by the check, and this one would go on from its half-done state.
EXPECT_KEY = "__batos_expects__"
#: Checkpoint ids this process stored, kept per open image: the newest of them are what tells
#: another process's checkpoint from one of its own runs'.
OWN_IDS = 4096


class _Bounded:
    """A map bounded to ``OWN_IDS`` entries, the least recently set dropped first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[Any, Any] = {}

    def set(self, key: Any, value: Any = None) -> None:
        with self._lock:
            self._items.pop(key, None)
            self._items[key] = value
            while len(self._items) > OWN_IDS:
                del self._items[next(iter(self._items))]

    def get(self, key: Any) -> Any:
        with self._lock:
            return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items


class _OwnCheckpoints(_Bounded):
    """The ids of the checkpoints stored through one open image by this process, newest last.

    Runs of one process on one thread are ordered by the process itself (the LangGraph server
    queues, interrupts or rolls back a thread's runs; the bridge and the CLI refuse a second):
    a cancelled run's last put may land after the next run read the thread, and that is no
    lost exchange. What the checkpointer refuses is a newer checkpoint another process stored.
    """


_OWN: weakref.WeakKeyDictionary[LivingImage, _OwnCheckpoints] = weakref.WeakKeyDictionary()
_OWN_LOCK = threading.Lock()


def _own(image: LivingImage) -> _OwnCheckpoints:
    with _OWN_LOCK:
        own = _OWN.get(image)
        if own is None:
            own = _OWN[image] = _OwnCheckpoints()
        return own


#: Prune strategies: the base class documents "delete", the LangGraph server sends "delete_all".
DELETE_STRATEGIES = frozenset({"delete", "delete_all"})


class _ExplicitTransactions(transaction.TransactionManager):
    """An explicit transaction manager whose ``abort`` is a no-op outside a transaction.

    Explicit mode makes a connection sync with the storage only when a transaction begins,
    not again after every commit and abort (three syncs per put before). ``abort`` must stay
    safe to call at any time: the pool calls it after each use, ``DB.close`` on every
    connection.
    """

    def __init__(self) -> None:
        super().__init__(explicit=True)

    def abort(self) -> None:
        try:
            super().abort()
        except NoTransaction:
            pass


class _Writer:
    """The saver's one write connection, used by one write at a time.

    Every write of a saver goes through it, so one process's writes never conflict with each
    other and the objects a put wrote are still in this connection's cache for the next put
    and for the ``get_tuple`` that usually follows. Reads use it when it is free
    (``acquire(wait=False)``) and the pool otherwise.
    """

    def __init__(self, image: LivingImage) -> None:
        self._image = image
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._closed = False

    def acquire(self, *, wait: bool = True) -> Connection | None:
        """The write connection, held until ``release()``; None if busy and not ``wait``."""
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            if self._closed:
                raise CheckpointError(
                    "the checkpointer was closed", hint="open a new ZODBSaver on the image"
                )
            if self._conn is None:
                self._conn = self._image.db.open(transaction_manager=_ExplicitTransactions())
        except BaseException:
            self._lock.release()
            raise
        return self._conn

    def release(self) -> None:
        self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.transaction_manager.abort()
            conn.close()


class _ConnectionPool:
    """Open connections, each with its own transaction manager, lent to one caller at a time."""

    def __init__(self, image: LivingImage, size: int) -> None:
        self._image = image
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._closed = False
        # ZODB logs a warning whenever more connections are open than its pool size (the
        # saver's write connection is one more).
        db = image.db
        db.setPoolSize(db.getPoolSize() + size + 1)

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        self._slots.acquire()
        try:
            with self._lock:
                if self._closed:
                    raise CheckpointError(
                        "the checkpointer was closed", hint="open a new ZODBSaver on the image"
                    )
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._image.db.open(transaction_manager=_ExplicitTransactions())
            try:
                yield conn
            finally:
                conn.transaction_manager.abort()
                with self._lock:
                    if self._closed:
                        conn.close()
                    else:
                        self._idle.append(conn)
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _thread_id(config: RunnableConfig | None) -> str:
    configurable = (config or {}).get("configurable") or {}
    value = configurable.get("thread_id")
    if isinstance(value, uuid.UUID):
        value = str(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise CheckpointConfigError(
            f"config['configurable']['thread_id'] must be a non-empty string, got {value!r}",
            hint='pass config={"configurable": {"thread_id": "my-thread"}} to invoke/stream',
        )
    return value


def _named(thread_id: str) -> str:
    """A thread id as a transaction's note names it: cut short, so that the namespace and
    checkpoint id after it stay in the note (``note_text`` cuts the note at its end)."""
    return thread_id if len(thread_id) <= 200 else thread_id[:199] + "…"


def _checkpoint_ns(config: RunnableConfig) -> str:
    ns = config["configurable"].get("checkpoint_ns") or ""
    if not isinstance(ns, str):
        raise CheckpointConfigError(f"checkpoint_ns must be a string, got {ns!r}")
    return ns


def _checkpoint_id(config: RunnableConfig, *, required: bool = False) -> str | None:
    value = config["configurable"].get("checkpoint_id")
    # An empty id names no checkpoint, as in LangGraph's own savers (``get_checkpoint_id``
    # reads it as falsy): a client that sends "" for "the latest" gets the latest.
    if (value is None or value == "") and not required:
        return None
    if not isinstance(value, str) or not value:
        raise CheckpointConfigError(
            f"config['configurable']['checkpoint_id'] must be a checkpoint id, got {value!r}",
            hint="use the config returned by put(), or one listed by get_state_history()",
        )
    return value


def _newest_first(namespaces: dict[str, Any], before_id: str | None) -> Iterator[tuple[str, str]]:
    """``(checkpoint id, namespace)`` of every checkpoint of ``namespaces`` (namespace →
    ``CheckpointIndex``) older than ``before_id`` when given, newest first across them."""
    each = []
    for ns, checkpoints in namespaces.items():
        keys = checkpoints.keys(max=before_id, excludemax=True) if before_id else checkpoints.keys()
        each.append([(checkpoint_id, ns) for checkpoint_id in reversed(keys)])
    return heapq.merge(*each, reverse=True)


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _inherited(
    index: Any, parent: CheckpointRecord | None, channel: str, version: str
) -> Any | None:
    """The stored value of ``channel`` at ``version``, which a put did not send again.

    LangGraph sends only the channels that changed since the checkpoint the put continues:
    the rest are the parent's. Failing that (a put that names no parent), the newest
    checkpoint of the namespace that has this version has the value.
    """
    if parent is not None:
        found, stored = parent.value_at(channel, version)
        if found:
            return stored
    keys = index.keys()
    for position in range(len(keys) - 1, -1, -1):
        found, stored = index[keys[position]].value_at(channel, version)
        if found:
            return stored
    return None


def image_data_serde() -> JsonPlusSerializer:
    """LangGraph's serializer, decoding only the types on its own list of safe ones (dates,
    UUIDs, LangChain messages, Send, Command…).

    A checkpoint is image data like any other record: the serializer's default imports and
    calls whatever module and function a stored value names, so a checkpoint written by anyone
    else could run code as it is read. A value of a type off the list decodes to its plain
    data instead (LangGraph logs it); give ``ZODBSaver`` a serde of your own to allow more.
    """
    return JsonPlusSerializer(allowed_msgpack_modules=None)


class ZODBSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver whose storage is the living image.

    ``ZODBSaver(image)`` needs an image whose checkpoint layout is up to date (one opened by
    ``open_runtime``, which applies every upgrade step once); on an older one it raises
    ``ImageError`` and changes nothing. The image stays the caller's: ``close()`` returns the
    saver's connections, not the image. ``effect_kinds`` are the commit effects it applies with
    a checkpoint (``store.checkpoint.effects``); a graph's assembly adds its own (``accept``).
    """

    def __init__(
        self,
        image: LivingImage,
        *,
        serde: SerializerProtocol | None = None,
        blob_threshold: int | None = None,
        max_connections: int = MAX_CONNECTIONS,
        effect_kinds: effects.EffectKinds | None = None,
        write_checks: Mapping[str, Callable[[Any], Any]] | None = None,
    ) -> None:
        super().__init__(serde=serde or image_data_serde())
        self.image = image
        require(image, CHECKPOINT_STEPS, "the checkpointer")
        self.effect_kinds: dict[str, effects.EffectKind] = dict(effect_kinds or {})
        self.write_checks: dict[str, Callable[[Any], Any]] = dict(write_checks or {})
        self._blob_threshold: int | None = (
            (blob_threshold or settings.get_int("checkpoint_blob_bytes"))
            if IBlobStorage.providedBy(image.db.storage)
            else None
        )
        self._pool = _ConnectionPool(image, max_connections)
        #: (thread, namespace) → the newest checkpoint stored by a run held to the
        #: newest-checkpoint check (``put``): its run's next put is held to it too.
        self._guarded = _Bounded()
        self._writer = _Writer(image)
        self._parking = ParkedWrites()

    def accept(
        self,
        kinds: effects.EffectKinds,
        write_checks: Mapping[str, Callable[[Any], Any]] | None = None,
    ) -> None:
        """Apply effects of ``kinds`` too from now on, and hold a client's writes to the
        channels of ``write_checks`` to them (a graph assembled with this saver)."""
        self.effect_kinds.update(kinds)
        self.write_checks.update(write_checks or {})

    def close(self) -> None:
        self._writer.close()
        self._pool.close()

    def __enter__(self) -> ZODBSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions -----------------------------------------------------------------------

    @contextmanager
    def _reading(self, *, writer: bool = False) -> Iterator[CheckpointTree]:
        """The checkpoint tree as the storage has it now, read without a transaction.

        With ``writer``, through the write connection if it is free: its cache holds what
        this saver last wrote, which a short read (``get_tuple``) most often wants.
        """
        conn = self._writer.acquire(wait=False) if writer else None
        if conn is None:
            with self._pool.connection() as conn:
                yield self._catch_up(conn)
            return
        try:
            yield self._catch_up(conn)
        finally:
            self._writer.release()

    @staticmethod
    def _catch_up(conn: Connection) -> CheckpointTree:
        # Catch up with the storage (what begin() does for a connection) without a
        # transaction: a read needs none, and an accidental write then raises
        # NoTransaction instead of committing anything.
        conn.newTransaction(None)
        return layout.checkpoints(conn.root())

    def _write(self, fn: Callable[[CheckpointTree], T], note: str) -> T:
        return self._write_root(lambda root: fn(layout.checkpoints(root)), note)

    def _write_root(self, fn: Callable[[Any], T], note: str) -> T:
        """Run ``fn(root)`` in one transaction of the write connection, retried on write
        conflicts; ``fn`` raises ``Unchanged(result)`` to abort it instead of committing it."""
        conn = self._writer.acquire()
        assert conn is not None
        try:
            return run_in_transaction(
                conn.transaction_manager,
                lambda: fn(conn.root()),
                note=note,
                user="checkpointer",
                hint="other runs keep writing the same thread; retry later",
            )
        finally:
            self._writer.release()

    def _dumps(self, value: Any, what: str) -> Typed:
        try:
            return self.serde.dumps_typed(value)
        except Exception as exc:
            raise CheckpointSerializationError(
                f"{what} holds a value the checkpoint serializer cannot encode "
                f"({type(value).__name__}): {exc}; nothing was written",
                hint="keep graph state to JSON-like data, LangChain messages, dataclasses or "
                "pydantic models, or give ZODBSaver a serde that handles this type",
            ) from exc

    # -- reading ----------------------------------------------------------------------------

    def _metadata(self, record: CheckpointRecord) -> Any:
        """A checkpoint's metadata as LangGraph wrote it (its writer's name taken out)."""
        metadata = self.serde.loads_typed(record.metadata)
        if isinstance(metadata, dict):
            metadata.pop(writers.WRITER_KEY, None)
        return metadata

    def writer_gone(self, config: RunnableConfig) -> bool:
        """Whether the process that stored the checkpoint ``config`` names is known to have
        ended (``store.checkpoint.writers``); False when unknown or not found."""
        thread_id, ns = _thread_id(config), _checkpoint_ns(config)
        checkpoint_id = _checkpoint_id(config)
        with self._reading() as tree:
            thread = tree.threads.get(thread_id)
            checkpoints = thread.namespaces.get(ns) if thread is not None else None
            record = checkpoints.get(checkpoint_id) if checkpoints and checkpoint_id else None
            if record is None:
                return False
            metadata = self.serde.loads_typed(record.metadata)
        return isinstance(metadata, dict) and writers.gone(metadata.get(writers.WRITER_KEY))

    def _tuple(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        record: CheckpointRecord,
        config: RunnableConfig | None = None,
    ) -> CheckpointTuple:
        checkpoint: Checkpoint = self.serde.loads_typed(record.checkpoint)
        loads = self.serde.loads_typed
        checkpoint["channel_values"] = {
            channel: loads(decode(stored)) for channel, stored in record.values.items()
        }
        writes = sorted(
            (path, task_id, idx, channel, stored)
            for (task_id, idx), (channel, stored, path) in record.writes.items()
        )
        return CheckpointTuple(
            config=config or _config(thread_id, ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=self._metadata(record),
            parent_config=(_config(thread_id, ns, record.parent_id) if record.parent_id else None),
            pending_writes=[
                (task_id, channel, self.serde.loads_typed(decode(stored)))
                for _path, task_id, _idx, channel, stored in writes
            ],
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config``, or the thread's latest when it names none.

        Returns None for an unknown thread or checkpoint id, as LangGraph expects; ``require``
        raises ``CheckpointNotFound`` instead.
        """
        thread_id = _thread_id(config)
        ns = _checkpoint_ns(config)
        checkpoint_id = _checkpoint_id(config)
        named: RunnableConfig | None = config
        with self._reading(writer=True) as tree:
            thread = tree.threads.get(thread_id)
            checkpoints = thread.namespaces.get(ns) if thread is not None else None
            if not checkpoints:
                return None
            if checkpoint_id is None:
                checkpoint_id = checkpoints.maxKey()
                named = _config(thread_id, ns, checkpoint_id)
                named["configurable"][LATEST_KEY] = ns
            else:
                # A run from a checkpoint named by id branches on purpose, even from a config
                # read as the latest and passed back later (a StateSnapshot's): LangGraph's
                # loop lays this config over the one it was given, so the key is unset here,
                # and its puts are never taken for a run's continuation (``_guarded``).
                named = {**config, "configurable": {**config["configurable"], LATEST_KEY: None}}
            record = checkpoints.get(checkpoint_id)
            if record is None:
                return None
            return self._tuple(thread_id, ns, checkpoint_id, record, named)

    def require(self, config: RunnableConfig) -> CheckpointTuple:
        """Like ``get_tuple``, but an unknown thread or checkpoint raises ``CheckpointNotFound``."""
        found = self.get_tuple(config)
        if found is None:
            configurable = config["configurable"]
            what = (
                f"checkpoint {configurable['checkpoint_id']!r} of thread"
                if configurable.get("checkpoint_id")
                else "thread"
            )
            raise CheckpointNotFound(
                f"no {what} {configurable['thread_id']!r} (namespace "
                f"{configurable.get('checkpoint_ns') or '(root)'!r}) in "
                f"{shown_uri(self.image.uri)}",
                hint="list threads and their checkpoints with 'batos threads [THREAD_ID]'",
            )
        return found

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints by thread, namespace, metadata ``filter``, ``before``: thread by
        thread, each thread's newest first across its namespaces (as the SQL savers order
        them), so that a subgraph's checkpoints sit among the root's by time."""
        return iter(self._list(config, self._tuple, filter=filter, before=before, limit=limit))

    def headers(
        self, thread_id: str, *, limit: int | None = None
    ) -> builtins.list[CheckpointHeader]:
        """``thread_id``'s checkpoints in ``list``'s order (newest first), at most ``limit``,
        as headers: ids, parent, metadata and how many pending writes, with no channel value
        or write decoded, so a thread holding large values is listed at the cost of its
        metadata. An unknown thread has none.

        Example: ``[h.checkpoint_id for h in saver.headers("chat-1", limit=10)]``
        """
        return self._list(
            {"configurable": {"thread_id": thread_id}},
            self._header,
            filter=None,
            before=None,
            limit=limit,
        )

    def _header(
        self, thread_id: str, ns: str, checkpoint_id: str, record: CheckpointRecord
    ) -> CheckpointHeader:
        return CheckpointHeader(
            thread_id=thread_id,
            namespace=ns,
            checkpoint_id=checkpoint_id,
            parent_id=record.parent_id,
            metadata=self._metadata(record),
            writes=len(record.writes),
        )

    def _list(
        self,
        config: RunnableConfig | None,
        each: Callable[[str, str, str, CheckpointRecord], T],
        *,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> builtins.list[T]:
        """``each(thread_id, ns, checkpoint_id, record)`` of the checkpoints ``list`` names."""
        # Collected inside one read transaction, so the caller never holds a connection.
        configurable = (config or {}).get("configurable") or {}
        wanted_ns = configurable.get("checkpoint_ns") if config else None
        wanted_id = configurable.get("checkpoint_id")
        before_id = _checkpoint_id(before) if before else None
        if limit is not None and limit <= 0:
            return []
        found: list[T] = []
        with self._reading() as tree:
            if config is not None and "thread_id" in configurable:
                thread_ids: Any = [_thread_id(config)]
            else:
                thread_ids = tree.threads.keys()
            for thread_id in thread_ids:
                thread = tree.threads.get(thread_id)
                if thread is None:
                    continue
                namespaces = {
                    ns: checkpoints
                    for ns, checkpoints in thread.namespaces.items()
                    if wanted_ns is None or ns == wanted_ns
                }
                for checkpoint_id, ns in _newest_first(namespaces, before_id):
                    if wanted_id and checkpoint_id != wanted_id:
                        continue
                    record = namespaces[ns][checkpoint_id]
                    if filter:
                        metadata = self._metadata(record)
                        if any(metadata.get(k) != v for k, v in filter.items()):
                            continue
                    found.append(each(thread_id, ns, checkpoint_id, record))
                    if limit is not None and len(found) >= limit:
                        return found
        return found

    # -- writing ----------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store one checkpoint, its new channel values and the writes parked for it, in one
        transaction — with the image changes of a commit the checkpoint carries
        (``store.checkpoint.effects``), applied once per commit id.

        A put of a run that started from the thread's latest checkpoint (``LATEST_KEY``) stores
        only while no other process stored a newer checkpoint in its namespace: two runs on one
        thread at once in two processes sharing the image would otherwise both store, and the
        thread's latest state would keep one run's exchange and silently drop the other's. The
        run whose put comes second gets ``ThreadMovedOn`` and stores nothing of that step (nor
        the commit it carries). A run's input on a thread it found empty is held to the same. A
        run from a checkpoint named by id (a fork) has no such condition, and neither has a
        newer checkpoint of this process's own (``_OwnCheckpoints``).
        """
        thread_id = _thread_id(config)
        ns = _checkpoint_ns(config)
        parent_id = _checkpoint_id(config)
        checkpoint_id = checkpoint["id"]
        key = (thread_id, ns, checkpoint_id)
        continues_latest = (
            config.get("configurable", {}).get(LATEST_KEY) == ns
            or (
                # A run's input on a thread it found empty: LangGraph's first put of a run (step
                # -1) with nothing to continue. Another process's checkpoint there means it started
                # first. Only in the root namespace: a subgraph's namespace may start afresh over
                # checkpoints of its own (a replay of a subgraph compiled with checkpointer=True).
                ns == ""
                and parent_id is None
                and metadata.get("source") == "input"
                and metadata.get("step") == -1
            )
            or (
                parent_id is not None
                and self._guarded.get((thread_id, ns)) == parent_id
                and LATEST_KEY not in config.get("configurable", {})
            )
        )
        expected = config.get("configurable", {}).get(EXPECT_KEY)
        if (
            isinstance(expected, str)
            and ns == ""
            and parent_id != (expected or None)
            and self._guarded.get((thread_id, ns)) != parent_id
        ):
            self._parking.put_failed(key)
            raise self._moved_on(thread_id, ns, expected or None, parent_id or "(none)")
        try:
            apply = self._put_transaction(
                config,
                thread_id,
                ns,
                parent_id,
                checkpoint,
                metadata,
                new_versions,
                continues_latest=continues_latest,
            )
            commit = self._commit(checkpoint, new_versions)
        except BaseException:
            self._parking.put_failed(key)
            raise
        parked = self._parking.begin_put(key)
        stored = False
        note = plain_note = f"checkpoint {_named(thread_id)} {ns} {checkpoint_id}"
        if commit is not None:
            note = commit["note"] or f"commit {commit['id']}"

        def transaction(root: Any) -> None:
            apply(parked, layout.checkpoints(root))
            if commit is not None and not effects.apply_commit(
                root, commit, key, self.effect_kinds
            ):
                # Applied before (a replay or fork of a committed cycle): the history must
                # not read as if the commit's changes were made a second time.
                root._p_jar.transaction_manager.get().description = note_text(
                    f"{plain_note} (commit {commit['id']} applied before: nothing of it now)"
                )

        # Known as this process's before it is stored: another of its runs may read it as the
        # latest the moment it commits. An id whose put then fails is never anyone's newest.
        _own(self.image).set(checkpoint_id)
        try:
            self._write_root(transaction, note)
            stored = True
        finally:
            self._parking.end_put(key, stored=stored)
        if continues_latest:
            # The run's next put continues this one: held to the same check, whether its
            # config carries the mark (a run from the latest) or not (one that started the
            # thread: LangGraph keeps the config it was given when a thread has no checkpoint).
            # Only the newest such of a namespace: a later fork from an older one is no
            # continuation of a run.
            self._guarded.set((thread_id, ns), checkpoint_id)
        return _config(thread_id, ns, checkpoint_id)

    def stored_here(self, checkpoint_id: str) -> bool:
        """Whether this process stored the checkpoint ``checkpoint_id`` (one of its newest)."""
        return checkpoint_id in _own(self.image)

    def _commit(
        self, checkpoint: Checkpoint, new_versions: ChannelVersions
    ) -> dict[str, Any] | None:
        """The commit this put must apply with its checkpoint (``store.checkpoint.effects``), if
        any: a value of the commit channel written since the checkpoint this put continues."""
        if effects.COMMIT_CHANNEL not in new_versions:
            return None
        value = checkpoint["channel_values"].get(effects.COMMIT_CHANNEL)
        return effects.check(value, self.effect_kinds) if value else None

    def _put_transaction(
        self,
        config: RunnableConfig,
        thread_id: str,
        ns: str,
        parent_id: str | None,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
        *,
        continues_latest: bool = False,
    ) -> Callable[[builtins.list[TaskWrites], CheckpointTree], None]:
        """Serialize everything a put stores, before its transaction begins; returns the
        function the transaction runs."""
        checkpoint_id = checkpoint["id"]
        body: dict[str, Any] = dict(checkpoint)
        values = body.pop("channel_values")
        # a channel in new_versions without a value was emptied at that version
        new_values = {
            channel: self._dumps(values[channel], f"channel {channel!r} of thread {thread_id!r}")
            for channel in new_versions
            if channel in values
        }
        versions = {
            channel: str(version) for channel, version in checkpoint["channel_versions"].items()
        }
        inherited = [channel for channel in versions if channel not in new_versions]
        full_metadata = get_checkpoint_metadata(config, metadata)
        if not full_metadata.get("run_id") and config.get("run_id"):
            # as the LangGraph server does, so delete_for_runs finds plain invoke() runs too
            full_metadata["run_id"] = str(config["run_id"])
        writer = writers.this_process()
        if writer is not None:  # whether it is gone can then be told (a busy thread's check)
            full_metadata = {**full_metadata, writers.WRITER_KEY: writer}  # type: ignore[misc]
        body_typed = self._dumps(body, f"checkpoint {checkpoint_id!r}")
        metadata_typed = self._dumps(full_metadata, f"metadata of checkpoint {checkpoint_id!r}")
        run_id = full_metadata.get("run_id")
        run_id = str(run_id) if run_id else None
        size = (
            len(body_typed[1])
            + len(metadata_typed[1])
            + sum(len(typed[1]) for typed in new_values.values())
        )
        blob_threshold = self._blob_threshold
        own = _own(self.image)

        def apply(parked: list[TaskWrites], tree: CheckpointTree) -> None:
            thread = tree.threads.get(thread_id)
            index = thread.namespaces.get(ns) if thread is not None else None
            parent = None
            if parent_id is not None:
                parent = index.get(parent_id) if index is not None else None
                if parent is None:
                    raise self._no_parent(thread_id, ns, parent_id, checkpoint_id)
            if continues_latest and index:
                # Two puts into one namespace write its index, so one of two at once conflicts
                # and runs this again on fresh state: the check sees the other.
                newest = index.maxKey()
                if newest not in (parent_id, checkpoint_id) and newest not in own:
                    raise self._moved_on(thread_id, ns, parent_id, newest)
            if index is None:
                index = tree.thread(thread_id, create=True).namespace(ns, create=True)
            stored: dict[str, Any] = {}
            for channel in inherited:
                value = _inherited(index, parent, channel, versions[channel])
                if value is not None:
                    stored[channel] = value
            for channel, typed in new_values.items():
                stored[channel] = encode(typed, blob_threshold=blob_threshold)
            existing = index.get(checkpoint_id)
            writes = dict(existing.writes) if existing is not None else {}
            for task_writes in parked:
                add_writes(writes, task_writes, partial(encode, blob_threshold=blob_threshold))
            index[checkpoint_id] = CheckpointRecord(
                body_typed,
                metadata_typed,
                checkpoint_id=checkpoint_id,
                parent_id=parent_id,
                run_id=run_id,
                versions=versions,
                values=stored,
                writes=writes,
                size=size,
            )
            if run_id:
                tree.index_run(run_id, (thread_id, ns, checkpoint_id))

        return apply

    def _moved_on(
        self, thread_id: str, ns: str, parent_id: str | None, newest: str
    ) -> ThreadMovedOn:
        where = f"thread {thread_id!r}" + (f" (namespace {ns!r})" if ns else "")
        continued = f"continues checkpoint {parent_id!r}" if parent_id else "found it empty"
        return ThreadMovedOn(
            f"{where} moved on while this run was in progress: this run {continued}, and "
            f"another run (another process sharing {shown_uri(self.image.uri)}, or a client "
            f"of the same thread) has since stored {newest!r}; nothing of this step was stored",
            hint="send the request again when the other run is done (it continues from the "
            "thread's latest state), or use a thread of its own for each request made at the "
            "same time; to branch from an earlier checkpoint on purpose, pass its "
            "checkpoint_id alone (from 'batos threads THREAD_ID' or get_state_history)",
        )

    def _no_parent(
        self, thread_id: str, ns: str, parent_id: str, checkpoint_id: str
    ) -> CheckpointNotFound:
        # A put's config names the checkpoint it continues from. LangGraph sends one it
        # could not find too (get_tuple returns None for an unknown id, as it must), which
        # would store a history hanging from nothing. The parent must be in the same thread
        # and namespace: LangGraph's own puts always continue a checkpoint of their namespace
        # (a subgraph starts its namespace with no parent), and so does every put in the
        # conformance suite.
        return CheckpointNotFound(
            f"cannot store checkpoint {checkpoint_id!r}: the checkpoint it continues, "
            f"{parent_id!r}, is not in thread {thread_id!r} (namespace {ns or '(root)'!r}) "
            f"of {shown_uri(self.image.uri)}; nothing was written",
            hint="pass a checkpoint_id listed by 'batos threads THREAD_ID' or "
            "graph.get_state_history(config), or leave it out to continue from the latest",
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes against a checkpoint, in one transaction.

        If the checkpoint is not stored yet (LangGraph saves checkpoints in the background and
        may send a step's writes first), the writes wait in memory and are stored by the
        checkpoint's own put, in its transaction; if that put fails, they are dropped.
        Until then they are in no listing, tuple or thread summary.
        """
        thread_id = _thread_id(config)
        ns = _checkpoint_ns(config)
        checkpoint_id = _checkpoint_id(config, required=True)
        assert checkpoint_id is not None
        if task_id == NULL_TASK_ID:
            # A run's Command(update=...): a client's values, stored before any node or
            # reducer sees them, and applied again by every later read of the thread. One
            # its channel's check refuses (it raises) is never stored.
            for channel, value in writes:
                check = self.write_checks.get(channel)
                if check is not None:
                    check(value)
        task_writes: TaskWrites = (
            task_id,
            task_path,
            [
                (
                    WRITES_IDX_MAP.get(channel, idx),
                    channel,
                    self._dumps(value, f"write to channel {channel!r} by task {task_id!r}"),
                )
                for idx, (channel, value) in enumerate(writes)
            ],
        )
        key = (thread_id, ns, checkpoint_id)

        def apply(tree: CheckpointTree) -> bool:
            thread = tree.threads.get(thread_id)
            index = thread.namespaces.get(ns) if thread is not None else None
            record = index.get(checkpoint_id) if index is not None else None
            if record is None:
                raise Unchanged(False)  # no empty transaction: the writes wait for their put
            writes = dict(record.writes)
            encoder = partial(encode, blob_threshold=self._blob_threshold)
            if not add_writes(writes, task_writes, encoder):
                raise Unchanged(True)  # a retried task's writes, stored already
            record.writes = writes
            return True

        note = f"writes {_named(thread_id)} {ns} {checkpoint_id} {task_id}"
        while True:
            generation = self._parking.settle(key)
            if generation is None:
                log.debug("dropped writes of task %s: the put of %s failed", task_id, key)
                return
            if self._write(apply, note) or self._parking.park(key, task_writes, generation):
                return

    # -- deleting and copying ---------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints, values and writes in every namespace."""
        thread_id = _thread_id({"configurable": {"thread_id": thread_id}})
        self._parking.drop_thread(thread_id)
        self._write(
            lambda tree: tree.delete_thread(thread_id), f"delete thread {_named(thread_id)}"
        )

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete every checkpoint (and its writes) written by the given runs, in any thread."""
        run_ids = [str(run_id) for run_id in run_ids]
        if run_ids:
            self._write(
                lambda tree: tree.delete_runs(run_ids), f"delete runs {', '.join(run_ids)[:200]}"
            )

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and write of one thread to another, in one transaction.

        Stored values are immutable, so the copy shares them with the source.
        """
        source = _thread_id({"configurable": {"thread_id": source_thread_id}})
        target = _thread_id({"configurable": {"thread_id": target_thread_id}})

        def retag(metadata: Typed) -> Typed:
            decoded = self.serde.loads_typed(metadata)
            if "thread_id" not in decoded:
                return metadata
            decoded["thread_id"] = target
            return self.serde.dumps_typed(decoded)

        if source != target:
            self._write(
                lambda tree: tree.copy_thread(source, target, retag),
                f"copy thread {_named(source)} to {_named(target)}",
            )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest`` keeps each namespace's newest checkpoint; ``delete`` drops all.

        Caveat: like LangGraph's own savers, ``keep_latest`` does not walk back to a
        ``DeltaChannel`` snapshot; do not prune threads of graphs that use the beta
        ``DeltaChannel``.
        """
        if strategy == "keep_latest":
            self.trim(thread_ids, keep=1)
        elif strategy in DELETE_STRATEGIES:
            for thread_id in thread_ids:
                self.delete_thread(thread_id)
        else:
            raise CheckpointError(
                f"unknown prune strategy {strategy!r}",
                hint="use 'keep_latest' or 'delete'",
            )

    def trim(self, thread_ids: Sequence[str] | None, *, keep: int) -> int:
        """Keep the newest ``keep`` checkpoints per namespace of each thread (all threads when
        ``thread_ids`` is None); returns how many checkpoints were deleted."""
        if keep < 1:
            raise CheckpointError(
                f"keep must be at least 1, got {keep}",
                hint="to drop a whole thread use delete_thread (or prune strategy 'delete')",
            )
        ids = None if thread_ids is None else [str(t) for t in thread_ids]
        return self._write(lambda tree: tree.trim(ids, keep), f"prune keep {keep}")

    # -- inspection -------------------------------------------------------------------------

    def threads(self) -> builtins.list[ThreadSummary]:
        """One summary per thread, in thread id order."""
        with self._reading() as tree:
            return [
                thread.summary(thread_id)
                for thread_id, thread in tree.threads.items()
                if thread.namespaces
            ]

    def recent_threads(self, limit: int) -> builtins.list[str]:
        """The ids of the ``limit`` threads with the newest checkpoints, newest first.

        Checkpoint ids are uuid6, ordered by time, and a namespace keeps its newest id in its
        small bucket: this reads a thread record, its namespaces and the root one's bucket per
        thread, never a checkpoint, so it stays cheap with thousands of threads (``threads()``
        reads every checkpoint to sum sizes). A thread with no root checkpoint is left out.
        """
        with self._reading() as tree:
            newest = (
                (root.maxKey(), thread_id)
                for thread_id, thread in tree.threads.items()
                if (root := thread.namespace("")) is not None and root
            )
            return [thread_id for _, thread_id in heapq.nlargest(limit, newest)]

    def thread_summary(self, thread_id: str) -> ThreadSummary:
        with self._reading() as tree:
            thread = tree.threads.get(thread_id)
            if thread is None or not thread.namespaces:
                raise CheckpointNotFound(
                    f"no thread {repr(thread_id)[:80]} in {shown_uri(self.image.uri)}",
                    hint="list the threads with 'batos threads'",
                )
            return thread.summary(thread_id)

    # -- async: the same work on an executor thread, off the event loop ---------------------

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, partial(fn, *args, **kwargs))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._run(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await self._run(
            self._list, config, self._tuple, filter=filter, before=before, limit=limit
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._run(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._run(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._run(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._run(self.delete_for_runs, list(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._run(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._run(self.prune, list(thread_ids), strategy=strategy)

    def get_next_version(self, current: str | int | None, channel: None = None) -> str:
        """Zero-padded counter plus a random tie-breaker, like LangGraph's own savers."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"
