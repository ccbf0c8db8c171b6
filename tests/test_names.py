"""Documents found by their names: a query that names a document its text and vectors did not
find gets that document's best passage first, and every other query keeps its order."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from zope.index.text.textindex import TextIndex

from store.core.image import LivingImage
from store.knowledge.catalog import NAMED_LEAVE, KnowledgeCatalog
from store.knowledge.curator import Curator
from store.knowledge.embeddings import Embedder
from store.knowledge.ingest import ingest_text
from store.knowledge.names import (
    NAME_CHARS,
    NAMED_DOCUMENTS,
    DocumentNames,
    Owners,
    decisive,
    name_words,
    terms,
)

# Copyright files as Debian ships them: none says the package's name, and all are called
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
    "doc/git/copyright": "Upstream-Name: Git\nFiles: *\nCopyright: 2005 Linus Torvalds\n"
    "License: GPL-2\n Git is licensed under the GPL, version 2, and its licence covers the "
    "git package and every package built from it.",
}
# Files whose text speaks of licences, packages and copyright holders far more than the ones
# above: the text and the vectors put them first for a question that names a package.
for _n in range(NAMED_LEAVE + 1):
    COPYRIGHTS[f"doc/tool{_n}/copyright"] = (
        f"Files: *\nCopyright: 20{10 + _n} The Tool Authors, who hold the copyright\nLicense: "
        "GPL-2+\n Which licence covers this package? The licence that covers the package is "
        "the GPL; you can redistribute the package under the terms of that licence."
    )


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


def test_terms_are_the_lexicons_own_words() -> None:
    lexicon = TextIndex().lexicon
    assert terms(lexicon, "Which licence covers the libdpkg-perl package?") == [
        "which",
        "licence",
        "covers",
        "libdpkg",
        "perl",
        "package",
    ]
    assert terms(lexicon, "") == []


def test_a_document_is_found_by_a_name_its_text_never_says(
    catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    questions = {
        "Which licence covers the libdpkg-perl package?": "doc/libdpkg-perl/copyright",
        "who holds the copyright on zlib1g": "doc/zlib1g/copyright",
        "Can I redistribute libgcc-s1?": "doc/libgcc-s1/copyright",
        "Which licence covers the git package?": "doc/git/copyright",
    }
    named = {q: [h.chunk_id for h in catalog.search(q, 5, record=False)] for q in questions}
    monkeypatch.setattr(DocumentNames, "named", lambda *args: [])
    plain = {q: catalog.search(q, 5, record=False) for q in questions}
    brought = 0
    for question, wanted in questions.items():
        found = [h.source for h in plain[question][:NAMED_LEAVE]]
        if wanted in found:  # found by its text and vectors: the order is theirs, untouched
            assert named[question] == [h.chunk_id for h in plain[question]], question
        else:  # its best passage first, then the rest in their order, none repeated
            first = catalog.search(question, 1, record=False, filters={"source": wanted})
            rest = [h.chunk_id for h in plain[question] if h.chunk_id != first[0].chunk_id]
            assert named[question] == [first[0].chunk_id, *rest][:5], question
            brought += 1
    assert brought >= 2  # the distractors keep most named files out of the first three


def test_a_query_that_found_its_named_document_keeps_its_order(
    catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "git" names the git file, and its text and vectors find it already: the order is the
    # fusion's own, exactly as it is with names not read at all.
    query = "Which licence covers the git package?"
    with catalog.image.read() as root:
        cat = root["catalog"]
        text = cat["text"]
        assert catalog._document_names(cat).named(text.lexicon, text.index._wordinfo, query) == [
            "doc/git/copyright"
        ]
    with_names = [h.chunk_id for h in catalog.search(query, 5, record=False)]
    monkeypatch.setenv("BATOS_CATALOG_NAMES", "off")
    plain = catalog.search(query, 5, record=False)
    assert "doc/git/copyright" in {h.source for h in plain[:NAMED_LEAVE]}
    assert with_names == [h.chunk_id for h in plain]


def test_modes_other_than_hybrid_never_read_names(catalog: KnowledgeCatalog) -> None:
    query = "Which licence covers the libdpkg-perl package?"
    assert catalog.search(query, 1, record=False)[0].source == "doc/libdpkg-perl/copyright"
    for mode in ("lexical", "dense"):
        hits = catalog.search(query, 1, mode=mode, record=False)
        assert all(h.source != "doc/libdpkg-perl/copyright" for h in hits), mode


def test_a_word_every_name_holds_names_no_document(catalog: KnowledgeCatalog) -> None:
    with catalog.image.read() as root:
        cat = root["catalog"]
        names = catalog._document_names(cat)
        lexicon, info = cat["text"].lexicon, cat["text"].index._wordinfo
        assert names.named(lexicon, info, "copyright holders") == []
        assert names.named(lexicon, info, "the zlib1g copyright") == ["doc/zlib1g/copyright"]


def test_the_named_passage_keeps_to_the_filters(catalog: KnowledgeCatalog) -> None:
    assert catalog.search("licence of libssl3", 1, record=False)[0].source == (
        "doc/libssl3/copyright"
    )
    hits = catalog.search(
        "licence of libssl3", 4, filters={"source": "doc/zlib1g/copyright"}, record=False
    )
    assert hits and {h.source for h in hits} == {"doc/zlib1g/copyright"}


def test_names_follow_the_catalog_as_it_changes(catalog: KnowledgeCatalog) -> None:
    query = "what licence does libfoo2 have"
    assert catalog.search(query, 1, record=False)[0].source != "doc/libfoo2/copyright"
    ingest_text(catalog, "doc/libfoo2/copyright", "Upstream-Name: foo\nLicense: MIT\n Permission.")
    assert catalog.search(query, 1, record=False)[0].source == "doc/libfoo2/copyright"
    # removed by another writer: this catalog learns of it from the version, as it would
    catalog.image.transact(lambda root: catalog.remove_document(root, "doc/libfoo2/copyright"))
    assert all(h.source != "doc/libfoo2/copyright" for h in catalog.search(query, 5, record=False))


def test_summaries_name_nothing(memory_image: LivingImage, embedder: Embedder) -> None:
    catalog = KnowledgeCatalog.open(memory_image, embedder)
    night = "The backup job runs every night at two and copies the image to the NAS."
    for i, text in enumerate([night, night.replace("runs every", "runs each")]):
        ingest_text(catalog, f"ops/nightly-backup-{i}.txt", text)
    ingest_text(catalog, "pets/penguins.txt", "Penguins swim very well in cold water.")
    curator = Curator(catalog, lambda texts: "Backups run at two.", max_chunks=1000)
    [cluster] = curator.plan()
    assert curator.fold(cluster, "Backups run at two.") is not None
    with memory_image.read() as root:
        sources = catalog._document_names(root["catalog"]).sources
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
    with memory_image.read() as root:
        cat = root["catalog"]
        names = catalog._document_names(cat)
        lexicon, info = cat["text"].lexicon, cat["text"].index._wordinfo
        assert names.named(lexicon, info, "how do I copy a file into a directory") == []
        assert names.named(lexicon, info, "what does zstd do") == ["man1/zstd.txt"]
    assert catalog.search("how do I copy a file into a directory", 1)[0].source == "man1/cp.txt"


def test_document_names_of_sources() -> None:
    lexicon = TextIndex().lexicon
    names = DocumentNames(lexicon, ["a/Dial_a_Ride.txt", "b/dial-tone.md"], [[1, 2], [3]])
    assert names.naming["dial"] == [0, 1] and names.naming["ride"] == [0]
    assert "a" not in names.naming  # a stop word, as the text index drops it


def test_documents_tied_on_a_name_are_taken_all_or_none() -> None:
    assert decisive({1: 3.0, 2: 1.0, 3: 1.0}, 3) == [1, 2, 3]
    assert decisive({1: 3.0, 2: 1.0, 3: 1.0, 4: 1.0}, 3) == [1]
    assert decisive({i: 0.7 for i in range(40)}, 3) == []  # "jobs" in forty names


@given(st.dictionaries(st.integers(), st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.5]), max_size=12))
def test_decisive_is_a_best_first_prefix_that_splits_no_tie(scores: dict[int, float]) -> None:
    chosen = decisive(scores, NAMED_DOCUMENTS)
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
    assert Owners(sets).others(chunks, sorted(named)) == len(expected)
