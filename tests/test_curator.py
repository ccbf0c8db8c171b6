"""Curator: folds redundant or cold chunks into summaries, archives and restores originals."""

from __future__ import annotations

import pytest

from batos.errors import ArchiveError
from store.catalog import KnowledgeCatalog
from store.curator import Curator, archives, originals
from store.embeddings import Embedder
from store.image import LivingImage
from store.ingest import ingest_text

NEAR_DUPLICATES = [
    "The backup job runs every night at two and copies the image to the NAS.",
    "Every night at two the backup job copies the image to the NAS.",
    "At two each night, the backup job copies the image onto the NAS.",
]
OTHERS = [
    "Penguins cannot fly but they swim very well in cold water.",
    "Sourdough needs a starter of wild yeast and lactic bacteria.",
    "The heart of a resting adult beats sixty to a hundred times a minute.",
]


class FakeSummarizer:
    """Deterministic stand-in for BABS: records each call, answers with a fixed format."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> str:
        self.calls.append(list(texts))
        return f"Summary of {len(texts)} notes: " + " / ".join(t.split(".")[0] for t in texts)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


def _fill(catalog: KnowledgeCatalog) -> None:
    for i, text in enumerate(NEAR_DUPLICATES):
        ingest_text(catalog, f"backup-{i}.txt", text)
    for i, text in enumerate(OTHERS):
        ingest_text(catalog, f"other-{i}.txt", text)


def test_redundant_chunks_fold_into_a_summary_and_come_back(
    file_uri: str, embedder: Embedder
) -> None:
    summarize = FakeSummarizer()
    with LivingImage.open(file_uri) as image:
        catalog = KnowledgeCatalog.open(image, embedder)
        _fill(catalog)
        before = {h.text for h in catalog.search("nightly backup to the NAS", 3, record=False)}
        report = Curator(catalog, summarize, max_chunks=1000).run()
        assert len(report.archives) == 1 and report.archived_chunks == 3
        assert sorted(summarize.calls[0]) == sorted(NEAR_DUPLICATES)
        assert report.live_before - report.live_after == 2
        [hit] = catalog.search("nightly backup to the NAS", 1)
        assert hit.kind == "summary" and hit.text.startswith("Summary of 3 notes")
        archive_id = report.archives[0]
        assert hit.metadata["archive"] == archive_id
        assert all(h.kind == "summary" for h in catalog.search("backup NAS", 5, mode="lexical"))
        catalog.close()
    # The archive is a blob in a file image, and reads back after a reopen.
    with LivingImage.open(file_uri) as image:
        catalog = KnowledgeCatalog.open(image, embedder)
        with image.read() as root:
            assert root["catalog"]["archives"][archive_id].blob is not None
        kept = originals(catalog, archive_id)
        assert sorted(r["text"] for r in kept) == sorted(NEAR_DUPLICATES)
        assert {r["source"] for r in kept} == {f"backup-{i}.txt" for i in range(3)}
        restored = Curator(catalog, summarize).restore(archive_id)
        assert len(restored) == 3
        assert {h.text for h in catalog.search("nightly backup to the NAS", 3)} == before
        assert catalog.search("Summary of 3 notes", 5, filters={"kind": "summary"}) == []
        assert archives(catalog) == []
        assert catalog.stats()["chunks"] == len(catalog.vectors) == 6
        with pytest.raises(ArchiveError):
            originals(catalog, archive_id)


def test_memory_stays_bounded_under_heavy_ingest_and_used_chunks_stay(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    topics = ["rivers", "volcanoes", "violins", "glaciers", "orchids", "comets"]
    for t, topic in enumerate(topics):
        for n in range(5):
            ingest_text(
                catalog,
                f"{topic}-{n}",
                f"Note {n} about {topic}: fact number {n * 7 + t} concerns {topic} in region {n}.",
            )
    [favourite] = catalog.search("violins fact number 16", 1)
    # Near-identical notes would fold as redundant anyway; this run looks at the budget alone.
    curator = Curator(catalog, FakeSummarizer(), max_chunks=10, similarity=1.01)
    report = curator.run()
    assert report.live_before == 30
    assert report.live_after <= 10
    assert catalog.stats()["chunks"] == len(catalog.vectors) == report.live_after
    assert favourite.chunk_id in catalog.vectors  # retrieved chunks are folded last
    # Each archive restores on demand, and another run keeps the bound.
    for archive in archives(catalog)[:2]:
        Curator(catalog, FakeSummarizer()).restore(archive["id"])
    assert Curator(catalog, FakeSummarizer(), max_chunks=10).run().live_after <= 10


def test_a_cluster_that_changed_meanwhile_is_skipped(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    _fill(catalog)
    curator = Curator(catalog, FakeSummarizer(), max_chunks=1000)
    [cluster] = curator.plan()
    ingest_text(catalog, "backup-0.txt", "The backup job moved to Sundays.")
    assert curator.fold(cluster, "stale summary") is None
    assert catalog.search("stale summary", 3, mode="lexical") == []
    assert archives(catalog) == []
