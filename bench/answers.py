"""Whether a model's free-text reply states an item's expected answer: a number, a date or a string.

The usefulness sets (``bench/data/usefulness/``) have short answers; replies are free text, so
the checker has to find what a reply *states* as its answer, not merely any mention of the
right value, or a reply that lists every number of a retrieved passage would pass. The rules:

**Numbers** (``kind`` "number") are read with thousands commas (``1,250``; a comma is a
thousands separator only before exactly three digits, so decimal commas are not read), a
decimal point, a sign, currency symbols and units around them (``$4.80``, ``11.7%``, ``20mg``),
a scale word (``1.2 million``) and simple number words (``forty``, ``twenty-three``, ``one
hundred and six``). Digits inside words (``TP1357``), version strings (``2.5.0``), list
items' numbers and citations of passages (``[2]``) are not numbers, and a ``Sources:`` line
(a cited answer's list of files and spans) is not read at all. A number that also appears
in the question is an operand the reply restates, never its answer, so it is left out. Of the
rest, the stated answer is, in order:

1. the first number after the last *conclusion marker* ("answer", "result", "total",
   "therefore", "thus", "so the", "=", "≈", …) that has a number after it in its sentence;
2. with no such marker, every number, when the reply names at most three distinct values
   ("The co-op has 412 members, as of 2023.");
3. otherwise the numbers of the first and the last sentence that have any, where replies put
   their answer, so a copied passage full of numbers does not pass by containing the right one.

The reply matches when a stated number is within the item's ``tolerance``: ``{"absolute": x}``
or ``{"relative": r}`` (a fraction of the expected value); none means exact.

**Dates** (``kind`` "date", the answer ISO ``YYYY-MM-DD``) are read as ISO dates, ``14 March
2024``, ``March 14th, 2024``, ``14th of March 2024`` (abbreviated months too) and numeric
``d/m/yyyy`` or ``m/d/yyyy``: a numeric date both readings of which are valid matches on either.
A date written without a year matches on its month and day. The stated date is chosen by the same
three rules, dates in the question left out.

**Strings** are compared after normalising both sides (case, accents, apostrophes and other
punctuation, the articles "a", "an" and "the"): the reply matches when the answer or one of the
``accept`` alternatives occurs in it as whole words. A weekday is the exception, since a reply
can hedge by naming them all: the one stated is the one after the last conclusion marker, else
the only one named, else the first and the last named
("1 March is a Wednesday, so 29 February is a Tuesday" states Wednesday and Tuesday; "Monday,
Tuesday or Wednesday? I think Monday" states Monday); a plural ("on Tuesdays") states its day.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

#: A stated date: (year or None when the reply gave none, month, day).
DateValue = tuple[int | None, int, int]

_UNITS = {
    word: n
    for n, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen".split()
    )
}
_TENS = {
    word: 10 * n
    for n, word in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)
}
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_NUMBER_WORD = "|".join(sorted([*_UNITS, *_TENS, *_SCALES], key=len, reverse=True))
_WORDS_RE = re.compile(
    rf"\b(?:{_NUMBER_WORD})(?:(?:\s*-\s*|\s+and\s+|\s+)(?:{_NUMBER_WORD}))*\b", re.IGNORECASE
)
_DIGITS_RE = re.compile(
    r"(?<![\w.,])(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<frac>\.\d+)?(?![\d])(?!\.\d)(?!,\d{3})"
    r"(?:\s*(?P<scale>thousand|million|billion)\b)?",
    re.IGNORECASE,
)
#: A list item's number ("1." or "2)" opening a line) and a citation of retrieved passages
#: ("[2]", "[1, 3]", "[1-2]") are not values the reply states.
_NOT_VALUES_RE = re.compile(
    r"^[ \t]*(?:[-*][ \t]+)?\d{1,2}[.)][ \t]|\[\d{1,2}(?:\s*[,–-]\s*\d{1,2})*\]", re.MULTILINE
)

_MONTHS = {
    name: n
    for n, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        1,
    )
    for name in names
}
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>[12]\d{3})"
_DATE_PATTERNS = (
    re.compile(rf"\b{_YEAR}[-/](?P<month>[01]?\d)[-/](?P<day>[0-3]?\d)\b"),
    re.compile(rf"\b{_DAY}(?:\s+of)?\s+(?P<mname>{_MONTH})\.?(?:,?\s+{_YEAR})?\b", re.IGNORECASE),
    re.compile(rf"\b(?P<mname>{_MONTH})\.?\s+{_DAY}\b(?:,?\s+{_YEAR})?\b", re.IGNORECASE),
    re.compile(r"\b(?P<a>[0-3]?\d)[/.](?P<b>[0-3]?\d)[/.](?P<year>[12]\d{3})\b"),
)

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
#: A weekday, singular or plural ("staff come in on Tuesdays" states Tuesday).
_WEEKDAY_RE = re.compile(rf"\b({'|'.join(WEEKDAYS)})s?\b", re.IGNORECASE)

#: Phrases after which a reply states its conclusion; the last one with a value after it wins.
#: The line a cited answer ends with, naming its passages' files and character spans: what
#: the reply cites, not what it states (the spans and the dates in file names are no answers).
_SOURCES_LINE_RE = re.compile(r"^[ \t]*sources?[ \t]*:.*$", re.IGNORECASE | re.MULTILINE)
_CONCLUSION_RE = re.compile(
    r"\b(?:final answer|answer|result|in total|total|altogether|therefore|thus|hence|so the|"
    r"comes to|works out to|equals)\b|[=≈]",
    re.IGNORECASE,
)
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+|\n+")
#: The most distinct values a reply may name and still be judged on all of them.
MAX_VALUES_ALL_STATED = 3


@dataclass(frozen=True)
class Mention:
    """One value found in a text, with where it is (character offsets)."""

    values: frozenset[Any]
    start: int
    end: int


@dataclass(frozen=True)
class Judgement:
    """Whether a reply matched, and why: ``reason`` names what was stated and expected."""

    matched: bool
    reason: str


def matches(item: Mapping[str, Any], reply: str) -> bool:
    """True when ``reply`` states the answer of ``item`` (a line of a usefulness set)."""
    return judge(item, reply).matched


def judge(item: Mapping[str, Any], reply: str) -> Judgement:
    """Judge ``reply`` against ``item`` by the module's rules; the reason says why (or why not).

    Raises ``ValueError`` for an item whose answer cannot be read as its ``kind``.
    """
    kind = item["kind"]
    question = item.get("question", "")
    reply = _SOURCES_LINE_RE.sub("", reply).rstrip()
    if kind == "number":
        expected = _one_number(item["answer"])
        near = _tolerance(item.get("tolerance"), expected)
        return _judge_values(
            "number",
            number_mentions(reply),
            number_mentions(question),
            lambda value: abs(value - expected) <= near,
            _format_number(expected),
            reply,
        )
    if kind == "date":
        expected_date = date.fromisoformat(item["answer"])
        return _judge_values(
            "date",
            date_mentions(reply),
            date_mentions(question),
            lambda value: _same_date(value, expected_date),
            expected_date.isoformat(),
            reply,
        )
    if kind == "string":
        return _judge_string(item, reply)
    raise ValueError(f"unknown answer kind {kind!r}; use 'number', 'date' or 'string'")


def number_mentions(text: str) -> list[Mention]:
    """Every number in ``text``, digits and simple number words, in order of position."""
    text = _NOT_VALUES_RE.sub(lambda m: " " * len(m.group()), text)
    found: list[Mention] = []
    for match in _DIGITS_RE.finditer(text):
        value = float(match["int"].replace(",", "") + (match["frac"] or ""))
        if match["scale"]:
            value *= _SCALES[match["scale"].lower()]
        start = match.start()
        if start and text[start - 1] in "-−" and (start < 2 or not text[start - 2].isalnum()):
            value, start = -value, start - 1
        found.append(Mention(frozenset([value]), start, match.end()))
    for match in _WORDS_RE.finditer(text):
        spelled = _words_value(match.group())
        if spelled is not None:
            found.append(Mention(frozenset([float(spelled)]), match.start(), match.end()))
    return sorted(found, key=lambda m: m.start)


def date_mentions(text: str) -> list[Mention]:
    """Every calendar date in ``text``; values are ``(year or None, month, day)`` tuples."""
    found: list[Mention] = []
    for pattern in _DATE_PATTERNS:
        for match in pattern.finditer(text):
            if any(m.start < match.end() and match.start() < m.end for m in found):
                continue
            values = frozenset(v for v in _date_readings(match.groupdict()) if _valid(v))
            if values:
                found.append(Mention(values, match.start(), match.end()))
    return sorted(found, key=lambda m: m.start)


def normalise(text: str) -> str:
    """Lower case, no accents, apostrophes or articles, other punctuation as spaces.

    A point between two digits is kept, so ``2.5`` stays one token and never matches ``2.5.1``.
    """
    text = unicodedata.normalize("NFKD", text.lower())
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = re.sub(r"['’‘`]", "", text)
    text = re.sub(r"(?<!\d)\.|\.(?!\d)", " ", text)
    text = re.sub(r"[^a-z0-9.]+", " ", text)
    return " ".join(word for word in text.split() if word not in ("a", "an", "the"))


def _judge_values(
    what: str,
    mentions: list[Mention],
    question_mentions: list[Mention],
    fits: Callable[[Any], bool],
    expected: str,
    reply: str,
    closed: bool = False,
) -> Judgement:
    operands = {v for m in question_mentions for v in m.values}
    candidates = [m for m in mentions if not m.values <= operands]
    if not candidates:
        left = " (those it has are all in the question)" if mentions else ""
        return Judgement(False, f"no {what} in the reply{left}; expected {expected}")
    stated, rule = _stated(candidates, reply, closed)
    shown = ", ".join(reply[m.start : m.end] for m in stated)
    if any(fits(value) for m in stated for value in m.values):
        return Judgement(True, f"stated {shown} ({rule}); expected {expected}")
    return Judgement(False, f"stated {shown} ({rule}), not {expected}")


def _stated(mentions: list[Mention], reply: str, closed: bool) -> tuple[list[Mention], str]:
    """The mentions a reply states as its answer, and the rule that chose them.

    ``closed``: the values are a closed class (weekdays), where naming several is hedging.
    """
    for marker in reversed(list(_CONCLUSION_RE.finditer(reply))):
        end = _sentence_end(reply, marker.end())
        after = [m for m in mentions if marker.end() <= m.start < end]
        if after:
            return [after[0]], f"after {marker.group()!r}"
    distinct = {v for m in mentions for v in m.values}
    if len(distinct) <= (1 if closed else MAX_VALUES_ALL_STATED):
        return mentions, "all the reply names"
    if closed:
        return [mentions[0], mentions[-1]], "the first and the last it names"
    first, last = _sentence_of(reply, mentions[0]), _sentence_of(reply, mentions[-1])
    lead = [m for m in mentions if _sentence_of(reply, m) in (first, last)]
    return lead, "first and last sentences with a value"


def _judge_string(item: Mapping[str, Any], reply: str) -> Judgement:
    wanted = [item["answer"], *item.get("accept", [])]
    text = f" {normalise(reply)} "
    if normalise(item["answer"]) in WEEKDAYS:
        accepted = {normalise(w) for w in wanted}
        return _judge_values(
            "weekday",
            _weekday_mentions(reply),
            _weekday_mentions(item.get("question", "")),
            lambda value: value in accepted,
            item["answer"],
            reply,
            closed=True,
        )
    for alternative in wanted:
        needle = normalise(alternative)
        if needle and f" {needle} " in text:
            return Judgement(True, f"found {alternative!r}")
    shown = ", ".join(repr(w) for w in wanted)
    return Judgement(False, f"none of {shown} in the reply")


def _weekday_mentions(text: str) -> list[Mention]:
    return [
        Mention(frozenset([m.group(1).lower()]), m.start(), m.end())
        for m in _WEEKDAY_RE.finditer(text)
    ]


def _sentence_end(text: str, position: int) -> int:
    found = _SENTENCE_END_RE.search(text, position)
    return found.start() if found else len(text)


def _sentence_of(text: str, mention: Mention) -> int:
    """Where the sentence holding ``mention`` starts."""
    starts = [0, *(m.end() for m in _SENTENCE_END_RE.finditer(text, 0, mention.start))]
    return starts[-1]


def _one_number(answer: str) -> float:
    found = number_mentions(answer)
    if len(found) != 1 or len(found[0].values) != 1:
        raise ValueError(f"a number answer must hold exactly one number, not {answer!r}")
    return next(iter(found[0].values))


def _tolerance(tolerance: Mapping[str, float] | None, expected: float) -> float:
    """The largest difference from ``expected`` that still counts as the answer."""
    slack = 1e-12 * max(1.0, abs(expected))
    if not tolerance:
        return slack
    if set(tolerance) == {"absolute"}:
        return tolerance["absolute"] + slack
    if set(tolerance) == {"relative"}:
        return tolerance["relative"] * abs(expected) + slack
    raise ValueError(f"tolerance must be {{'absolute': x}} or {{'relative': r}}, not {tolerance}")


def _format_number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _words_value(words: str) -> int | None:
    """The value of number words such as "one hundred and six"; None for a lone "hundred"."""
    total = current = 0
    seen = False
    for word in re.split(r"[\s-]+", words.lower()):
        if word in _UNITS:
            current += _UNITS[word]
        elif word in _TENS:
            current += _TENS[word]
        elif word == "hundred":
            if not seen:
                return None
            current *= 100
        elif word in _SCALES:
            if not seen:
                return None
            total += current * _SCALES[word]
            current = 0
        else:
            continue
        seen = True
    return total + current if seen else None


def _date_readings(groups: Mapping[str, Any]) -> Iterable[DateValue]:
    year = int(groups["year"]) if groups.get("year") else None
    if groups.get("mname"):
        yield year, _MONTHS[groups["mname"].lower()], int(groups["day"])
    elif groups.get("a"):
        a, b = int(groups["a"]), int(groups["b"])
        yield year, b, a
        yield year, a, b
    else:
        yield year, int(groups["month"]), int(groups["day"])


def _valid(value: DateValue) -> bool:
    year, month, day = value
    try:
        date(year or 2000, month, day)
    except ValueError:
        return False
    return True


def _same_date(value: DateValue, expected: date) -> bool:
    year, month, day = value
    return (month, day) == (expected.month, expected.day) and year in (None, expected.year)
