"""Ingestion: files in, documents of the knowledge catalog out — per file all or nothing.

Text, Markdown, HTML and PDF are read, chunked and embedded outside any transaction; prepared
documents are then written in batches of about ``catalog_commit_chunks`` chunks, one commit per
batch, each document inside its own savepoint so a failing one leaves no trace and the rest of
its batch still commits. An unchanged file (same content hash) is skipped; a changed one
replaces its chunks and drops the curator's summaries of its old text. A file that cannot be
read gets a ``DocumentError`` in the report and the batch goes on.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transaction.interfaces import TransientError

from batos import settings
from batos.errors import DocumentError
from store.catalog import Change, KnowledgeCatalog, PreparedDocument, catalog_root
from store.chunking import chunk
from store.curator import unfold

log = logging.getLogger("batos.ingest")

TEXT_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".rst", ""}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
PDF_SUFFIXES = {".pdf"}
SUPPORTED = TEXT_SUFFIXES | HTML_SUFFIXES | PDF_SUFFIXES
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


# -- reading ----------------------------------------------------------------------------


def read_document(path: Path, *, max_bytes: int | None = None) -> tuple[str, str, str]:
    """(text, format, content hash) of one file, or a ``DocumentError`` saying what is wrong."""
    limit = max_bytes if max_bytes is not None else settings.get_int("catalog_max_bytes")
    try:
        size = path.stat().st_size
        if size > limit:
            raise DocumentError(
                f"{path} is {size:,} bytes, over the {limit:,}-byte limit",
                hint="split it, or raise BATOS_CATALOG_MAX_BYTES",
            )
        data = path.read_bytes()
    except FileNotFoundError:
        raise DocumentError(f"no such file: {path}", hint="check the path") from None
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not data.strip():
        raise DocumentError(f"{path} is empty", hint="nothing to ingest; remove it from the list")
    suffix = path.suffix.lower()
    if suffix in PDF_SUFFIXES:
        text, fmt = _pdf_text(path, data), "pdf"
    elif suffix in HTML_SUFFIXES:
        text, fmt = _html_text(path, _decode(path, data)), "html"
    else:
        text = _decode(path, data)
        fmt = "markdown" if suffix in {".md", ".markdown"} else "text"
    if not text.strip():
        raise DocumentError(
            f"{path} has no text to index",
            hint="a scanned PDF needs OCR first; an HTML page may carry only scripts",
        )
    return text, fmt, hashlib.sha256(data).hexdigest()


def _decode(path: Path, data: bytes) -> str:
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
    if b"\x00" in data[:8192]:
        raise DocumentError(
            f"{path} looks binary (it holds NUL bytes)",
            hint="ingest text, Markdown, HTML or PDF files",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"{path} is not UTF-8 (bad byte at offset {exc.start}) and has no byte-order mark",
            hint=f"convert it first, e.g. iconv -f LATIN1 -t UTF-8 {path.name} > out.txt",
        ) from None


def _html_text(path: Path, markup: str) -> str:
    from bs4 import BeautifulSoup

    try:
        soup = BeautifulSoup(markup, "html.parser")
        for tag in soup(["script", "style", "noscript", "template"]):
            tag.decompose()
        lines = soup.get_text("\n").splitlines()
    except Exception as exc:  # a parser bug on one odd page must not end the batch
        raise DocumentError(f"{path} is not readable HTML: {type(exc).__name__}: {exc}") from exc
    blocks = (line.strip() for line in lines)
    # Keep block structure as paragraphs so the sentence splitter sees the page's layout.
    return "\n\n".join(line for line in blocks if line)


def _pdf_text(path: Path, data: bytes) -> str:
    import io

    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{path} is an encrypted PDF", hint="decrypt it (qpdf --decrypt)")
        pages = [page.extract_text() or "" for page in reader.pages]
    except DocumentError:
        raise
    except Exception as exc:
        # pypdf raises whatever a malformed file provokes (AttributeError, RecursionError,
        # LimitReachedError, ...), not only PdfReadError: any of them is this file's fault.
        raise DocumentError(
            f"{path} is not a readable PDF: {type(exc).__name__}: {exc}",
            hint="open and re-save it with a PDF tool, or extract its text another way",
        ) from exc
    return "\n\n".join(page.strip() for page in pages if page.strip())


def expand(paths: Iterable[Path]) -> Iterator[Path]:
    """Files named, and supported files under folders named (sorted, hidden ones skipped)."""
    for path in paths:
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                hidden = any(part.startswith(".") for part in child.relative_to(path).parts)
                if child.is_file() and not hidden and child.suffix.lower() in SUPPORTED:
                    yield child
        else:
            yield path


# -- preparing and writing -----------------------------------------------------------------


def prepare(
    catalog: KnowledgeCatalog,
    source: str,
    text: str,
    content_hash: str,
    fmt: str = "text",
    metadata: dict[str, Any] | None = None,
) -> PreparedDocument:
    """Chunk and embed one document's text (slow; runs outside any transaction)."""
    # The model reads max_tokens positions, two of them taken by [CLS] and [SEP]; a larger
    # budget would make chunks whose tail is never embedded.
    max_tokens = min(settings.get_int("catalog_chunk_tokens"), catalog.embedder.max_tokens - 2)
    pieces = chunk(text, catalog.embedder, max_tokens=max_tokens)
    if not pieces:
        raise DocumentError(f"{source} produced no chunks")
    vectors = catalog.embedder.encode([p.text for p in pieces])
    return PreparedDocument(
        source=source,
        content_hash=content_hash,
        format=fmt,
        metadata=dict(metadata or {}),
        spans=[(p.start, p.end, p.text) for p in pieces],
        vectors=vectors,
    )


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
            if existing is not None and existing.content_hash == doc.content_hash:
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


def ingest_paths(
    catalog: KnowledgeCatalog,
    paths: Iterable[Path],
    *,
    metadata: dict[str, Any] | None = None,
    on_file: Callable[[Path, str], None] | None = None,
) -> IngestReport:
    """Ingest files (folders are walked); ``on_file(path, outcome)`` follows the progress."""
    report = IngestReport()
    commit_chunks = settings.get_int("catalog_commit_chunks")
    batch: list[PreparedDocument] = []
    paths_of: dict[str, Path] = {}

    def flush() -> None:
        if not batch:
            return
        results, errors = write_batch(catalog, batch)
        report.commits += 1
        for doc in batch:
            path = paths_of[doc.source]
            if doc.source in errors:
                report.failed.append((str(path), errors[doc.source]))
                _tell(on_file, path, "failed")
                continue
            status = results.get(doc.source, "unchanged")
            getattr(report, status).append(str(path))
            if status != "unchanged":
                report.chunks += len(doc.spans)
            _tell(on_file, path, status)
        batch.clear()

    for path in expand(paths):
        source = str(path.resolve())
        try:
            text, fmt, content_hash = read_document(path)
            known = catalog.document(source)
            if known is not None and known["content_hash"] == content_hash:
                report.unchanged.append(str(path))
                _tell(on_file, path, "unchanged")
                continue
            doc = prepare(catalog, source, text, content_hash, fmt, metadata)
        except DocumentError as exc:
            report.failed.append((str(path), exc))
            _tell(on_file, path, "failed")
            continue
        except Exception:
            # Not this file's fault (the embedding model failing, say): the run ends, but the
            # documents already prepared are whole, so they are written rather than lost.
            flush()
            raise
        batch.append(doc)
        paths_of[source] = path
        if sum(len(d.spans) for d in batch) >= commit_chunks:
            flush()
    flush()
    return report


def ingest_text(
    catalog: KnowledgeCatalog,
    source: str,
    text: str,
    *,
    fmt: str = "text",
    metadata: dict[str, Any] | None = None,
) -> str:
    """Ingest a text held in memory under the name ``source``; returns the outcome."""
    content_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    known = catalog.document(source)
    if known is not None and known["content_hash"] == content_hash:
        return "unchanged"
    if not text.strip():
        raise DocumentError(f"{source} is empty", hint="nothing to ingest")
    results, errors = write_batch(
        catalog, [prepare(catalog, source, text, content_hash, fmt, metadata)]
    )
    if source in errors:
        raise errors[source]
    return results[source]


def _tell(on_file: Callable[[Path, str], None] | None, path: Path, outcome: str) -> None:
    if on_file is not None:
        on_file(path, outcome)
