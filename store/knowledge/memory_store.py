"""LangGraph's long-term memory (``BaseStore``) kept in the living image, next to the catalog.

Items live under the image's ``layout.MEMORY`` key: an OOBTree from namespace tuple to an OOBTree
from key to ``MemoryItem``. Semantic search embeds the indexed fields (``["$"]``, the whole value,
unless ``fields`` or a put's ``index`` say otherwise) with the catalog's all-MiniLM-L6-v2 and ranks
by cosine (max over an item's fields). A batch is one transaction — or, inside ``bound(root)``, part
of the caller's transaction, so a mind cycle's memories commit or vanish with it. The application's
runtime (``batos.shell.runtime``) makes the one every entry point uses."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np
from BTrees.OOBTree import OOBTree
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    get_text_at_path,
    tokenize_path,
)
from persistent import Persistent

from store.core import layout
from store.core.image import LivingImage
from store.core.layout import UpgradeStep
from store.core.schema import require
from store.knowledge.catalog import CATALOG_STEPS
from store.knowledge.embeddings import DIMS, Embedder, from_bytes, to_bytes

log = logging.getLogger("batos.memory")

#: The transaction a batch joins instead of opening its own (set by ``ImageStore.bound``).
_bound_root: contextvars.ContextVar[Any | None] = contextvars.ContextVar(
    "batos_memory_root", default=None
)


class MemoryItem(Persistent):
    """One stored value with its timestamps and the vectors of its indexed fields."""

    def __init__(self, value: dict[str, Any], now: float) -> None:
        self.value = value
        self.created_at = now
        self.updated_at = now
        self.vectors = b""

    def item(self, namespace: tuple[str, ...], key: str) -> Item:
        return Item(
            value=dict(self.value),
            key=key,
            namespace=namespace,
            created_at=_stamp(self.created_at),
            updated_at=_stamp(self.updated_at),
        )


def _layout_1(root: Any) -> None:
    if layout.find(root, layout.MEMORY) is None:
        root[layout.MEMORY] = OOBTree()


MEMORY_STEPS: tuple[UpgradeStep, ...] = (
    UpgradeStep(
        "memory-1",
        "LangGraph long-term memory store (namespace → key → item)",
        _layout_1,
    ),
)


class ImageStore(BaseStore):
    """A LangGraph ``BaseStore`` whose items live in the living image (sync and async)."""

    supports_ttl = False

    def __init__(
        self,
        image: LivingImage,
        *,
        embedder: Embedder | None = None,
        fields: Sequence[str] | None = None,
    ) -> None:
        require(image, (*CATALOG_STEPS, *MEMORY_STEPS), "the memory store")
        self.image = image
        self.embedder = embedder or Embedder()
        self.fields = list(fields or ["$"])

    # -- transactions ------------------------------------------------------------------

    @staticmethod
    @contextmanager
    def bound(root: Any) -> Iterator[None]:
        """Within this block, store operations read and write through ``root``'s transaction
        (the caller commits or aborts); without it each batch commits on its own."""
        token = _bound_root.set(root)
        try:
            yield
        finally:
            _bound_root.reset(token)

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        embedded = self._embed(ops)
        root = _bound_root.get()
        if root is not None:
            return self._apply(root, ops, embedded)
        if any(isinstance(op, PutOp) for op in ops):
            return self.image.transact(
                lambda root: self._apply(root, ops, embedded), note="memory: store batch"
            )
        with self.image.read() as root:
            return self._apply(root, ops, embedded)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        # ZODB is synchronous; a worker thread keeps the event loop free. to_thread copies
        # the context, so a ``bound`` transaction is seen there too.
        return await asyncio.to_thread(self.batch, list(ops))

    # -- embedding (outside the transaction: it is the slow part) ----------------------

    def _embed(self, ops: Sequence[Op]) -> dict[int, tuple[np.ndarray, ...]]:
        """{op index: query vector (search) or field vectors (put)}."""
        texts: list[str] = []
        wanted: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            if isinstance(op, SearchOp) and op.query:
                wanted[i] = [len(texts)]
                texts.append(op.query)
            elif isinstance(op, PutOp) and op.value is not None and op.index is not False:
                found = self._texts(op)
                wanted[i] = list(range(len(texts), len(texts) + len(found)))
                texts.extend(found)
        vectors = self.embedder.encode(texts) if texts else np.zeros((0, DIMS), np.float32)
        return {i: tuple(vectors[j] for j in rows) for i, rows in wanted.items()}

    def _texts(self, op: PutOp) -> list[str]:
        paths = op.index if isinstance(op.index, list) else self.fields
        texts: list[str] = []
        for path in paths:
            tokens = path if path == "$" else tokenize_path(path)
            texts.extend(t for t in get_text_at_path(op.value, tokens) if t)
        return texts

    # -- operations ------------------------------------------------------------------

    def _apply(
        self, root: Any, ops: Sequence[Op], embedded: dict[int, tuple[np.ndarray, ...]]
    ) -> list[Result]:
        tree = layout.memory(root)
        results: list[Result] = []
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                results.append(_get(tree, op.namespace, op.key))
            elif isinstance(op, PutOp):
                _put(tree, op, embedded.get(i, ()))
                results.append(None)
            elif isinstance(op, SearchOp):
                vectors = embedded.get(i)
                results.append(_search(tree, op, vectors[0] if vectors else None))
            elif isinstance(op, ListNamespacesOp):
                results.append(_list_namespaces(tree, op))
            else:
                raise ValueError(f"unknown store operation {type(op).__name__}")
        return results


def _get(tree: Any, namespace: tuple[str, ...], key: str) -> Item | None:
    items = tree.get(tuple(namespace))
    record = items.get(key) if items is not None else None
    return record.item(tuple(namespace), key) if record is not None else None


def _put(tree: Any, op: PutOp, vectors: Sequence[np.ndarray]) -> None:
    namespace = tuple(op.namespace)
    items = tree.get(namespace)
    if op.value is None:
        if items is not None and op.key in items:
            del items[op.key]
            if not items:
                del tree[namespace]
        return
    if items is None:
        items = tree[namespace] = OOBTree()
    now = time.time()
    record = items.get(op.key)
    if record is None:
        record = items[op.key] = MemoryItem(dict(op.value), now)
    else:
        record.value = dict(op.value)
        record.updated_at = now
    record.vectors = to_bytes(np.vstack(vectors)) if len(vectors) else b""


def put_item(
    root: Any,
    namespace: Sequence[str],
    key: str,
    value: dict[str, Any],
    vectors: Sequence[np.ndarray] = (),
) -> None:
    """Store one item inside the caller's transaction, with vectors the caller already has
    (a graph that computed them earlier need not embed again at commit time)."""
    tree = layout.memory(root)
    _put(tree, PutOp(tuple(namespace), key, value), vectors)


def _in_prefix(tree: Any, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    # Tuples sort element-wise, so every namespace starting with ``prefix`` follows it.
    for namespace, items in tree.items(min=prefix):
        if namespace[: len(prefix)] != prefix:
            break
        yield namespace, items


def _search(tree: Any, op: SearchOp, query: np.ndarray | None) -> list[SearchItem]:
    found: list[tuple[float | None, tuple[str, ...], str, MemoryItem]] = []
    for namespace, items in _in_prefix(tree, tuple(op.namespace_prefix)):
        for key, record in items.items():
            if op.filter and not _matches(record.value, op.filter):
                continue
            score = None
            if query is not None and record.vectors:
                score = float(np.max(from_bytes(record.vectors) @ query))
            found.append((score, namespace, key, record))
    if query is not None:
        # Scored items first, best first; items without vectors after them.
        found.sort(key=lambda f: (f[0] is None, -(f[0] or 0.0)))
    else:
        found.sort(key=lambda f: -f[3].updated_at)
    page = found[op.offset : op.offset + op.limit]
    return [
        SearchItem(
            namespace=namespace,
            key=key,
            value=dict(record.value),
            created_at=_stamp(record.created_at),
            updated_at=_stamp(record.updated_at),
            score=score,
        )
        for score, namespace, key, record in page
    ]


def _matches(value: Any, wanted: Any) -> bool:
    """LangGraph's filter language: equality, nested dicts, and $eq $ne $gt $gte $lt $lte."""
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_compare(value, op, arg) for op, arg in wanted.items())
        if not isinstance(value, dict):
            return False
        return all(_matches(value.get(k), v) for k, v in wanted.items())
    return value == wanted


def _compare(value: Any, operator: str, argument: Any) -> bool:
    if operator == "$eq":
        return value == argument
    if operator == "$ne":
        return value != argument
    if value is None:
        return False
    try:
        left, right = float(value), float(argument)
    except (TypeError, ValueError):
        return False
    comparisons = {
        "$gt": left > right,
        "$gte": left >= right,
        "$lt": left < right,
        "$lte": left <= right,
    }
    if operator not in comparisons:
        raise ValueError(f"unsupported filter operator {operator!r}; use $eq $ne $gt $gte $lt $lte")
    return comparisons[operator]


def _list_namespaces(tree: Any, op: ListNamespacesOp) -> list[tuple[str, ...]]:
    namespaces: Iterable[tuple[str, ...]] = tree.keys()
    if op.match_conditions:
        namespaces = [
            ns for ns in namespaces if all(_namespace_matches(c, ns) for c in op.match_conditions)
        ]
    if op.max_depth is not None:
        chosen = sorted({ns[: op.max_depth] for ns in namespaces})
    else:
        chosen = sorted(namespaces)
    return chosen[op.offset : op.offset + op.limit]


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    if not path:
        return True
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


def _stamp(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)
