"""Damaged image files: a commit cut short by a crash reopens, damaged history is refused
untouched, ``batos repair`` recovers what ZODB can, and damage found while loading is a clear
error."""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from batos.errors import ImageCorruptError, ImageLockedError
from batos.shell.cli import main
from store.core.image import LivingImage
from store.core.image_file import check, repair


def _path(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def _transactions(path: Path) -> list[tuple[int, int]]:
    """(offset, length) of each transaction, read straight from the file's headers."""
    data, pos, found = path.read_bytes(), 4, []
    while pos + 23 <= len(data):
        (length,) = struct.unpack_from(">Q", data, pos + 8)
        found.append((pos, length))
        pos += length + 8
    return found


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder under ``folder`` with its bytes, to prove nothing changed."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def _two_transactions(uri: str) -> None:
    with LivingImage.open(uri) as image:
        image.transact(lambda root: root.__setitem__("first", "x" * 1000), note="first")
        image.transact(lambda root: root.__setitem__("second", "y" * 1000), note="second")


def test_truncated_committed_transaction_is_refused_and_nothing_changes(file_uri):
    _two_transactions(file_uri)
    path = _path(file_uri)
    os.truncate(path, path.stat().st_size - 300)
    before = _snapshot(path.parent)
    with pytest.raises(ImageCorruptError) as info:
        LivingImage.open(file_uri)
    assert "cut short" in info.value.message and "second" in info.value.message
    assert f"batos --image {file_uri} repair" in info.value.hint
    assert _snapshot(path.parent) == before  # no truncation, no .tr0, no lock or temp file


def test_corrupt_header_in_the_middle_is_refused_untouched(file_uri):
    _two_transactions(file_uri)
    path = _path(file_uri)
    first_pos, _ = _transactions(path)[-2]
    with open(path, "r+b") as handle:  # a length past the end of the file, as a bad disk might
        handle.seek(first_pos + 8)
        handle.write(struct.pack(">Q", 10**9))
    before = _snapshot(path.parent)
    with pytest.raises(ImageCorruptError, match="cut short"):
        LivingImage.open(file_uri)
    assert _snapshot(path.parent) == before


def test_uncommitted_last_transaction_is_dropped_with_a_warning(file_uri, caplog):
    """Status 'c': the commit was still being written when the process died."""
    _two_transactions(file_uri)
    path = _path(file_uri)
    last_pos, _ = _transactions(path)[-1]
    with open(path, "r+b") as handle:
        handle.seek(last_pos + 16)
        handle.write(b"c")
    with caplog.at_level(logging.WARNING, logger="batos.image"):
        with LivingImage.open(file_uri) as image, image.read() as root:
            assert root["first"] == "x" * 1000
            assert "second" not in root
    assert "never committed" in caplog.text


def test_process_killed_mid_commit_reopens(file_uri):
    """A real SIGKILL between writing a transaction and marking it committed."""
    LivingImage.open(file_uri).close()
    script = textwrap.dedent(
        f"""
        import os, signal
        from ZODB.FileStorage import FileStorage
        from store.core.image import LivingImage
        image = LivingImage.open({file_uri!r})
        image.transact(lambda root: root.__setitem__("kept", 1))
        FileStorage._finish = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        image.transact(lambda root: root.__setitem__("lost", "z" * 5000))
        """
    )
    victim = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert victim.returncode == -9, victim.stderr
    path = _path(file_uri)
    assert check(path).uncommitted_tail
    with open(path, "r+b") as handle:  # and killed earlier still, mid-write of the record
        handle.truncate(path.stat().st_size - 2000)
    with LivingImage.open(file_uri) as image, image.read() as root:
        assert root["kept"] == 1 and "lost" not in root
    with LivingImage.open(file_uri) as image:  # the next commit lands on a clean end
        image.transact(lambda root: root.__setitem__("after", 2))
    assert check(path).sound


def test_repair_replaces_the_image_and_keeps_the_damaged_file(file_uri):
    _two_transactions(file_uri)
    path = _path(file_uri)
    os.truncate(path, path.stat().st_size - 300)
    damaged_bytes = path.read_bytes()
    report = repair(path)
    assert report.damaged_copy is not None
    assert report.damaged_copy.name.startswith("live_image.fs.damaged-")
    assert report.damaged_copy.read_bytes() == damaged_bytes
    assert report.bytes_dropped > 0 and report.transactions == report.check.transactions
    assert not list(path.parent.glob("*.recovered-*"))
    with LivingImage.open(file_uri) as image, image.read() as root:
        assert root["first"] == "x" * 1000 and "second" not in root
    assert repair(path).damaged_copy is None  # sound now: nothing to do


def test_repair_refuses_an_image_in_use(file_uri):
    _two_transactions(file_uri)
    with LivingImage.open(file_uri):
        with pytest.raises(ImageLockedError):
            repair(_path(file_uri))


def test_cli_damaged_image_exit_3_then_repair(capsys, file_uri):
    assert main(["--image", file_uri, "init"]) == 0
    path = _path(file_uri)
    os.truncate(path, path.stat().st_size - 50)
    capsys.readouterr()
    assert main(["--image", file_uri, "inspect"]) == 3
    err = capsys.readouterr().err
    assert "damaged" in err and "repair" in err
    assert main(["--image", file_uri, "repair"]) == 0
    out = capsys.readouterr().out
    assert "damage:" in out and "dropped" in out and ".damaged-" in out
    assert main(["--image", file_uri, "inspect", "robin"]) == 0


def test_cli_object_damaged_inside_the_file_is_a_clear_error(capsys, file_uri):
    from ZODB.FileStorage import FileIterator

    assert main(["--image", file_uri, "init"]) == 0
    with LivingImage.open(file_uri) as image, image.read() as root:
        oid = root["objects"]["robin"]._p_oid
    path = _path(file_uri)
    iterator = FileIterator(str(path))
    where = [
        (record.pos, len(record.data))
        for txn in iterator
        for record in txn
        if record.oid == oid and record.data
    ][-1]
    iterator.close()
    pos, size = where
    with open(path, "r+b") as handle:  # garbage instead of robin's pickle; lengths intact
        handle.seek(pos + 42)
        handle.write(b"\xff" * size)
    capsys.readouterr()
    assert main(["--image", file_uri, "inspect", "robin"]) == 3
    err = capsys.readouterr().err
    assert "damaged" in err and "cannot be read" in err and "repair" in err
    assert "Traceback" not in err
    # Recovery cannot mend a record's bytes: repair names the record, the transaction that
    # wrote it and the undo that puts it back, and changes nothing.
    before = _snapshot(path.parent)
    assert main(["--image", file_uri, "repair"]) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert f"record 0x{oid.hex()}" in err and "Nothing was changed" in err
    assert _snapshot(path.parent) == before
    tid = err.split(f"record 0x{oid.hex()} (written by transaction ")[1][:16]
    assert f"undo {tid}" in err
    assert main(["--image", file_uri, "undo", tid]) == 0
    assert main(["--image", file_uri, "repair"]) == 0
    assert "all sound" in capsys.readouterr().out


def test_a_file_another_process_is_writing_is_reported_in_use(file_uri):
    """Its last commit may be half-written as we read it: that is not damage."""
    _two_transactions(file_uri)
    path = _path(file_uri)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys
            from store.core.image import LivingImage
            image = LivingImage.open({file_uri!r})
            print("open", flush=True)
            sys.stdin.read()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        os.truncate(path, path.stat().st_size - 300)  # what a reader may see mid-commit
        with pytest.raises(ImageLockedError):
            LivingImage.open(file_uri)
    finally:
        holder.communicate("")
