"""The in-memory embedding matrix behind dense search, and the rank fusion that merges rankings.

The matrix is a volatile cache: the image keeps every vector as float32 bytes, and this index is
rebuilt from them when a process first searches, then kept in step incrementally.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np

from store.embeddings import DIMS

#: The constant of reciprocal-rank fusion (Cormack et al. 2009): damps the weight of the very
#: top ranks so that one list cannot dominate.
RRF_K = 60


class VectorIndex:
    """Unit vectors by integer id in one dense float32 matrix; exact cosine top-k.

    Deleting moves the last row into the hole, so the matrix stays dense and a search is a
    single matrix-vector product. Thread-safe: searches and updates take one lock.
    """

    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims
        self._matrix = np.zeros((0, dims), dtype=np.float32)
        self._ids = np.zeros(0, dtype=np.int64)
        self._rows: dict[int, int] = {}
        self._size = 0
        self._lock = threading.RLock()
        #: The catalog's change counter this cache reflects (None: never synchronised).
        self.version: int | None = None

    def __len__(self) -> int:
        return self._size

    def __contains__(self, chunk_id: int) -> bool:
        return chunk_id in self._rows

    def ids(self) -> np.ndarray:
        with self._lock:
            return self._ids[: self._size].copy()

    def clear(self) -> None:
        with self._lock:
            self._matrix = np.zeros((0, self.dims), dtype=np.float32)
            self._ids = np.zeros(0, dtype=np.int64)
            self._rows.clear()
            self._size = 0
            self.version = None

    def add(self, ids: Sequence[int], vectors: np.ndarray) -> None:
        """Insert or overwrite rows; ``vectors`` is (len(ids), dims)."""
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but {len(vectors)} vectors")
        with self._lock:
            self._reserve(self._size + len(ids))
            for chunk_id, vector in zip(ids, vectors, strict=True):
                row = self._rows.get(int(chunk_id))
                if row is None:
                    row = self._size
                    self._size += 1
                    self._rows[int(chunk_id)] = row
                    self._ids[row] = chunk_id
                self._matrix[row] = vector

    def remove(self, ids: Iterable[int]) -> None:
        with self._lock:
            for chunk_id in ids:
                row = self._rows.pop(int(chunk_id), None)
                if row is None:
                    continue
                last = self._size - 1
                if row != last:
                    moved = int(self._ids[last])
                    self._matrix[row] = self._matrix[last]
                    self._ids[row] = moved
                    self._rows[moved] = row
                self._size = last

    def vector(self, chunk_id: int) -> np.ndarray | None:
        with self._lock:
            row = self._rows.get(int(chunk_id))
            return None if row is None else self._matrix[row].copy()

    def search(
        self, query: np.ndarray, k: int, allowed: Iterable[int] | None = None
    ) -> list[tuple[int, float]]:
        """The ``k`` ids most similar to ``query`` (a unit vector), best first, with cosines."""
        with self._lock:
            if allowed is None:
                ids = self._ids[: self._size]
                scores = self._matrix[: self._size] @ query
            else:
                rows = np.fromiter(
                    (r for r in map(self._rows.get, allowed) if r is not None), dtype=np.int64
                )
                ids = self._ids[rows]
                scores = self._matrix[rows] @ query
        return top_k(ids, scores, k)

    def _reserve(self, n: int) -> None:
        if n <= len(self._matrix):
            return
        capacity = max(n, int(len(self._matrix) * 1.5) + 64)
        matrix = np.zeros((capacity, self.dims), dtype=np.float32)
        matrix[: self._size] = self._matrix[: self._size]
        ids = np.zeros(capacity, dtype=np.int64)
        ids[: self._size] = self._ids[: self._size]
        self._matrix, self._ids = matrix, ids


def top_k(ids: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` highest-scoring (id, score) pairs, best first (ties by smaller id)."""
    if k <= 0 or len(ids) == 0:
        return []
    if len(ids) > k:
        part = np.argpartition(-scores, k - 1)[:k]
        ids, scores = ids[part], scores[part]
    order = np.lexsort((ids, -scores))
    return [(int(ids[i]), float(scores[i])) for i in order]


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]], k: int, constant: int = RRF_K
) -> list[tuple[int, float]]:
    """Merge ranked id lists: each id scores the sum of 1/(constant + rank) over the lists."""
    fused: dict[int, float] = {}
    for ranking in rankings:
        for rank, chunk_id in enumerate(ranking, start=1):
            fused[chunk_id] = fused.get(chunk_id, 0.0) + 1.0 / (constant + rank)
    ordered = sorted(fused.items(), key=lambda item: (-item[1], item[0]))
    return ordered[:k]
