"""Documents found by their names: the text index holds each chunk's document name, and a query
that names documents adds their passages to the fusion as a third list."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from images import laid_out

from store.core.image import LivingImage
from store.core.schema import upgrade
from store.knowledge.catalog import (
    CATALOG_STEPS,
    NAME_CHARS,
    NAMED_DOCUMENTS,
    KnowledgeCatalog,
    _decisive,
    _Owners,
    indexed_text,
    name_words,
)
from store.knowledge.curator import Curator
from store.knowledge.embeddings import Embedder
from store.knowledge.ingest import ingest_text

# Four copyright files as Debian ships them: none says the package's name, and all are called
# "copyright", so the package is named by the folder alone.
COPYRIGHTS = {
    "doc/libdpkg-perl/copyright": "Upstream-Name: dpkg\nFiles: *\nCopyright: 1994 Ian "
    "Murdock\nLicense: GPL-2+\n This program is free software; you can redistribute it.",
    "doc/zlib1g/copyright": "Upstream-Name: zlib\nFiles: *\nCopyright: 1995 Jean-loup "
    "Gailly and Mark Adler\nLicense: Zlib\n This software is provided 'as-is'.",
    "doc/libssl3/copyright": "Upstream-Name: OpenSSL\nFiles: *\nCopyright: 1998 The OpenSSL "
    "Project\nLicense: Apache-2.0\n Licensed under the Apache License, Version 2.0.",
    "doc/libgcc-s1/copyright": "Upstream-Name: GCC\nFiles: *\nCopyright: 1987 Free Software "
    "Foundation\nLicense: GPL-3+ with GCC-exception\n The runtime library exception applies.",
}


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture
def catalog(memory_image: LivingImage, embedder: Embedder) -> KnowledgeCatalog:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    for source, text in COPYRIGHTS.items():
        ingest_text(catalog, source, text)
    return catalog


def test_name_words_are_the_folder_and_the_file_without_its_suffix() -> None:
    assert name_words("/usr/share/doc/libdpkg-perl/copyright") == "libdpkg perl copyright"
    assert name_words("docs/quelldale_dial_a_ride_2026.txt") == "docs quelldale dial a ride 2026"
    assert name_words("guides/BookingGuide.md") == "guides Booking Guide"
    assert name_words("C:\\Users\\me\\notes.v2.pdf") == "me notes v2"
    assert name_words("README") == "README"
    assert name_words("") == ""


@given(st.text(max_size=600))
def test_name_words_are_bounded_words_of_any_source(source: str) -> None:
    words = name_words(source)
    assert len(words) <= NAME_CHARS
    assert re.fullmatch(r"(?:[^\W_]+(?: [^\W_]+)* ?)?", words)


def test_a_document_is_found_by_a_name_its_text_never_says(catalog: KnowledgeCatalog) -> None:
    for question, wanted in (
        ("Which licence covers the libdpkg-perl package?", "doc/libdpkg-perl/copyright"),
        ("who holds the copyright on zlib1g", "doc/zlib1g/copyright"),
        ("Can I redistribute libgcc-s1?", "doc/libgcc-s1/copyright"),
    ):
        assert catalog.search(question, 1, record=False)[0].source == wanted, question
    # the text index holds the names: a name alone finds its document with no vectors at all
    for name, wanted in (
        ("libdpkg", "libdpkg-perl"),
        ("zlib1g", "zlib1g"),
        ("libgcc", "libgcc-s1"),
    ):
        [hit] = catalog.search(name, 1, mode="lexical", record=False)
        assert hit.source == f"doc/{wanted}/copyright"


def test_a_word_every_name_holds_names_no_document(catalog: KnowledgeCatalog) -> None:
    # "copyright" is every document's name here: it picks none, and the hybrid ranking of a
    # query with no other name word is the two-list fusion of the text and the vectors.
    catalog.search("copyright", 1, record=False)  # loads the vectors, as every search does
    with catalog.image.read() as root:
        cat = root["catalog"]
        vector = catalog.embedder.encode_one("copyright holders")
        assert catalog._named(cat, "copyright holders", vector, 50, None) == []
        named = catalog._named(cat, "the zlib1g copyright", vector, 50, None)
        assert named and {cat["chunks"][i].source for i in named} == {"doc/zlib1g/copyright"}


def test_the_named_list_keeps_to_the_filters(catalog: KnowledgeCatalog) -> None:
    hits = catalog.search(
        "licence of libssl3", 4, filters={"source": "doc/zlib1g/copyright"}, record=False
    )
    assert {h.source for h in hits} == {"doc/zlib1g/copyright"}


def test_an_older_image_is_reindexed_with_its_names(embedder: Embedder) -> None:
    image = LivingImage.open("memory://")
    upgrade(image, CATALOG_STEPS[:3])  # the layout before names were indexed
    old = KnowledgeCatalog(image, embedder)
    source, text = "doc/libdpkg-perl/copyright", COPYRIGHTS["doc/libdpkg-perl/copyright"]
    ingest_text(old, source, text)
    # as the code before this step indexed it: the chunk's text alone
    with image.read() as root:
        [chunk] = root["catalog"]["chunks"].values()
        chunk_id = chunk.id
    image.transact(lambda root: root["catalog"]["text"].index_doc(chunk_id, chunk.text))
    assert old.search("libdpkg", 1, mode="lexical", record=False) == []
    version = KnowledgeCatalog.version
    with image.read() as root:
        before = version(root)
    catalog = KnowledgeCatalog.open(laid_out(image), embedder)  # as the runtime opens it
    assert catalog.search("libdpkg", 1, mode="lexical", record=False)[0].source == source
    with image.read() as root:
        assert version(root) == before + 1  # other processes' caches learn the index moved
        assert root["schema"]["catalog-5"]


def test_a_summary_is_indexed_under_the_names_it_folded(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    night = "The backup job runs every night at two and copies the image to the NAS."
    for i, text in enumerate([night, night.replace("runs every", "runs each")]):
        ingest_text(catalog, f"ops/nightly-backup-{i}.txt", text)
    ingest_text(catalog, "pets/penguins.txt", "Penguins swim very well in cold water.")
    curator = Curator(catalog, lambda texts: "Backups run at two.", max_chunks=1000)
    [cluster] = curator.plan()
    assert curator.fold(cluster, "Backups run at two.") is not None
    [hit] = catalog.search("nightly", 1, mode="lexical", record=False)
    assert hit.kind == "summary"  # "nightly" is in the folded documents' names alone
    with memory_image.read() as root:
        assert "nightly backup 0" in indexed_text(root["catalog"]["chunks"][hit.chunk_id])
        # a summary's own source ("curator://summary/…") names nothing
        sources, _, _ = catalog._document_names(root["catalog"])
    assert sorted(sources) == [
        "ops/nightly-backup-0.txt",
        "ops/nightly-backup-1.txt",
        "pets/penguins.txt",
    ]


def test_a_name_that_is_an_everyday_word_names_nothing(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    # Man pages are named by their commands, and some commands are everyday words: the page
    # called "file" is not what a question about copying files names.
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    pages = {
        "man1/file.txt": "determine the type of data by its magic number",
        "man1/cp.txt": "copy a file or several files into a directory, keeping the file mode",
        "man1/mv.txt": "move or rename a file; a file moved across devices is copied",
        "man1/rm.txt": "remove each file given; a directory needs the recursive option",
        "man1/ls.txt": "list the file names of a directory, sorted by name",
        "man1/zstd.txt": "compress a file with the Zstandard algorithm",
    }
    for source, text in pages.items():
        ingest_text(catalog, source, text)
    catalog.search("file", 1, record=False)  # loads the vectors, as every search does
    with memory_image.read() as root:
        cat = root["catalog"]
        query = "how do I copy a file into a directory"
        assert catalog._named(cat, query, catalog.embedder.encode_one(query), 50, None) == []
        query = "what does zstd do"  # a name no text says is specific to its page
        named = catalog._named(cat, query, catalog.embedder.encode_one(query), 50, None)
        assert {cat["chunks"][i].source for i in named} == {"man1/zstd.txt"}
    assert catalog.search("how do I copy a file into a directory", 1)[0].source == "man1/cp.txt"


def test_documents_tied_on_a_name_are_taken_all_or_none() -> None:
    assert _decisive({1: 3.0, 2: 1.0, 3: 1.0}, 3) == [1, 2, 3]
    assert _decisive({1: 3.0, 2: 1.0, 3: 1.0, 4: 1.0}, 3) == [1]
    assert _decisive({i: 0.7 for i in range(40)}, 3) == []  # "jobs" in forty names


@given(st.dictionaries(st.integers(), st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.5]), max_size=12))
def test_decisive_is_a_best_first_prefix_that_splits_no_tie(scores: dict[int, float]) -> None:
    chosen = _decisive(scores, NAMED_DOCUMENTS)
    assert len(chosen) <= NAMED_DOCUMENTS and len(set(chosen)) == len(chosen)
    taken = [scores[key] for key in chosen]
    assert taken == sorted(taken, reverse=True)
    left = [score for key, score in scores.items() if key not in chosen]
    assert all(score < min(taken) for score in left) if taken else True
    assert not {score for score in left} & set(taken)  # a tie is never split


@given(
    st.lists(st.sets(st.integers(0, 60), max_size=6), max_size=6),
    st.sets(st.integers(0, 70), max_size=20),
    st.sets(st.integers(0, 6), max_size=3),
)
def test_owners_count_the_other_documents_holding_chunks(
    documents: list[set[int]], chunks: set[int], named: set[int]
) -> None:
    owned: dict[int, int] = {}
    for index, ids in enumerate(documents):
        for chunk_id in ids - owned.keys():  # a chunk belongs to one document
            owned[chunk_id] = index
    sets = [{c for c, i in owned.items() if i == index} for index in range(len(documents))]
    expected = {owned[c] for c in chunks if c in owned} - named
    assert _Owners(sets).others(chunks, sorted(named)) == len(expected)
