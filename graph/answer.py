"""What the answering persona reads, and what is done to its reply before anyone sees it.

``history`` picks the thread's earlier turns the answering model sees. ``answer_prompt`` turns
a cycle's partials into the one prompt the lead persona answers from: the parts of the plan it
took itself become an outline (no model call of their own), notes of other personas, passages
from memory and a program's result become context. ``cut_at_sentence`` keeps an answer that
ran out of tokens from ending mid-word; ``repetition`` and ``REFUSAL`` are what the quality
gate holds an answer to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from batos import settings
from graph import prompts as prompt_files
from graph.compute import NUMBER
from graph.request import content_text
from graph.retrieval import CONTEXT_HEADER, fence
from graph.tables import linearized

#: Most passages one answer is given (each about 200 tokens: evaluating a prompt costs about a
#: second per 90 tokens on two cores).
MAX_PASSAGES = 5

#: Earlier turns of the thread the answering model sees: the user's last HISTORY_TURNS
#: messages (what a user tells the mind is in them, and they are short), each cut to
#: USER_CHARS; the last RECENT_ANSWERS answers whole up to ANSWER_CHARS, older ones cut to
#: OLD_ANSWER_CHARS (every prompt token costs about a hundredth of a second on two cores).
HISTORY_TURNS = 12
USER_CHARS = 600
RECENT_ANSWERS, ANSWER_CHARS, OLD_ANSWER_CHARS = 2, 1500, 240
#: Longest answer the gate passes, in characters.
MAX_ANSWER_CHARS = 8000
#: Openings of a refusal; the gate fails an answer that starts with one.
REFUSAL = re.compile(
    r"^\s*(i'?m sorry,?\s+(but\s+)?i\s+(can(no|')t|am unable)|i\s+(can(no|')t|am unable to)"
    r"\s+(help|assist|answer|comply)|as an ai\b)",
    re.IGNORECASE,
)
#: Repetition is measured on runs of this many words, and only in answers this long: shorter
#: answers and phrases repeat by chance.
REPEAT_NGRAM, REPEAT_MIN_WORDS = 4, 24
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")


def repetition(text: str) -> float:
    """Share of the answer's word 4-grams that repeat an earlier one (0: none, near 1: a loop).

    A small model that loses the thread says the same thing over and over ("X is easy to learn
    because it has fewer keywords" for every X); its answer stays on topic, so relevance alone
    passes it.
    """
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) < REPEAT_MIN_WORDS:
        return 0.0
    grams = [tuple(words[i : i + REPEAT_NGRAM]) for i in range(len(words) - REPEAT_NGRAM + 1)]
    return 1.0 - len(set(grams)) / len(grams)


_SENTENCE_END = re.compile(r"[.!?…](?:[\"')\]]*)(?=\s|$)|\n")
_LIST_MARK = re.compile(r"(?:^|\s)\d{1,3}\.$")


def prompts() -> dict[str, Any]:
    return prompt_files.load("mind")


def passages_text(passages: Sequence[Mapping[str, Any]]) -> str:
    """Numbered, fenced passages (``[n]`` is the position in ``passages``, from 1), their
    tables written out row by row (``mind_tables``; graph.tables): what the model reads.
    Checks against the passages read their stored text, which states the same figures."""
    if not passages:
        return ""
    rows = settings.get_str("mind_tables") == "on"
    parts = [CONTEXT_HEADER]
    for n, passage in enumerate(passages, start=1):
        text = str(passage["text"])
        parts.append(fence(n, str(passage["citation"]), linearized(text) if rows else text))
    return "\n\n".join(parts)


def merged_passages(groups: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Passages of several retrievals, each chunk once, taken round-robin (the best of each
    retrieval first) up to ``MAX_PASSAGES``."""
    seen: set[int] = set()
    merged: list[dict[str, Any]] = []
    for rank in range(max((len(g) for g in groups), default=0)):
        for group in groups:
            if rank < len(group) and group[rank]["chunk_id"] not in seen:
                seen.add(group[rank]["chunk_id"])
                merged.append(dict(group[rank]))
    return merged[:MAX_PASSAGES]


def focus(passages: Sequence[Mapping[str, Any]], question: str, words: int) -> list[dict[str, Any]]:
    """Each passage cut to its sentences sharing most content words with ``question`` (all of
    the best-matching ones, then others up to about ``words`` words), in their order, the cuts
    marked with "…"; ``words`` 0 keeps whole passages.

    A model on two cores reads about 90 prompt tokens a second, so five whole chunks cost some
    ten seconds before the first word of the answer; the sentences a question's words point at
    are most of what a small model needs, and the rest distracts it.
    """
    from graph.plan import content_words
    from store.knowledge.chunking import sentences

    if words <= 0:
        return [dict(p) for p in passages]
    asked = content_words(question)
    out = []
    for passage in passages:
        text = str(passage["text"])
        spans = sentences(text)
        if len(text.split()) <= words or len(spans) < 2:
            out.append(dict(passage))
            continue
        shared = [len(content_words(text[a:b]) & asked) for a, b in spans]
        keep: set[int] = set()
        used = 0
        best = max(shared)
        for i in sorted(range(len(spans)), key=lambda i: (-shared[i], i)):
            size = len(text[spans[i][0] : spans[i][1]].split())
            if used + size > words and not (best and shared[i] == best):
                continue  # the best-matching sentences are kept whatever their length
            keep.add(i)
            used += size
        if not keep:
            out.append(dict(passage))
            continue
        pieces: list[str] = []
        last = -1
        for i in sorted(keep):
            if pieces and i != last + 1:
                pieces.append("…")
            pieces.append(text[spans[i][0] : spans[i][1]])
            last = i
        if max(keep) < len(spans) - 1:
            pieces.append("…")
        if min(keep) > 0:
            pieces.insert(0, "…")
        out.append({**passage, "text": " ".join(pieces)})
    return out


def answer_prompt(
    request: str,
    partials: Sequence[Mapping[str, Any]],
    passages: Sequence[Mapping[str, Any]],
) -> str:
    """The weave prompt for ``request`` from the cycle's ``partials`` (in plan order)."""
    p = prompts()
    context, rules = "", ""
    items: list[str] = []
    if passages:
        context += p["weave_passages"].format(passages=passages_text(passages))
        rules += p["rule_passages"]
    computed = [x for x in partials if x.get("kind") == "computed" and x.get("ok")]
    for x in computed:
        context += p["weave_computed"].format(value=x["text"])
    if computed:
        rules += p["rule_computed"]
    notes = [x for x in partials if x.get("kind") == "note" and x.get("ok") and x.get("text")]
    for x in notes:
        context += p["weave_note"].format(persona=x["persona"], facet=x["facet"], text=x["text"])
    if notes:
        rules += p["rule_notes"]
    for x in partials:
        if x.get("kind") == "instruction" and x.get("text"):
            # A facet that fell back has no instruction of its own: its part is its query.
            part = x["query"] if x.get("degraded") and x.get("query") else x["text"]
            items.append(f"{len(items) + 1}. {part}")
    outline = p["outline"].format(items="\n".join(items)) if len(items) > 1 else ""
    if len(items) == 1:  # one part: its instruction is the task itself
        outline = "\n" + items[0].split(". ", 1)[1]
    return p["weave"].format(context=context, request=request, outline=outline, rules=rules)


def grounded_prompt(request: str, passages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt of an answer from ``passages``: the question after them, and before them as
    well when ``mind_question_first`` is on."""
    first = prompts()["question_first"] if settings.get_str("mind_question_first") == "on" else ""
    return (first + prompts()["grounded"]).format(passages=passages_text(passages), request=request)


def grounded_quote_prompt(request: str, passages: Sequence[Mapping[str, Any]]) -> str:
    return prompts()["grounded_quote"].format(passages=passages_text(passages), request=request)


#: What a question asks for, in the words a prompt asks for it again.
ASKED_WORDS = {
    "date": "date, day or time",
    "code": "code, version or number",
    "figure": "figure",
    "name": "name",
}


def grounded_asked_prompt(request: str, passages: Sequence[Mapping[str, Any]], kind: str) -> str:
    """The prompt of a second answer from ``passages`` whose first did not give the ``kind`` of
    thing (answer.asked_kind) ``request`` asks for."""
    return prompts()["grounded_asked"].format(
        passages=passages_text(passages), request=request, what=ASKED_WORDS[kind]
    )


@dataclass(frozen=True)
class Quoted:
    """A quote-first reply taken apart: the answer a user is given, the sentence the model
    copied from the passages, and whether that sentence is really in them (``passage``: its
    number from 1, None when it is not found or there is no quote)."""

    answer: str
    quote: str
    passage: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"quote": self.quote, "passage": self.passage, "found": self.passage is not None}


_QUOTE_MARK = re.compile(r"^[\s*_#>-]*quote[\s*_]*:[\s*_]*", re.IGNORECASE | re.MULTILINE)
_ANSWER_MARK = re.compile(r"^[\s*_#>-]*answer[\s*_]*:[\s*_]*", re.IGNORECASE | re.MULTILINE)
_NO_QUOTE = re.compile(r"^[\W_]*none\b", re.IGNORECASE)
#: Share of a quote's words that must occur, in order, in one passage for it to count as
#: copied from it (a small model drops a word or changes punctuation as it copies).
QUOTE_OVERLAP = 0.8


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(_CITATION.sub(" ", text))]


def quoted_in(quote: str, passages: Sequence[Mapping[str, Any]]) -> int | None:
    """The number (from 1) of the passage ``quote`` was copied from, or None. Too short a
    quote (under four words) cannot be told from one written afresh."""
    from difflib import SequenceMatcher

    words = _words(quote)
    if len(words) < 4:
        return None
    best, where = 0.0, None
    for n, passage in enumerate(passages, start=1):
        matcher = SequenceMatcher(None, words, _words(str(passage["text"])), autojunk=False)
        share = sum(block.size for block in matcher.get_matching_blocks()) / len(words)
        if share > best:
            best, where = share, n
    return where if best >= QUOTE_OVERLAP else None


def split_quoted(text: str, passages: Sequence[Mapping[str, Any]]) -> Quoted:
    """Take a quote-first reply apart (``grounded_quote``): "Quote: …" then "Answer: …".

    A reply that kept to neither line is its own answer; one with a quote and no "Answer:" line
    gives what follows the quote's line, or the quote itself when nothing does.
    """
    quote_mark = _QUOTE_MARK.search(text)
    answer_mark = _ANSWER_MARK.search(text)
    quote = ""
    if answer_mark:
        reply = text[answer_mark.end() :].strip()
        if quote_mark and quote_mark.end() <= answer_mark.start():
            quote = text[quote_mark.end() : answer_mark.start()].strip()
    elif quote_mark:
        line, _, rest = text[quote_mark.end() :].partition("\n")
        quote, reply = line.strip(), rest.strip() or line.strip()
    else:
        reply = text.strip()
    quote = _CITATION.sub(" ", quote).strip().strip('"“” ')
    if _NO_QUOTE.match(quote):
        quote = ""
    reply = reply or text.strip()
    return Quoted(reply, quote, quoted_in(quote, passages) if quote else None)


_NOT_FOUND = re.compile(
    r"\b(do(es)? not (contain|say|mention|include|specify|state|provide|give)|"
    r"(is|are) not (mentioned|given|stated|specified|found|provided|included)|"
    r"no (information|mention|details?)|not (in|found in) the (passages|documents|text)|"
    r"(can ?not|unable to) (find|determine|answer))\b",
    re.IGNORECASE,
)
_CITATION = re.compile(r"\[[^\]]{0,80}\]")


#: Words an answer uses to point at its sources, which say nothing of the answer itself.
_POINTERS = frozenset({"found", "passa", "refer", "memor", "sourc"})


def found_nothing(text: str) -> bool:
    """Whether a grounded answer says the passages do not hold the answer, or says nothing
    beyond its citations ("Found in [2]." names a place, not an answer)."""
    from graph.plan import content_words

    body = _CITATION.sub(" ", text.split("\n\nSources: ")[0])
    substance = content_words(body) - _POINTERS
    figure = any(c.isdigit() for c in body)
    return bool(_NOT_FOUND.search(body)) or (not figure and not substance)


def restates(text: str, request: str) -> bool:
    """Whether an answer gives nothing the request did not: no figure and no word of its own
    ("The cheese goes in the oatcakes [1]." for "Which cheese goes in the oatcakes?"),
    or an opening that stops at its colon ("The population at each census: [1]")."""
    from graph.plan import content_words

    body = _CITATION.sub(" ", text.split("\n\nSources: ")[0]).strip()
    if body.endswith(":"):
        return True
    if any(c.isdigit() for c in body):
        return False
    own = content_words(body) - content_words(request) - _POINTERS
    return not own


#: Where a question's own words start: the request's start, a new sentence or clause, or a
#: preposition before them ("on which day", "from what date"). "When" and "who" elsewhere are
#: no question: "what happens when it runs out?", "people who have allergies".
_CLAUSE = (
    r"(?:^|[.?!;:,(]\s*|\b(?:and|but|so|or|then|please|also)\s+)"
    r"(?:(?:on|in|at|from|since|until|till|by|for|to|with|of|after|before)\s+)?"
)
#: What a question asks for, by its words: a date (or time), a code or version, a figure, or a
#: name. The kind whose words come first wins, a date before a code at the same place ("what is
#: the release date?"). "How long" and "how often" are left out: "overnight" and "weekly"
#: answer them with no figure.
_ASKS = (
    (
        "date",
        re.compile(
            _CLAUSE + r"(when\b|(what|which)(?:'s| is| was| will be)?(?: the)?(?: [\w-]+)?? "
            r"(date|day|year|month|time|deadline)\b)",
            re.I,
        ),
    ),
    (
        "code",
        re.compile(
            _CLAUSE + r"(what|which)(?:'s| is| was)?(?: the)? (?:(?:part|product|model|serial|"
            r"reference|order|item|stock) (?:code|number)|version|release\b(?! date)|code\b)",
            re.I,
        ),
    ),
    (
        "figure",
        re.compile(
            _CLAUSE + r"(how (much|many|far|old|tall|high|deep|wide|heavy|big|fast)\b|by how\b|"
            r"what (percentage|proportion|share)\b)",
            re.I,
        ),
    ),
    (
        "name",
        re.compile(
            _CLAUSE + r"(who|whom|whose)\b|" + _CLAUSE + r"which (?!(?:of|one|ones|way|side|is|"
            r"are|was|were|would|should|do|does|did|can|could|will|has|have|had|must|might|may)"
            r"\b)[\w-]+|" + _CLAUSE + r"what(?:'s| is| was) the name\b",
            re.I,
        ),
    ),
)
#: Months and weekdays as English writes them, capitalised ("you may" is no month).
_MONTH_OR_DAY = re.compile(
    r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|January|February|March|April|"
    r"June|July|August|September|October|November|December|"
    r"(Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)days?|Mon|Tue|Wed|Thu|Fri|Sat|Sun|"
    r"[Tt]oday|[Tt]omorrow|[Tt]onight|[Yy]esterday|[Nn]oon|[Mm]idnight)\b"
)
#: What answers "when": a month or weekday, a season or feast, a year or decade, a time
#: ("7:40", "0930", "9am", "8 o'clock") or a date in figures ("12/04", "2026-04-12"). A price
#: ("4.50") or a range ("9-5") is none.
_WHEN = re.compile(
    _MONTH_OR_DAY.pattern
    + r"|\b([Ss]pring|[Ss]ummer|[Aa]utumn|[Ww]inter|Easter|Christmas|[Ww]eekdays?|[Ww]eekends?)\b"
    r"|\b(1[5-9]|20)\d\d\b|\b\d{3}0s\b|\b\d{1,2}:\d\d\b|\b[0-2]\d[0-5]\d\b"
    r"|\b\d{1,2}(?:[.:]\d\d)? ?[ap]\.?m\b|\b\w+ o'clock\b"
    r"|\b\d{1,2}/\d{1,2}(/\d{2,4})?\b|\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}(st|nd|rd|th)\b"
)
_NUMBER_WORD = re.compile(
    r"\b(one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
    r"fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|"
    r"eighty|ninety|hundreds?|thousands?|millions?|billions?|half|twice|once|thrice|dozens?|"
    r"none|nothing|free|no|both|zero|several|quarter|single|double|triple)\b",
    re.I,
)
_CAPITALISED = re.compile(r"\b[A-Z][\w'&-]*")
#: What the gate asks for again, by kind.
ASKED_FOR = {
    "date": "when (a date, day or time), and the answer gives none: give the one the passages "
    "state for it",
    "code": "for a version, code or number, and the answer gives none: give the one the "
    "passages state",
    "figure": "for a figure, and the answer gives none: give the figure the passages state, or "
    "work it out from theirs",
    "name": "who or which, and the answer names nothing the question did not: give the name "
    "the passages state",
}


def asked_kind(request: str) -> str | None:
    """What ``request`` asks for: "date", "code", "figure", "name", or None (anything else:
    "why", "how do I", "what kind of" are answered in words)."""
    found = []
    for order, (kind, pattern) in enumerate(_ASKS):
        match = pattern.search(request)
        if match:
            found.append((match.start(), order, kind))
    return min(found)[2] if found else None


def _digit_words(text: str) -> set[str]:
    # Each run of word characters once, kept when it holds a digit (a pattern around the digit
    # backtracks over every start of a long run).
    return {w for w in re.findall(r"\w+", text) if any(c.isdigit() for c in w)}


def _when_words(text: str) -> set[str]:
    """``text``'s dates and times, lower-cased, a weekday or month without its plural "s" (the
    question's "Sunday" is the answer's "Sundays")."""
    out = set()
    for m in _WHEN.finditer(text):
        said = m[0].lower()
        out.add(said[:-1] if _MONTH_OR_DAY.fullmatch(m[0]) and said.endswith("s") else said)
    return out


def _capitalised(text: str, *, openers: bool) -> list[str]:
    """``text``'s capitalised words; without the ones opening a sentence unless ``openers``."""
    out = []
    for m in _CAPITALISED.finditer(text):
        at = m.start() - 1
        while at >= 0 and text[at].isspace():  # back over spaces, not a copy of the text
            at -= 1
        if openers or (at >= 0 and text[at] not in ".!?:\"'*#>-|"):
            out.append(m[0])
    return out


def _gives(
    kind: str,
    text: str,
    request: str,
    common: frozenset[str] = frozenset(),
    *,
    openers: bool = True,
) -> bool:
    """Whether ``text`` states something of ``kind`` that ``request`` does not; a capitalised
    word that is in ``common`` (written in lower case elsewhere) names nothing, nor, unless
    ``openers``, one opening a sentence."""
    from graph.plan import content_words

    if kind == "date":  # a month, weekday, year, time or date: "150 metres" is none
        return bool(_when_words(text) - _when_words(request))
    if kind == "figure":
        return any(c.isdigit() for c in text) or bool(_NUMBER_WORD.search(text))
    new_digits = bool(_digit_words(text) - _digit_words(request))
    if kind == "code":
        return new_digits or bool(re.search(r"\bversion [a-z]+\b", text, re.I))
    # A month or weekday names no one ("stops at the gate from Monday to Saturday").
    asked = content_words(request) | _POINTERS
    named = [
        w
        for w in _capitalised(text, openers=openers)
        if not _MONTH_OR_DAY.fullmatch(w) and w.lower() not in common
    ]
    return new_digits or bool(content_words(" ".join(named)) - asked)


def unasked(text: str, request: str, passages: Sequence[Mapping[str, Any]]) -> str | None:
    """The kind of thing a fast answer from passages was asked for and does not give, when the
    passages do give one (None: it gives it, it says the passages do not, nothing is asked for,
    or no passage could).

    A small model that has found the right passage answers around the fact it was asked for:
    "The new Sunday bus starts on Sundays [1]" for when it starts, "Found in the table under
    'Blade set'" for the blades' part code, while the passage it cites states the date or code.
    """
    kind = asked_kind(request)
    if kind is None or found_nothing(text):
        return None
    body = _answer_body(text)
    given = " ".join(str(p["text"]) for p in passages)
    # "Every" opening a sentence is no name when the passages write "every".
    common = frozenset(w.lower() for w in re.findall(r"\b[a-z][\w'-]*", given + " " + body))
    if _gives(kind, body, request, common):
        return None
    # The passages name someone only where a name stands inside a sentence: "Tenants report
    # them." names no one.
    return kind if _gives(kind, given, request, common, openers=False) else None


_LIST_ITEM = re.compile(r"^\s*\d{1,3}[.)]\s", re.MULTILINE)


def _figure_values(text: str) -> list[tuple[str, float]]:
    out = []
    for m in NUMBER.finditer(text):  # a figure, not part of a name, code or version
        raw = m.group().rstrip(",")
        try:
            out.append((raw, float(raw.replace(",", ""))))
        except ValueError:
            continue
    return out


def _rounded(text: str) -> list[tuple[str, float]]:
    """``text``'s figures with values rounded, so 0.1 + 0.2 and 0.3 compare equal."""
    return [(raw, round(value, 6)) for raw, value in _figure_values(text)]


def _answer_body(text: str) -> str:
    """What an answer states: its citations, sources line and list numbering taken out."""
    return _LIST_ITEM.sub(" ", _CITATION.sub(" ", text.split("\n\nSources: ")[0]))


def unsupported_figures(
    text: str, passages: Sequence[Mapping[str, Any]], request: str
) -> list[str]:
    """The figures a grounded answer states that neither its passages nor the request give,
    when it shows fewer than two figures that they do give ([]: nothing to hold against it).

    An answer from passages whose number is in none of them made the number up ("the limit is
    1 MB" where the changelog says 250 MB). One that works a figure out shows the figures it
    comes from, so two or more given figures let an answer through with a derived one."""
    stated = _rounded(_answer_body(text))
    if not stated:
        return []
    given = " ".join(str(p["text"]) for p in passages) + "\n" + request
    have = {value for _, value in _rounded(given)}
    unsupported = [raw for raw, value in stated if value not in have]
    supported = len(stated) - len(unsupported)
    return list(dict.fromkeys(unsupported)) if unsupported and supported < 2 else []


_ONE_CITATION = re.compile(r"\[(\d{1,2})\]")


def recited(
    text: str, passages: Sequence[Mapping[str, Any]], request: str
) -> tuple[str, tuple[int, int] | None]:
    """``text`` with its one cited passage corrected, when the passage it cites holds none of
    the figures it states and exactly one other passage holds them all; and (cited, holding)
    when it was corrected, else None.

    A small model cites a passage that names the subject ("the Wrenfield co-op lent its van")
    instead of the one holding the fee it quotes; a source a user follows should say what
    the answer says. An answer with no figure, or several citations, is left as it is."""
    numbers = {int(m) for m in _ONE_CITATION.findall(text)}
    if len(numbers) != 1:
        return text, None
    cited = numbers.pop()
    if not 1 <= cited <= len(passages):
        return text, None
    asked = {v for _, v in _rounded(request)}
    figures = [(raw, v) for raw, v in _rounded(_answer_body(text)) if v not in asked]
    stated = {v for _, v in figures}
    if not stated:
        return text, None

    def holds(passage: Mapping[str, Any]) -> set[float]:
        return {v for _, v in _rounded(str(passage["text"]))} & stated

    if holds(passages[cited - 1]) or _mentions(str(passages[cited - 1]["text"]), figures):
        return text, None
    holding = [n for n, p in enumerate(passages, start=1) if holds(p) == stated]
    if len(holding) != 1:
        return text, None
    return text.replace(f"[{cited}]", f"[{holding[0]}]"), (cited, holding[0])


def _mentions(text: str, figures: Sequence[tuple[str, float]]) -> bool:
    """Whether a figure's digits stand in ``text`` at all, even inside a name or version that
    is no figure of its own ("LGPL-2.1+" for an answer's "version 2.1"): a citation is only
    moved away from a passage that cannot be where the figure came from."""
    return any(re.search(rf"(?<![\d.]){re.escape(raw)}(?!\d)", text) for raw, _ in figures)


#: A run of citations ("[2]", " [1][3]", " [1] [3]") with the space before it.
_CLUSTER = re.compile(r"[ \t]*\[\d{1,2}\](?:[ \t]*\[\d{1,2}\])*")
_SENTENCE_STOP = re.compile(r"[.!?](?=\s|$)|\n")
#: A word label in brackets ending a line ("… 12 years [warranty].", "[meeting notes]"): a
#: model asked to cite passages as [n] that names one in words instead.
_LABEL = re.compile(r"[ \t]?\[([A-Za-z][A-Za-z .'&_-]{0,40})\](?=[.!?]?[ \t]*$)", re.MULTILINE)


def unechoed(text: str, passages: Sequence[Mapping[str, Any]]) -> str:
    """``text`` with a passage's citation line copied into it ("port_guide.md:1463-2210",
    or the file's whole path) put back as that passage's ``[n]``: a reader is given the
    source's number and sources line, not a path of the machine the answer was made on."""
    # Every passage's own citation line first: passages of one file share its path.
    for key in ("citation", "source"):
        for n, passage in enumerate(passages, start=1):
            echo = str(passage.get(key) or "")
            if len(echo) >= 8 and echo in text:
                text = re.sub(rf"{re.escape(echo)}(?::\d+(?:-\d+)?)?", f"[{n}]", text)
    return text


#: A code of letters and digits ("B14", "DH-20", "M400X"): as telling as a figure.
_WORD_RUN = re.compile(r"\w+(?:-\w+)*")


def _codes(text: str) -> set[str]:
    # Each run of word characters once (a lookahead per word boundary was quadratic on
    # "a-a-a-…"), kept when it has both a digit and a letter.
    return {
        run.lower()
        for run in _WORD_RUN.findall(text)
        if any(c.isdigit() for c in run) and any(c.isalpha() for c in run)
    }


def attributed(
    text: str, passages: Sequence[Mapping[str, Any]], request: str
) -> tuple[str, int | None]:
    """``text``, an answer from ``passages`` that cites none of them, citing the one passage
    that states what it says; and that passage's number, or None when nothing changed.

    The passage must state every figure and code ("B14") the answer gives that the request
    does not, and of those share the most of the answer's own words with it; among passages
    stating them all and sharing as many words, the best-ranked (each does state them). An
    answer with no figure or code cites only a passage sharing two or more of its words, and
    more than any other: words alone that two passages share equally cite nothing rather than
    a guess. A word label where a citation would stand ("[warranty]") gives way to it.
    """
    from graph.plan import content_words

    if any(1 <= int(n) <= len(passages) for n in _ONE_CITATION.findall(text)):
        return text, None
    body = _answer_body(_LABEL.sub("", text))
    figures = {v for _, v in _rounded(body)} - {v for _, v in _rounded(request)}
    codes = _codes(body) - _codes(request)
    words = content_words(body) - content_words(request)
    telling = bool(figures or codes)
    if not words and not telling:
        return text, None
    scored = []
    for n, passage in enumerate(passages, start=1):
        said = str(passage["text"])
        if figures <= {v for _, v in _rounded(said)} and codes <= _codes(said):
            scored.append((-len(words & content_words(said)), n))
    scored.sort()
    if not scored:
        return text, None
    shared, n = -scored[0][0], scored[0][1]
    if not telling and (shared < 2 or (len(scored) > 1 and scored[1][0] == scored[0][0])):
        return text, None
    label = _LABEL.search(text)
    if label:
        return text[: label.start()] + f" [{n}]" + text[label.end() :], n
    stop = _SENTENCE_STOP.search(text)
    at = stop.start() if stop else len(text.rstrip())
    return text[:at].rstrip() + f" [{n}]" + text[at:], n


#: A word label right before a citation ("1437 passengers [report] [1]"): the number says it.
_LABEL_BEFORE = re.compile(r"\[[A-Za-z][A-Za-z .'&_-]{0,40}\][ \t]*(?=\[\d{1,2}\])")


def unlabelled(text: str) -> str:
    """``text`` without the word labels a model put where the numbered citation that follows
    them already stands."""
    return _LABEL_BEFORE.sub("", text)


def figure_sources(figures: Sequence[str], passages: Sequence[Mapping[str, Any]]) -> list[int]:
    """For each of ``figures``, the number (from 1) of the first passage that states it, in
    ``figures``' order, each once; a figure no passage states has none."""
    from graph.compute import gives

    found: list[int] = []
    for figure in figures:
        n = next((n for n, p in enumerate(passages, 1) if gives(str(p["text"]), figure)), None)
        if n is not None and n not in found:
            found.append(n)
    return found


def cite_sources(
    text: str, passages: Sequence[Mapping[str, Any]], figures: Sequence[str], value: str
) -> tuple[str, tuple[list[int], list[int]] | None]:
    """``text``, an answer stating ``value`` worked out from ``figures``, with the sentence
    that states it citing the passages that state those figures; and (citations dropped,
    citations added) when it changed.

    A small model weaving a computed result cites whichever passage its eye fell on (a
    licence file for a ferry's passenger count); the passages the figures were copied from are
    known, so that sentence cites them, and its citations of passages holding none of the
    figures are taken out (other sentences keep theirs). An answer that does not state
    ``value``, or whose figures no passage states, is left as it is."""
    from graph.compute import gives

    holding = figure_sources(figures, passages)
    stops = [m.start() for m in _SENTENCE_STOP.finditer(text)] + [len(text.rstrip())]
    at = next((i for i in stops if gives(_answer_body(text[:i]), value)), None)
    if not holding or at is None:
        return text, None
    begin = max((i + 1 for i in stops if i < at), default=0)
    sentence = text[begin:at]
    cited = {int(n) for n in _ONE_CITATION.findall(sentence) if 1 <= int(n) <= len(passages)}
    if set(holding) <= cited:
        return text, None

    def holds_none(n: int) -> bool:
        said = str(passages[n - 1]["text"])
        return not any(gives(said, figure) for figure in figures)

    dropped = sorted(n for n in cited - set(holding) if holds_none(n))
    missing = sorted(n for n in holding if n not in cited)

    def rebuilt(numbers: Sequence[int]) -> str:
        kept = sorted({n for n in numbers if n not in dropped})
        return " " + "".join(f"[{n}]" for n in kept) if kept else ""

    sentence = _CLUSTER.sub(
        lambda m: rebuilt([int(n) for n in _ONE_CITATION.findall(m[0])]), sentence
    ).rstrip()
    last = re.search(_CLUSTER.pattern + "$", sentence)
    if last:  # the sentence already ends in citations: the missing ones join them
        numbers = [int(n) for n in _ONE_CITATION.findall(last[0])]
        sentence = sentence[: last.start()] + rebuilt(numbers + missing)
    else:
        sentence += rebuilt(missing)
    return text[:begin] + sentence + text[at:], (dropped, missing)


def cut_at_sentence(text: str) -> str:
    """``text`` up to its last full sentence (or line): for an answer that ran out of tokens.

    A line break counts as a boundary, since a list item or heading before it is complete. An
    answer with no boundary at all is cut at its last whole word, with an ellipsis.
    """
    ends = [
        m.end()
        for m in _SENTENCE_END.finditer(text.rstrip())
        if not _LIST_MARK.search(text, 0, m.end())  # "8." opens a list item, ends nothing
    ]
    if ends and ends[-1] > len(text) // 4:
        return text[: ends[-1]].rstrip()
    head = text.rstrip()
    space = head.rfind(" ")
    return (head[:space] if space > 0 else head).rstrip(" ,;:-") + "…"


def history(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Earlier turns for the answering model: user and answer messages, not failures.

    A request whose answer failed (or was interrupted) is joined to the user's next message,
    so turns keep alternating as chat templates expect; one right before the request is left
    out (the request follows it).
    """
    turns: list[list[Any]] = []  # [role, text], consecutive same-role messages joined
    for message in messages[:-1]:
        if isinstance(message, AIMessage) and message.additional_kwargs.get("batos_failed"):
            continue
        if not isinstance(message, HumanMessage | AIMessage):
            continue
        role = "user" if isinstance(message, HumanMessage) else "ai"
        text = content_text(message.content)
        if role == "user":
            text = text[:USER_CHARS]
        if turns and turns[-1][0] == role:
            turns[-1][1] += "\n" + text
        else:
            turns.append([role, text])
    if turns and turns[-1][0] == "user":  # the request itself follows: no two user turns
        turns.pop()
    users = [i for i, (role, _) in enumerate(turns) if role == "user"]
    turns = turns[users[-HISTORY_TURNS] :] if len(users) > HISTORY_TURNS else turns
    answers = [i for i, (role, _) in enumerate(turns) if role == "ai"]
    recent = set(answers[-RECENT_ANSWERS:])
    kept: list[BaseMessage] = []
    for i, (role, text) in enumerate(turns):
        if role == "user":
            kept.append(HumanMessage(content=text))
            continue
        limit = ANSWER_CHARS if i in recent else OLD_ANSWER_CHARS
        kept.append(AIMessage(content=text if len(text) <= limit else text[:limit] + "…"))
    return kept
