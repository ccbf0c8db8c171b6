"""The curator: folds cold or redundant chunks into summaries and archives the originals.

A chunk is *cold* when nobody has retrieved it in the last ``cold_after`` seconds (or ever). A
*cluster* is a group of cold chunks that say nearly the same thing (cosine at least
``similarity``) or — when the catalog holds more live chunks than ``catalog_max_chunks`` — a
topical group of the least recently retrieved ones. Each cluster is summarised by a callable
the caller supplies (``summarize(texts) -> str``; the graph layer wires a persona's model to
it), the summary becomes one searchable chunk, and the originals go to a compressed archive in
the image (a ZODB blob where the storage has blobs). Summaries fold again later, so the live set
stays bounded however long the image runs.

``originals`` reads an archive back without changing anything; ``restore`` puts the chunks back
and drops the summary (opening first any archive the summary itself was folded into). When a
document is re-ingested, ``unfold`` drops the summaries made from its old text and puts the
other originals they covered back, for a later run to fold again. Summaries are drafted outside
any transaction; each cluster is then applied in its own transaction and skipped if any of its
chunks changed meanwhile.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from persistent import Persistent
from ZODB.blob import Blob
from ZODB.interfaces import IBlobStorage

from batos import settings
from batos.errors import ArchiveError, PromptTooLong
from store.knowledge.catalog import Change, Chunk, KnowledgeCatalog, catalog_root, stored_vector
from store.knowledge.names import SUMMARY_PREFIX

log = logging.getLogger("batos.curator")

Summarize = Callable[[list[str]], str]

#: A chunk not retrieved for this long (or never) is cold: a week of disuse.
COLD_AFTER_SECONDS = 7 * 24 * 3600.0
#: Cosine at or above which two cold chunks count as saying the same thing.
REDUNDANT_SIMILARITY = 0.85
#: Most chunks folded into one summary (keeps the summariser's prompt small).
MAX_CLUSTER = 8
#: Cold chunks compared pairwise when looking for redundancy (the comparison is quadratic).
REDUNDANCY_SCAN = 4000
#: When over budget, archive down to this fraction of ``catalog_max_chunks`` so the next
#: ingest does not trigger the curator again at once.
TARGET_FRACTION = 0.9


class Archive(Persistent):
    """Originals the curator folded into one summary chunk, compressed."""

    def __init__(self, archive_id: int, summary_id: int, payload: bytes, use_blob: bool):
        self.id = archive_id
        self.summary_id = summary_id
        self.created = time.time()
        self.size = len(payload)
        if use_blob:
            self.blob: Blob | None = Blob()
            with self.blob.open("w") as out:
                out.write(payload)
            self.payload = b""
        else:
            self.blob = None
            self.payload = payload

    def read(self) -> bytes:
        if self.blob is None:
            return self.payload
        with self.blob.open("r") as data:
            return data.read()


@dataclass
class CurationReport:
    live_before: int = 0
    live_after: int = 0
    archives: list[int] = field(default_factory=list)
    archived_chunks: int = 0
    skipped_clusters: int = 0
    #: Clusters skipped because their texts do not fit the summariser's prompt (their chunk
    #: ids), counted in ``skipped_clusters`` too.
    too_long: list[tuple[int, ...]] = field(default_factory=list)


@dataclass(frozen=True)
class Cluster:
    chunk_ids: tuple[int, ...]
    texts: tuple[str, ...]
    reason: str  # "redundant" or "cold"


class Curator:
    """Plans and applies the folding of cold chunks; see the module docstring."""

    def __init__(
        self,
        catalog: KnowledgeCatalog,
        summarize: Summarize,
        *,
        max_chunks: int | None = None,
        similarity: float = REDUNDANT_SIMILARITY,
        min_age_seconds: float = 0.0,
        cold_after: float = COLD_AFTER_SECONDS,
    ) -> None:
        self.catalog = catalog
        self.summarize = summarize
        # None is "not given"; 0 is a budget (of nothing), never the setting in disguise.
        self.max_chunks = (
            settings.get_int("catalog_max_chunks") if max_chunks is None else max_chunks
        )
        self.similarity = similarity
        self.min_age_seconds = min_age_seconds
        self.cold_after = cold_after

    # -- planning --------------------------------------------------------------------

    def plan(self) -> list[Cluster]:
        """Clusters to fold: redundant cold groups first, then, while the catalog is over
        budget, topical groups of the least recently retrieved chunks."""
        self.catalog.flush_retrievals()
        now = time.time()
        with self.catalog.image.read() as root:
            cat = catalog_root(root)
            self.catalog._sync(cat)
            live = len(cat["chunks"])
            retrieved = cat["retrieved"]
            foldable: list[tuple[int, Chunk]] = []
            for document in cat["documents"].values():
                # Summaries fold too: old summaries become summaries of summaries, which is
                # what keeps the live set bounded however long the image runs.
                for chunk_id in document.chunk_ids:
                    chunk = cat["chunks"][chunk_id]
                    if now - chunk.created >= self.min_age_seconds:
                        foldable.append((retrieved.get(chunk_id, 0), chunk))
            # Never retrieved first (oldest first), then least recently retrieved.
            foldable.sort(key=lambda pair: (pair[0], pair[1].created, pair[1].start))
            cutoff = now - self.cold_after
            clusters = self._redundant([c for last, c in foldable if last <= cutoff])
            taken = {cid for c in clusters for cid in c.chunk_ids}
            excess = live - sum(len(c.chunk_ids) - 1 for c in clusters) - self.max_chunks
            if excess > 0:
                excess += int(self.max_chunks * (1 - TARGET_FRACTION))
                rest = [c for _, c in foldable if c.id not in taken]
                clusters.extend(self._least_used_groups(rest, excess))
        return clusters

    def _redundant(self, cold: Sequence[Chunk]) -> list[Cluster]:
        candidates = [c for c in cold if c.id in self.catalog.vectors][:REDUNDANCY_SCAN]
        if len(candidates) < 2:
            return []
        # every candidate has a vector: kept above only if it is in the vector store
        vectors = np.vstack([self.catalog.vectors.vector(c.id) for c in candidates])  # type: ignore[misc]
        similar = (vectors @ vectors.T) >= self.similarity
        free = np.ones(len(candidates), dtype=bool)
        clusters = []
        for i in range(len(candidates)):
            if not free[i]:
                continue
            members = np.flatnonzero(similar[i] & free)[:MAX_CLUSTER]
            if len(members) < 2:
                continue
            free[members] = False
            group = [candidates[j] for j in members]
            clusters.append(
                Cluster(tuple(c.id for c in group), tuple(c.text for c in group), "redundant")
            )
        return clusters

    def _least_used_groups(self, ordered: Sequence[Chunk], excess: int) -> list[Cluster]:
        """Topical groups of up to MAX_CLUSTER chunks drawn from the least used ones only,
        until folding them would remove ``excess`` chunks from the live set."""
        needed = -(-excess * MAX_CLUSTER // (MAX_CLUSTER - 1)) + 1
        pool = [c for c in ordered if c.id in self.catalog.vectors][: min(needed, REDUNDANCY_SCAN)]
        if len(pool) < 2:
            return []
        # every member of the pool has a vector: kept above only if it is in the vector store
        vectors = np.vstack([self.catalog.vectors.vector(c.id) for c in pool])  # type: ignore[misc]
        similarity = vectors @ vectors.T
        free = np.ones(len(pool), dtype=bool)
        groups: list[Cluster] = []
        for seed in range(len(pool)):
            if excess <= 0:
                break
            if not free[seed]:
                continue
            others = np.flatnonzero(free)
            nearest = others[np.argsort(-similarity[seed, others], kind="stable")]
            members = nearest[: min(MAX_CLUSTER, excess + 1)]
            if len(members) < 2:
                break
            free[members] = False
            group = sorted((pool[j] for j in members), key=lambda c: (c.source, c.start))
            groups.append(Cluster(tuple(c.id for c in group), tuple(c.text for c in group), "cold"))
            excess -= len(members) - 1
        return groups

    # -- applying --------------------------------------------------------------------

    def run(
        self,
        max_clusters: int | None = None,
        *,
        on_cluster: Callable[[int, int, CurationReport], None] | None = None,
    ) -> CurationReport:
        """Plan, summarise and fold; each cluster commits on its own.

        A cluster whose texts the summariser's model cannot take in one prompt
        (``PromptTooLong``) is skipped and listed in ``report.too_long``: it would fail the
        same way on every run, and end the run each time before any later cluster.
        ``on_cluster(done, total, report)`` follows the progress, once per cluster.
        """
        report = CurationReport(live_before=self.catalog.stats()["chunks"])
        clusters = self.plan()[:max_clusters]
        for done, cluster in enumerate(clusters, start=1):
            try:
                summary = self.summarize(list(cluster.texts)).strip()
            except PromptTooLong as exc:
                log.warning("cluster %s skipped: %s", list(cluster.chunk_ids), exc.message)
                report.too_long.append(cluster.chunk_ids)
                summary = ""
            archive_id = self.fold(cluster, summary) if summary else None
            if archive_id is None:
                report.skipped_clusters += 1
            else:
                report.archives.append(archive_id)
                report.archived_chunks += len(cluster.chunk_ids)
            if on_cluster is not None:
                on_cluster(done, len(clusters), report)
        report.live_after = self.catalog.stats()["chunks"]
        log.info("curated: %s", report)
        return report

    def fold(self, cluster: Cluster, summary: str) -> int | None:
        """Replace the cluster's chunks by ``summary``; None if they changed meanwhile."""
        vector = self.catalog.embedder.encode_one(summary)
        outcome: dict[str, Any] = {}

        def apply(root: Any) -> int | None:
            cat = catalog_root(root)
            chunks = [cat["chunks"].get(cid) for cid in cluster.chunk_ids]
            if any(c is None for c in chunks) or tuple(c.text for c in chunks) != cluster.texts:
                return None
            outcome["version"] = self.catalog.version(root)
            records = [_record(c, stored_vector(cat, c)) for c in chunks]
            payload = zlib.compress(json.dumps(records).encode("utf-8"), 6)
            archive_id = _new_archive_id(cat)
            change = self.catalog.remove_chunks(root, cluster.chunk_ids, archive=archive_id)
            change.extend(
                self.catalog.add_chunk(
                    root,
                    f"{SUMMARY_PREFIX}{archive_id}",
                    summary,
                    vector,
                    kind="summary",
                    metadata={
                        "archive": archive_id,
                        "reason": cluster.reason,
                        "sources": sorted({c.source for c in chunks}),
                    },
                )
            )
            summary_id = change.added[-1]
            cat["archives"][archive_id] = Archive(archive_id, summary_id, payload, _has_blobs(root))
            outcome["change"] = change
            return archive_id

        archive_id = self.catalog.image.transact(apply, note="curator: fold a cluster")
        if archive_id is not None:
            self.catalog.committed(outcome["change"], outcome["version"])
        return archive_id

    def restore(self, archive_id: int) -> list[int]:
        """Put an archive's chunks back (where their documents still hold them) and drop its
        summary; returns the chunk ids that came back. If the summary was itself folded into
        another archive, that one is opened first, so a summary and its originals are never
        live together."""
        outcome: dict[str, Any] = {}

        def apply(root: Any) -> list[int]:
            outcome["version"] = self.catalog.version(root)
            change, restored = unfold(self.catalog, root, archive_id, touch=True)
            outcome["change"] = change
            return restored

        restored = self.catalog.image.transact(apply, note=f"curator: restore {archive_id}")
        self.catalog.committed(outcome["change"], outcome["version"])
        return restored


def unfold(
    catalog: KnowledgeCatalog, root: Any, archive_id: int, *, touch: bool = False
) -> tuple[Change, list[int]]:
    """Inside the caller's transaction: drop ``archive_id``'s summary, put back the archived
    chunks their documents still list, delete the archive. ``touch`` marks them retrieved now
    (a restore asked for them); otherwise they come back as cold as they went."""
    cat = catalog_root(root)
    archive = cat["archives"].get(archive_id)
    if archive is None:
        raise _missing(archive_id)
    change = Change()
    restored: list[int] = []
    holder = cat["documents"].get(f"{SUMMARY_PREFIX}{archive_id}")
    if archive.summary_id not in cat["chunks"] and holder is not None:
        # The summary went into an outer archive: open that first, which makes it live.
        for outer in holder.archives:
            if outer in cat["archives"]:
                more, back = unfold(catalog, root, outer, touch=touch)
                change.extend(more)
                restored.extend(back)
    change.extend(catalog.remove_chunks(root, [archive.summary_id]))
    # The outer archive brought this summary back only for it to go again here: it is not
    # among the chunks that came back (a restore counted it, one more than it restored).
    restored = [c for c in restored if c != archive.summary_id]
    now = int(time.time())
    records = _decode(archive.read())
    for record in records:
        document = cat["documents"].get(record["source"])
        if document is None or record["id"] not in document.archived:
            continue  # the document was removed or re-ingested since
        inner = record["metadata"].get("archive") if record["kind"] == "summary" else None
        if inner is not None and inner not in cat["archives"]:
            continue  # a summary whose originals are back already
        vector = np.frombuffer(base64.b64decode(record["vector"]), dtype="<f4")
        added = catalog.reinstate(root, record, vector)
        change.extend(added)
        restored.extend(added.added)
        if touch:
            cat["retrieved"][added.added[-1]] = now
    for record in records:
        document = cat["documents"].get(record["source"])
        if document is not None and archive_id in document.archives:
            document.archives = tuple(a for a in document.archives if a != archive_id)
    del cat["archives"][archive_id]
    return change, restored


def originals(catalog: KnowledgeCatalog, archive_id: int) -> list[dict[str, Any]]:
    """The archived chunks of ``archive_id`` (source, start, end, text, …), read-only."""
    with catalog.image.read() as root:
        archive = catalog_root(root)["archives"].get(archive_id)
        if archive is None:
            raise _missing(archive_id)
        records = _decode(archive.read())
    for record in records:
        record.pop("vector", None)
    return records


def archives(catalog: KnowledgeCatalog) -> list[dict[str, Any]]:
    with catalog.image.read() as root:
        return [
            {"id": a.id, "summary": a.summary_id, "created": a.created, "bytes": a.size}
            for a in catalog_root(root)["archives"].values()
        ]


def _record(chunk: Chunk, vector: np.ndarray) -> dict[str, Any]:
    return {
        "id": chunk.id,
        "source": chunk.source,
        "start": chunk.start,
        "end": chunk.end,
        "text": chunk.text,
        "kind": chunk.kind,
        "metadata": chunk.metadata,
        "created": chunk.created,
        "vector": base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii"),
    }


def _decode(payload: bytes) -> list[dict[str, Any]]:
    try:
        return json.loads(zlib.decompress(payload))
    except (zlib.error, ValueError) as exc:
        raise ArchiveError(
            f"a curator archive cannot be decoded: {exc}",
            hint="the image may be damaged; check it with 'batos history' and undo if needed",
        ) from exc


def _new_archive_id(cat: Any) -> int:
    while True:
        archive_id = random.randint(1, 2**31 - 1)
        if archive_id not in cat["archives"]:
            return archive_id


def _has_blobs(root: Any) -> bool:
    return IBlobStorage.providedBy(root._p_jar.db().storage)


def _missing(archive_id: int) -> ArchiveError:
    return ArchiveError(
        f"no curator archive {archive_id}", hint="list them with 'batos curate --list'"
    )
