"""Ingestion: formats, per-file errors, idempotent re-ingest, replacement, atomic documents."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from documents import (
    BROKEN_TO_UNICODE,
    DEBIAN_COPYRIGHT,
    make_deflated_pdf,
    make_drawing_pdf,
    make_pdf,
    make_shared_stream_pdf,
)
from images import laid_out

from batos.errors import CatalogError, ConfigurationError, DocumentError
from store.core.image import LivingImage
from store.knowledge import ingest as ingest_module
from store.knowledge.catalog import KnowledgeCatalog
from store.knowledge.chunking import MIN_TOKENS, chunk_and_embed
from store.knowledge.embeddings import FLOAT32, INT8, Embedder
from store.knowledge.ingest import expand, ingest_paths, ingest_text, read_document

CATS = "Cats purr when they are content. Kittens learn to hunt by playing with siblings."
DOGS = "Dogs bark at strangers. Puppies chew shoes while their teeth grow."
BIRDS = "Parrots can imitate human speech. Penguins cannot fly but swim very well."


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture
def catalog(memory_image: LivingImage, embedder: Embedder) -> KnowledgeCatalog:
    return KnowledgeCatalog.open(memory_image, embedder)


def test_html_inline_tags_stay_in_their_sentence_and_cells_on_their_row(tmp_path: Path) -> None:
    (tmp_path / "museum.html").write_text(
        "<html><body><h1>The lens</h1><p>It was installed in <b>1931</b>. Visit us "
        "at <a href='/map'>4 Quay Street</a>, opposite the pier.</p>"
        "<table><tr><th>Ticket</th><th>Price</th></tr><tr><td>Adult</td><td>£9.00</td></tr>"
        "</table></body></html>"
    )
    text, fmt, _ = read_document(tmp_path / "museum.html")
    assert fmt == "html"
    assert text.split("\n\n") == [
        "The lens",
        "It was installed in 1931. Visit us at 4 Quay Street, opposite the pier.",
        "Ticket | Price",
        "---|---",  # the header row, marked as Markdown marks one
        "Adult | £9.00",
    ]


def test_an_html_paragraph_wrapped_in_its_source_is_one_run_of_sentences(tmp_path: Path) -> None:
    """As a browser shows it: the source's line breaks are spaces, but in <pre> and at <br>."""
    (tmp_path / "groups.html").write_text(
        "<p>Members of this\ngroup can read the\nsystem's memory.</p>\n"
        "<p>Line one<br>line two</p>\n<pre>make\nmake install</pre>"
    )
    text, _, _ = read_document(tmp_path / "groups.html")
    assert text.split("\n\n") == [
        "Members of this group can read the system's memory.",
        "Line one",
        "line two",
        "make",
        "make install",
    ]


def test_an_html_comment_stays_out_of_the_text_even_across_lines(tmp_path: Path) -> None:
    """The Rust book's ``<!-- ignore\n-->`` markers were read as the word "ignore"."""
    (tmp_path / "book.html").write_text(
        "<p>Stored in <a href='/w'>two's complement</a><!-- ignore\n--> representation.</p>"
    )
    assert read_document(tmp_path / "book.html")[0] == "Stored in two's complement representation."


def test_a_large_or_deeply_nested_html_page_is_read_whole(tmp_path: Path) -> None:
    """Pages of 20,000 rows or elements nested 100,000 deep: reading them once edited the
    parsed tree, in time growing with the square of their size (50 s for the rows; the
    nesting did not end in five minutes)."""
    rows = "".join(f"<tr><td>row {i}</td><td>{i * 3}</td></tr>" for i in range(20_000))
    (tmp_path / "rows.html").write_text(f"<table><tr><th>a</th><th>b</th></tr>{rows}</table>")
    paragraphs = read_document(tmp_path / "rows.html")[0].split("\n\n")
    assert paragraphs[:3] == ["a | b", "---|---", "row 0 | 0"] and len(paragraphs) == 20_002
    (tmp_path / "deep.html").write_text("<div>" * 100_000 + "deep" + "</div>" * 100_000)
    assert read_document(tmp_path / "deep.html")[0] == "deep"


def test_reads_text_markdown_html_and_pdf(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Cats\n\n" + CATS)
    (tmp_path / "b.html").write_text(
        "<html><head><script>steal()</script><style>p{}</style></head>"
        f"<body><h1>Dogs</h1><p>{DOGS}</p></body></html>"
    )
    (tmp_path / "c.pdf").write_bytes(make_pdf("Penguins cannot fly but swim very well."))
    (tmp_path / "d.txt").write_bytes(b"\xef\xbb\xbf" + BIRDS.encode())
    md, fmt, _ = read_document(tmp_path / "a.md")
    assert fmt == "markdown" and md.startswith("# Cats")
    html, fmt, _ = read_document(tmp_path / "b.html")
    assert fmt == "html" and DOGS in html and "steal" not in html and "p{}" not in html
    pdf, fmt, _ = read_document(tmp_path / "c.pdf")
    assert fmt == "pdf" and "Penguins cannot fly" in pdf
    text, fmt, _ = read_document(tmp_path / "d.txt")
    assert fmt == "text" and text == BIRDS


@pytest.mark.parametrize(
    "head",
    [
        '<meta charset="iso-8859-1">',
        "<meta http-equiv='Content-Type' content='text/html; charset=windows-1252'>",
        "<META CHARSET=latin1>",
    ],
)
def test_an_html_page_is_read_in_the_encoding_it_declares(tmp_path: Path, head: str) -> None:
    page = tmp_path / "café.html"
    page.write_bytes(f"<html><head>{head}</head><body><p>Crème brûlée, 4 €.</p>".encode("cp1252"))
    if "iso-8859-1" in head or "latin1" in head:  # no euro sign in latin-1
        page.write_bytes(f"<html><head>{head}</head><body><p>Crème brûlée.</p>".encode("latin-1"))
    text, fmt, _ = read_document(page)
    assert fmt == "html" and "Crème brûlée" in text


def test_an_html_page_that_is_not_what_it_declares_is_refused(tmp_path: Path) -> None:
    for declared in ("utf-8", "no-such-codec", "ascii"):
        page = tmp_path / f"{declared}.html"
        page.write_bytes(f'<meta charset="{declared}"><p>café</p>'.encode("latin-1"))
        with pytest.raises(DocumentError, match="is not UTF-8") as info:
            read_document(page)
        assert "iconv" in info.value.hint
    text = tmp_path / "notes.txt"  # a text file has nothing to declare: its <meta> is text
    text.write_bytes('<meta charset="latin-1"> café'.encode("latin-1"))
    with pytest.raises(DocumentError, match="is not UTF-8"):
        read_document(text)


def test_bad_files_get_their_own_error_and_the_batch_goes_on(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_CATALOG_MAX_BYTES", "1000")
    (tmp_path / "good.txt").write_text(CATS)
    (tmp_path / "binary.txt").write_bytes(b"\x7fELF\x00\x00\x01")
    (tmp_path / "empty.md").write_text("  \n")
    (tmp_path / "latin1.txt").write_bytes("café crème".encode("latin-1"))
    (tmp_path / "huge.txt").write_text("word " * 400)
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf at all")
    (tmp_path / "scripts.html").write_text("<script>only()</script>")
    report = ingest_paths(catalog, [tmp_path])
    assert [Path(p).name for p in report.added] == ["good.txt"]
    failed = {Path(p).name: e for p, e in report.failed}
    assert set(failed) == {
        "binary.txt",
        "empty.md",
        "latin1.txt",
        "huge.txt",
        "broken.pdf",
        "scripts.html",
    }
    assert "binary" in failed["binary.txt"].message
    assert "empty" in failed["empty.md"].message
    assert "not UTF-8" in failed["latin1.txt"].message and "iconv" in failed["latin1.txt"].hint
    assert "limit" in failed["huge.txt"].message and failed["huge.txt"].hint
    assert all(isinstance(e, DocumentError) for e in failed.values())
    assert catalog.stats()["documents"] == 1


def test_reingesting_an_unchanged_file_is_a_no_op(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    (tmp_path / "cats.txt").write_text(CATS)
    first = ingest_paths(catalog, [tmp_path])
    version = catalog.stats()["version"]
    chunks = catalog.document(str(tmp_path / "cats.txt"))["chunks"]
    again = ingest_paths(catalog, [tmp_path])
    assert first.added and again.unchanged == first.added and again.commits == 0
    assert catalog.stats()["version"] == version
    assert catalog.document(str(tmp_path / "cats.txt"))["chunks"] == chunks


def test_a_changed_file_replaces_its_chunks(tmp_path: Path, catalog: KnowledgeCatalog) -> None:
    path = tmp_path / "pets.txt"
    path.write_text(CATS)
    ingest_paths(catalog, [path])
    old = set(catalog.document(str(path))["chunks"])
    assert catalog.search("kittens", 1)[0].source == str(path)
    path.write_text(DOGS)
    report = ingest_paths(catalog, [path])
    assert report.replaced == [str(path)]
    new = set(catalog.document(str(path))["chunks"])
    assert new and not old & new
    assert catalog.search("kittens", 3, mode="lexical") == []
    assert catalog.search("puppies", 1)[0].source == str(path)
    assert catalog.stats()["chunks"] == len(new) == len(catalog.vectors)


def test_commits_are_batched_and_each_document_is_atomic(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure half-way through one document's chunks leaves nothing of it; the rest of
    its batch still commits, in one transaction."""
    long_dogs = " ".join([DOGS] * 6)
    for name, text in (("a_cats.txt", CATS), ("b_dogs.txt", long_dogs), ("c_birds.txt", BIRDS)):
        (tmp_path / name).write_text(text)
    monkeypatch.setenv("BATOS_CATALOG_CHUNK_TOKENS", "20")
    catalog.search("warm up the cache", 1)
    real = KnowledgeCatalog._index_chunk
    calls = {"dogs": 0}

    def crash_inside_dogs(self, cat, chunk, fmt):  # type: ignore[no-untyped-def]
        if chunk.source.endswith("b_dogs.txt"):
            calls["dogs"] += 1
            if calls["dogs"] == 3:
                raise RuntimeError("disk on fire")
        return real(self, cat, chunk, fmt)

    monkeypatch.setattr(KnowledgeCatalog, "_index_chunk", crash_inside_dogs)
    report = ingest_paths(catalog, [tmp_path])
    assert calls["dogs"] == 3  # two of its chunks had been indexed before the crash
    assert report.commits == 1
    assert sorted(Path(p).name for p in report.added) == ["a_cats.txt", "c_birds.txt"]
    [(path, error)] = report.failed
    assert path.endswith("b_dogs.txt") and "disk on fire" in error.message
    assert catalog.document(str(tmp_path / "b_dogs.txt")) is None
    assert catalog.search("puppies chew shoes", 5, mode="lexical") == []
    assert all(h.source != str(tmp_path / "b_dogs.txt") for h in catalog.search("dogs", 10))
    stored = {
        c
        for n in ("a_cats.txt", "c_birds.txt")
        for c in catalog.document(str(tmp_path / n))["chunks"]
    }
    assert set(catalog.vectors.ids().tolist()) == stored
    with catalog.image.read() as root:
        assert "b_dogs" not in " ".join(str(k) for k in root["catalog"]["fields"]["source"])


def test_ingest_text_and_oversized_batches_commit_in_several_transactions(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_CATALOG_COMMIT_CHUNKS", "1")
    for i, text in enumerate((CATS, DOGS, BIRDS)):
        (tmp_path / f"{i}.txt").write_text(text)
    report = ingest_paths(catalog, [tmp_path])
    assert len(report.added) == 3 and report.commits == 3
    assert ingest_text(catalog, "memo", "Penguins swim.") == "added"
    assert ingest_text(catalog, "memo", "Penguins swim.") == "unchanged"
    assert ingest_text(catalog, "memo", "Penguins dive.") == "replaced"
    with pytest.raises(DocumentError):
        ingest_text(catalog, "blank", "   ")


def test_a_byte_order_mark_over_bad_bytes_fails_alone_and_the_batch_keeps_the_rest(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    (tmp_path / "a_good.txt").write_text(CATS)
    (tmp_path / "b_bad16.txt").write_bytes(b"\xff\xfeabc")  # UTF-16 mark, odd byte count
    (tmp_path / "b_bad8.txt").write_bytes(b"\xef\xbb\xbfcaf\xe9")  # UTF-8 mark, Latin-1 byte
    (tmp_path / "c_good.txt").write_text(DOGS)
    report = ingest_paths(catalog, [tmp_path])
    assert sorted(Path(p).name for p in report.added) == ["a_good.txt", "c_good.txt"]
    failed = {Path(p).name: e for p, e in report.failed}
    assert set(failed) == {"b_bad16.txt", "b_bad8.txt"}
    assert "UTF-16 byte-order mark" in failed["b_bad16.txt"].message
    assert "UTF-8 byte-order mark" in failed["b_bad8.txt"].message
    assert all(isinstance(e, DocumentError) and e.hint for e in failed.values())
    assert report.commits == 1 and catalog.stats()["documents"] == 2


def test_any_pdf_parser_failure_is_that_files_error(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    # A mangled trailer makes pypdf raise AttributeError, outside its own exception tree.
    mangled = make_pdf("Penguins cannot fly.").replace(b"trailer\n<<", b"trailer\n<>><")
    (tmp_path / "a_mangled.pdf").write_bytes(mangled)
    (tmp_path / "b_good.pdf").write_bytes(make_pdf("Penguins cannot fly but swim very well."))
    (tmp_path / "c_good.txt").write_text(CATS)
    report = ingest_paths(catalog, [tmp_path])
    assert sorted(Path(p).name for p in report.added) == ["b_good.pdf", "c_good.txt"]
    [(path, error)] = report.failed
    assert path.endswith("a_mangled.pdf") and isinstance(error, DocumentError)
    assert "not a readable PDF" in error.message and error.hint
    assert catalog.document(str(tmp_path / "a_mangled.pdf")) is None


def test_a_missing_path_is_reported_like_any_bad_file(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    (tmp_path / "cats.txt").write_text(CATS)
    report = ingest_paths(catalog, [tmp_path / "nowhere.txt", tmp_path / "cats.txt"])
    assert report.added == [str(tmp_path / "cats.txt")]
    [(path, error)] = report.failed
    assert path == str(tmp_path / "nowhere.txt")
    assert error.message.startswith("no such file") and error.hint == "check the path"


def test_a_file_the_chunker_fails_on_is_reported_and_the_rest_committed(
    tmp_path: Path, memory_image: LivingImage
) -> None:
    """However the chunker breaks on one file's text, that file fails by name, with the
    reason; the others are ingested and committed."""

    class BrittleTokenizer(Embedder):
        def token_starts(self, text: str) -> np.ndarray:
            if "poison" in text:
                raise IndexError("list index out of range")
            return super().token_starts(text)

    for name, text in (("a.txt", CATS), ("b.txt", "A poison pill. " * 3), ("c.txt", DOGS)):
        (tmp_path / name).write_text(text)
    catalog = KnowledgeCatalog.open(memory_image, BrittleTokenizer(INT8))
    report = ingest_paths(catalog, [tmp_path])
    assert sorted(Path(p).name for p in report.added) == ["a.txt", "c.txt"]
    [(path, error)] = report.failed
    assert path == str(tmp_path / "b.txt") and isinstance(error, DocumentError)
    assert "b.txt could not be cut into chunks: IndexError: list index out of range" in (
        error.message
    )
    assert "report it" in error.hint
    assert report.commits == 1 and catalog.stats()["documents"] == 2


def test_a_debian_copyright_file_is_ingested(tmp_path: Path, catalog: KnowledgeCatalog) -> None:
    (tmp_path / "copyright").write_text(DEBIAN_COPYRIGHT)
    report = ingest_paths(catalog, [tmp_path])
    assert report.added == [str(tmp_path / "copyright")] and not report.failed
    [hit] = catalog.search("where is the complete text of the GPL on Debian", 1)
    assert hit.source == str(tmp_path / "copyright")
    assert DEBIAN_COPYRIGHT[hit.start : hit.end] == hit.text


def test_a_walk_reads_names_whose_last_dot_starts_a_version_or_a_word(tmp_path: Path) -> None:
    """Debian's licences and notes: "Apache-2.0", "README.Debian" are text with no suffix."""
    for name in ("Apache-2.0", "LGPL-2.1", "README.Debian", "notes.txt"):
        (tmp_path / name).write_text(f"The text of {name}.")
    for name in ("tool.so.6", "archive.Z", "data.json", "prog.1"):
        (tmp_path / name).write_bytes(b"\x7fELF\0\0" if name != "data.json" else b"{}")
    assert [p.name for p in expand([tmp_path])] == [
        "Apache-2.0",
        "LGPL-2.1",
        "README.Debian",
        "notes.txt",
    ]  # a binary one sniffed as ever, a real file type not in the list left out
    assert read_document(tmp_path / "README.Debian")[1] == "text"


def test_a_supported_type_is_read_as_such_however_its_suffix_is_capitalised(
    tmp_path: Path,
) -> None:
    """``Page.Html`` was read as text with no suffix, markup and scripts included, and a
    ``Spec.Pdf`` found in a folder was left out without a word."""
    (tmp_path / "Page.Html").write_text(
        "<html><body><p>Tides turn twice a day.</p><script>var token=1;</script></body></html>"
    )
    (tmp_path / "Spec.Pdf").write_bytes(make_pdf("Gears mesh at the pitch circle."))
    (tmp_path / "README.Debian").write_text("Notes for Debian.")
    assert [p.name for p in expand([tmp_path])] == ["Page.Html", "README.Debian", "Spec.Pdf"]
    text, kind, _ = read_document(tmp_path / "Page.Html")
    assert kind == "html" and "Tides turn" in text and "token" not in text
    assert "pitch circle" in read_document(tmp_path / "Spec.Pdf")[0]
    assert read_document(tmp_path / "README.Debian")[1] == "text"


def test_a_file_of_nothing_but_nul_bytes_is_binary_not_utf16(tmp_path: Path) -> None:
    (tmp_path / "zeros.txt").write_bytes(b"\0" * 10_000)  # a zeroed or sparse file
    with pytest.raises(DocumentError, match="looks binary") as info:
        read_document(tmp_path / "zeros.txt")
    assert "iconv" not in (info.value.hint or "")


@pytest.mark.parametrize(
    ("name", "data", "says", "hint"),
    [
        ("u16.txt", "Hello there.".encode("utf-16-le"), "UTF-16 text", "-f UTF-16LE"),
        ("u16be.txt", "Hello there.".encode("utf-16-be"), "UTF-16 text", "-f UTF-16BE"),
        ("changelog.Debian.gz", b"\x1f\x8b\x08\x00rest", "gzip-compressed", "zcat"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), "is not UTF-8", "iconv -f LATIN1"),
    ],
)
def test_a_text_in_another_form_is_refused_with_the_command_that_converts_it(
    tmp_path: Path, name: str, data: bytes, says: str, hint: str
) -> None:
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DocumentError, match=says) as info:
        read_document(tmp_path / name)
    assert hint in info.value.hint
    assert str(tmp_path) in info.value.hint.split(">")[-1]  # the copy goes beside the file


def test_a_stray_nul_past_the_sniffed_head_is_dropped_from_a_text(tmp_path: Path) -> None:
    (tmp_path / "log.txt").write_bytes(b"A" * 9000 + b"\0 tail text about iguanas.")
    text, _, _ = read_document(tmp_path / "log.txt")
    assert "\0" not in text and text.endswith("A tail text about iguanas.")


def test_a_pdf_whose_character_map_yields_lone_surrogates_is_ingested(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    """The tokenizer refuses lone surrogates: they become U+FFFD, the rest of the text stays."""
    path = tmp_path / "broken-map.pdf"
    path.write_bytes(make_pdf("Penguins swim. A broken map.", BROKEN_TO_UNICODE))
    text, fmt, _ = read_document(path)
    assert text == "Penguins swim. \ufffd broken map." and fmt == "pdf"
    report = ingest_paths(catalog, [path])
    assert report.added == [str(path)] and not report.failed
    assert catalog.search("penguins", 1)[0].source == str(path)
    assert ingest_text(catalog, "memo", "half a pair \ud83d here") == "added"
    assert catalog.chunk_texts("memo")[0][2] == "half a pair \ufffd here"


def test_pipes_links_in_a_loop_and_vanished_files_fail_alone(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    """Named files that are no regular file are refused without reading (a pipe would block
    the run for ever); a link loop and a file deleted after the listing are reported."""
    folder = tmp_path / "notes"
    folder.mkdir()
    for name, text in (("a.txt", CATS), ("b.txt", DOGS), ("c.txt", BIRDS)):
        (folder / name).write_text(text)
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    loop = tmp_path / "loop.txt"
    loop.symlink_to(tmp_path / "loop2.txt")
    (tmp_path / "loop2.txt").symlink_to(loop)

    listed = sorted(folder.iterdir())

    def files_deleting_b_once_a_is_read() -> Iterator[Path]:
        yield from (pipe, loop, listed[0])
        listed[1].unlink()  # after the listing, while the batch runs
        yield from listed[1:]

    report = ingest_paths(catalog, files_deleting_b_once_a_is_read())
    assert sorted(Path(p).name for p in report.added) == ["a.txt", "c.txt"]
    failed = {Path(p).name: e for p, e in report.failed}
    assert set(failed) == {"pipe.txt", "loop.txt", "b.txt"}
    assert "not a regular file" in failed["pipe.txt"].message
    assert "symbolic links" in failed["loop.txt"].message
    assert failed["b.txt"].message == f"no such file: {folder / 'b.txt'}"
    assert catalog.stats()["documents"] == 2


def test_a_walk_reports_documents_it_cannot_read_and_skips_what_is_no_document(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    """Inside a folder, an entry named as a document that is a dangling link, a link loop or a
    pipe fails by name (before, it went missing without a word); an entry with no suffix that
    is no regular file is no document and is left out, as a binary one is."""
    (tmp_path / "a.txt").write_text(CATS)
    (tmp_path / "gone.txt").symlink_to(tmp_path / "moved-away.txt")
    (tmp_path / "loop.md").symlink_to(tmp_path / "loop2.md")
    (tmp_path / "loop2.md").symlink_to(tmp_path / "loop.md")
    os.mkfifo(tmp_path / "pipe.txt")
    os.mkfifo(tmp_path / "control")
    (tmp_path / "README").symlink_to(tmp_path / "nowhere")
    report = ingest_paths(catalog, [tmp_path])
    assert report.added == [str(tmp_path / "a.txt")]
    failed = {Path(p).name: e.message for p, e in report.failed}
    assert set(failed) == {"gone.txt", "loop.md", "loop2.md", "pipe.txt"}
    assert failed["gone.txt"] == (
        f"{tmp_path / 'gone.txt'} is a link to {tmp_path / 'moved-away.txt'}, which does not exist"
    )
    assert "symbolic links" in failed["loop.md"]
    assert "not a regular file" in failed["pipe.txt"]


def test_an_unreadable_file_and_an_unlistable_folder_are_reported_by_name(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    (tmp_path / "a.txt").write_text(CATS)
    (tmp_path / "locked.txt").write_text(DOGS)
    (tmp_path / "locked.txt").chmod(0)
    try:
        (tmp_path / "locked.txt").read_bytes()
    except PermissionError:
        pass
    else:
        pytest.skip("this process reads files whatever their permissions (root)")
    (tmp_path / "closed").mkdir()
    (tmp_path / "closed" / "inside.txt").write_text(BIRDS)
    (tmp_path / "closed").chmod(0)
    try:
        report = ingest_paths(catalog, [tmp_path])
    finally:
        (tmp_path / "closed").chmod(0o755)
    assert report.added == [str(tmp_path / "a.txt")]
    failed = {Path(p).name: e for p, e in report.failed}
    assert set(failed) == {"locked.txt", "closed"}
    assert all(
        "Permission denied" in e.message and "permissions" in e.hint for e in failed.values()
    )


def test_a_chunk_budget_below_the_minimum_is_refused_before_any_file(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_CATALOG_CHUNK_TOKENS", str(MIN_TOKENS - 1))
    (tmp_path / "a.txt").write_text(CATS)
    with pytest.raises(ConfigurationError, match="BATOS_CATALOG_CHUNK_TOKENS") as info:
        ingest_paths(catalog, [tmp_path])
    assert "8 to 254" in str(info.value)
    assert catalog.stats()["documents"] == 0


# -- commits by time, encoders ---------------------------------------------------------


def test_commits_come_every_few_seconds_of_work_and_a_crash_keeps_whole_documents(
    tmp_path: Path, memory_image: LivingImage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the commit interval shorter than one file's work, every file commits on its own;
    a model failure on the third leaves the first two whole and nothing of the third."""
    monkeypatch.setenv("BATOS_CATALOG_COMMIT_SECONDS", "0.000001")
    for name, text in (("a.txt", CATS), ("b.txt", DOGS), ("c.txt", BIRDS)):
        (tmp_path / name).write_text(text)

    class FailingThirdTime(Embedder):
        calls = 0

        def encode_units(self, texts, units):  # type: ignore[no-untyped-def]
            FailingThirdTime.calls += 1
            if FailingThirdTime.calls == 3:
                raise RuntimeError("the model process died")
            return super().encode_units(texts, units)

    catalog = KnowledgeCatalog.open(memory_image, FailingThirdTime(INT8))
    with pytest.raises(RuntimeError, match="model process died"):
        ingest_paths(catalog, [tmp_path])
    assert catalog.stats()["documents"] == 2
    assert catalog.document(str(tmp_path / "c.txt")) is None
    for name in ("a.txt", "b.txt"):
        stored = catalog.chunk_texts(str(tmp_path / name))
        assert " ".join(t for _, _, t in stored) == (tmp_path / name).read_text()
    report = ingest_paths(catalog, [tmp_path])  # the run picks up where it stopped
    assert report.added == [str(tmp_path / "c.txt")] and report.commits == 1
    assert len(report.unchanged) == 2


def test_the_int8_encoder_is_the_same_model_and_chunk_vectors_are_real_encodings() -> None:
    """int8 vectors stay close to float32 ones; each chunk's vector — a cut part's too — is
    what encoding that chunk's text alone gives."""
    int8, float32 = Embedder(INT8), Embedder(FLOAT32)
    texts = [CATS, DOGS, BIRDS]
    assert ((int8.encode(texts) * float32.encode(texts)).sum(axis=1) > 0.97).all()
    cats = (
        "Cats are small domesticated carnivores. They sleep for most of the day. A cat purrs "
        "when it is content. Kittens learn to hunt by playing with their siblings."
    )
    physics = (
        "Quantum mechanics describes nature at the scale of atoms. The wave function gives "
        "the probabilities of measurement outcomes. Entanglement links distant particles."
    )
    for embedder in (int8, float32):
        pieces, vectors = chunk_and_embed(f"{cats} {physics}", embedder, max_tokens=250)
        assert [p.text for p in pieces] == [cats, physics]  # one packed chunk, cut in two
        alone = embedder.encode([p.text for p in pieces])
        assert np.allclose(vectors, alone, atol=1e-4)


def test_a_catalog_keeps_the_encoder_its_vectors_came_from(
    memory_image: LivingImage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_CATALOG_ENCODER", "minilm-int8")
    catalog = KnowledgeCatalog.open(memory_image)
    assert catalog.embedder.encoder == INT8
    ingest_text(catalog, "cats", CATS)
    mixed = KnowledgeCatalog.open(memory_image, Embedder(FLOAT32))
    with pytest.raises(CatalogError, match="minilm-int8 encoder"):
        mixed.search("purring", 1)
    with pytest.raises(CatalogError, match="minilm-int8 encoder"):
        ingest_text(mixed, "dogs", DOGS)
    assert catalog.stats()["documents"] == 1
    assert mixed.search("purr", 1, mode="lexical")[0].source == "cats"  # no vectors used
    monkeypatch.setenv("BATOS_CATALOG_ENCODER", "minilm-float32")
    assert KnowledgeCatalog.open(memory_image).embedder.encoder == INT8  # the record wins


def test_an_image_from_before_encoder_records_keeps_float32(memory_image: LivingImage) -> None:
    catalog = KnowledgeCatalog.open(memory_image, Embedder(FLOAT32))
    ingest_text(catalog, "cats", CATS)

    def forget(root):  # type: ignore[no-untyped-def]
        del root["catalog"]["encoder"]
        del root["schema"]["catalog-3"]

    memory_image.transact(forget)
    reopened = KnowledgeCatalog.open(laid_out(memory_image))  # as the runtime opens it
    assert reopened.embedder.encoder == FLOAT32
    assert reopened.search("purring", 1, mode="dense")[0].source == "cats"


@pytest.mark.parametrize(
    ("metadata", "said"),
    [
        ({"source": "elsewhere"}, "the catalog sets itself"),
        ({"kind": "summary"}, "the catalog sets itself"),
        ({"topic": ["a", "b"]}, "holds a list"),
        ({"topic": {"a": 1}}, "holds a dict"),
        ({"topic": None}, "holds a NoneType"),
        ({5: "x"}, "is not a name"),
        ({"": "x"}, "is not a name"),
        ({"n" * 65: "x"}, "is not a name"),
        ({"topic": "x" * 1001}, "1,001 characters"),
        ({f"f{i}": i for i in range(33)}, "33 fields"),
        ({"weight": float("nan")}, "nan, not a number a filter can use"),
        ({"weight": float("-inf")}, "-inf, not a number a filter can use"),
        ({"size": 10**5000}, "an integer of 16,610 bits"),
        ("topic=cats", "must be a mapping"),
    ],
)
def test_metadata_a_search_could_never_filter_by_is_refused_before_anything_is_read(
    catalog: KnowledgeCatalog, tmp_path: Path, metadata, said: str
) -> None:
    """The Python API holds the rules the command line's --meta does: each value is indexed
    for search filters, so what could not be indexed (or would be hidden) is refused."""
    page = tmp_path / "page.txt"
    page.write_text("Newts are small amphibians that live near ponds.")
    with pytest.raises(CatalogError, match=said) as info:
        ingest_text(catalog, "mem://newts", page.read_text(), metadata=metadata)
    assert info.value.hint
    with pytest.raises(CatalogError, match=said):
        ingest_paths(catalog, [page], metadata=metadata)
    assert catalog.document("mem://newts") is None and catalog.stats()["documents"] == 0


def test_scalar_metadata_of_every_kind_is_kept_and_filters(catalog: KnowledgeCatalog) -> None:
    given = {"topic": "newts", "year": 2024, "weight": 0.5, "reviewed": True}
    assert ingest_text(catalog, "mem://n", "Newts live near ponds.", metadata=given) == "added"
    assert catalog.document("mem://n")["metadata"] == given
    assert [h.source for h in catalog.search("newts", filters={"year": 2024})] == ["mem://n"]


def test_fields_added_run_by_run_are_bounded_together(catalog: KnowledgeCatalog) -> None:
    half = {f"a{i}": i for i in range(20)}
    assert ingest_text(catalog, "mem://n", "Newts live near ponds.", metadata=half) == "added"
    more = {f"b{i}": i for i in range(20)}
    with pytest.raises(DocumentError, match="would have 40 metadata fields"):
        ingest_text(catalog, "mem://n", "Newts live near ponds.", metadata=more)
    assert catalog.document("mem://n")["metadata"] == half


def test_a_long_round_of_embedding_is_announced_before_it_runs(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store.knowledge import ingest

    monkeypatch.setattr(ingest, "LONG_ROUND", 1)  # a large document's round, in miniature
    (tmp_path / "big.txt").write_text("Newts live near ponds. " * 40)
    notes: list[str] = []
    report = ingest_paths(catalog, [tmp_path / "big.txt"], on_note=notes.append)
    assert report.added and notes and notes[0].startswith("embedding ")
    assert "(most from big.txt)" in notes[0]


def test_files_before_a_large_document_are_committed_before_its_long_round(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large document embedded for minutes held back the commit of every small file read
    before it in the same interval: a kill then lost them all, and nothing was said of them."""
    from store.knowledge import ingest

    monkeypatch.setattr(ingest, "LONG_ROUND", 8)  # a large document's round, in miniature
    monkeypatch.setenv("BATOS_CATALOG_COMMIT_SECONDS", "3600")
    (tmp_path / "small.txt").write_text(DOGS)
    (tmp_path / "big.txt").write_text("Newts live near ponds and hunt at dusk. " * 300)
    events: list[str] = []
    report = ingest_paths(
        catalog,
        [tmp_path / "small.txt", tmp_path / "big.txt"],
        on_file=lambda path, outcome, _: events.append(f"{path.name} {outcome}"),
        on_note=lambda note: events.append("note"),
    )
    assert events == ["small.txt added", "note", "big.txt added"]
    assert report.commits == 2


def test_a_folder_tree_deeper_than_the_recursion_limit_is_walked(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    """os.walk recursed once per level: a tree a thousand folders deep ended the run with a
    RecursionError, and the paths named after it were never read."""
    import sys

    deep = folder = tmp_path / "deep"
    deep.mkdir()
    bottom = deep / "bottom.txt"
    (tmp_path / "after.txt").write_text(DOGS)
    try:
        for _ in range(sys.getrecursionlimit() + 100):
            folder = folder / "d"
            folder.mkdir()  # one level at a time: mkdir(parents=True) recurses too
        bottom = folder / "bottom.txt"
        bottom.write_text(CATS)
        report = ingest_paths(catalog, [deep, tmp_path / "after.txt"])
    finally:
        # pytest's clean-up (shutil.rmtree) recurses per level too, and a tree left behind
        # ends a later session with a RecursionError: undo it here, however far it got
        bottom.unlink(missing_ok=True)
        while folder != deep:
            folder.rmdir()
            folder = folder.parent
    assert report.added == [str(bottom), str(tmp_path / "after.txt")]
    assert not report.failed


def test_a_pdf_whose_text_outgrows_the_size_limit_fails_at_that_page(tmp_path: Path) -> None:
    """The byte limit bounds the file; a small PDF whose pages all draw one stream holds many
    times its size in text. Extraction stops on the page that passes the limit (in
    characters), not after every page."""
    pdf = tmp_path / "shared.pdf"
    pdf.write_bytes(make_shared_stream_pdf(pages=400, lines=40))
    size = pdf.stat().st_size
    assert size < 100_000
    text, _, _ = read_document(pdf, max_bytes=10**7)  # within a larger limit, all is read
    assert len(text) > 600_000
    with pytest.raises(DocumentError) as info:
        read_document(pdf, max_bytes=100_000)
    stopped = int(info.value.message.split("stopped at page ")[1].split(" ")[0])
    assert stopped == 100_000 // (len(text) // 400) + 1
    assert "of 400" in info.value.message and "100,000 characters" in info.value.message
    assert "BATOS_CATALOG_MAX_BYTES" in info.value.hint


@pytest.mark.parametrize(
    "shape",
    [
        {"pages": 100, "draws": 0},  # 100 pages drawing one stream
        {"pages": 1, "draws": 100},  # a form drawn 100 times by the page
        {"pages": 1, "draws": 100, "nested": True},  # ... by a form the page draws
    ],
    ids=["shared-stream", "form", "nested-form"],
)
def test_a_pdf_whose_drawing_costs_more_than_its_cpu_seconds_fails_in_that_time(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch, shape: dict
) -> None:
    """A file of kilobytes whose one line of text a page sits among megabytes of no-op
    operators, drawn again and again: pypdf parsed such files for hours. Its reader runs in a
    process of its own held to ``catalog_pdf_seconds`` of CPU; the run goes on."""
    monkeypatch.setenv("BATOS_CATALOG_PDF_SECONDS", "1")
    pdf = tmp_path / "a_drawn.pdf"
    pdf.write_bytes(make_drawing_pdf(nops=25_000, **shape))  # 100 KB drawn 100 times
    assert pdf.stat().st_size < 200_000
    (tmp_path / "b.txt").write_text(CATS)
    began = time.monotonic()
    report = ingest_paths(catalog, [tmp_path])
    assert time.monotonic() - began < 30  # 1 s of CPU, the grace, and b.txt
    [(path, error)] = report.failed
    assert path == str(pdf)
    assert "took more than 1 s of CPU to read" in error.message
    assert "BATOS_CATALOG_PDF_SECONDS" in error.hint
    assert report.added == [str(tmp_path / "b.txt")]


def test_a_pdf_drawn_a_few_times_is_read_in_its_own_process(tmp_path: Path) -> None:
    pdf = tmp_path / "forms.pdf"
    pdf.write_bytes(make_drawing_pdf(pages=1, draws=3, nops=2_500, nested=True))
    assert read_document(pdf)[0] == "Penguins swim."
    shared = tmp_path / "shared.pdf"
    shared.write_bytes(make_drawing_pdf(pages=6, draws=0, nops=2_500))
    assert read_document(shared)[0].count("Penguins swim.") == 6


def test_a_pdf_that_needs_more_memory_than_its_reader_may_take_fails_alone(
    tmp_path: Path,
) -> None:
    """A stream of 60 MB of zeros is 60 KB compressed: decoding it in the ingesting process
    took its memory; the reader's process may map ``catalog_pdf_memory_mb`` more than the
    ingesting one has. A fresh process reads it here: memory an older one freed but still
    maps would be the reader's too."""
    pdf = tmp_path / "bomb.pdf"
    pdf.write_bytes(make_deflated_pdf(b"\0" * 60_000_000))
    assert pdf.stat().st_size < 100_000
    script = (
        "import sys; from pathlib import Path\n"
        "from batos.errors import DocumentError\n"
        "from store.knowledge.ingest import read_document\n"
        "try:\n    print(repr(read_document(Path(sys.argv[1]))[0]))\n"
        "except DocumentError as exc:\n    print(exc.message, '|', exc.hint)\n"
    )
    root = str(Path(__file__).resolve().parents[1])
    said = {}
    for memory in ["40", "2048"]:
        env = {**os.environ, "PYTHONPATH": root, "BATOS_CATALOG_PDF_MEMORY_MB": memory}
        done = subprocess.run(
            [sys.executable, "-c", script, str(pdf)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        said[memory] = done.stdout.strip()
    assert "memory" in said["40"] and "BATOS_CATALOG_PDF_MEMORY_MB" in said["40"], said
    assert said["2048"] == "'Penguins swim.'"


@pytest.mark.parametrize(
    ("report", "status", "says"),
    [
        (b"T" + "é".encode() * 11, 0, "gave more text than it may hold"),  # 11 > limit 10
        (b"Xanything", 0, "its reader stopped (exit status 0)"),
        (b"", 9, "its reader stopped (signal SIGKILL)"),
        (b"T" + b"fine", 9, "its reader stopped (signal SIGKILL)"),  # killed after writing
        (b"E" + b"unreadable\n" + b"x" * 5000, 0, "is not a readable PDF: xxx"),
        (b"T\xff\xfe not UTF-8", 0, "its reader sent back no text"),
        (b"", 63, "its reader stopped (signal 63)"),
    ],
)
def test_what_a_pdfs_reader_sends_back_is_checked_before_it_is_used(
    report: bytes, status: int, says: str
) -> None:
    """The reader's process ran hostile input: its report is bytes, bounded, and a text is
    taken only from a process that exited cleanly, within the character limit."""
    from store.knowledge import pdf

    code = status if status else 0  # a raw wait status: a signal number, or exit code << 8
    with pytest.raises(DocumentError, match=re.escape(says)) as info:
        pdf._outcome("f.pdf", report, False, code, 10, 300.0, 2048)
    assert len(info.value.message) < 600


def test_files_of_proc_and_sys_are_refused_before_they_are_opened(
    tmp_path: Path, catalog: KnowledgeCatalog
) -> None:
    """/etc/mtab is /proc/self/mounts, which names this process's folder: each run stored it
    again under a new name. /proc/kmsg is consumed by reading it. Neither is a document."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text(CATS)
    (folder / "mounts").symlink_to("/proc/self/mounts")  # no suffix: it would be sniffed
    (folder / "status.txt").symlink_to("/proc/self/status")
    named = [folder, Path("/proc/self/status"), Path("/proc"), Path("/sys/kernel")]
    files = list(expand(named))
    assert files == [
        folder / "a.txt",
        folder / "mounts",
        folder / "status.txt",
        Path("/proc/self/status"),
        Path("/proc"),  # not walked
        Path("/sys/kernel"),
    ]
    report = ingest_paths(catalog, files)
    assert report.added == [str(folder / "a.txt")]
    assert [Path(p).name for p, _ in report.failed] == [
        "mounts",
        "status.txt",
        "status",
        "proc",
        "kernel",
    ]
    for _, error in report.failed:
        assert "in the kernel" in error.message and "snapshot.txt" in error.hint
    assert f"(mounted at /proc; it is /proc/{os.getpid()}/mounts)" in report.failed[0][1].message
    assert catalog.document(str(folder / "a.txt")) is not None


def test_an_unchanged_file_is_told_by_its_bytes_before_its_text_is_extracted(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run over a folder already ingested read every PDF's text again to find it
    unchanged; the hash of the file's bytes is compared first."""
    (tmp_path / "a.pdf").write_bytes(make_pdf("Penguins cannot fly but swim very well."))
    (tmp_path / "b.txt").write_text(CATS)
    assert len(ingest_paths(catalog, [tmp_path]).added) == 2
    (tmp_path / "b.txt").write_text(DOGS)
    extracted: list[str] = []
    real = ingest_module._extract

    def extract(path: Path, *args: object, **options: object) -> object:
        extracted.append(path.name)
        return real(path, *args, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(ingest_module, "_extract", extract)
    report = ingest_paths(catalog, [tmp_path])
    assert report.unchanged == [str(tmp_path / "a.pdf")]
    assert report.replaced == [str(tmp_path / "b.txt")]
    assert extracted == ["b.txt"]


@pytest.mark.parametrize("emptied", [b"", b"<html><script>x=1</script></html>"])
def test_a_file_emptied_since_it_was_ingested_says_its_old_text_is_kept_and_how_to_drop_it(
    tmp_path: Path, catalog: KnowledgeCatalog, emptied: bytes
) -> None:
    page = tmp_path / "page.html"
    page.write_text(f"<p>{CATS}</p>")
    assert ingest_paths(catalog, [page]).added == [str(page)]
    page.write_bytes(emptied)
    report = ingest_paths(catalog, [page])
    [(_, error)] = report.failed
    assert "earlier text is still in the catalog" in error.message
    assert f"'batos forget {page}' removes it" in error.message
    assert catalog.document(str(page)) is not None
    fresh = tmp_path / "new.html"  # never ingested: no word of an earlier text
    fresh.write_bytes(emptied)
    [(_, error)] = ingest_paths(catalog, [fresh]).failed
    assert "earlier text" not in error.message


@pytest.mark.parametrize("commit_seconds", ["3", "0.000001"], ids=["one-round", "round-each"])
def test_files_of_the_same_bytes_are_embedded_once_and_stored_under_each_name(
    tmp_path: Path,
    catalog: KnowledgeCatalog,
    monkeypatch: pytest.MonkeyPatch,
    commit_seconds: str,
) -> None:
    """Debian's copyright files repeat the same licences: 200 of them held 112 distinct texts,
    and each copy was cut and embedded again. A copy waiting with its original, or coming
    after the original was embedded and written, takes its chunks and vectors."""
    monkeypatch.setenv("BATOS_CATALOG_COMMIT_SECONDS", commit_seconds)
    for name, text in [
        ("a.txt", CATS),
        ("b.txt", DOGS),
        ("c.txt", CATS),
        ("d.md", CATS),  # the same bytes read as Markdown: its own document
        ("e.txt", CATS),
    ]:
        (tmp_path / name).write_text(text)
    encoded: list[str] = []
    real = catalog.embedder.encode_units

    def encode_units(texts: list[str], spans: object) -> object:
        encoded.extend(texts)
        return real(texts, spans)  # type: ignore[arg-type]

    monkeypatch.setattr(catalog.embedder, "encode_units", encode_units)
    report = ingest_paths(catalog, [tmp_path], metadata={"shelf": "pets"})
    assert [Path(p).name for p in report.added] == ["a.txt", "b.txt", "c.txt", "d.md", "e.txt"]
    assert sorted(encoded) == sorted([CATS, DOGS, CATS])  # a, b and d; not c or e
    first = catalog.document(str(tmp_path / "a.txt"))
    for name in ["c.txt", "e.txt"]:
        twin = catalog.document(str(tmp_path / name))
        assert twin is not None and first is not None
        assert twin["content_hash"] == first["content_hash"]
        assert twin["metadata"] == {"shelf": "pets"}
    sources = {hit.source for hit in catalog.search("kittens purr", k=10)}
    assert {str(tmp_path / n) for n in ["a.txt", "c.txt", "d.md", "e.txt"]} <= sources


def test_a_twin_of_a_document_already_written_is_written_on_the_runs_schedule(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of a document embedded earlier in the run waited for some other file's round
    (or the run's end): lost to a Ctrl-C, and the progress stood still meanwhile."""
    monkeypatch.setenv("BATOS_CATALOG_COMMIT_SECONDS", "0.000001")
    for name, text in [("a.txt", CATS), ("b.txt", CATS), ("c.txt", DOGS)]:
        (tmp_path / name).write_text(text)
    told: list[str] = []

    def paths() -> Iterator[Path]:
        yield tmp_path / "a.txt"
        yield tmp_path / "b.txt"
        assert told == ["a.txt", "b.txt"]  # b written before c is even read
        yield tmp_path / "c.txt"

    report = ingest_paths(catalog, paths(), on_file=lambda p, _o, _r: told.append(p.name))
    assert report.added == [str(tmp_path / n) for n in ["a.txt", "b.txt", "c.txt"]]


def test_a_kernel_file_system_is_told_by_its_mount_wherever_it_is_mounted(
    tmp_path: Path, catalog: KnowledgeCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bind mount of /proc under another name, or /proc met while walking a folder above
    it (a container's root), is neither opened nor walked: it fails by name."""
    root = tmp_path / "root"
    (root / "proc" / "1").mkdir(parents=True)
    (root / "proc" / "1" / "status").write_text("Name: init")
    (root / "notes.txt").write_text(CATS)
    mounted = str(root / "proc")
    table = [(mounted, "proc"), ("/", "ext4")]
    monkeypatch.setattr(ingest_module, "_mount_table", lambda: table)
    assert list(expand([root])) == [root / "notes.txt", root / "proc"]
    report = ingest_paths(catalog, [root, root / "proc" / "1" / "status"])
    assert report.added == [str(root / "notes.txt")]
    assert [Path(p).name for p, _ in report.failed] == ["proc", "status"]
    for _, error in report.failed:
        assert f"in the kernel's proc file system (mounted at {mounted})" in error.message


def test_a_pdfs_reader_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A kill -9 of the ingesting process left its PDF reader running for up to its CPU
    limit (five minutes by default)."""
    pdf = tmp_path / "slow.pdf"
    pdf.write_bytes(make_drawing_pdf(pages=400, draws=0, nops=25_000))  # a minute or more
    script = (
        "import sys; from pathlib import Path\n"
        "from store.knowledge.ingest import read_document\n"
        "read_document(Path(sys.argv[1]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with subprocess.Popen([sys.executable, "-c", script, str(pdf)], env=env) as host:
        children = Path(f"/proc/{host.pid}/task/{host.pid}/children")
        reader = 0
        for _ in range(300):
            found = children.read_text().split() if children.exists() else []
            if found:
                reader = int(found[0])
                break
            time.sleep(0.1)
        assert reader, "the reader's process never started"
        host.kill()
        host.wait(timeout=30)
    for _ in range(100):
        try:
            state = Path(f"/proc/{reader}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":  # dead, waiting for whoever adopted it to reap it
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the reader {reader} outlived its host")
