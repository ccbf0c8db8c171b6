"""A corpus built at bench time from this machine's manual pages, and a retrieval task on it.

Pages come from /usr/share/man/man1, rendered to plain text by ``man -l`` and ``col -b`` (both
from man-db/groff; ``apt-get install man-db groff-base`` where missing). The pages are taken in
sorted order, every ``step``-th one, skipping pages under 1 KB or over 60 KB of text; the
*held-out* set is the even positions of that walk, the *development* set the odd ones, so the
two never share a page. Nothing of BAT OS's own data is involved.

The task: each page's NAME line says what the command does ("ls - list directory contents");
its description (after the dash, without the command's name) is the query, and the right
answer is that page. The NAME section is taken out of the text that is indexed, so the query
is never found verbatim at the top of its page.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MAN1 = Path("/usr/share/man/man1")
MIN_BYTES = 1_000
MAX_BYTES = 60_000
_NAME = re.compile(r"^NAME\s*\n(.*?)\n\s*\n", re.S | re.M)
_SECTION = re.compile(r"^[A-Z][A-Z ]+$", re.M)


@dataclass(frozen=True)
class Page:
    name: str
    query: str
    text: str


def render(path: Path) -> str:
    env = {**os.environ, "MANWIDTH": "80", "MAN_KEEP_FORMATTING": "0", "LC_ALL": "C.UTF-8"}
    raw = subprocess.run(
        ["man", "-l", str(path)], capture_output=True, env=env, timeout=60, check=False
    ).stdout
    plain = subprocess.run(["col", "-bx"], input=raw, capture_output=True, check=False).stdout
    return plain.decode("utf-8", "replace")


def split_name(text: str) -> tuple[str, str] | None:
    """(query, text without its NAME section), or None when the page has no usable NAME."""
    match = _NAME.search(text)
    if match is None:
        return None
    line = " ".join(match.group(1).split())
    if " - " not in line:
        return None
    query = line.split(" - ", 1)[1].strip()
    if len(query.split()) < 2:
        return None
    body = text[: match.start()] + text[match.end() :]
    return query, body


def pages(count: int, *, held_out: bool, step: int = 7) -> list[Page]:
    """``count`` pages of the held-out (even) or development (odd) half of the walk."""
    if not MAN1.is_dir():
        raise SystemExit(f"{MAN1} is missing: apt-get install man-db groff-base manpages")
    names = sorted(p for p in MAN1.iterdir() if p.name.endswith(".1.gz"))[::step]
    wanted = names[0 if held_out else 1 :: 2]
    out: list[Page] = []
    seen: set[str] = set()
    with ThreadPoolExecutor(4) as pool:
        for start in range(0, len(wanted), 32):
            batch = wanted[start : start + 32]
            for path, text in zip(batch, pool.map(render, batch), strict=True):
                size = len(text.encode())
                parts = split_name(text) if MIN_BYTES <= size <= MAX_BYTES else None
                if parts is None or parts[0].lower() in seen:
                    continue
                seen.add(parts[0].lower())
                out.append(Page(path.name.removesuffix(".1.gz"), parts[0], parts[1]))
                if len(out) == count:
                    return out
    return out


def write(corpus: Sequence[Page], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for page in corpus:
        path = folder / f"{page.name}.txt"
        path.write_text(page.text, encoding="utf-8")
        paths.append(path)
    return paths


def pieces(
    text: str, count_offsets: Callable[[str], list[tuple[int, int]]], size: int
) -> list[str]:
    """``text`` cut every ``size`` tokens (by the tokenizer's offsets), as a user who feeds a
    model fixed windows would cut it."""
    offsets = count_offsets(text)
    out = []
    for first in range(0, len(offsets), size):
        window = offsets[first : first + size]
        out.append(text[window[0][0] : window[-1][1]])
    return out


def mrr_at_10(ranked: Sequence[Sequence[str]], wanted: Sequence[str]) -> float:
    """Mean reciprocal rank of the right page among the first 10 distinct pages returned."""
    total = 0.0
    for sources, right in zip(ranked, wanted, strict=True):
        distinct = list(dict.fromkeys(sources))[:10]
        total += 1.0 / (distinct.index(right) + 1) if right in distinct else 0.0
    return total / len(wanted)
