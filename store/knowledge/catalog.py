"""The knowledge catalog (O-RAG): documents and chunks kept in the living image, searched hybrid.

Layout under the image's ``layout.CATALOG`` key (declared by ``CATALOG_STEPS``):

    documents   OOBTree  source → Document (content hash, chunk ids, float32 vectors)
    chunks      IOBTree  chunk id → Chunk (text, span in its document, metadata)
    fields      OOBTree  field → OOBTree value → IFTreeSet of chunk ids (metadata filters)
    text        zope.index TextIndex with an Okapi BM25 ranking, docid = chunk id
    archives    IOBTree  archive id → Archive (compressed originals the curator folded away)
    retrieved   IIBTree  chunk id → when it was last retrieved, unix seconds (what makes a
                         chunk "cold" for the curator: not retrieved lately)
    version     Length   bumped by every change to the set of chunks, by a random amount
                         (an undo rewinds it, and the next change must not bring it back to
                         a value a process's cache already holds)
    encoder     str      the embedding encoder that made the stored vectors (None until the
                         first chunk): queries and new chunks must use the same one, since
                         int8 and float32 vectors of one text differ (cosine 0.98-1.0)

Retrieval fuses a BM25 ranking (over in-memory posting arrays loaded from the text index) and an
exact cosine ranking (over an in-memory matrix rebuilt from the stored vectors) with
reciprocal-rank fusion. Retrieved text is data: nothing here executes it
or hands it to anything that could.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from BTrees import family32
from BTrees.IIBTree import IIBTree
from BTrees.IOBTree import IOBTree
from BTrees.Length import Length
from BTrees.OOBTree import OOBTree
from persistent import Persistent
from persistent.mapping import PersistentMapping
from zope.index.text.textindex import TextIndex

from batos import settings
from batos.errors import CatalogError
from store.core import layout
from store.core.image import LivingImage
from store.core.layout import UpgradeStep
from store.core.schema import require
from store.knowledge.embeddings import DIMS, FLOAT32, Embedder, from_bytes, to_bytes
from store.knowledge.lexical import LexicalIndex
from store.knowledge.names import SUMMARY_PREFIX, DocumentNames
from store.knowledge.vectors import RRF_K, VectorIndex, reciprocal_rank_fusion

log = logging.getLogger("batos.catalog")

#: Metadata fields every chunk is indexed under, whatever its document brings.
BUILTIN_FIELDS = ("source", "kind", "format")
#: Bounds of a document's own metadata: fields, a name's and a text value's characters.
MAX_FIELDS, MAX_FIELD_NAME, MAX_FIELD_VALUE = 32, 64, 1000


def _spellings(accepted: Iterable[Any]) -> set[str]:
    """The indexed texts a filter's values match. Values are indexed as ``str(value)``, so a
    true/false given through the Python API sits in the index as 'True' or 'False', while the
    command line (``-w reviewed=true``) and JSON clients spell it 'true': either spelling of a
    truth value finds both."""
    spelt: set[str] = set()
    for value in accepted:
        text = str(value)
        spelt.add(text)
        if isinstance(value, bool) or text.lower() in ("true", "false"):
            spelt.update((text.lower(), text.lower().capitalize()))
    return spelt


def _number_shown(value: Any) -> str:
    """A number as shown in an error: whole, or its size when it is too long to read."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length():,} bits"
    return repr(value)


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A document's own metadata as given to ingest, or ``CatalogError`` saying what to change.

    Every value is indexed for ``search(filters=…)``: a value of another kind (a list, a
    mapping, None) would be stored and never found, a name the catalog sets itself would be
    hidden by the catalog's own value, and a name that is not text cannot sit beside the
    others in the index."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise CatalogError(
            f"metadata must be a mapping of names to values, not {type(metadata).__name__}",
            hint="e.g. metadata={'topic': 'cats'}",
        )
    if len(metadata) > MAX_FIELDS:
        raise CatalogError(
            f"metadata has {len(metadata)} fields; a document takes at most {MAX_FIELDS}",
            hint="keep the fields you will filter searches by",
        )
    for name, value in metadata.items():
        shown = repr(name)  # a client's name, echoed cut short
        shown = shown if len(shown) <= 40 else f"{shown[:38]}…{shown[0]}"
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_FIELD_NAME:
            raise CatalogError(
                f"metadata field {shown} is not a name of 1 to {MAX_FIELD_NAME} characters",
                hint="name fields with short text, e.g. 'topic'",
            )
        if name in BUILTIN_FIELDS:
            raise CatalogError(
                f"metadata field {shown} is one the catalog sets itself",
                hint=f"choose another name than {', '.join(BUILTIN_FIELDS)}, e.g. 'topic'",
            )
        if not isinstance(value, (str, int, float, bool)):
            raise CatalogError(
                f"metadata field {shown} holds a {type(value).__name__}: only text, numbers "
                "and true/false are indexed for search filters",
                hint="give one value per field, e.g. 'topic': 'cats'",
            )
        if isinstance(value, str) and len(value) > MAX_FIELD_VALUE:
            raise CatalogError(
                f"metadata field {shown} holds {len(value):,} characters; a value takes at "
                f"most {MAX_FIELD_VALUE:,}",
                hint="keep long text in the document itself",
            )
        if (isinstance(value, float) and not math.isfinite(value)) or (
            isinstance(value, int) and value.bit_length() > 64
        ):  # no JSON for NaN and infinities; an integer's digits could not all be written
            raise CatalogError(
                f"metadata field {shown} holds {_number_shown(value)}, not a number a filter "
                "can use",
                hint="give a finite number within 64 bits, or the value as text",
            )
    return dict(metadata)


#: Candidates each half of a hybrid search contributes to the fusion, per result asked for.
CANDIDATES_PER_RESULT = 4
MIN_CANDIDATES = 50
#: Retrieval times are written to the image at most this often (and on close), so searching
#: does not turn every read into a write transaction.
RETRIEVAL_FLUSH_SECONDS = 30.0
_MAX_ID = 2**31 - 1  # zope.index and IF trees hold signed 32-bit document ids
#: A document a query names is brought forward only when none of its passages is already among
#: this many of the fused results: the mind reads three passages.
NAMED_LEAVE = 3

IFTreeSet = family32.IF.TreeSet


# -- persistent records -------------------------------------------------------------------


class Document(Persistent):
    """One ingested source; its chunks' vectors live here as one float32 block (row = chunk).

    ``archived`` lists its chunks the curator folded away, ``archives`` the archives that hold
    them (so a changed document can drop the summaries made from its old text).
    """

    archives: tuple[int, ...] = ()  # class default: documents stored before it existed

    def __init__(self, source: str, content_hash: str, fmt: str, metadata: Mapping[str, Any]):
        self.source = source
        self.content_hash = content_hash
        self.format = fmt
        self.metadata = dict(metadata)
        self.chunk_ids: tuple[int, ...] = ()
        self.vectors = b""
        self.archived: tuple[int, ...] = ()
        self.ingested_at = time.time()

    def __repr__(self) -> str:
        return f"<Document {self.source} chunks={len(self.chunk_ids)}>"


class Chunk(Persistent):
    """A retrievable passage: text plus its ``[start, end)`` character span in its document."""

    def __init__(
        self,
        chunk_id: int,
        source: str,
        start: int,
        end: int,
        text: str,
        kind: str = "text",
        metadata: Mapping[str, Any] | None = None,
    ):
        self.id = chunk_id
        self.source = source
        self.start = start
        self.end = end
        self.text = text
        self.kind = kind
        self.metadata = dict(metadata or {})
        self.created = time.time()

    def __repr__(self) -> str:
        return f"<Chunk {self.id} {self.source}[{self.start}:{self.end}]>"


#: A bump of the version counter is drawn from 1 to this: two processes' caches never take
#: one state of the catalog for another, even after an undo rewound the counter.
_MAX_BUMP = 2**31


def _bump(cat: Any) -> int:
    """Move the version counter on by a random amount; the amount. (A ``Length`` adds the
    changes of concurrent transactions, so the bumps of two writers both count.)"""
    amount = random.randint(1, _MAX_BUMP)
    cat["version"].change(amount)
    return amount


def _layout_1(root: Any) -> None:
    if layout.find(root, layout.CATALOG) is not None:
        return
    root[layout.CATALOG] = PersistentMapping(
        documents=OOBTree(),
        chunks=IOBTree(),
        fields=OOBTree(),
        text=TextIndex(),
        archives=IOBTree(),
        usage=IIBTree(),
        version=Length(0),
    )


def _layout_2(root: Any) -> None:
    cat = layout.catalog(root)
    if "retrieved" in cat:
        return
    # Counts said how often, never when: chunks retrieved before this step count as retrieved
    # now, so the change of meaning does not make every used chunk cold at once.
    now = int(time.time())
    cat["retrieved"] = IIBTree(
        {cid: now for cid, count in cat["usage"].items() if count and cid in cat["chunks"]}
    )
    del cat["usage"]


def _layout_3(root: Any) -> None:
    cat = layout.catalog(root)
    if "encoder" in cat:
        return
    # Every vector stored before this step came from sentence-transformers in float32.
    cat["encoder"] = FLOAT32 if len(cat["chunks"]) else None


CATALOG_STEPS: tuple[UpgradeStep, ...] = (
    UpgradeStep(
        "catalog-1",
        "knowledge catalog: documents, chunks, BM25 text index, field indexes, archives",
        _layout_1,
    ),
    UpgradeStep(
        "catalog-2",
        "retrieval times (the catalog's 'retrieved') replace retrieval counts",
        _layout_2,
    ),
    UpgradeStep(
        "catalog-3",
        "the catalog records which embedding encoder made its vectors (float32 until now)",
        _layout_3,
    ),
)


def catalog_root(root: Any) -> Any:
    found = layout.find(root, layout.CATALOG)
    if found is None:
        raise CatalogError(
            "this image has no knowledge catalog yet",
            hint="open the image with open_runtime() (or run 'batos init') first",
        )
    return found


def holds_chunks(root: Any) -> bool:
    """Whether the image has a catalog with anything in it (read only)."""
    cat = layout.find(root, layout.CATALOG)
    return cat is not None and len(cat["chunks"]) > 0


def stored_vector(cat: Any, chunk: Chunk) -> np.ndarray:
    """The vector the image holds for ``chunk`` (a copy of its row in the document's block)."""
    document = cat["documents"][chunk.source]
    return from_bytes(document.vectors)[document.chunk_ids.index(chunk.id)].copy()


# -- what callers get back ------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedDocument:
    """A parsed, chunked and embedded document, ready to be written in one transaction."""

    source: str
    content_hash: str
    format: str
    metadata: Mapping[str, Any]
    spans: Sequence[tuple[int, int, str]]
    vectors: np.ndarray


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk, with what is needed to cite it."""

    chunk_id: int
    source: str
    start: int
    end: int
    text: str
    score: float
    kind: str = "text"
    lexical_rank: int | None = None
    dense_rank: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["metadata"] = dict(self.metadata)
        return data

    @property
    def citation(self) -> str:
        return f"{self.source}:{self.start}-{self.end}"


@dataclass
class Change:
    """What one write did to the chunk set, so the vector cache can follow without a reload."""

    added: list[int] = field(default_factory=list)
    added_vectors: list[np.ndarray] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    #: How far the write moved the catalog's version counter (the sum of its bumps).
    bumps: int = 0

    def extend(self, other: Change) -> None:
        """Follow with ``other``. Caches apply removals before additions, so a chunk this
        change added and ``other`` removes (a summary restored, then dropped) must not stay
        listed as added."""
        gone = set(other.removed)
        if gone.intersection(self.added):
            kept = [
                (i, v) for i, v in zip(self.added, self.added_vectors, strict=True) if i not in gone
            ]
            self.added = [i for i, _ in kept]
            self.added_vectors = [v for _, v in kept]
        self.added.extend(other.added)
        self.added_vectors.extend(other.added_vectors)
        self.removed.extend(other.removed)
        self.bumps += other.bumps


# -- the catalog ------------------------------------------------------------------------


class KnowledgeCatalog:
    """Hybrid retrieval over the chunks in one living image, with the writes that keep it whole.

    Writes take a root (the caller's transaction) and return a ``Change``; call
    ``committed(change, version_before)`` after the commit so this process's vector cache
    follows. Reads open their own read-only view. The embedder's encoder must be the one the
    catalog records (``open`` picks it when given no embedder); a write or a search with
    another one raises ``CatalogError`` rather than mix two kinds of vectors.
    """

    def __init__(self, image: LivingImage, embedder: Embedder | None = None) -> None:
        self.image = image
        self.embedder = embedder or Embedder()
        self.vectors = VectorIndex()
        self.lexical = LexicalIndex()
        self._last_filter: tuple[Any, np.ndarray] | None = None
        self._names: tuple[int, DocumentNames] | None = None  # for one catalog version
        self._names_lock = threading.Lock()
        self._retrieved: dict[int, int] = {}
        self._retrieved_flushed = time.monotonic()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, image: LivingImage, embedder: Embedder | None = None) -> KnowledgeCatalog:
        """The catalog of ``image`` (``ImageError`` if its catalog layout is not up to date:
        ``open_runtime`` brings it there); with no ``embedder``,
        one of the encoder its vectors came from (``catalog_encoder`` for a new catalog)."""
        require(image, CATALOG_STEPS, "the knowledge catalog")
        if embedder is None:
            with image.read() as root:
                recorded = catalog_root(root).get("encoder")
            embedder = Embedder(recorded or settings.get_str("catalog_encoder"))
        return cls(image, embedder)

    def _check_encoder(self, cat: Any, *, claim: bool = False) -> None:
        """Refuse to mix encoders; with ``claim``, a catalog without one takes ours."""
        recorded = cat.get("encoder")
        if recorded is None:
            if claim and "encoder" in cat:
                cat["encoder"] = self.embedder.encoder
            return
        if recorded != self.embedder.encoder:
            raise CatalogError(
                f"this catalog's vectors were made by the {recorded} encoder, not "
                f"{self.embedder.encoder}: their scores would not compare",
                hint=f"open it with Embedder({recorded!r}), or with no embedder at all",
            )

    def close(self) -> None:
        self.flush_retrievals()

    # -- writes (inside the caller's transaction) --------------------------------------

    def put_document(self, root: Any, doc: PreparedDocument) -> Change:
        """Add ``doc``, replacing an earlier version of the same source; all or nothing."""
        if len(doc.spans) != len(doc.vectors):
            raise ValueError(f"{doc.source}: {len(doc.spans)} chunks, {len(doc.vectors)} vectors")
        cat = catalog_root(root)
        self._check_encoder(cat, claim=True)
        change = self.remove_document(root, doc.source)
        record = Document(doc.source, doc.content_hash, doc.format, doc.metadata)
        ids = []
        for (start, end, text), vector in zip(doc.spans, doc.vectors, strict=True):
            chunk = Chunk(self._new_id(cat), doc.source, start, end, text, "text", doc.metadata)
            self._index_chunk(cat, chunk, doc.format)
            ids.append(chunk.id)
            change.added.append(chunk.id)
            change.added_vectors.append(vector)
        record.chunk_ids = tuple(ids)
        record.vectors = to_bytes(np.asarray(doc.vectors, dtype=np.float32).reshape(-1, DIMS))
        cat["documents"][doc.source] = record
        change.bumps += _bump(cat)
        return change

    def add_chunk(
        self,
        root: Any,
        source: str,
        text: str,
        vector: np.ndarray,
        *,
        kind: str,
        metadata: Mapping[str, Any],
        chunk_id: int | None = None,
    ) -> Change:
        """Append one chunk to ``source`` (created as needed); the curator's summaries use it."""
        cat = catalog_root(root)
        self._check_encoder(cat, claim=True)
        document = cat["documents"].get(source)
        if document is None:
            document = Document(source, "", kind, metadata)
            cat["documents"][source] = document
        if chunk_id is None or chunk_id in cat["chunks"]:
            chunk_id = self._new_id(cat)
        chunk = Chunk(chunk_id, source, 0, len(text), text, kind, metadata)
        self._index_chunk(cat, chunk, document.format)
        document.chunk_ids = (*document.chunk_ids, chunk.id)
        document.vectors = document.vectors + to_bytes(vector.reshape(1, DIMS))
        return Change(added=[chunk.id], added_vectors=[vector], bumps=_bump(cat))

    def reinstate(self, root: Any, record: Mapping[str, Any], vector: np.ndarray) -> Change:
        """Put back an archived chunk (a record the curator wrote) into its document."""
        cat = catalog_root(root)
        self._check_encoder(cat, claim=True)
        document = cat["documents"][record["source"]]
        chunk_id = record["id"] if record["id"] not in cat["chunks"] else self._new_id(cat)
        chunk = Chunk(
            chunk_id,
            document.source,
            record["start"],
            record["end"],
            record["text"],
            record["kind"],
            record["metadata"],
        )
        chunk.created = record["created"]
        self._index_chunk(cat, chunk, document.format)
        document.chunk_ids = (*document.chunk_ids, chunk_id)
        document.vectors = document.vectors + to_bytes(vector.reshape(1, DIMS))
        document.archived = tuple(i for i in document.archived if i != record["id"])
        return Change(added=[chunk_id], added_vectors=[vector], bumps=_bump(cat))

    def remove_document(self, root: Any, source: str) -> Change:
        cat = catalog_root(root)
        change = Change()
        document = cat["documents"].get(source)
        if document is None:
            return change
        for chunk_id in document.chunk_ids:
            self._unindex_chunk(cat, chunk_id)
            change.removed.append(chunk_id)
        del cat["documents"][source]
        change.bumps += _bump(cat)
        return change

    def forget(self, sources: Sequence[str]) -> dict[str, int]:
        """Remove the documents ``sources`` and their chunks from the catalog, in one
        transaction (the image's history undoes it); {source: chunks removed}.

        ``CatalogError`` names a source the catalog does not hold, and one whose chunks the
        curator folded into archives: their text lives on there and in the archives'
        summaries, so forgetting the document alone would not forget it. Nothing is removed
        then."""
        outcome: dict[str, Any] = {}

        def apply(root: Any) -> dict[str, int]:
            cat = catalog_root(root)
            missing = [s for s in sources if s not in cat["documents"]]
            if missing:
                raise CatalogError(
                    f"the catalog holds no document {missing[0][:200]!r}"
                    + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""),
                    hint="name a document as 'batos search --json' shows its source (for a "
                    "file, its absolute path); nothing was removed",
                )
            folded = [s for s in sources if cat["documents"][s].archived]
            if folded:
                archives = sorted(set(cat["documents"][folded[0]].archives))
                raise CatalogError(
                    f"{folded[0][:200]!r} has chunks the curator folded into "
                    f"archive(s) {', '.join(map(str, archives))}: their text lives on there and "
                    "in the archives' summaries; nothing was removed",
                    hint="restore them first ('batos curate --restore ID' for each), then forget "
                    "the document",
                )
            outcome["version"] = self.version(root)
            change, removed = Change(), {}
            for source in dict.fromkeys(sources):
                one = self.remove_document(root, source)
                removed[source] = len(one.removed)
                change.extend(one)
            outcome["change"] = change
            return removed

        count = len(sources)
        removed = self.image.transact(apply, note=f"catalog: forget {count} document(s)")
        self.committed(outcome["change"], outcome["version"])
        return removed

    def remove_chunks(
        self, root: Any, chunk_ids: Iterable[int], *, archive: int | None = None
    ) -> Change:
        """Take chunks out of the live set. With ``archive`` their documents note that they
        went to that archive (so a restore knows they belong); a document left with neither
        live nor archived chunks and no file behind it (a summary holder) is dropped."""
        cat = catalog_root(root)
        by_source: dict[str, set[int]] = {}
        for chunk_id in set(chunk_ids):
            chunk = cat["chunks"].get(chunk_id)
            if chunk is not None:
                by_source.setdefault(chunk.source, set()).add(chunk_id)
        change = Change()
        for source, ids in by_source.items():
            document = cat["documents"][source]
            for chunk_id in ids:
                self._unindex_chunk(cat, chunk_id)
                change.removed.append(chunk_id)
            keep = [i for i, cid in enumerate(document.chunk_ids) if cid not in ids]
            document.vectors = to_bytes(from_bytes(document.vectors)[keep])
            document.chunk_ids = tuple(document.chunk_ids[i] for i in keep)
            if archive is not None:
                document.archived = (*document.archived, *sorted(ids))
                if archive not in document.archives:
                    document.archives = (*document.archives, archive)
            if not (document.chunk_ids or document.archived or document.content_hash):
                del cat["documents"][source]
        if change.removed:
            change.bumps += _bump(cat)
        return change

    @staticmethod
    def version(root: Any) -> int:
        """The catalog's change counter as this transaction sees it."""
        return catalog_root(root)["version"]()

    def _new_id(self, cat: Any) -> int:
        chunks = cat["chunks"]
        while True:
            chunk_id = random.randint(1, _MAX_ID)
            if chunk_id not in chunks:
                return chunk_id

    def _index_chunk(self, cat: Any, chunk: Chunk, fmt: str) -> None:
        cat["chunks"][chunk.id] = chunk
        cat["text"].index_doc(chunk.id, chunk.text)
        for name, value in self._field_values(chunk, fmt).items():
            values = cat["fields"].get(name)
            if values is None:
                values = cat["fields"][name] = OOBTree()
            members = values.get(value)
            if members is None:
                members = values[value] = IFTreeSet()
            members.add(chunk.id)

    def _unindex_chunk(self, cat: Any, chunk_id: int) -> None:
        chunk = cat["chunks"].pop(chunk_id, None)
        if chunk is None:
            return
        cat["text"].unindex_doc(chunk_id)
        document = cat["documents"].get(chunk.source)
        fmt = document.format if document is not None else ""
        for name, value in self._field_values(chunk, fmt).items():
            members = cat["fields"].get(name, {}).get(value)
            if members is not None and chunk_id in members:
                members.remove(chunk_id)
                if not members:
                    del cat["fields"][name][value]
        if chunk_id in cat["retrieved"]:
            del cat["retrieved"][chunk_id]

    @staticmethod
    def _field_values(chunk: Chunk, fmt: str) -> dict[str, str]:
        values = {
            name: str(value)
            for name, value in chunk.metadata.items()
            if isinstance(value, (str, int, float, bool))
        }
        values.update(source=chunk.source, kind=chunk.kind, format=fmt)
        return values

    # -- keeping this process's vector cache in step -----------------------------------

    def committed(self, change: Change, version_before: int) -> None:
        """Apply a committed change to the caches; ``version_before`` is the counter the
        writing transaction read before its first change. If anyone else wrote meanwhile,
        the next search compares the caches with the image."""
        with self._lock:
            caches = [c for c in (self.vectors, self.lexical) if c.version is not None]
            if not caches:
                return  # never loaded: the first search loads everything anyway
            if self.vectors.version is not None:
                self.vectors.remove(change.removed)
                if change.added:
                    self.vectors.add(change.added, np.vstack(change.added_vectors))
            with self.image.read() as root:
                cat = catalog_root(root)
                now = cat["version"]()
                if self.lexical.version is not None:
                    self.lexical.remove(change.removed)
                    self.lexical.add(cat["text"].index, change.added)
            for cache in caches:
                alone = cache.version == version_before and now == version_before + change.bumps
                cache.version = now if alone else -1

    def _sync(self, cat: Any) -> None:
        """Bring the vector matrix to the version ``cat`` shows."""
        version = cat["version"]()
        with self._lock:
            if self.vectors.version == version:
                return
            if self.vectors.version is None:
                self._rebuild(cat)
            else:
                self._reconcile(cat)
            self.vectors.version = version

    def _sync_lexical(self, cat: Any) -> int:
        """Bring the posting arrays to the version ``cat`` shows; returns that version."""
        version = cat["version"]()
        with self._lock:
            lexical = self.lexical
            if lexical.version == version:
                return version
            index = cat["text"].index
            if lexical.version is None or lexical.stale:
                started = time.perf_counter()
                lexical.load(index)
                log.info(
                    "loaded %d chunk lengths in %.2fs", len(lexical), time.perf_counter() - started
                )
            else:
                stored = np.fromiter(cat["chunks"].keys(), dtype=np.int64)
                cached = lexical.ids()
                lexical.remove(np.setdiff1d(cached, stored, assume_unique=True))
                lexical.add(index, np.setdiff1d(stored, cached, assume_unique=True))
            lexical.version = version
            return version

    def _rebuild(self, cat: Any) -> None:
        started = time.perf_counter()
        ids: list[int] = []
        blocks: list[np.ndarray] = []
        for document in cat["documents"].values():
            if document.chunk_ids:
                ids.extend(document.chunk_ids)
                blocks.append(from_bytes(document.vectors))
            document._p_deactivate()  # the blocks keep the bytes; free the rest
        matrix = np.vstack(blocks) if blocks else np.zeros((0, DIMS), dtype=np.float32)
        self.vectors.load(np.asarray(ids, dtype=np.int64), matrix)
        log.info("loaded %d vectors in %.2fs", len(self.vectors), time.perf_counter() - started)

    def _reconcile(self, cat: Any) -> None:
        """Bring the cache in line with the image after another process changed it."""
        stored = np.fromiter(cat["chunks"].keys(), dtype=np.int64)
        cached = self.vectors.ids()
        self.vectors.remove(np.setdiff1d(cached, stored, assume_unique=True).tolist())
        missing = np.setdiff1d(stored, cached, assume_unique=True).tolist()
        by_source: dict[str, set[int]] = {}
        for chunk_id in missing:
            by_source.setdefault(cat["chunks"][chunk_id].source, set()).add(chunk_id)
        for source, wanted in by_source.items():
            document = cat["documents"][source]
            rows = [i for i, cid in enumerate(document.chunk_ids) if cid in wanted]
            ids = [document.chunk_ids[i] for i in rows]
            self.vectors.add(ids, from_bytes(document.vectors)[rows])

    # -- reads ----------------------------------------------------------------------------

    def search(
        self,
        query: str,
        k: int = 5,
        *,
        filters: Mapping[str, str | Sequence[str]] | None = None,
        mode: str = "hybrid",
        record: bool = True,
        query_vector: np.ndarray | None = None,
    ) -> list[Hit]:
        """The ``k`` best chunks for ``query``: ``mode`` is 'hybrid', 'lexical' or 'dense'.

        ``filters`` maps a metadata field (``source``, ``kind``, ``format`` or a document's own
        metadata key) to a value or a list of accepted values; all fields must match.
        ``query_vector`` is ``query``'s embedding when the caller has it already.
        """
        if mode not in ("hybrid", "lexical", "dense"):
            raise CatalogError(
                f"unknown search mode {mode!r}", hint="use 'hybrid', 'lexical' or 'dense'"
            )
        if k <= 0 or not query.strip():
            return []
        depth = max(k * CANDIDATES_PER_RESULT, MIN_CANDIDATES) if mode == "hybrid" else k
        if mode == "lexical":
            query_vector = None
        elif query_vector is None:
            query_vector = self.embedder.encode_one(query)
        with self.image.read() as root:
            cat = catalog_root(root)
            allowed = self._allowed(cat, filters)
            if allowed is not None and not len(allowed):
                return []
            lexical = self._lexical(cat, query, depth, allowed) if mode != "dense" else []
            dense: list[tuple[int, float]] = []
            if query_vector is not None:
                self._check_encoder(cat)
                self._sync(cat)
                dense = self.vectors.search(query_vector, depth, allowed)
            if mode == "lexical":
                ranked = lexical[:k]
            elif mode == "dense":
                ranked = dense[:k]
            else:
                ranked = reciprocal_rank_fusion([[i for i, _ in lexical], [i for i, _ in dense]], k)
                if query_vector is not None:
                    ranked = self._with_named(cat, query, query_vector, ranked, k, allowed)
            lexical_rank = {cid: rank for rank, (cid, _) in enumerate(lexical, start=1)}
            dense_rank = {cid: rank for rank, (cid, _) in enumerate(dense, start=1)}
            hits = [
                self._hit(cat["chunks"][cid], score, lexical_rank.get(cid), dense_rank.get(cid))
                for cid, score in ranked
                if cid in cat["chunks"]
            ]
        if record:
            self._record_retrievals(hit.chunk_id for hit in hits)
        return hits

    def _with_named(
        self,
        cat: Any,
        query: str,
        query_vector: np.ndarray,
        ranked: list[tuple[int, float]],
        k: int,
        allowed: np.ndarray | None,
    ) -> list[tuple[int, float]]:
        """``ranked`` with the best passage of each document ``query`` names in front, when
        none of those documents has a passage among its first ``NAMED_LEAVE`` already.

        A query whose text and vectors found the document it names keeps its order exactly:
        it is a query whose words are in its document anyway, and reordering its passages by
        the name lost answers that were right. A named document that nothing found ("the
        libdpkg-perl package", whose file never says its name) gets its passage nearest the
        query read first, scored level with the fusion's best.
        """
        if settings.get_str("catalog_names") == "off":
            return ranked
        text = cat["text"]
        named = self._document_names(cat).named(text.lexicon, text.index._wordinfo, query)
        if not named:
            return ranked
        chunks = cat["chunks"]
        # A chunk another thread's commit added after this read's snapshot is not in it: it
        # counts for nothing here, as the hits leave it out.
        if any(
            chunk is not None and chunk.source in named
            for chunk in (chunks.get(cid) for cid, _ in ranked[:NAMED_LEAVE])
        ):
            return ranked
        top = ranked[0][1] if ranked else 1.0 / (RRF_K + 1)  # a first place in one list
        front: list[tuple[int, float]] = []
        for source in named:
            document = cat["documents"].get(source)
            if document is None or not document.chunk_ids:
                continue
            ids = np.unique(np.asarray(document.chunk_ids, dtype=np.int64))
            if allowed is not None:
                ids = np.intersect1d(ids, allowed, assume_unique=True)
            # empty when another thread has just taken the document's vectors out
            nearest = self.vectors.search(query_vector, 1, ids) if len(ids) else []
            if nearest:
                front.append((nearest[0][0], top))
        chosen = {cid for cid, _ in front}
        return (front + [(cid, score) for cid, score in ranked if cid not in chosen])[:k]

    def _document_names(self, cat: Any) -> DocumentNames:
        """The catalog's document names, built once per catalog version."""
        version = cat["version"]()
        with self._names_lock:  # one thread builds; the others wait for it, then read it
            if self._names is not None and self._names[0] == version:
                return self._names[1]
            by_source = cat["fields"].get("source", {})
            sources = [s for s in cat["documents"].keys() if not s.startswith(SUMMARY_PREFIX)]
            names = DocumentNames(
                cat["text"].lexicon, sources, [by_source.get(source, ()) for source in sources]
            )
            self._names = (version, names)
            return names

    def known_terms(self, terms: Iterable[str]) -> set[str]:
        """Which of ``terms`` occur in the catalog's text (as its full-text index splits and
        normalises them): a name the catalog knows says a request is about it."""
        with self.image.read() as root:
            lexicon = catalog_root(root)["text"].lexicon
            return {t for t in terms if any(lexicon.termToWordIds(t))}

    def _lexical(
        self, cat: Any, query: str, k: int, allowed: np.ndarray | None
    ) -> list[tuple[int, float]]:
        text = cat["text"]
        wids = [wid for wid in text.lexicon.termToWordIds(query) if wid]
        if not wids:  # stop words only, or no word the catalog has seen
            return []
        version = self._sync_lexical(cat)
        return self.lexical.search(text.index, wids, k, allowed, version=version)

    def unmatched(self, filters: Mapping[str, Any]) -> list[str]:
        """The fields of ``filters`` no chunk has any of the asked values of: what to tell a
        user whose filtered search found nothing, rather than "no match"."""
        with self.image.read() as root:
            fields = catalog_root(root)["fields"]
            missing = []
            for name, value in filters.items():
                accepted = [value] if isinstance(value, (str, int, float, bool)) else list(value)
                values = fields.get(name)
                if values is None or not any(s in values for s in _spellings(accepted)):
                    missing.append(name)
            return missing

    def _allowed(self, cat: Any, filters: Mapping[str, Any] | None) -> np.ndarray | None:
        """The chunk ids every filter accepts (sorted int64), or None for no filter.

        The last result is kept for its catalog version: a run of queries under one filter
        (``batos search --file … --where …``) gets the same array back, which the caches
        recognise and map to their rows once.
        """
        if not filters:
            return None
        wanted = {
            name: [value] if isinstance(value, (str, int, float, bool)) else list(value)
            for name, value in filters.items()
        }
        key = (cat["version"](), sorted((n, sorted(_spellings(v))) for n, v in wanted.items()))
        last = self._last_filter
        if last is not None and last[0] == key:
            return last[1]
        result = None
        for name, accepted in wanted.items():
            values = cat["fields"].get(name)
            spelt = _spellings(accepted)
            sets = [values[v] for v in spelt if values is not None and v in values]
            members = family32.IF.multiunion(sets) if sets else IFTreeSet()
            result = members if result is None else family32.IF.intersection(result, members)
        assert result is not None  # filters is not empty
        # The tree set iterates in ascending order, which the caches' lookups rely on.
        allowed = np.fromiter(result.keys(), dtype=np.int64, count=len(result))
        self._last_filter = (key, allowed)
        return allowed

    @staticmethod
    def _hit(chunk: Chunk, score: float, lexical: int | None, dense: int | None) -> Hit:
        return Hit(
            chunk.id,
            chunk.source,
            chunk.start,
            chunk.end,
            chunk.text,
            float(score),
            chunk.kind,
            lexical,
            dense,
            dict(chunk.metadata),
        )

    # -- retrieval times, for the curator ---------------------------------------------

    def _record_retrievals(self, chunk_ids: Iterable[int]) -> None:
        now = int(time.time())
        with self._lock:
            self._retrieved.update(dict.fromkeys(chunk_ids, now))
            due = time.monotonic() - self._retrieved_flushed > RETRIEVAL_FLUSH_SECONDS
        if due:
            self.flush_retrievals()

    def flush_retrievals(self) -> None:
        """Write the retrieval times gathered in this process to the image."""
        with self._lock:
            pending, self._retrieved = self._retrieved, {}
            self._retrieved_flushed = time.monotonic()
        if not pending:
            return

        def write(root: Any) -> None:
            cat = catalog_root(root)
            retrieved = cat["retrieved"]
            for chunk_id, when in pending.items():
                if chunk_id in cat["chunks"] and retrieved.get(chunk_id, 0) < when:
                    retrieved[chunk_id] = when

        self.image.transact(write, note="catalog: retrieval times")

    # -- inspection -------------------------------------------------------------------

    def document(self, source: str) -> dict[str, Any] | None:
        with self.image.read() as root:
            document = catalog_root(root)["documents"].get(source)
            if document is None:
                return None
            return {
                "source": document.source,
                "content_hash": document.content_hash,
                "format": document.format,
                "chunks": list(document.chunk_ids),
                "archived": list(document.archived),
                "archives": list(document.archives),
                "metadata": dict(document.metadata),
            }

    def chunk_texts(self, source: str) -> list[tuple[int, int, str]]:
        """(start, end, text) of a document's live chunks, in document order."""
        with self.image.read() as root:
            cat = catalog_root(root)
            document = cat["documents"].get(source)
            if document is None:
                return []
            chunks = [cat["chunks"][cid] for cid in document.chunk_ids]
            return sorted((c.start, c.end, c.text) for c in chunks)

    def stats(self) -> dict[str, int]:
        with self.image.read() as root:
            cat = catalog_root(root)
            return {
                "documents": len(cat["documents"]),
                "chunks": len(cat["chunks"]),
                "archives": len(cat["archives"]),
                "words": cat["text"].wordCount(),
                "version": cat["version"](),
            }
