"""Packing the image, and how much of it there is before and after, in the storage's own terms.

A FileStorage pack rewrites the file, so its size is the measure. RelStorage on PostgreSQL
deletes rows: the database's size on disk does not shrink (PostgreSQL keeps the freed pages for
reuse until ``VACUUM FULL``), so the measure there is the object-state rows and their bytes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from store.core.image import LivingImage, image_path, shown_uri

log = logging.getLogger("batos.pack")


@dataclass(frozen=True)
class Footprint:
    """How much an image holds: bytes, and for a database the object revisions stored."""

    bytes: int
    revisions: int | None = None  # object-state rows (RelStorage only)
    blob_chunks: int | None = None  # blob rows (RelStorage only)


@dataclass(frozen=True)
class PackReport:
    """What a pack did: the footprint before and after and how the storage packs."""

    storage: str  # "FileStorage", "ZEO", "RelStorage (history-preserving)", …
    before: Footprint
    after: Footprint
    notes: tuple[str, ...] = ()


def _relstorage(image: LivingImage) -> Any:
    if not image.uri.startswith("postgres"):
        return None
    from relstorage.storage import RelStorage

    storage = image.db.storage
    return storage if isinstance(storage, RelStorage) else None


def footprint(image: LivingImage) -> Footprint:
    """What the image holds now; on RelStorage counted in the database with SQL."""
    storage = _relstorage(image)
    if storage is None:
        return Footprint(bytes=image.db.getSize())

    def count(_conn: object, cursor: Any) -> tuple[int, int, int]:
        cursor.execute("SELECT count(*), coalesce(sum(state_size), 0) FROM object_state")
        rows, size = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM blob_chunk")
        (chunks,) = cursor.fetchone()
        return int(rows), int(size), int(chunks)

    rows, size, chunks = storage._adapter.connmanager.open_and_call(count)
    return Footprint(bytes=size, revisions=rows, blob_chunks=chunks)


def pack(image: LivingImage, days: float = 0.0) -> PackReport:
    """Pack the image: drop revisions older than ``days`` days and objects nothing reaches.

    On a history-free RelStorage there are no old revisions: pack only collects unreachable
    objects, those last written before the pack time.
    """
    storage = _relstorage(image)
    notes: list[str] = []
    if storage is None:
        kind = "ZEO" if image.uri.startswith("zeo") else type(image.db.storage).__name__
    else:
        history = storage.keep_history
        kind = f"RelStorage ({'history-preserving' if history else 'history-free'})"
        if history:
            notes.append(
                f"revisions older than {days:g} days that are no longer current were "
                "deleted, with objects nothing reaches; undo before that point is gone"
            )
        else:
            notes.append(
                "a history-free database keeps one revision per object: pack deleted the "
                f"objects nothing reaches that were last written over {days:g} days ago"
            )
        notes.append(
            "PostgreSQL reuses the freed space; 'VACUUM FULL' in psql returns it to the "
            "operating system (it locks the tables while it runs)"
        )
    before = footprint(image)
    image.db.pack(days=days)
    path = image_path(image.uri)
    if path is not None:
        # FileStorage keeps the file as it was before the pack beside it (x.fs.old): more on
        # disk than before the pack. A copy made first is the backup to keep. (A ZEO server
        # started by 'batos zeo start' is told not to keep one.)
        Path(f"{path}.old").unlink(missing_ok=True)
    after = footprint(image)
    log.info("packed %s (%s): %s -> %s", shown_uri(image.uri), kind, before, after)
    return PackReport(kind, before, after, tuple(notes))
