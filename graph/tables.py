"""Tables in passages written out row by row, each value after its column's header.

A small model reading a table as text loses track of which column a value sits in: asked what
the first permit costs "under the new charges", it gives the figure of the column before the
change, and asked for the quilting model's stitches, the plain model's. Written out as
"First permit for a household — until 2 Nov 2025: 30.00; from 3 Nov 2025: 45.00." each value
carries its header, and the row its label, where the model reads it.

Two shapes are read: rows of cells between ``|`` (Markdown tables, and HTML tables as the
catalog's parser writes them, blank lines between rows allowed), and fixed-width columns under
a header line (plain-text notices), each value under the header it lines up with. Anything
else is left as it is, and so is a table whose writing out would drop a word of it: the
passage the model reads says everything the stored one does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: A Markdown table's line under its header: |---|:--:|
_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
#: Runs of text in a fixed-width line: words separated by single spaces.
_SEGMENT = re.compile(r"\S+(?: \S+)*")
_WORD = re.compile(r"\w+")
#: Longest table written out; a longer passage is left as it is.
MAX_CHARS = 20_000


def _cells(line: str) -> list[str] | None:
    """The cells of a ``|`` row, or None when ``line`` is none."""
    text = line.strip()
    if "|" not in text:
        return None
    if text.startswith("|"):
        text = text[1:]
    if text.endswith("|"):
        text = text[:-1]
    return [cell.strip() for cell in text.split("|")]


#: A header cell names its column; one that starts with a figure ("34.99 a month") is a
#: value, unless it is a year ("2023", "2024/25") heading a column of figures.
_VALUE_START = re.compile(r"^[(£$€-]?\s*\d")
_YEAR_CELL = re.compile(r"^(19|20)\d\d(/\d\d)?$")


def _headerish(cell: str) -> bool:
    return bool(_YEAR_CELL.match(cell) or not _VALUE_START.match(cell))


def _is_header(cells: Sequence[str]) -> bool:
    """Whether ``cells`` read as a header: some text above the values, none of it a value."""
    named = [c for c in cells[1:] if c]
    return bool(named) and all(_headerish(c) for c in named)


def _row(label: str, pairs: Sequence[tuple[str, str]]) -> str:
    said = "; ".join(f"{header}: {value}" if header else value for header, value in pairs)
    said = said.rstrip(".")
    if not said:
        return label
    return f"{label} — {said}." if label else f"{said}."


def _pipe_table(lines: list[str], start: int) -> tuple[list[str], int] | None:
    """The ``|`` table starting at ``lines[start]`` written out, and the index after it."""
    if _SEPARATOR.match(lines[start]):
        return None
    header = _cells(lines[start])
    if header is None or len(header) < 2:
        return None
    # A header row is marked by the rule under it (Markdown, and HTML's header cells as the
    # catalog's parser writes them). A Markdown table with an empty header row ("| | |")
    # holds names and values: its rows are written out as they are. Unmarked, a first row
    # is taken for a header only when it is a row of short column names.
    after = next((line for line in lines[start + 1 :] if line.strip()), "")
    marked = bool(_SEPARATOR.match(after))
    names = marked and not any(header)
    if not names and not (_is_header(header) and (marked or all(map(_column_name, header)))):
        return None
    rows: list[list[str]] = []
    end = start + 1
    last = start
    while end < len(lines):
        line = lines[end]
        if not line.strip():
            end += 1
            continue
        if _SEPARATOR.match(line) and "|" in line and not rows:
            last = end = end + 1
            continue
        cells = _cells(line)
        if cells is None or len(cells) != len(header):
            break
        rows.append(cells)
        last = end = end + 1
    if not rows:
        return None
    written = [f"{header[0]}:"] if header[0] else []
    written += [
        _row(cells[0], [(header[i], cells[i]) for i in range(1, len(cells)) if cells[i]])
        for cells in rows
    ]
    return written, last


def _segments(line: str) -> list[tuple[int, int, str]]:
    """Runs of ``line`` separated by two spaces or more, with their columns."""
    return [(m.start(), m.end(), m.group()) for m in _SEGMENT.finditer(line)]


def _under(span: tuple[int, int], headers: Sequence[tuple[int, int, str]]) -> int | None:
    """The header ``span`` lines up with (overlaps most), or None."""
    best, most = None, 0
    for n, (start, end, _) in enumerate(headers):
        overlap = min(end, span[1]) - max(start, span[0])
        if overlap > most:
            best, most = n, overlap
    return best


#: A line of dashes or rules under a fixed-width header, or between its rows.
_RULE = re.compile(r"^[\s=_-]*-{3,}[\s=_-]*$|^[\s=_-]*={3,}[\s=_-]*$")
#: A column name over labels: a few words, and no figure but a year ("Girth 2015").
_NAME_WORDS = 4


def _column_name(text: str) -> bool:
    return len(text.split()) <= _NAME_WORDS and all(
        _YEAR_CELL.match(n) for n in re.findall(r"\d+", text)
    )


def _header(lines: list[str], start: int) -> tuple[list[tuple[int, int, str]], int, bool] | None:
    """The columns of a fixed-width header at ``lines[start]`` (start, end, name), where its
    rows begin, and whether it is underlined. A rule of dashes one or two lines down gives
    the columns, each named by the header words above its dashes; else the header line's
    own runs are the columns."""
    for rule_at in (start + 1, start + 2):
        if rule_at < len(lines) and _RULE.match(lines[rule_at]):
            break
        if rule_at >= len(lines) or not lines[rule_at].strip() or "|" in lines[rule_at]:
            rule_at = -1
            break
    else:
        rule_at = -1
    dashes = _segments(lines[rule_at]) if rule_at > 0 else []
    if len(dashes) >= 2:
        named: dict[int, list[str]] = {n: [] for n in range(len(dashes))}
        for line in lines[start:rule_at]:
            for begin, end, text in _segments(line):
                place = _under((begin, end), dashes)
                if place is None:
                    return None
                named[place].append(text)
        columns = [(b, e, " ".join(named[n])) for n, (b, e, _) in enumerate(dashes)]
        return columns, rule_at + 1, True
    if rule_at == start + 2:  # two lines over a rule across the page: a title, not a header
        return None
    return _segments(lines[start]), start + 1, False


def _fixed_table(lines: list[str], start: int) -> tuple[list[str], int] | None:
    """The fixed-width table under the header at ``lines[start]`` written out, and the index
    after it. Its first row says whether the first column holds the labels (its label sits
    under the first header) or the labels have no header. A line of a label alone joins the
    next line's label; a line that starts under a value column carries on the row above
    ("12:00 L" under the 11:00 departures, the second line of a tree's name).

    A header over the labels as well ("Tag  Tree  Girth 2015") must be underlined or be a
    row of short column names: a list of names and values ("Pupils return   Wednesday 3
    September") is no table, and its first line no header."""
    line = lines[start]
    if "|" in line or _RULE.match(line) or "  " not in line.strip():
        return None
    found = _header(lines, start)
    if found is None:
        return None
    headers, end, underlined = found
    if len(headers) < 2 or not all(_headerish(name) for _, _, name in headers if name):
        return None
    rows: list[tuple[str, dict[int, list[str]]]] = []
    labels: int | None = None  # the header over the labels: 0, or None when they have none
    pending = ""
    while end < len(lines) and lines[end].strip() and "|" not in lines[end]:
        if _RULE.match(lines[end]):
            end += 1
            continue
        segments = _segments(lines[end])
        places = [_under(s[:2], headers) for s in segments]
        if not rows and not pending:
            labels = places[0] if places[0] in (None, 0) else -1
        if places[0] != labels:
            # a row carried on under its value columns
            if not rows or pending or any(p is None or p == labels for p in places):
                break
            for place, (_, _, text) in zip(places, segments, strict=True):
                rows[-1][1].setdefault(place or 0, []).append(text)
            end += 1
            continue
        if len(segments) == 1:  # a label carried on to the next line
            pending = f"{pending} {segments[0][2]}".strip()
            end += 1
            continue
        if any(p is None or p == labels for p in places[1:]):
            break
        values: dict[int, list[str]] = {}
        for place, (_, _, text) in zip(places[1:], segments[1:], strict=True):
            values.setdefault(place or 0, []).append(text)
        rows.append((f"{pending} {segments[0][2]}".strip(), values))
        pending = ""
        end += 1
    if pending or len(rows) < 2:
        return None
    labelled = labels == 0
    if labelled and not underlined and not all(_column_name(n) for _, _, n in headers):
        return None
    written = [f"{headers[0][2]}:"] if labelled and headers[0][2] else []
    for label, values in rows:
        pairs = [(headers[n][2], " ".join(v)) for n, v in sorted(values.items())]
        written.append(_row(label, pairs))
    return written, end


def _words(lines: Sequence[str]) -> set[str]:
    return {w.lower() for line in lines for w in _WORD.findall(line)}


def linearized(text: str) -> str:
    """``text`` with each table it holds written out row by row (see the module's doc)."""
    if len(text) > MAX_CHARS or ("|" not in text and "   " not in text):
        return text
    lines = text.split("\n")
    out: list[str] = []
    n = 0
    while n < len(lines):
        found = _pipe_table(lines, n) or _fixed_table(lines, n)
        if found is not None:
            written, after = found
            # every word of the table is still there (its header's words in the rows); if
            # not, its lines are left as they are, none of them read as another table's
            out.extend(written if _words(lines[n:after]) <= _words(written) else lines[n:after])
            n = after
            continue
        out.append(lines[n])
        n += 1
    return "\n".join(out)
