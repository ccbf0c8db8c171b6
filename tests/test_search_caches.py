"""The search caches: BM25 over posting arrays agrees with zope.index; filtered dense search."""

from __future__ import annotations

import numpy as np
import pytest

from store.core.image import LivingImage
from store.knowledge.catalog import KnowledgeCatalog, catalog_root
from store.knowledge.embeddings import Embedder
from store.knowledge.ingest import ingest_text
from store.knowledge.vectors import VectorIndex, top_k

WORDS = "pump valve sensor cable firmware board coolant limit router mesh".split()
QUERIES = [
    "pump",
    "pump valve",
    "valve valve firmware",  # a repeated word counts twice, as in zope.index
    "the pump and the board",  # stop words drop out
    "coolant limit router mesh sensor",
    "nothing-like-this",
    "the of and",
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


def _notes(seed: int, n: int) -> dict[str, str]:
    rng = np.random.default_rng(seed)
    notes = {}
    for i in range(n):
        words = rng.choice(WORDS, size=rng.integers(3, 12))
        notes[f"note-{seed}-{i}"] = " ".join(words).capitalize() + "."
    return notes


def _reference(catalog: KnowledgeCatalog, query: str) -> dict[int, float]:
    """Every chunk's score under zope.index's own Okapi BM25 search."""
    with catalog.image.read() as root:
        return dict(catalog_root(root)["text"].index.search(query) or {})


def _assert_agrees(catalog: KnowledgeCatalog) -> None:
    for query in QUERIES:
        ours = catalog.search(query, 8, mode="lexical")
        theirs = _reference(catalog, query)
        best = sorted(theirs.values(), reverse=True)[:8]
        assert [h.score for h in ours] == pytest.approx(best, rel=1e-5), query
        # Same chunks, up to the order of equal scores (zope keeps float32, we sum in float64).
        assert all(theirs[h.chunk_id] == pytest.approx(h.score, rel=1e-5) for h in ours), query


def test_bm25_over_posting_arrays_agrees_with_zope_index_through_changes(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    for source, text in _notes(1, 40).items():
        ingest_text(catalog, source, text)
    _assert_agrees(catalog)  # loads the cache
    assert catalog.lexical.version == catalog.stats()["version"]
    # Additions, replacements and removals reach the loaded cache without a reload.
    for source, text in _notes(2, 15).items():
        ingest_text(catalog, source, text)
    for source in list(_notes(1, 10)):
        ingest_text(catalog, source, "Router mesh firmware only.")

    # Another writer (as another process would) changes the image behind this cache's back.
    other = KnowledgeCatalog.open(memory_image, embedder)
    memory_image.transact(
        lambda root: [other.remove_document(root, s) for s in list(_notes(1, 20))[10:]]
    )
    ingest_text(other, "late", "Pump pump pump valve.")
    _assert_agrees(catalog)
    assert catalog.search("pump", 1, mode="lexical")[0].source == "late"
    assert len(catalog.lexical) == catalog.stats()["chunks"]


def test_lexical_filters_use_the_same_scores(memory_image: LivingImage, embedder: Embedder) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    for source, text in _notes(3, 30).items():
        ingest_text(catalog, source, text, metadata={"shelf": source[-1]})
    everything = {h.chunk_id: h.score for h in catalog.search("pump valve", 30, mode="lexical")}
    shelved = catalog.search("pump valve", 30, mode="lexical", filters={"shelf": ["1", "2"]})
    assert shelved and {h.metadata["shelf"] for h in shelved} <= {"1", "2"}
    assert all(h.score == pytest.approx(everything[h.chunk_id]) for h in shelved)


def test_filtered_dense_search_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((500, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = rng.choice(2**31 - 1, size=500, replace=False).astype(np.int64)
    index = VectorIndex(dims=8)
    index.add(ids.tolist(), vectors)
    index.remove(ids[:50].tolist())  # swaps rows around
    query = vectors[123]
    for allowed in (np.sort(ids[::3]), np.sort(ids[40:60]), ids[::-7]):
        live = np.isin(ids, allowed) & ~np.isin(ids, ids[:50])
        expected = top_k(ids[live], vectors[live] @ query, 10)
        found = index.search(query, 10, allowed)
        assert [i for i, _ in found] == [i for i, _ in expected]
        assert np.allclose([s for _, s in found], [s for _, s in expected])
    assert index.search(query, 5, iter(ids[100:103].tolist()))[0][0] in ids[100:103]
    assert index.search(query, 5, np.zeros(0, dtype=np.int64)) == []


def test_the_half_precision_pass_still_gives_the_exact_top_k() -> None:
    """Near-duplicates whose cosines differ by less than float16 can tell apart: the exact
    float32 ranking must come out anyway."""
    rng = np.random.default_rng(1)
    base = rng.standard_normal((20, 384)).astype(np.float32)
    vectors = np.repeat(base, 200, axis=0) + rng.normal(0, 1e-3, (4000, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1, 4001, dtype=np.int64)
    cold, warm = VectorIndex(), VectorIndex()
    cold.add(ids.tolist(), vectors)
    warm.load(ids, vectors)
    warm.warm()  # the half-precision copy that a background thread makes after a first search
    assert warm._half is not None
    for query in vectors[::400] + rng.normal(0, 1e-3, (10, 384)).astype(np.float32):
        query /= np.linalg.norm(query)
        exact = vectors @ query
        expected = top_k(ids, exact, 25)
        for index in (cold, warm):
            found = index.search(query, 25)
            # Equal up to float32 rounding (BLAS sums a gathered block in another order).
            assert np.allclose([s for _, s in found], [s for _, s in expected], atol=1e-6)
            assert all(exact[i - 1] >= expected[-1][1] - 1e-6 for i, _ in found)
            assert len({i for i, _ in found}) == 25


def test_a_query_vector_the_caller_has_spares_the_embedding(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    for source, text in _notes(4, 12).items():
        ingest_text(catalog, source, text)
    vector = embedder.encode_one("router mesh")
    given = catalog.search("router mesh", 5, query_vector=vector)
    assert [h.chunk_id for h in given] == [h.chunk_id for h in catalog.search("router mesh", 5)]


def test_a_repeated_filter_follows_writes_between_queries(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    for source, text in _notes(5, 30).items():
        ingest_text(catalog, source, text, metadata={"shelf": source[-1]})
    shelf = {"shelf": "7"}
    for mode in ("lexical", "dense", "hybrid"):
        assert {h.metadata["shelf"] for h in catalog.search("pump", 10, mode=mode, filters=shelf)}
    ingest_text(catalog, "new-7", "Pump pump pump valve.", metadata={"shelf": "7"})
    for mode in ("lexical", "dense", "hybrid"):
        hits = catalog.search("pump pump valve", 40, mode=mode, filters=shelf)
        assert "new-7" in {h.source for h in hits} and {h.metadata["shelf"] for h in hits} == {"7"}
    other = KnowledgeCatalog.open(memory_image, embedder)  # a write this cache did not see
    memory_image.transact(lambda root: other.remove_document(root, "new-7"))
    for mode in ("lexical", "dense", "hybrid"):
        hits = catalog.search("pump pump valve", 40, mode=mode, filters=shelf)
        assert "new-7" not in {h.source for h in hits}
