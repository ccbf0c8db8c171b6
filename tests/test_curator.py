"""Curator: folds redundant or cold chunks into summaries, archives and restores originals."""

from __future__ import annotations

import time

import pytest
from images import laid_out, open_laid_out

from batos.errors import ArchiveError, ModelError, PromptTooLong
from store.core.image import LivingImage
from store.core.schema import upgrade
from store.knowledge.catalog import CATALOG_STEPS, KnowledgeCatalog
from store.knowledge.curator import Curator, archives, originals
from store.knowledge.embeddings import Embedder
from store.knowledge.ingest import ingest_text

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
    with open_laid_out(file_uri) as image:
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
    with open_laid_out(file_uri) as image:
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
    # A budget of 0 is a budget: it used to be read as "not given", the setting's 200,000.
    assert Curator(catalog, FakeSummarizer(), max_chunks=0).max_chunks == 0
    assert Curator(catalog, FakeSummarizer()).max_chunks == 200_000


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


def _check_archives(catalog: KnowledgeCatalog) -> None:
    """A summary and the originals it stands for are never live together, and every live
    summary's archive exists."""
    with catalog.image.read() as root:
        cat = root["catalog"]
        live = set(cat["chunks"].keys())
        for archive_id, archive in cat["archives"].items():
            assert not {r["id"] for r in originals(catalog, archive_id)} & live
            holder = cat["documents"][f"curator://summary/{archive_id}"]
            assert archive.summary_id in live or archive.summary_id in holder.archived
        for chunk_id in live:
            chunk = cat["chunks"][chunk_id]
            if chunk.kind == "summary":
                assert chunk.metadata["archive"] in cat["archives"]


def _leaf_texts(catalog: KnowledgeCatalog) -> list[str]:
    """Every original text the catalog holds, live or archived, summaries left out."""
    texts = []
    with catalog.image.read() as root:
        cat = root["catalog"]
        texts += [c.text for c in cat["chunks"].values() if c.kind != "summary"]
        archive_ids = list(cat["archives"].keys())
    for archive_id in archive_ids:
        texts += [r["text"] for r in originals(catalog, archive_id) if r["kind"] != "summary"]
    return texts


def test_the_live_set_stays_within_its_cap_over_many_rounds(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    subjects = ["rivers", "violins", "comets", "orchids", "glaciers", "lanterns", "ferries"]
    ingested: list[str] = []
    for round_ in range(6):
        for n, subject in enumerate(subjects):
            text = f"Round {round_} note {n}: {subject} record {round_ * 31 + n} for the archive."
            ingest_text(catalog, f"r{round_}-{subject}", text)
            ingested.append(text)
        catalog.search("violins record", 3)  # some use, so not everything is equally cold
        report = Curator(catalog, FakeSummarizer(), max_chunks=12).run()
        assert report.live_after <= 12, (round_, report)
        stats = catalog.stats()
        assert stats["chunks"] == report.live_after == len(catalog.vectors) == len(catalog.lexical)
        _check_archives(catalog)
    # Nothing was lost: every note is live or in an archive (summaries of summaries included).
    assert sorted(_leaf_texts(catalog)) == sorted(ingested)


def test_cold_means_not_retrieved_lately(memory_image: LivingImage, embedder: Embedder) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    _fill(catalog)
    only = {"source": "backup-0.txt"}
    [used] = catalog.search("backup job runs every night at two", 1, filters=only)
    curator = Curator(catalog, FakeSummarizer(), max_chunks=1000)
    [cluster] = curator.plan()  # the retrieval was written to the image by plan()
    assert used.chunk_id not in cluster.chunk_ids and len(cluster.chunk_ids) == 2
    with memory_image.read() as root:
        assert root["catalog"]["retrieved"][used.chunk_id] >= time.time() - 60
    eight_days_ago = int(time.time()) - 8 * 24 * 3600
    memory_image.transact(
        lambda root: root["catalog"]["retrieved"].__setitem__(used.chunk_id, eight_days_ago)
    )
    [cluster] = curator.plan()
    assert used.chunk_id in cluster.chunk_ids and len(cluster.chunk_ids) == 3
    [cluster] = Curator(catalog, FakeSummarizer(), cold_after=10 * 24 * 3600).plan()
    assert used.chunk_id not in cluster.chunk_ids  # eight days is "lately" for a 10-day window


def test_reingesting_a_document_drops_summaries_of_its_old_text(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    _fill(catalog)
    [archive_id] = Curator(catalog, FakeSummarizer(), max_chunks=1000).run().archives
    assert catalog.document("backup-0.txt")["archives"] == [archive_id]
    assert ingest_text(catalog, "backup-0.txt", "The backup job moved to Sundays.") == "replaced"
    assert archives(catalog) == []
    assert catalog.search("Summary of 3 notes", 5, filters={"kind": "summary"}) == []
    live = {h.text for h in catalog.search("backup job NAS", 10, mode="lexical")}
    assert live == {"The backup job moved to Sundays.", *NEAR_DUPLICATES[1:]}
    assert catalog.stats()["chunks"] == len(catalog.vectors) == 6
    _check_archives(catalog)


def _nested(catalog: KnowledgeCatalog) -> tuple[int, int]:
    """An archive (inner) whose summary was folded into a second archive (outer)."""
    _fill(catalog)
    [inner] = Curator(catalog, FakeSummarizer(), max_chunks=1000).run().archives
    outer_run = Curator(catalog, FakeSummarizer(), max_chunks=1, similarity=1.01).run()
    with catalog.image.read() as root:
        summary = root["catalog"]["archives"][inner].summary_id
        assert summary not in root["catalog"]["chunks"]
    [outer] = [a for a in outer_run.archives if summary in {r["id"] for r in originals(catalog, a)}]
    _check_archives(catalog)
    return inner, outer


@pytest.mark.parametrize("order", ["inner first", "outer first"])
def test_nested_archives_restore_in_any_order(
    memory_image: LivingImage, embedder: Embedder, order: str
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    inner, outer = _nested(catalog)
    curator = Curator(catalog, FakeSummarizer())
    if order == "inner first":
        with catalog.image.read() as root:
            summary = root["catalog"]["archives"][inner].summary_id
        back = curator.restore(inner)  # opens the outer archive first
        with catalog.image.read() as root:  # every id it returns is a live chunk
            live = set(root["catalog"]["chunks"])
        assert summary not in back and set(back) <= live, (summary, back)
        assert len(back) == len(set(back))
        with pytest.raises(ArchiveError):
            curator.restore(outer)
    else:
        curator.restore(outer)
        _check_archives(catalog)
        curator.restore(inner)
    _check_archives(catalog)
    backups = {h.text for h in catalog.search("backup job NAS", 10, mode="lexical")}
    assert backups == set(NEAR_DUPLICATES)
    remaining = {a["id"] for a in archives(catalog)}
    assert inner not in remaining and outer not in remaining
    assert catalog.stats()["chunks"] == len(catalog.vectors)


def test_retrieval_counts_of_an_older_image_become_retrieval_times(embedder: Embedder) -> None:
    memory_image = LivingImage.open("memory://")
    upgrade(memory_image, CATALOG_STEPS[:1])  # the layout before retrieval times
    old = KnowledgeCatalog(memory_image, embedder)
    _fill(old)
    used = old.document("backup-0.txt")["chunks"][0]
    memory_image.transact(lambda root: root["catalog"]["usage"].__setitem__(used, 3))
    catalog = KnowledgeCatalog.open(laid_out(memory_image), embedder)  # as the runtime opens it
    with memory_image.read() as root:
        assert "usage" not in root["catalog"]
        assert dict(root["catalog"]["retrieved"]).keys() == {used}
    [cluster] = Curator(catalog, FakeSummarizer(), max_chunks=1000).plan()
    assert used not in cluster.chunk_ids  # the used chunk stays warm after the upgrade
    assert len(cluster.chunk_ids) == 2


def test_a_cluster_too_long_for_the_summariser_is_skipped_and_the_run_goes_on(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    """An engine that cannot take a cluster's prompt raises PromptTooLong; that cluster would
    fail the same way on every run, so it is skipped and reported, and the others fold."""
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    _fill(catalog)
    for i, text in enumerate(["Owls hunt at night.", "At night owls hunt."]):
        ingest_text(catalog, f"owls-{i}.txt", text)
    calls: list[list[str]] = []

    def summarize(texts: list[str]) -> str:
        calls.append(texts)
        if len(calls) == 1:
            raise PromptTooLong("the prompt is 33741 tokens; the context holds 4096")
        return "Summary: " + texts[0]

    curator = Curator(catalog, summarize, max_chunks=1000)
    clusters = curator.plan()
    assert len(clusters) == 2
    report = curator.run()
    assert report.too_long == [clusters[0].chunk_ids]
    assert report.skipped_clusters == 1
    assert len(report.archives) == 1
    assert len(calls) == 2


def test_a_cluster_an_openai_compatible_server_finds_too_long_is_skipped_too(
    memory_image: LivingImage, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through BABS on an OpenAI-compatible server whose context the first cluster
    does not fit: the server's 400 ended every curation run at that cluster."""
    from chat_servers import FakeOpenAI

    from graph.curation import babs_summarizer

    server = FakeOpenAI()
    server.models = {"batos-babs"}
    server.answer = lambda body: "Summary: owls hunt at night."
    refusals = {
        # OpenAI and vLLM
        "owls": (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 4096 tokens. However, "
                    "your messages resulted in 33741 tokens.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
        ),
        # llama-server
        "backup": (
            400,
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                }
            },
        ),
    }

    def refuse(body: dict) -> tuple[int, dict] | None:
        prompt = body["messages"][-1]["content"].lower()
        return next((refused for word, refused in refusals.items() if word in prompt), None)

    server.refuse = refuse
    server.thread.start()
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.setenv("BATOS_OPENAI_BASE_URL", server.url)
    try:
        catalog = KnowledgeCatalog.open(memory_image, embedder)
        _fill(catalog)
        for i, text in enumerate(["Owls hunt at night.", "At night owls hunt."]):
            ingest_text(catalog, f"owls-{i}.txt", text)
        summarize = babs_summarizer()
        with pytest.raises(PromptTooLong, match="maximum context length") as raised:
            summarize(["Owls hunt at night."])
        assert "--max-model-len" in raised.value.hint
        curator = Curator(catalog, summarize, max_chunks=1000)
        clusters = curator.plan()
        report = curator.run()
        assert len(report.too_long) == 2 == len(clusters)  # each skipped, the run ended whole
        # a 400 for another reason is no prompt too long: it still ends the run
        refusals["owls"] = (400, {"error": {"message": "temperature must be at most 2"}})
        with pytest.raises(ModelError) as other:
            summarize(["Owls hunt at night."])
        assert not isinstance(other.value, PromptTooLong)
    finally:
        server.stop()
