"""The file behind a file:// image: checked before ZODB opens it, repaired only on request.

FileStorage mends a file by itself when it opens it: whatever follows the last transaction it
can read is cut off (and copied to ``NAME.trN``). That is right for a transaction that never
committed — a process killed mid-commit leaves one, its status byte still 'c' — and wrong for
a committed transaction that is damaged: those bytes are history, and cutting them silently
loses it. ``check`` reads the transaction headers first so that the two can be told apart;
``repair`` runs ZODB's own ``fsrecover`` into a new file and keeps the damaged one beside it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import logging
import mmap
import os
import re
import shutil
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from ZODB.FileStorage import packed_version
from ZODB.FileStorage.format import TRANS_HDR, TRANS_HDR_LEN
from ZODB.TimeStamp import TimeStamp

from batos.errors import ImageCorruptError, ImageError, ImageLockedError

log = logging.getLogger("batos.image")

#: The first four bytes of every FileStorage file this ZODB reads.
MAGIC: bytes = packed_version
#: Offset of the status byte in a transaction header: ' ' committed, 'p' packed, 'u' undone,
#: 'c' checkpoint (the commit was still being written).
_STATUS_AT = 16
_COMMITTED = (b" ", b"p", b"u")
_LENGTH = struct.Struct(">Q")


@dataclass(frozen=True)
class FileCheck:
    """What ``check`` found: how far the file holds sound committed transactions, and after."""

    path: Path
    size: int
    #: committed transactions read before the end of the file (or before the damage)
    transactions: int
    #: byte offset just after the last sound committed transaction
    end: int
    #: the bytes after ``end`` are one transaction that never committed (a crash mid-commit):
    #: opening drops them, which loses nothing that was ever committed
    uncommitted_tail: bool = False
    #: what is wrong at ``end`` when it is not an uncommitted tail; None when sound
    damage: str | None = None

    @property
    def sound(self) -> bool:
        return self.damage is None and not self.uncommitted_tail


def check(path: Path) -> FileCheck:
    """Read every transaction header of the FileStorage at ``path``; change nothing.

    Raises ``ImageCorruptError`` when the file is not a FileStorage at all. Headers only (no
    object records), through a memory map: a few microseconds per transaction.
    """
    path = Path(path)
    size = path.stat().st_size
    if size == 0:  # a new, empty file: FileStorage writes the magic on open
        return FileCheck(path, 0, 0, 0)
    with open(path, "rb") as handle:
        if handle.read(4) != MAGIC:
            raise ImageCorruptError(
                f"{path} is damaged or not a ZODB FileStorage: it does not start with {MAGIC!r}",
                hint="check the path: a file:// image must name a file written by BAT OS, "
                "or restore the image from a backup",
            )
        if size == len(MAGIC):
            return FileCheck(path, size, 0, size)
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _scan(path, data, size)


def _scan(path: Path, data: mmap.mmap, size: int) -> FileCheck:
    pos, count = len(MAGIC), 0

    def found(**outcome: object) -> FileCheck:
        return FileCheck(path, size, count, pos, **outcome)  # type: ignore[arg-type]

    def damaged(template: str) -> FileCheck:
        # Described only once something is wrong: reading the header's text costs more
        # than the whole check of a sound transaction.
        return found(damage=template.replace("{txn}", _describe(data, pos, size)))

    while pos < size:
        left = size - pos
        if left < TRANS_HDR_LEN:
            status = data[pos + _STATUS_AT : pos + _STATUS_AT + 1]
            if status in (b"", b"c"):  # the header itself was being written
                return found(uncommitted_tail=True)
            return found(damage=f"the file ends {left} bytes into a transaction header")
        _tid, length, status, ulen, dlen, elen = struct.unpack_from(TRANS_HDR, data, pos)
        if status == b"c":
            if pos + length + 8 >= size:
                return found(uncommitted_tail=True)
            return damaged("an uncommitted {txn} is followed by more data")
        if status not in _COMMITTED:
            return damaged(f"the {{txn}} has an invalid status byte {status!r}")
        if length < TRANS_HDR_LEN + ulen + dlen + elen:
            return damaged("the header of the {txn} is inconsistent")
        if pos + length + 8 > size:
            return damaged(
                f"the committed {{txn}} is cut short: it needs {length + 8:,} bytes, "
                f"the file holds {left:,}"
            )
        (check_length,) = _LENGTH.unpack_from(data, pos + length)
        if check_length != length:
            return damaged("the committed {txn} fails its length check")
        pos += length + 8
        count += 1
    return found()


def _describe(data: mmap.mmap, pos: int, size: int) -> str:
    """'transaction at byte N (time, user: description)', as far as the header can be read."""
    tid, _length, _status, ulen, dlen, _elen = struct.unpack_from(TRANS_HDR, data, pos)
    details = []
    with contextlib.suppress(ValueError, OverflowError, OSError):
        when = dt.datetime.fromtimestamp(TimeStamp(tid).timeTime())
        details.append(when.isoformat(sep=" ", timespec="seconds"))
    start = pos + TRANS_HDR_LEN
    if start + ulen + dlen <= size:
        user = data[start : start + ulen].decode("utf-8", "replace")
        note = data[start + ulen : start + ulen + dlen].decode("utf-8", "replace")
        details.append(f"{user}: {note}" if note else user)
    inside = f" ({', '.join(d for d in details if d)})" if any(details) else ""
    return f"transaction at byte {pos:,}{inside}"


# -- repair -------------------------------------------------------------------------------


@dataclass
class RepairReport:
    """What ``repair`` did: the check that called for it, where the original went, what left."""

    check: FileCheck
    #: the damaged original, kept beside the image; None when nothing needed repairing
    damaged_copy: Path | None = None
    #: committed transactions in the repaired image
    transactions: int = 0
    #: bytes of the original that are not in the repaired image
    bytes_dropped: int = 0
    #: fsrecover's own account of each part it skipped
    messages: list[str] = field(default_factory=list)


_RECOVER_LINES = re.compile(r"(error [^\n]*|Time stamps [^\n]*)")


def repair(path: Path) -> RepairReport:
    """Replace a damaged FileStorage at ``path`` by what ``ZODB.fsrecover`` can save of it.

    The damaged file is kept as ``NAME.damaged-TIMESTAMP`` (its index beside it); the recovered
    copy takes its place in one rename, so ``path`` is at every moment either the old file or
    the new one. Holds the image's lock throughout: an image in use is refused.
    """
    import zc.lockfile
    from ZODB import fsrecover

    path = Path(path)
    if not path.exists():
        raise ImageError(f"no image at {path}", hint="check the path given to --image")
    lock_path = Path(f"{path}.lock")
    lock_was_there = lock_path.exists()
    try:
        lock = zc.lockfile.LockFile(str(lock_path))
    except zc.lockfile.LockError:
        raise ImageLockedError(
            f"{path} is open in another process",
            hint="stop that process (or the ZEO server serving the image), then repair",
        ) from None
    try:
        found = check(path)
        if found.damage is None:
            _refuse_unreadable_records(path, found)
            return RepairReport(found, transactions=found.transactions)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        recovered = path.with_name(f"{path.name}.recovered-{stamp}")
        damaged = path.with_name(f"{path.name}.damaged-{stamp}")
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                fsrecover.recover(str(path), str(recovered))
        except (Exception, SystemExit) as exc:
            _remove_storage_files(recovered, with_data=True)
            raise ImageError(
                f"ZODB's recovery of {path} failed: {exc}\n{output.getvalue()[-2000:]}",
                hint="nothing was changed; restore the image from a backup",
            ) from exc
        _remove_storage_files(recovered, with_data=False)
        _keep_aside(path, damaged)
        os.replace(recovered, path)
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{recovered}.index", f"{path}.index")
        repaired = check(path)
        log.info("repaired %s; the damaged file is kept as %s", path, damaged)
        return RepairReport(
            found,
            damaged_copy=damaged,
            transactions=repaired.transactions,
            bytes_dropped=found.size - repaired.size,
            messages=_RECOVER_LINES.findall(output.getvalue()),
        )
    finally:
        lock.close()
        if not lock_was_there:
            lock_path.unlink(missing_ok=True)


def set_aside_unsafe_index(path: Path) -> Path | None:
    """Move the index file of the FileStorage at ``path`` aside when it names any code.

    ZODB unpickles ``NAME.index`` with no restriction when it opens the file, so an index
    written by someone else could run anything. The index FileStorage writes holds plain data
    only (positions and object ids); any other is renamed ``NAME.index.refused`` and ZODB
    builds the index again from the file (a read of every transaction, once). Returns the new
    name of the index set aside, or None.
    """
    from store.core.image_globals import is_plain_data

    index = Path(f"{path}.index")
    try:
        data = index.read_bytes()
    except OSError:  # none there, or none ZODB could read either
        return None
    if is_plain_data(data):
        return None
    refused = Path(f"{index}.refused")
    try:
        os.replace(index, refused)
    except OSError as exc:  # a read-only folder: the index cannot be set aside, nor trusted
        raise ImageError(
            f"the index of {path} names code, which the index FileStorage writes never does, "
            f"and it cannot be set aside ({exc.strerror})",
            hint=f"delete {index} (the image rebuilds it from the file on its next opening), "
            "or open the image from a folder you can write",
        ) from None
    log.warning(
        "the index of %s names code, which the index FileStorage writes never does: it is "
        "set aside as %s and rebuilt from the image",
        path,
        refused,
    )
    return refused


#: At most this many unreadable records are named in a message.
SHOWN_RECORDS = 5


def unreadable_records(path: Path) -> list[tuple[bytes, bytes, str]]:
    """The records of a structurally sound FileStorage whose current state does not read
    back, or refers to a record that is not stored: (oid, the transaction that wrote that
    state, why), oldest oid first.

    Bytes changed inside a record leave every transaction's length and links intact, so
    ``check`` and ``fsrecover`` pass the file; the damage shows only when the record's pickle
    is read. Each current record is read as ZODB reads its references (a pickle walk that
    builds no objects), which is what fails there.
    """
    from ZODB.FileStorage import FileStorage
    from ZODB.POSException import POSKeyError
    from ZODB.serialize import referencesf

    set_aside_unsafe_index(path)
    storage = FileStorage(str(path), read_only=True)
    try:
        found: list[tuple[bytes, bytes, str]] = []
        stored: dict[bytes, tuple[bytes, bytes]] = {}
        for oid in sorted(storage._index.keys()):
            try:
                stored[oid] = storage.load(oid)
            except POSKeyError:
                pass  # its creation was undone: no state, which is no damage
            except Exception as exc:  # the record's header or back-pointer is what broke
                found.append((oid, b"", _why(exc)))
        for oid, (data, tid) in stored.items():
            try:
                missing = [ref for ref in referencesf(data) if ref not in stored]
            except Exception as exc:
                found.append((oid, tid, _why(exc)))
                continue
            if missing:  # what fsrefs calls a dangling reference
                found.append((oid, tid, f"refers to record 0x{missing[0].hex()}, not stored"))
        return sorted(found)
    finally:
        storage.close()


def _why(exc: Exception) -> str:
    text = str(exc).strip()[:120]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _refuse_unreadable_records(path: Path, found: FileCheck) -> None:
    """Transactions sound, records not: say which, and what puts each back (nothing here
    changes the file: undoing a transaction also reverts its other changes, the user's call)."""
    bad = unreadable_records(path)
    if not bad:
        return
    tids = sorted({tid for _, tid, _ in bad if tid}, reverse=True)
    named = "; ".join(
        f"record 0x{oid.hex()} (written by transaction {tid.hex() or 'unknown'}): {why}"
        for oid, tid, why in bad[:SHOWN_RECORDS]
    )
    more = f" and {len(bad) - SHOWN_RECORDS} more" if len(bad) > SHOWN_RECORDS else ""
    undo = " and ".join(f"'batos --image {path.as_uri()} undo {tid.hex()}'" for tid in tids[:3])
    hint = (
        (
            f"{undo} puts each record back to its state before that transaction (its other "
            "changes are reverted too; see 'batos history'); or restore the image from a backup"
        )
        if tids
        else "restore the image from a backup"
    )
    raise ImageCorruptError(
        f"{path}: its {found.transactions:,} transactions are sound, but {len(bad):,} "
        f"record(s) cannot be read: {named}{more}. Recovery cannot mend a record's bytes. "
        "Nothing was changed",
        hint=hint,
    )


def _keep_aside(path: Path, damaged: Path) -> None:
    """Give the original a second name (its index moves with it) before it is replaced."""
    try:
        os.link(path, damaged)
    except OSError:  # a file system without hard links
        shutil.copy2(path, damaged)
    with contextlib.suppress(FileNotFoundError):
        os.replace(f"{path}.index", f"{damaged}.index")


def _remove_storage_files(fs: Path, *, with_data: bool) -> None:
    # A FileStorage leaves its lock and temporary file behind when closed.
    suffixes = [".lock", ".tmp"] + ([".index", ""] if with_data else [])
    for suffix in suffixes:
        Path(f"{fs}{suffix}").unlink(missing_ok=True)
