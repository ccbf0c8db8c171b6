"""Ingestion: files in, documents of the knowledge catalog out — per file all or nothing.

Text, Markdown, HTML and PDF are read and packed into chunks outside any transaction; the
chunks of several documents are embedded together (one model batch sorted by length pads
little), and prepared documents are written one commit every ``catalog_commit_seconds`` of work
or ``catalog_commit_chunks`` chunks, whichever comes first — so a kill loses a few seconds —
each document inside its own savepoint so a failing one leaves no trace and the rest of its
batch still commits. An unchanged file (same content hash) is skipped; a changed one replaces
its chunks and drops the curator's summaries of its old text. A file that cannot be read
(missing, unreadable, no regular file, not UTF-8, a PDF the parser fails on, too large) or
cut into chunks gets a ``DocumentError`` naming it in the report, and the batch goes on.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import os
import re
import shlex
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
from transaction.interfaces import TransientError

from batos import settings
from batos.errors import BatosError, ConfigurationError, DocumentError
from store.core.text import well_formed
from store.knowledge.catalog import (
    MAX_FIELDS,
    Change,
    KnowledgeCatalog,
    PreparedDocument,
    catalog_root,
    check_metadata,
)
from store.knowledge.chunking import MIN_TOKENS, Plan, finish, plan
from store.knowledge.curator import unfold
from store.knowledge.pdf import pdf_text, reason

log = logging.getLogger("batos.ingest")

TEXT_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".rst", ""}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_SUFFIXES = {".pdf"}
SUPPORTED = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES
#: Bytes read from the start of a file to tell text from a program or an archive (a NUL byte
#: among them means binary, as git and grep tell).
SNIFF_BYTES = 8192
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


@dataclass
class IngestReport:
    """What one ingest run did, file by file."""

    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    failed: list[tuple[str, DocumentError]] = field(default_factory=list)
    chunks: int = 0
    commits: int = 0
    #: Bytes of files read (unchanged ones too) and seconds since the start.
    bytes: int = 0
    seconds: float = 0.0

    @property
    def files(self) -> int:
        """Files dealt with so far, whatever the outcome."""
        return len(self.added) + len(self.replaced) + len(self.unchanged) + len(self.failed)


#: Most chunks embedded together: one model batch of documents' chunks, sorted by length.
#: Fewer when the measured rate says a round would hold back the next commit.
ENCODE_CHUNKS = 64
#: Chunks of the first round, before any rate is known: small, so the first commit comes soon.
FIRST_ROUND = 16


# -- reading ----------------------------------------------------------------------------


def read_document(path: Path, *, max_bytes: int | None = None) -> tuple[str, str, str]:
    """(text, format, content hash) of one file, or a ``DocumentError`` saying what is wrong."""
    limit = max_bytes if max_bytes is not None else settings.get_int("catalog_max_bytes")
    _not_pseudo(path)
    data = _read_bytes(path, limit)
    text, fmt = _extract(path, data, limit)
    return text, fmt, _content_hash(data)


def _format(path: Path) -> str:
    """How a file is read, by its name: "pdf", "html", "markdown" or "text"."""
    suffix = file_type(path.name)
    if suffix in PDF_SUFFIXES:
        return "pdf"
    if suffix in HTML_SUFFIXES:
        return "html"
    return "markdown" if suffix in {".md", ".markdown"} else "text"


def _content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _extract(path: Path, data: bytes, limit: int, *, known: bool = False) -> tuple[str, str]:
    """(text, format) of a file's bytes. ``known``: the catalog holds an earlier text of it,
    which a file with no text left does not replace (the error says how to remove it)."""
    kept = (
        "; its earlier text is still in the catalog "
        f"('batos forget {shlex.quote(str(path))}' removes it)"
    )
    if not data.strip():
        raise DocumentError(
            f"{path} is empty{kept if known else ''}",
            hint="nothing to ingest; remove it from the list",
        )
    fmt = _format(path)
    if fmt == "pdf":
        text = pdf_text(str(path), data, limit)
    elif fmt == "html":
        text = _html_text(path, _decode(path, data, html=True))
    else:
        text = _decode(path, data)
    text = well_formed(text)
    if not text.strip():
        raise DocumentError(
            f"{path} has no text to index{kept if known else ''}",
            hint="a scanned PDF needs OCR first; an HTML page may carry only scripts",
        )
    return text, fmt


#: Kernel file systems: their files are made as they are read (/proc/kmsg is consumed by the
#: read) and /proc/self names another process's folder on each run, so a document read from
#: one would change under its own name or come back under a new name every time. Told by the
#: type of the file system a path lies in, wherever it is mounted (a bind mount of /proc).
PSEUDO_TYPES = frozenset(
    {
        "proc",
        "sysfs",
        "debugfs",
        "tracefs",
        "securityfs",
        "cgroup",
        "cgroup2",
        "configfs",
        "pstore",
        "bpf",
        "efivarfs",
        "fusectl",
        "binfmt_misc",
        "devpts",
        "mqueue",
    }
)
#: Seconds the mount table is kept between reads (a folder's walk asks for every entry).
_MOUNTS_SECONDS = 2.0
_mounts: tuple[float, list[tuple[str, str]]] = (-_MOUNTS_SECONDS, [])


def _mount_table() -> list[tuple[str, str]]:
    """(mount point, file system type) of this process's mounts, longest mount point first;
    /proc and /sys alone where the table cannot be read."""
    global _mounts
    read_at, table = _mounts
    if time.monotonic() - read_at < _MOUNTS_SECONDS:
        return table
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as lines:
            table = []
            for line in lines:
                fields, _, after = line.partition(" - ")
                parts = fields.split(" ")
                if len(parts) >= 5 and after:
                    point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), parts[4])
                    table.append((point, after.split(" ", 1)[0]))
    except OSError:
        table = [("/proc", "proc"), ("/sys", "sysfs")]
    table.sort(key=lambda mount: -len(mount[0]))
    _mounts = (time.monotonic(), table)
    return table


def _is_pseudo(path: Path) -> tuple[str, str] | None:
    """(mount point, type) of the kernel file system ``path`` lies in once links are
    resolved, or None."""
    real = os.path.realpath(path)
    for point, kind in _mount_table():
        if real == point or real.startswith(point.rstrip("/") + "/"):
            return (point, kind) if kind in PSEUDO_TYPES else None
    return None


def _not_pseudo(path: Path) -> None:
    """A ``DocumentError`` for a file of /proc or /sys (a link to one included), before it is
    opened."""
    mount = _is_pseudo(path)
    if mount is None:
        return
    real = os.path.realpath(path)
    where = "" if str(path) == real else f"; it is {real}"
    raise DocumentError(
        f"{path} is in the kernel's {mount[1]} file system (mounted at {mount[0]}{where}): "
        "its text is made as it is read and is not a document",
        hint=f"save what you want to keep to a file first (cat {shlex.quote(str(path))} > "
        "snapshot.txt) and ingest that",
    )


def _read_bytes(path: Path, limit: int) -> bytes:
    """The bytes of a regular file, at most ``limit`` of them however the file grows meanwhile.

    Opened without blocking and checked on the open descriptor: a pipe or a device named
    among the files would otherwise hang the run, or read without end.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if path.is_symlink():
            raise DocumentError(
                f"{path} is a link to {_echo_link(path)}, which does not exist",
                hint="mend the link or remove it",
            ) from None
        raise DocumentError(f"no such file: {path}", hint="check the path") from None
    except PermissionError as exc:
        raise DocumentError(
            f"cannot read {path}: {exc.strerror or exc}",
            hint="check its permissions (ls -l), or run as a user who may read it",
        ) from None
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise DocumentError(
                    f"{path} is not a regular file (a folder, pipe, socket or device)",
                    hint="ingest files, or folders to walk for them",
                )
            if info.st_size > limit:
                raise _too_large(path, info.st_size, limit)
            data = handle.read(limit + 1)
        except OSError as exc:
            raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise _too_large(path, len(data), limit)
    return data


def _echo_link(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "a missing file"


def _too_large(path: Path, size: int, limit: int) -> DocumentError:
    return DocumentError(
        f"{path} is {size:,} bytes, over the {limit:,}-byte limit",
        hint="split it, or raise BATOS_CATALOG_MAX_BYTES",
    )


#: An HTML page's declared encoding: ``<meta charset="…">`` or the http-equiv form, which
#: the HTML standard looks for in the first 1,024 bytes.
_META_CHARSET = re.compile(
    rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]{1,40})""", re.I
)


def _declared_charset(data: bytes) -> str | None:
    """The codec an HTML page declares, when Python knows it (None otherwise)."""
    found = _META_CHARSET.search(data[:1024])
    if found is None:
        return None
    try:
        return codecs.lookup(found.group(1).decode("ascii")).name
    except LookupError:
        return None


def _decode(path: Path, data: bytes, *, html: bool = False) -> str:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as exc:
                raise DocumentError(
                    f"{path} starts with a {encoding.removesuffix('-sig').upper()} byte-order "
                    f"mark but is not valid {encoding.removesuffix('-sig').upper()} "
                    f"(bad bytes at offset {exc.start}: {exc.reason})",
                    hint="the file is damaged or mislabelled; re-export it as UTF-8",
                ) from None
    head = data[:SNIFF_BYTES]
    if head.startswith(b"\x1f\x8b"):  # gzip, as Debian keeps changelogs
        plain = path.with_suffix("") if path.suffix == ".gz" else path.with_name(path.name + ".txt")
        raise DocumentError(
            f"{path} is gzip-compressed",
            hint=f"uncompress it first: zcat {shlex.quote(str(path))} > {shlex.quote(str(plain))}",
        )
    if b"\x00" in head:
        odd, even = head[1::2], head[0::2]
        utf16 = odd.count(0) > len(odd) * 0.9 or even.count(0) > len(even) * 0.9
        # nothing but NULs (a zeroed or sparse file) is no text in any encoding
        if head.strip(b"\x00") and utf16:
            # text in UTF-16 with no byte-order mark: every other byte of ASCII is a NUL
            endian = "LE" if odd.count(0) > even.count(0) else "BE"
            raise DocumentError(
                f"{path} looks like UTF-16 text with no byte-order mark",
                hint=f"convert it first: iconv -f UTF-16{endian} -t UTF-8 "
                f"{shlex.quote(str(path))} > {shlex.quote(str(_converted(path)))}",
            )
        raise DocumentError(
            f"{path} looks binary (it holds NUL bytes)",
            hint="ingest text, Markdown, HTML or PDF files",
        )
    if b"\x00" in data:  # past the sniffed head: a stray NUL in a text is no text
        data = data.replace(b"\x00", b"")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        declared = _declared_charset(data) if html else None
        if declared is not None and declared != "utf-8":
            try:
                return data.decode(declared)
            except UnicodeDecodeError:
                pass  # the page is not what it says it is: the UTF-8 error below
        raise DocumentError(
            f"{path} is not UTF-8 (bad byte at offset {exc.start}) and has no byte-order mark",
            hint="convert it first, e.g. iconv -f LATIN1 -t UTF-8 "
            f"{shlex.quote(str(path))} > {shlex.quote(str(_converted(path)))}",
        ) from None


def _converted(path: Path) -> Path:
    """Where a converted copy of ``path`` goes: beside it, not in the current folder."""
    return path.with_name(f"{path.stem}.utf8{path.suffix or '.txt'}")


_HTML_BLOCKS = (
    "p div section article header footer main nav aside h1 h2 h3 h4 h5 h6 ul ol li dl dt dd "
    "table thead tbody tfoot tr caption blockquote pre figure figcaption address hr title "
    "details summary form fieldset legend"
).split()
_HTML_BLOCK_SET = frozenset(_HTML_BLOCKS)
_HTML_CELLS = ["td", "th"]


def _html_text(path: Path, markup: str) -> str:
    from bs4 import BeautifulSoup

    try:
        soup = BeautifulSoup(markup, "html.parser")
        for tag in soup(["script", "style", "noscript", "template"]):
            tag.decompose()
        text = "".join(_page_text(soup))
    except Exception as exc:  # a parser bug on one odd page must not end the batch
        raise DocumentError(f"{path} is not readable HTML: {reason(exc)}") from exc
    lines = (" ".join(line.split()).strip(" |") for line in text.splitlines())
    # Keep block structure as paragraphs so the sentence splitter sees the page's layout.
    return "\n\n".join(line for line in lines if line)


def _page_text(soup: Any) -> Iterator[str]:
    """A parsed page's text, in one pass over its elements (a loop, not recursion: a page
    can nest a hundred thousand deep). Editing the tree instead (a string before and after
    each block) costs time in each element's siblings and descendants: 50 s for a table of
    20,000 rows.

    Block elements become paragraphs, table cells are set apart on their row, and inline
    elements (<b>, <a>, <span>…) stay inside their sentence: "built in <b>1931</b>." is one
    sentence, not three paragraphs. A line break in the source is a space on the page (but
    in <pre>): a paragraph wrapped at 72 columns is one run of sentences, not one paragraph
    per line. A row of header cells is marked as Markdown marks one ("---|---" under it):
    which row names the columns is known here, and lost once the cells are plain text.
    """
    from bs4 import CData, NavigableString, Tag

    stack: list[tuple[Any, bool, bool]] = [(soup, False, False)]  # node, leaving, in <pre>
    while stack:
        node, leaving, in_pre = stack.pop()
        if isinstance(node, NavigableString):
            if type(node) in (NavigableString, CData):  # comments, doctypes: not the page's
                yield str(node) if in_pre else str(node).replace("\n", " ")
            continue
        if not isinstance(node, Tag):
            continue
        name = node.name
        if leaving:
            if name in _HTML_BLOCK_SET:
                yield "\n\n"
            if name in _HTML_CELLS:
                yield " | "
            if name == "tr":
                cells = node.find_all(_HTML_CELLS, recursive=False)
                if cells and all(cell.name == "th" for cell in cells):
                    yield "\n\n" + "|".join(["---"] * len(cells)) + "\n\n"
            continue
        if name == "br":
            yield "\n"
            continue
        if name in _HTML_BLOCK_SET:
            yield "\n\n"
        stack.append((node, True, in_pre))
        inner = in_pre or name == "pre"
        stack.extend((child, False, inner) for child in reversed(node.contents))


#: What follows a name's last dot but is no file type: a version ("Apache-2.0", "LGPL-2.1") or a
#: capitalised word ("README.Debian", "NEWS.Source"), as Debian's documentation names files.
_NAME_PART = re.compile(r"\.(?:\d+|[A-Z][a-z]+)")


def file_type(name: str) -> str:
    """The suffix that says what a file holds, lower-cased; "" for a name whose last dot
    starts a version or a capitalised word, which is read as a name with no suffix."""
    suffix = Path(name).suffix
    if suffix.lower() in SUPPORTED:  # Page.Html, Spec.PDF: a type, however it is spelt
        return suffix.lower()
    return "" if _NAME_PART.fullmatch(suffix) else suffix.lower()


def expand(paths: Iterable[Path]) -> Iterator[Path]:
    """Files named, and supported files under folders named (sorted, hidden ones skipped, and
    files with no suffix that are binary).

    A folder that cannot be listed is yielded itself, so that reading it reports it by name
    rather than its files going missing without a word.
    """
    for path in paths:
        if not _is_folder(path) or _is_pseudo(path):
            yield path  # a folder of /proc is not walked (its files are read as they are
            continue  # listed): it fails by name
        found: list[Path] = []
        unlisted: list[Path] = []
        for folder, names in _walk(path, unlisted):
            found.extend(
                Path(folder, name)
                for name in names
                if not name.startswith(".") and _listed(Path(folder, name), file_type(name))
            )
        yield from sorted(found + unlisted)


def _walk(top: Path, unlisted: list[Path]) -> Iterator[tuple[Path, list[str]]]:
    """Each folder under ``top`` (``top`` too) with the names of the entries in it that are no
    folders; hidden folders are left out and linked ones not followed. A folder that cannot be
    listed is added to ``unlisted``, to be reported by name.

    Iterative: ``os.walk`` recurses once per level on Python 3.11, so a tree some thousand
    folders deep ended the whole run with a RecursionError.
    """
    stack = [top]
    while stack:
        folder = stack.pop()
        names: list[str] = []
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if _entry_is_folder(entry):
                        if entry.name.startswith(".") or entry.is_symlink():
                            continue
                        if _is_pseudo(Path(entry.path)):  # /proc under a walked root
                            unlisted.append(Path(entry.path))  # fails by name, unread
                        else:
                            stack.append(Path(entry.path))
                    else:
                        names.append(entry.name)
        except OSError as exc:
            unlisted.append(Path(exc.filename or folder))
            continue
        yield folder, names


def _entry_is_folder(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # no permission to look: reading it will say so
        return False


def _listed(path: Path, kind: str) -> bool:
    """Whether a folder's entry is read. One named as a document (``.txt``, ``.pdf``…) is,
    whatever it is: a dangling link, a link loop or a pipe then fails by name when read (a
    pipe without being opened), rather than the document going missing without a word; so is
    a link into /proc or /sys. One with no suffix is read only when it is a regular file with
    no NUL in its head."""
    if kind not in SUPPORTED:
        return False
    if kind or _is_pseudo(path):  # a link into /proc is not opened to be sniffed
        return True
    return _is_file(path) and not _binary(path)


def _binary(path: Path) -> bool:
    """Whether a file with no suffix found in a folder is binary (a NUL byte in its first
    ``SNIFF_BYTES``, as git and grep tell): a folder's programs and data files are not
    documents, and listing them as failures would hide the files that did fail."""
    # Opened without blocking, and read only if regular: a file such as /proc/kmsg blocks
    # a plain read until the kernel writes to it, and would hang the walk of its folder.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # reading it will say why
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False  # reading it will say why
        return b"\0" in os.read(fd, SNIFF_BYTES)
    except BlockingIOError:
        return True  # nothing to read without waiting: no document to read either
    except OSError:
        return False  # reading it will say why
    finally:
        os.close(fd)


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # no permission to look: reading it will say so
        return False


def _is_file(path: Path) -> bool:
    """Whether a folder's entry is a file to read (not a pipe, socket or dangling link)."""
    try:
        return path.is_file()
    except OSError:  # no permission to look: reading it will say so
        return True


# -- preparing and writing -----------------------------------------------------------------


@dataclass
class _Pending:
    """A document read and packed, waiting for its chunks to be embedded."""

    source: str
    content_hash: str
    format: str
    metadata: dict[str, Any]
    plan: Plan


def _plan(
    catalog: KnowledgeCatalog,
    source: str,
    text: str,
    content_hash: str,
    fmt: str,
    metadata: dict[str, Any] | None,
) -> _Pending:
    # The model reads max_tokens positions, two of them taken by [CLS] and [SEP]; a larger
    # budget would make chunks whose tail is never embedded.
    max_tokens = min(settings.get_int("catalog_chunk_tokens"), catalog.embedder.max_tokens - 2)
    if max_tokens < MIN_TOKENS:
        raise ConfigurationError(
            f"BATOS_CATALOG_CHUNK_TOKENS={max_tokens} is below the {MIN_TOKENS} tokens a chunk "
            "needs at least",
            hint=f"set it between {MIN_TOKENS} and {catalog.embedder.max_tokens - 2}, or unset it",
        )
    try:
        packed = plan(text, catalog.embedder, max_tokens)
    except BatosError:
        raise
    except Exception as exc:
        # The chunker is meant to take any text; if one still breaks it, that is this
        # file's failure to report (with the traceback under -v), not the end of the run.
        log.warning("could not chunk %s", source, exc_info=True)
        raise DocumentError(
            f"{source} could not be cut into chunks: {reason(exc)}",
            hint="a bug in BAT OS's chunker: please report it with this file; "
            "the other files were ingested",
        ) from exc
    if not packed.chunks:
        raise DocumentError(f"{source} produced no chunks")
    return _Pending(source, content_hash, fmt, dict(metadata or {}), packed)


def _embed(catalog: KnowledgeCatalog, pending: Sequence[_Pending]) -> list[PreparedDocument]:
    """Embed the chunks of several documents in one pass, cut them at topic shifts, and
    embed the cut parts in a second, smaller pass."""
    texts = [t for doc in pending for t in doc.plan.texts()]
    spans = [u for doc in pending for u in doc.plan.unit_spans()]
    vectors, sums, counts = catalog.embedder.encode_units(texts, spans)
    finished = []
    at = 0
    for doc in pending:
        n = len(doc.plan.chunks)
        pieces, found = finish(
            doc.plan, vectors[at : at + n], sums[at : at + n], counts[at : at + n]
        )
        finished.append((doc, pieces, found))
        at += n
    missing = [
        (k, i)
        for k, (_, pieces, found) in enumerate(finished)
        for i, v in enumerate(found)
        if v is None
    ]
    if missing:
        encoded = catalog.embedder.encode([finished[k][1][i].text for k, i in missing])
        for (k, i), vector in zip(missing, encoded, strict=True):
            finished[k][2][i] = vector
    return [
        PreparedDocument(
            source=doc.source,
            content_hash=doc.content_hash,
            format=doc.format,
            metadata=doc.metadata,
            spans=[(p.start, p.end, p.text) for p in pieces],
            # every missing vector was encoded above
            vectors=np.vstack(cast(list[np.ndarray], found)).astype(np.float32),
        )
        for doc, pieces, found in finished
    ]


def prepare(
    catalog: KnowledgeCatalog,
    source: str,
    text: str,
    content_hash: str,
    fmt: str = "text",
    metadata: dict[str, Any] | None = None,
) -> PreparedDocument:
    """Chunk and embed one document's text (slow; runs outside any transaction)."""
    return _embed(catalog, [_plan(catalog, source, text, content_hash, fmt, metadata)])[0]


def write_batch(
    catalog: KnowledgeCatalog, batch: Sequence[PreparedDocument]
) -> tuple[dict[str, str], dict[str, DocumentError]]:
    """Write prepared documents in one commit; returns ({source: outcome}, {source: error}).

    Each document goes in under a savepoint: one that fails is rolled back alone and reported,
    the others commit together. Documents whose stored hash already matches are skipped.
    """
    results: dict[str, str] = {}
    errors: dict[str, DocumentError] = {}
    outcome: dict[str, Any] = {}

    def write(root: Any) -> None:
        results.clear()
        errors.clear()
        change = Change()
        documents = catalog_root(root)["documents"]
        archives = catalog_root(root)["archives"]
        txn = root._p_jar.transaction_manager.get()
        outcome["version"] = catalog.version(root)
        for doc in batch:
            existing = documents.get(doc.source)
            if (
                existing is not None
                and existing.content_hash == doc.content_hash
                and dict(existing.metadata) == doc.metadata
            ):
                results[doc.source] = "unchanged"
                continue
            savepoint = txn.savepoint()
            try:
                change.extend(catalog.put_document(root, doc))
                # Summaries made from the old text would go on answering for it: drop them,
                # and put back the other documents' chunks they covered (cold, to fold again).
                for archive_id in existing.archives if existing is not None else ():
                    if archive_id in archives:
                        change.extend(unfold(catalog, root, archive_id)[0])
            except TransientError:
                raise  # the whole batch is retried on fresh state
            except Exception as exc:
                savepoint.rollback()
                log.warning("could not write %s: %s", doc.source, exc)
                errors[doc.source] = DocumentError(
                    f"{doc.source} could not be written: {type(exc).__name__}: {exc}",
                    hint="nothing of it was kept; fix the cause and ingest it again",
                )
                continue
            results[doc.source] = "replaced" if existing is not None else "added"
        outcome["change"] = change

    catalog.image.transact(write, note=f"ingest {len(batch)} document(s)")
    catalog.committed(outcome["change"], outcome["version"])
    return dict(results), dict(errors)


#: A round of embedding this many chunks (a large document's) is announced before it runs.
LONG_ROUND = 500


def ingest_paths(
    catalog: KnowledgeCatalog,
    paths: Iterable[Path],
    *,
    metadata: dict[str, Any] | None = None,
    on_file: Callable[[Path, str, IngestReport], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> IngestReport:
    """Ingest files (folders are walked).

    ``on_file(path, outcome, report)`` is called for each file once its outcome is final
    (written, skipped or failed), with the report so far; ``on_note(text)`` hears what a long
    step is doing before it starts (a large document's chunks being embedded), so a run
    silent for minutes says why.
    """
    metadata = check_metadata(metadata)
    limit = settings.get_int("catalog_max_bytes")
    started = time.monotonic()
    report = IngestReport()
    commit_chunks = settings.get_int("catalog_commit_chunks")
    commit_seconds = settings.get_float("catalog_commit_seconds")
    pending: list[_Pending] = []
    ready: list[PreparedDocument] = []
    paths_of: dict[str, Path] = {}
    # Files of the same bytes and type (the same licence in many packages) are embedded once:
    # a twin of a document waiting to be embedded waits with it, one of a document embedded
    # in this run takes its chunks and vectors (those of the last TWIN_CHUNKS chunks kept).
    twins: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    embedded: dict[tuple[str, str], PreparedDocument] = {}
    arrival: dict[str, int] = {}  # each document's place in the run, by source
    last_commit = time.monotonic()
    writing = False
    rate: float | None = None  # chunks embedded per second, once measured

    def tell(path: Path, outcome: str) -> None:
        report.seconds = time.monotonic() - started
        if on_file is not None:
            on_file(path, outcome, report)

    def flush() -> None:
        nonlocal last_commit, writing
        if not ready:
            return
        ready.sort(key=lambda doc: arrival[doc.source])  # twins among the files they follow
        writing = True
        results, errors = write_batch(catalog, ready)
        writing = False
        last_commit = time.monotonic()
        report.commits += 1
        for doc in ready:
            path = paths_of[doc.source]
            if doc.source in errors:
                report.failed.append((str(path), errors[doc.source]))
                tell(path, "failed")
                continue
            status = results.get(doc.source, "unchanged")
            getattr(report, status).append(str(path))
            if status != "unchanged":
                report.chunks += len(doc.spans)
            tell(path, status)
        ready.clear()

    def embed() -> None:
        nonlocal rate
        if pending:
            began = time.monotonic()
            count = sum(len(d.plan.chunks) for d in pending)
            if on_note is not None and count >= LONG_ROUND:
                largest = max(pending, key=lambda d: len(d.plan.chunks))
                guess = f", about {count / rate:.0f} s at the rate so far" if rate else ""
                name = Path(largest.source).name
                on_note(f"embedding {count:,} chunks (most from {name}){guess}")
            for doc in _embed(catalog, pending):
                ready.append(doc)
                key = (doc.content_hash, doc.format)
                ready.extend(_twin(doc, twin, kept) for twin, kept in twins.pop(key, ()))
                embedded[key] = doc
            pending.clear()
            while sum(len(d.spans) for d in embedded.values()) > TWIN_CHUNKS:
                del embedded[next(iter(embedded))]  # the oldest first
            rate = count / max(time.monotonic() - began, 1e-6)
        flush_if_due()

    def flush_if_due() -> None:
        due = time.monotonic() - last_commit >= commit_seconds
        if due or sum(len(d.spans) for d in ready) >= commit_chunks:
            flush()

    try:
        for path in expand(paths):
            try:
                _not_pseudo(path)
                data = _read_bytes(path, limit)
                source = _source(path)
                report.bytes += len(data)
                content_hash = _content_hash(data)
                known = catalog.document(source)
                kept = _metadata(known, metadata)
                # A file reached again under another name (a linked folder) is the same
                # document: once in a run, or its outcomes would be told under one name.
                # An unchanged file is told by its bytes' hash, before its text is extracted
                # (a PDF's extraction can take minutes).
                if source in paths_of or _unchanged(known, content_hash, kept):
                    report.unchanged.append(str(path))
                    tell(path, "unchanged")
                    continue
                key = (content_hash, _format(path))
                if key in embedded or key in twins:
                    paths_of[source] = path
                    arrival[source] = len(arrival)
                    if key in embedded:
                        ready.append(_twin(embedded[key], source, kept))
                        flush_if_due()  # written on the schedule of any other document
                    else:
                        twins[key].append((source, kept))
                    continue
                text, fmt = _extract(path, data, limit, known=known is not None)
                del data  # the text alone is kept while the document waits to be embedded
                planned = _plan(catalog, source, text, content_hash, fmt, kept)
            except DocumentError as exc:
                report.failed.append((str(path), exc))
                tell(path, "failed")
                continue
            if len(planned.plan.chunks) >= LONG_ROUND and (pending or ready):
                # A large document's round runs for minutes: the files before it are
                # embedded and committed first, rather than wait for it (and be lost with
                # it to a kill).
                embed()
                flush()
            pending.append(planned)
            paths_of[source] = path
            arrival[source] = len(arrival)
            twins[key] = []
            # A round of embedding takes about half the commit interval at the rate measured
            # so far, so commits keep their pace on a slow or busy machine too.
            size = FIRST_ROUND if rate is None else int(rate * commit_seconds / 2)
            size = max(1, min(size, ENCODE_CHUNKS, commit_chunks))
            waiting = sum(len(d.plan.chunks) for d in pending)
            if waiting >= size or time.monotonic() - last_commit >= commit_seconds:
                embed()
        embed()
        flush()
    except Exception:
        # Not one file's fault (the embedding model failing, say): the run ends, but the
        # documents already embedded are whole, so they are written rather than lost.
        if not writing:
            flush()
        raise
    report.seconds = time.monotonic() - started
    return report


#: Chunks of the documents embedded in a run kept for their twins (text and vectors: some
#: 2 KB a chunk).
TWIN_CHUNKS = 20_000


def _twin(doc: PreparedDocument, source: str, metadata: dict[str, Any]) -> PreparedDocument:
    """``doc``'s chunks and vectors under another file's name and metadata."""
    return PreparedDocument(
        source=source,
        content_hash=doc.content_hash,
        format=doc.format,
        metadata=metadata,
        spans=doc.spans,
        vectors=doc.vectors,
    )


def _metadata(known: Mapping[str, Any] | None, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """A document's metadata once ingested again: what it held, updated with what is given
    (a run without --meta keeps its values; one with new values gives them)."""
    kept = {**(known["metadata"] if known is not None else {}), **(given or {})}
    if len(kept) > MAX_FIELDS:  # each run's fields within bounds, but together too many
        raise DocumentError(
            f"with the fields it holds already, this document would have {len(kept)} "
            f"metadata fields; it takes at most {MAX_FIELDS}",
            hint="give values to the fields it has, or ingest it under a new name",
        )
    return kept


def _unchanged(
    known: Mapping[str, Any] | None, content_hash: str, metadata: Mapping[str, Any]
) -> bool:
    return (
        known is not None
        and known["content_hash"] == content_hash
        and known["metadata"] == dict(metadata)
    )


def _source(path: Path) -> str:
    """The name a file's document is kept under: its absolute path, links resolved."""
    try:
        return str(path.resolve())
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python 3.11)
        raise DocumentError(f"cannot resolve {path}: {reason(exc)}") from None


def ingest_text(
    catalog: KnowledgeCatalog,
    source: str,
    text: str,
    *,
    fmt: str = "text",
    metadata: dict[str, Any] | None = None,
) -> str:
    """Ingest a text held in memory under the name ``source``; returns the outcome."""
    metadata = check_metadata(metadata)
    text = well_formed(text)
    content_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    known = catalog.document(source)
    kept = _metadata(known, metadata)
    if _unchanged(known, content_hash, kept):
        return "unchanged"
    if not text.strip():
        raise DocumentError(f"{source} is empty", hint="nothing to ingest")
    results, errors = write_batch(
        catalog, [prepare(catalog, source, text, content_hash, fmt, kept)]
    )
    if source in errors:
        raise errors[source]
    return results[source]
