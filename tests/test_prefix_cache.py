"""The engine's set-aside KV caches, without a model: which one comes back, and the budget."""

from __future__ import annotations

from pathlib import Path

from batos.models.engine import PrefixCache, _Stashed, common_prefix

A, B = (Path("a.gguf"),), (Path("b.gguf"),)


def _entry(adapters: tuple[Path, ...], tokens: list[int], size: int = 10) -> _Stashed:
    return _Stashed(adapters, tuple(tokens), b"x" * size)


def test_the_longest_shared_prefix_under_the_same_adapters_comes_back() -> None:
    cache = PrefixCache()
    cache.put(_entry(A, [1, 2, 3, 4, 5, 6, 7, 8]), budget=1000)
    cache.put(_entry(A, [1, 2, 9, 9, 9, 9, 9, 9]), budget=1000)
    cache.put(_entry(B, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), budget=1000)
    found = cache.take(A, [1, 2, 3, 4, 5, 6, 7, 0, 0], beat=0)
    assert found is not None and found.tokens[:3] == (1, 2, 3) and found.adapters == A
    assert len(cache) == 2  # taken out: the live cache holds it now
    assert cache.take(A, [1, 2, 3, 4, 5, 6, 7], beat=0) is None  # only [1, 2] shared now


def test_an_entry_must_beat_the_live_cache_by_the_minimum_gain() -> None:
    cache = PrefixCache()
    cache.put(_entry(A, list(range(20))), budget=1000)
    gain = PrefixCache.MIN_GAIN
    assert cache.take(A, list(range(20)), beat=20 - gain + 1) is None
    assert cache.take(A, list(range(20)), beat=20 - gain) is not None


def test_the_budget_evicts_least_recent_and_refuses_what_cannot_fit() -> None:
    cache = PrefixCache()
    cache.put(_entry(A, [1] * 5, size=40), budget=100)
    cache.put(_entry(B, [2] * 5, size=40), budget=100)
    cache.put(_entry(A, [3] * 5, size=40), budget=100)
    assert cache.nbytes == 80 and cache.take(A, [1] * 5, beat=0) is None
    cache.put(_entry(A, [4] * 5, size=101), budget=100)
    assert cache.nbytes == 80


def test_an_entry_a_longer_one_extends_is_dropped_and_drop_forgets_an_adapter() -> None:
    cache = PrefixCache()
    cache.put(_entry(A, [1, 2, 3]), budget=1000)
    cache.put(_entry(A, [1, 2, 3, 4, 5]), budget=1000)
    assert len(cache) == 1
    cache.put(_entry(B, [1, 2, 3, 4, 5]), budget=1000)
    cache.drop(Path("a.gguf"))
    assert len(cache) == 1 and cache.take(B, [1, 2, 3, 4, 5], beat=0) is not None


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2
