"""Files that appear whole or not at all: write beside the target, then one rename.

``replacing(target)`` gives a temporary path in the target's folder (same file system, so the
rename is atomic); when the block ends normally it takes the target's place, when it raises it
is removed and the target is untouched. Every file BAT OS writes outside the image — models,
adapters, manifests, Modelfiles, converter trees, cache markers — goes through it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(target: Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield a fresh path beside ``target`` to write (a file or a folder); it becomes ``target``.

    A folder replaces an existing folder in two steps (the old one is removed first), so a
    crash between them leaves no folder, never a half-written one. ``durable`` syncs a file to
    disk before the rename, for files too costly to rebuild to risk losing after a crash.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Hidden, and keeping the suffix for tools that look at it.
    draft = target.with_name(
        f".{target.stem}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp{target.suffix}"
    )
    try:
        yield draft
        if durable and draft.is_file():
            with draft.open("rb") as handle:
                os.fsync(handle.fileno())
        if draft.is_dir() and target.is_dir():
            shutil.rmtree(target)
        os.replace(draft, target)
    finally:
        if draft.is_dir():
            shutil.rmtree(draft, ignore_errors=True)
        else:
            draft.unlink(missing_ok=True)


def write_text(target: Path, text: str, *, durable: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``target`` through ``replacing``."""
    with replacing(target, durable=durable) as draft:
        draft.write_text(text, encoding="utf-8")
    return Path(target)


def copy_file(source: Path, target: Path, *, durable: bool = False) -> Path:
    """Copy ``source`` to ``target`` through ``replacing``."""
    with replacing(target, durable=durable) as draft:
        shutil.copyfile(source, draft)
    return Path(target)
