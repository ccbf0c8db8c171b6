"""Scratch folders of training work, named after the process that made them.

A retraining or conversion killed outright (SIGKILL, the out-of-memory killer) leaves its
scratch folder behind, a few MB to GB of weights each time; the next piece of training work
removes those whose process is gone before it makes its own.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

#: batos-<kind>-<pid>-<random>: what ``scratch`` names its folders.
_NAME = re.compile(r"batos-[a-z]+-(\d{1,10})-")


@contextmanager
def scratch(kind: str, folder: Path | None = None) -> Iterator[str]:
    """A temporary folder for ``kind`` of work (in ``folder``, else the temporary folder),
    removed at the end; the ones of processes that ended without removing theirs go first."""
    sweep(Path(folder) if folder is not None else Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=f"batos-{kind}-{os.getpid()}-", dir=folder) as path:
        yield path


def sweep(folder: Path) -> list[Path]:
    """Remove the scratch folders in ``folder`` whose process no longer runs; those removed.

    A name's pid that now belongs to another process keeps its folder (it cannot be told
    from a live owner); a link is never followed, and what cannot be removed is left."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        found = _NAME.match(entry.name)
        if found is None or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(found.group(1))
        if pid == os.getpid() or psutil.pid_exists(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed
