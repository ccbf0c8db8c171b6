"""The in-memory embedding matrix behind dense search, and the rank fusion that merges rankings.

The matrix is a volatile cache: the image keeps every vector as float32 bytes, and this index is
rebuilt from them when a process first searches, then kept in step incrementally. Its
half-precision copy needs torch, whose import takes seconds: the first searches of a process
score in float32 with numpy while a background thread imports torch and makes the copy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy as np

from store.knowledge.embeddings import DIMS, torch_threads

#: The constant of reciprocal-rank fusion (Cormack et al. 2009): damps the weight of the very
#: top ranks so that one list cannot dominate.
RRF_K = 60
#: Bound on |half-precision cosine − float32 cosine| for unit vectors. Rounding query and row
#: to float16 (relative error 2⁻¹¹ each) moves a cosine by at most 2·2⁻¹¹·Σ|qᵢmᵢ| ≤ 9.8e-4,
#: rounding the result to float16 by at most 4.9e-4 more (torch accumulates in float32);
#: measured 3e-4 on all-MiniLM vectors. Twice the bound, for safety.
HALF_ERROR = 3e-3
#: Threads for the half-precision pass: one sequential read of the matrix is memory-bound,
#: and on a shared machine a second thread waited on more than it helped (12 ms against 20 ms
#: at 100k rows).
SEARCH_THREADS = 1


class VectorIndex:
    """Unit vectors by integer id in one dense matrix; exact cosine top-k.

    A search reads a float16 copy of the matrix (half the memory traffic of float32, which is
    what a pass over 100k rows costs), keeps every row that could be in the top k given the
    float16 error bound, and ranks those by exact float32 cosine — the same result as a
    float32 pass, at half the cost, for 1.5x the memory. Until that copy exists (``warm``), a
    search is one exact float32 pass. Deleting moves the last row into the hole, so the
    matrix stays dense. Thread-safe: searches and updates take one lock.
    """

    def __init__(self, dims: int = DIMS) -> None:
        self.dims = dims
        self._lock = threading.RLock()
        self.clear()

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
            # The half-precision copy, once warm() has run (it then outlives a clear).
            self._warm: bool = getattr(self, "_warm", False)
            self._half = np.zeros((0, self.dims), dtype=np.float16) if self._warm else None
            self._ids = np.zeros(0, dtype=np.int64)
            self._rows: dict[int, int] = {}
            self._size = 0
            self._order: np.ndarray | None = None  # argsort of the live ids, built on demand
            self._ordered = self._ids  # the live ids sorted, with _order
            self._last_rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
            self._warming: threading.Thread | None = getattr(self, "_warming", None)
            #: The catalog's change counter this cache reflects (None: never synchronised).
            self.version: int | None = None

    def load(self, ids: np.ndarray, matrix: np.ndarray) -> None:
        """Replace every row at once (a rebuild): ``matrix`` is (len(ids), dims)."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) != len(matrix):
            raise ValueError(f"{len(ids)} ids but {len(matrix)} vectors")
        rows = dict(zip(ids.tolist(), range(len(ids)), strict=True))
        if len(rows) != len(ids):
            raise ValueError("an id appears twice in one load")
        with self._lock:
            version = self.version
            self.clear()
            self.version = version
            self._matrix = np.ascontiguousarray(matrix, dtype=np.float32)
            if self._warm:
                self._half = self._matrix.astype(np.float16)
            self._ids = ids.copy()
            self._rows = rows
            self._size = len(ids)
            self._ordered = self._ids

    def warm(self) -> None:
        """Import torch and make the half-precision copy; searches use it from then on."""
        import torch  # noqa: F401  (seconds: why this runs off the first search's path)

        with self._lock:
            if self._half is None:
                self._half = self._matrix.astype(np.float16)
            self._warm = True

    def _warm_later(self) -> None:
        if self._warming is None:
            self._warming = threading.Thread(target=self.warm, name="vectors-warm", daemon=True)
            self._warming.start()

    def add(self, ids: Sequence[int], vectors: np.ndarray) -> None:
        """Insert or overwrite rows; ``vectors`` is (len(ids), dims)."""
        if len(ids) != len(vectors):
            raise ValueError(f"{len(ids)} ids but {len(vectors)} vectors")
        keys = [int(i) for i in ids]
        if len(set(keys)) != len(keys):
            raise ValueError("an id appears twice in one add")
        with self._lock:
            self.reserve(self._size + len(keys))
            self._order = None
            rows = np.fromiter((self._rows.get(i, -1) for i in keys), np.int64, len(keys))
            new = np.flatnonzero(rows < 0)
            rows[new] = np.arange(self._size, self._size + len(new))
            self._rows.update(zip([keys[i] for i in new], rows[new].tolist(), strict=True))
            self._ids[rows[new]] = [keys[i] for i in new]
            self._size += len(new)
            self._matrix[rows] = vectors
            if self._half is not None:
                self._half[rows] = vectors

    def remove(self, ids: Iterable[int]) -> None:
        with self._lock:
            self._order = None
            for chunk_id in ids:
                row = self._rows.pop(int(chunk_id), None)
                if row is None:
                    continue
                last = self._size - 1
                if row != last:
                    moved = int(self._ids[last])
                    self._matrix[row] = self._matrix[last]
                    if self._half is not None:
                        self._half[row] = self._half[last]
                    self._ids[row] = moved
                    self._rows[moved] = row
                self._size = last

    def vector(self, chunk_id: int) -> np.ndarray | None:
        with self._lock:
            row = self._rows.get(int(chunk_id))
            return None if row is None else self._matrix[row].copy()

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | Iterable[int] | None = None
    ) -> list[tuple[int, float]]:
        """The ``k`` ids most similar to ``query`` (a unit vector), best first, with cosines.

        ``allowed`` restricts the result to those ids (fastest as a sorted int64 array).
        """
        if allowed is not None and not isinstance(allowed, np.ndarray):
            allowed = np.fromiter((int(i) for i in allowed), dtype=np.int64)
        query = np.asarray(query, dtype=np.float32)
        with self._lock:
            size = self._size
            if k <= 0 or not size:
                return []
            rows = None if allowed is None else self._rows_of(allowed)
            count = size if rows is None else len(rows)
            if count > 4 * k and (rows is None or len(rows) * 4 >= size) and self._half is None:
                self._warm_later()
                exact = self._matrix[:size] @ query
                if rows is None:
                    return top_k(self._ids[:size], exact, k)
                return top_k(self._ids[rows], exact[rows], k)
            if count > 4 * k and (rows is None or len(rows) * 4 >= size):
                # One half-precision pass keeps only the rows that may be in the top k.
                approx = self._half_scores(query, size)
                if rows is not None:
                    approx = approx[rows]
                kth = np.partition(approx, len(approx) - k)[len(approx) - k]
                near = np.flatnonzero(approx >= kth - 2 * HALF_ERROR)
                rows = near if rows is None else rows[near]
            elif rows is None:
                rows = np.arange(size)
            # else: few allowed rows, cheaper to gather and score exactly than to pass over all
            ids = self._ids[rows]
            scores = self._matrix[rows] @ query
        return top_k(ids, scores, k)

    def _half_scores(self, query: np.ndarray, size: int) -> np.ndarray:
        """Every row's cosine with ``query`` in half precision (within HALF_ERROR)."""
        import torch

        assert self._half is not None  # search() checked
        with torch_threads(SEARCH_THREADS), torch.inference_mode():
            matrix = torch.from_numpy(self._half[:size])
            scores = matrix @ torch.from_numpy(query.astype(np.float16))
        return scores.numpy().astype(np.float32)

    def _rows_of(self, ids: np.ndarray) -> np.ndarray:
        """Rows holding any of ``ids``, found by binary search in a sorted copy of the ids.
        The answer for the last ``ids`` array is kept until the rows change."""
        if self._order is None:
            self._order = np.argsort(self._ids[: self._size], kind="stable")
            self._ordered = self._ids[: self._size][self._order]
        last = self._last_rows
        if last is not None and last[0] is ids and last[1] is self._order:
            return last[2]
        ordered = self._ordered
        at = np.searchsorted(ordered, ids)
        found = at < len(ordered)
        found[found] = ordered[at[found]] == ids[found]
        rows = self._order[at[found]]
        self._last_rows = (ids, self._order, rows)
        return rows

    def reserve(self, n: int) -> None:
        """Make room for ``n`` rows at once (a rebuild knows how many are coming)."""
        if n <= len(self._matrix):
            return
        capacity = max(n, int(len(self._matrix) * 1.5) + 64)
        matrix = np.zeros((capacity, self.dims), dtype=np.float32)
        matrix[: self._size] = self._matrix[: self._size]
        half = None
        if self._half is not None:
            half = np.zeros((capacity, self.dims), dtype=np.float16)
            half[: self._size] = self._half[: self._size]
        ids = np.zeros(capacity, dtype=np.int64)
        ids[: self._size] = self._ids[: self._size]
        self._matrix, self._half, self._ids = matrix, half, ids


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
