"""Scratch folders of training work, named after the process that made them.

A retraining or conversion killed outright (SIGKILL, the out-of-memory killer) leaves its
scratch folder behind, a few MB to GB of weights each time; the next piece of training work
removes those it can tell are abandoned before it makes its own.

A folder is abandoned only when all of these hold: it is a real folder (no link) of this user,
named ``batos-<kind>-<pid>-…``, made on this host (its lock file says so), no process of that
pid runs here, and its lock file's lock can be taken: its owner holds that lock (``flock``)
for as long as it works, which the kernel keeps across pid namespaces (a container on the same
host) and drops when the owner dies however it ends.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

#: batos-<kind>-<pid>-<random>: what ``scratch`` names its folders.
_NAME = re.compile(r"batos-[a-z]+-(\d{1,10})-")
#: The file in each folder whose lock its owner holds, and which names the owner's host.
LOCK = ".batos-scratch-lock"


@contextmanager
def scratch(kind: str, folder: Path | None = None) -> Iterator[str]:
    """A temporary folder for ``kind`` of work (in ``folder``, else the temporary folder),
    removed at the end; the abandoned ones there go first."""
    sweep(Path(folder) if folder is not None else Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=f"batos-{kind}-{os.getpid()}-", dir=folder) as path:
        lock = os.open(os.path.join(path, LOCK), os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(lock, socket.gethostname().encode("utf-8", "replace")[:255])
            yield path
        finally:
            os.close(lock)  # the lock goes with it


def sweep(folder: Path) -> list[Path]:
    """Remove the abandoned scratch folders in ``folder`` (see the module); those removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        found = _NAME.match(entry.name)
        if found is None or not _abandoned(entry, int(found.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed


def _abandoned(entry: os.DirEntry[str], pid: int) -> bool:
    try:
        if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != (
            os.getuid()
        ):
            return False
    except OSError:
        return False
    if pid == os.getpid() or psutil.pid_exists(pid):
        return False
    try:
        lock = os.open(os.path.join(entry.path, LOCK), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False  # no lock file: made before its owner wrote one, or not ours
    try:
        host = os.read(lock, 256).decode("utf-8", "replace")
        if host != socket.gethostname()[:255]:
            return False  # another host's (a shared folder): its processes are not seen here
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # its owner holds it: alive, in another pid namespace
        return True
    finally:
        os.close(lock)
