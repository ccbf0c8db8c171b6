"""The in-memory BM25 scorer behind lexical search: the image's postings, held as numpy arrays.

zope.index's OkapiIndex keeps the postings (word → {chunk id: count}) and chunk lengths in the
image. Scoring through its ``search()`` merges one BTree bucket per posting in Python-visible
structures — about 100 ms for a few common words at 100k chunks. This cache holds, for each
word a query has used, its chunks' rows and counts as arrays and scores a query with a handful
of vector operations over a dense accumulator, using the same Okapi BM25 formula and
parameters. Like the vector matrix it is volatile: loaded from the image when a process first
searches, then kept in step by the catalog with the same changes.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from store.knowledge.vectors import top_k

#: Once dead rows outnumber live ones (and are at least this many), the cache is dropped and
#: reloaded on the next search rather than carried around.
COMPACT_AFTER = 4096
#: Each cached word keeps where its this many best scores are, best first: the query's k-th
#: best total among these rows (the allowed ones) bounds its k-th best total from below.
TOP_SCORES = 256


class LexicalIndex:
    """Rows of chunks (append-only; removal marks a row dead) and per-word posting arrays.

    ``index`` arguments are the catalog's ``OkapiIndex``; its ``_wordinfo`` (word id →
    {chunk id: count}) and ``_docweight`` (chunk id → length in words) are read directly
    because zope.index has no bulk API for them. Thread-safe: one lock.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.clear()

    def clear(self) -> None:
        with self._lock:
            self._ids = np.zeros(0, dtype=np.int64)  # row → chunk id; -1 once dead
            self._lengths = np.zeros(0, dtype=np.float32)
            self._alive = np.zeros(0, dtype=bool)
            self._size = 0
            self._live = 0
            self._total_length = 0.0
            self._order: np.ndarray | None = None  # argsort of _ids[:size], built on demand
            self._ordered = self._ids  # _ids[:size] sorted, with _order
            self._last_mask: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
            # word id → (rows, counts) of the words queries have used
            self._postings: dict[int, tuple[np.ndarray, np.ndarray]] = {}
            # word id → (live rows, idf · tf, positions of its best scores in decreasing order
            # of score): dropped by any change to the rows
            self._scored: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
            #: The catalog's change counter this cache reflects (None: never loaded).
            self.version: int | None = None

    def __len__(self) -> int:
        return self._live

    @property
    def stale(self) -> bool:
        """Whether so many rows are dead that a reload is cheaper than keeping them."""
        dead = self._size - self._live
        return dead >= COMPACT_AFTER and dead > self._live

    def ids(self) -> np.ndarray:
        """The live chunk ids, sorted."""
        with self._lock:
            ids = self._ids[: self._size]
            return np.sort(ids[self._alive[: self._size]])

    def load(self, index: Any) -> None:
        """Start over from the index's chunk lengths; postings load per word on first use."""
        weights = index._docweight
        count = len(weights)
        with self._lock:
            self.clear()
            self._ids = np.fromiter(weights.keys(), dtype=np.int64, count=count)
            self._lengths = np.fromiter(weights.values(), dtype=np.float32, count=count)
            self._alive = np.ones(count, dtype=bool)
            self._size = self._live = count
            self._total_length = float(self._lengths.sum(dtype=np.float64))

    def add(self, index: Any, chunk_ids: Iterable[int]) -> None:
        """Take in chunks the index holds now (ones it lacks, or this cache has, are skipped)."""
        wanted = np.unique(np.fromiter((int(c) for c in chunk_ids), dtype=np.int64))
        with self._lock:
            _, known = self._rows_of(wanted)
            extra: dict[int, list[tuple[int, int]]] = {}
            for chunk_id in wanted[~known].tolist():
                length = index._docweight.get(chunk_id)
                if length is None:
                    continue
                row = self._append(chunk_id, length)
                for wid, count in Counter(index.get_words(chunk_id)).items():
                    if wid in self._postings:  # words not loaded yet will read the index
                        extra.setdefault(wid, []).append((row, count))
            for wid, pairs in extra.items():
                rows, counts = self._postings[wid]
                added = np.array(pairs, dtype=np.int64)
                self._postings[wid] = (
                    np.concatenate([rows, added[:, 0].astype(np.int32)]),
                    np.concatenate([counts, added[:, 1].astype(np.float32)]),
                )

    def remove(self, chunk_ids: Iterable[int]) -> None:
        wanted = np.fromiter((int(c) for c in chunk_ids), dtype=np.int64)
        with self._lock:
            rows, _ = self._rows_of(np.unique(wanted))
            rows = rows[self._alive[rows]]
            self._alive[rows] = False
            self._ids[rows] = -1  # a chunk id may come back (a restore) under a new row
            self._changed()
            self._live -= len(rows)
            self._total_length -= float(self._lengths[rows].sum(dtype=np.float64))

    def mask(self, allowed: np.ndarray) -> np.ndarray:
        """A boolean array over rows: live rows whose chunk id is in ``allowed`` (the answer
        for the last ``allowed`` array is kept until the rows change)."""
        with self._lock:
            order, _ = self._sorted()
            last = self._last_mask
            if last is not None and last[0] is allowed and last[1] is order:
                return last[2]
            out = np.zeros(self._size, dtype=bool)
            out[self._rows_of(allowed)[0]] = True
            self._last_mask = (allowed, order, out)
            return out

    def search(
        self,
        index: Any,
        wids: Sequence[int],
        k: int,
        allowed: np.ndarray | None = None,
        *,
        version: int | None = None,
    ) -> list[tuple[int, float]]:
        """The ``k`` best (chunk id, BM25 score) pairs for the query's word ids, best first.

        Okapi BM25 exactly as zope.index's OkapiIndex computes it: idf = ln(1 + N/df),
        tf = f·(k1+1) / (f + k1·(1 − b + b·len/avglen)), summed over query words (a word
        the query repeats counts that many times). ``version`` is the catalog version
        ``index`` shows: postings read at another version than this cache's are used for
        this query but not kept (another thread may have moved the cache meanwhile).
        """
        with self._lock:
            if not self._live:
                return []
            keep = version == self.version
            inside = self.mask(allowed) if allowed is not None else None
            parts = []
            leaders = []  # each word's best rows (among the allowed ones)
            for wid, repeats in Counter(wids).items():
                rows, weights, best = self._weights(index, wid, keep=keep)
                if not len(rows):
                    continue
                parts.append((rows, weights * repeats if repeats > 1 else weights))
                if inside is not None:
                    best = best[inside[rows[best]]]
                leaders.append(rows[best])
            if not parts:
                return []
            return self._best(parts, k, allowed, leaders)

    def _best(
        self,
        parts: list[tuple[np.ndarray, np.ndarray]],
        k: int,
        allowed: np.ndarray | None,
        leaders: list[np.ndarray] | None = None,
    ) -> list[tuple[int, float]]:
        """Sum the words' scores per row and keep the ``k`` best rows as (chunk id, score).

        ``leaders`` holds each word's best-scoring (allowed) rows: the k-th best total among
        them is a score k rows reach, so no row below it can be among the k best, and one
        comparison over the rows replaces a partition of all of them.
        """
        total = sum(len(rows) for rows, _ in parts)
        if total * 8 < self._size:  # rare words: sort the few matches rather than scan all rows
            rows, inverse = np.unique(np.concatenate([r for r, _ in parts]), return_inverse=True)
            scores = np.bincount(inverse, weights=np.concatenate([w for _, w in parts]))
            if allowed is not None:
                inside = self.mask(allowed)[rows]
                rows, scores = rows[inside], scores[inside]
            return top_k(self._ids[rows], scores, k)
        dense = np.zeros(self._size, dtype=np.float32)
        for rows, weights in parts:
            np.add.at(dense, rows, weights)  # twice as fast as dense[rows] += weights here
        if allowed is not None:
            dense *= self.mask(allowed)
        candidates = np.sort(np.concatenate(leaders)) if leaders else np.zeros(0, np.intp)
        # Each row once (np.unique hashes, which costs more than this sort of a few hundred).
        if len(candidates):
            candidates = candidates[np.concatenate(([True], candidates[1:] != candidates[:-1]))]
        if len(candidates) >= k:
            reached = dense[candidates]
            bound = np.partition(reached, len(reached) - k)[len(reached) - k]
            if bound > 0:
                rows = np.flatnonzero(dense >= bound)
                return top_k(self._ids[rows], dense[rows], k)
        if k < len(dense):
            # Only the k best can be returned: select them without listing every match.
            rows = np.argpartition(dense, len(dense) - k)[-k:]
        else:
            rows = np.arange(len(dense))
        rows = rows[dense[rows] > 0]
        return top_k(self._ids[rows], dense[rows], k)

    # -- internals -------------------------------------------------------------------

    def _weights(
        self, index: Any, wid: int, *, keep: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(live rows, idf · tf, the positions of its TOP_SCORES best scores, best first) of one
        word; kept until the next change to the rows, since the common words that cost most to
        score are also the ones queries repeat."""
        cached = self._scored.get(wid)
        if cached is not None:
            return cached
        rows, counts = self._term(index, wid, keep=keep)
        rows = rows.astype(np.intp)  # stored as int32; numpy would convert on every use
        if self._live < self._size:
            live = self._alive[rows]
            rows, counts = rows[live], counts[live]
        if not len(rows):
            return rows, counts, np.zeros(0, dtype=np.intp)
        k1, b = float(index.K1), float(index.B)
        average = self._total_length / self._live
        idf = math.log(1.0 + self._live / len(rows))
        norm = (1.0 - b) + b * (self._lengths[rows] / average)
        weights = (idf * (counts * (k1 + 1.0) / (counts + k1 * norm))).astype(np.float32)
        if len(weights) > TOP_SCORES:
            top = np.argpartition(weights, len(weights) - TOP_SCORES)[-TOP_SCORES:]
            best = top[np.argsort(-weights[top], kind="stable")]
        else:
            best = np.argsort(-weights, kind="stable")
        if keep:
            self._scored[wid] = (rows, weights, best)
        return rows, weights, best

    def _term(self, index: Any, wid: int, *, keep: bool) -> tuple[np.ndarray, np.ndarray]:
        """(rows, counts) of one word, loaded from the index on first use."""
        cached = self._postings.get(wid)
        if cached is None:
            postings = index._wordinfo.get(wid)
            if postings is None:
                return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
            n = len(postings)
            ids = np.fromiter(postings.keys(), dtype=np.int64, count=n)
            counts = np.fromiter(postings.values(), dtype=np.float32, count=n)
            rows, found = self._rows_of(ids)
            cached = (rows.astype(np.int32), counts[found])
            if keep:
                self._postings[wid] = cached
        return cached

    def _rows_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the live chunks among ``ids``, and which of ``ids`` were found."""
        order, ordered = self._sorted()
        ids = np.asarray(ids, dtype=np.int64)
        at = np.searchsorted(ordered, ids)
        found = at < len(ordered)
        found[found] = ordered[at[found]] == ids[found]
        return order[at[found]], found

    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """(argsort of the row ids, the ids in that order), rebuilt after a change."""
        if self._order is None:
            self._order = np.argsort(self._ids[: self._size], kind="stable")
            self._ordered = self._ids[: self._size][self._order]
        return self._order, self._ordered

    def _append(self, chunk_id: int, length: int) -> int:
        if self._size == len(self._ids):
            capacity = max(64, int(self._size * 1.5))
            self._ids = _grown(self._ids, capacity)
            self._lengths = _grown(self._lengths, capacity)
            self._alive = _grown(self._alive, capacity)
        row = self._size
        self._ids[row] = chunk_id
        self._lengths[row] = length
        self._alive[row] = True
        self._size += 1
        self._live += 1
        self._total_length += float(length)
        self._changed()
        return row

    def _changed(self) -> None:
        self._order = None
        self._scored.clear()


def _grown(array: np.ndarray, capacity: int) -> np.ndarray:
    out = np.zeros(capacity, dtype=array.dtype)
    out[: len(array)] = array
    return out
