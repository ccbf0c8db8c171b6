"""Program-aided answers: for a request that needs an exact number or date, BRICK's model writes
a small program, the sandbox runs it, and the answer quotes its result.

A 1.5B model gets multi-step arithmetic and calendar questions wrong when it answers in words;
written as code (``def solve(self)``) and run, the same model gets most of them right. The
program is generated code like any other: the PersistenceGuardian audits it, RestrictedPython
and the forked, confined child run it, and only its bounded result comes back. Nothing is
installed: the program serves this one request.

``looks_computational`` decides when to try. A program that cannot be written or run degrades
the answer (the persona answers without a computed result), never the request.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from batos.errors import BatosError
from graph import prompts as prompt_files
from prototypes import guardian, sandbox
from prototypes.bounded import bounded_repr, strict_json
from prototypes.codex import load_codex
from prototypes.uvm import UvmObject

#: The persona that writes programs, and what it may spend on one.
AUTHOR = "BRICK"
PROGRAM_TOKENS = 320
#: Tries per request: the first program, then one repair shown what went wrong.
ATTEMPTS = 2
#: Longest computed value the answer is given, in characters.
MAX_RESULT_CHARS = 300
SELECTOR = "solve"

#: A figure: not part of a name or code ("DH-20", "A4", "v2.1").
NUMBER = re.compile(r"(?<![\w.-])\d[\d,]*(?:\.\d+)?(?![\w-])")
_MONTHS = (
    r"jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sep(t|tember)?|"
    r"oct(ober)?|nov(ember)?|dec(ember)?"
)
_DATE = re.compile(
    rf"\b\d{{4}}-\d{{1,2}}-\d{{1,2}}\b|\b\d{{1,2}}\s+({_MONTHS})\b|\b({_MONTHS})\s+\d{{1,2}}\b",
    re.IGNORECASE,
)
#: Words of a question whose answer is a quantity, a date or a time.
_ASKS = re.compile(
    r"\b(how (many|much|long|far|old|fast|often)|what (is|was|will be|are) (the )?(total|sum|"
    r"average|mean|difference|cost|price|area|volume|speed|rate|percentage)|calculate|compute|"
    r"convert|percent(age)?|per ?cent|average|total|sum of|times|divided|multiplied|"
    r"interest|compound|discount|tax|tip|split|share|per|each|remain(s|ing)?|left over|"
    r"days? (between|until|after|before|from)|weeks? (between|until|after|before)|"
    r"what (day|date|weekday|time)|which (day|date|weekday)|in (celsius|fahrenheit|km|miles|"
    r"kilometers|kilometres|meters|metres|feet|inches|pounds|kilograms|kg|lbs|litres|liters|"
    r"gallons|ounces|grams|minutes|hours|seconds))\b",
    re.IGNORECASE,
)


_COMPARATIVES = (
    "more|less|fewer|longer|shorter|older|younger|further|farther|higher|lower|bigger|smaller|"
    "larger|earlier|later|heavier|lighter|cheaper|dearer|faster|slower"
)
#: "How many more", "how many minutes longer", "how much cheaper", "how much do I save": a
#: comparison whose answer is the size of the gap between two figures.
_COMPARISON = (
    rf"how (many|much)( [a-z]+)? ({_COMPARATIVES})|"
    r"how much (do|does|did|would|will|can|could) (i|we|you|they|one|it|he|she) save"
)
#: Words of a question whose answer is worked out from figures given elsewhere (in memory).
#: "more than" alone asks for nothing computed: "when did the street drop by more than two
#: metres?" wants a date.
_DERIVED = re.compile(
    rf"\b({_COMPARISON}|by how (many|much)|difference between|in total|altogether|combined|"
    r"(for )?how many (years|days|weeks|months) "
    r"(passed|elapsed|between|after|before|separate|did|were|was|had))\b",
    re.IGNORECASE,
)


def looks_computational(text: str, *, grounded: bool = False, derived: bool = True) -> bool:
    """Whether ``text`` asks for a quantity, date or time computed from what it gives — or,
    when it is about the catalog (``grounded``), from figures its passages give.

    Two figures (or a date) and a word that asks for a computed answer; a bare number ("my
    locker code is 4471"), a model name ("DH-20") or a question with no figure is not one,
    unless a grounded question asks how many more, in total, the difference… ("by how many"
    too, unless ``derived`` is off: how the mind answered before it asked that).
    """
    figures = len(NUMBER.findall(text)) + 2 * len(_DATE.findall(text))
    if figures >= 2 and ("%" in text or bool(_ASKS.search(text))):
        return True
    if not derived:
        return grounded and bool(_DERIVED.search(_BY_HOW.sub(" ", text)))
    return grounded and bool(_DERIVED.search(text) or asks_total(text))


_BY_HOW = re.compile(r"\bby how (many|much)\b", re.IGNORECASE)

#: A four-digit year: in "the 1951 census" or "in 2024 than in 2023" it names which figure,
#: it is not one to compute with.
_YEAR = re.compile(r"^(1[5-9]|20)\d\d$")


def needs_facts(text: str) -> bool:
    """Whether a computation asks for a quantity derived from figures it does not give: "how
    many more newts in 2024 than in 2023?" names its operands by year and leaves their values
    to the documents. A word problem that states two operands takes them from itself."""
    if not (_DERIVED.search(text) or asks_total(text)):
        return False
    operands = [f for f in NUMBER.findall(text) if not _YEAR.match(f)]
    return len(operands) + 2 * len(_DATE.findall(text)) < 2


#: Questions whose answer is the size of a difference, never its sign: "how many fewer people
#: lived there in 1951 than in 1901?" is 743, whichever figure the program subtracted from
#: which ("by how much did it fall?" is answered "by 5", not "by -5").
_MAGNITUDE = re.compile(
    rf"\b({_COMPARISON}|by how (many|much)|difference between)\b", re.IGNORECASE
)
_NEGATIVE = re.compile(r"^-(?=\d)")


def magnitude(question: str, value: str) -> str:
    """``value`` as the answer to ``question``: a negative number without its sign when the
    question asks how much more, fewer, by how much or the difference (the order of the two
    operands is the program's choice, not the answer)."""
    if _MAGNITUDE.search(question) and NUMBER.fullmatch(value.lstrip("-")):
        return _NEGATIVE.sub("", value)
    return value


@dataclass(frozen=True)
class Computed:
    """What the program gave, or why there is no result (``ok`` False)."""

    ok: bool
    value: str = ""
    source: str = ""
    reason: str = ""
    attempts: int = 0
    #: The figures the result was worked out from that came from the facts (not the
    #: question), as shown: what an answer stating the result should cite.
    figures: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "value": self.value,
            "source": self.source,
            "reason": self.reason,
            "attempts": self.attempts,
            "figures": list(self.figures),
        }


def messages_for(
    question: str, failed: list[tuple[str, str]], facts: str = ""
) -> list[BaseMessage]:
    """The conversation the author sees: rules, worked examples, the question (after the
    ``facts`` it is to take its figures from, when given), the last failure."""
    p = prompt_files.load("compute")
    identity = load_codex().persona(AUTHOR).identity
    messages: list[BaseMessage] = [SystemMessage(identity + "\n\n" + p["system"])]
    for example in p.get("examples", []):
        messages += [HumanMessage(example["task"]), AIMessage(example["answer"])]
    task = p["task"].format(question=question)
    if facts:
        task = p["facts"].format(facts=facts) + "\n\n" + task
    messages.append(HumanMessage(task))
    for source, reason in failed[-1:]:
        messages += [
            AIMessage(f"```python\n{source}```"),
            HumanMessage(p["repair"].format(reason=reason)),
        ]
    return messages


def shown(value: Any) -> str:
    """The program's result as the answer is given it: a float without binary noise."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"the program returned {value}")
        return f"{value:.10g}" if abs(value) < 1e15 else f"{value:.6e}"
    if isinstance(value, int):
        if value.bit_length() > 128:
            raise ValueError("the program returned an integer too large to state")
        return str(value)
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("the program returned an empty string")
        return value.strip()[:MAX_RESULT_CHARS]
    if isinstance(value, list | tuple) and 0 < len(value) <= 10:
        return ", ".join(shown(v) for v in value)[:MAX_RESULT_CHARS]
    if isinstance(value, datetime.datetime):
        return f"{value.day} {value:%B %Y %H:%M}"
    if isinstance(value, datetime.date):
        return f"{value.day} {value:%B %Y}"  # "18 August 2025", not datetime.date(2025, 8, 18)
    if isinstance(value, datetime.timedelta):
        return f"{value.days} days" if not value.seconds else str(value)
    if value is None:
        raise ValueError("the program returned None: it must return the answer")
    return bounded_repr(value, MAX_RESULT_CHARS)


def run_program(source: str) -> str:
    """Audit and run ``source`` (``def solve(self)``) in the sandbox; its result as text.

    Raises ``ValueError`` saying what went wrong, in words the author can act on.
    """
    try:
        guardian.check(SELECTOR, source)
        fn = sandbox.compile_sandboxed(SELECTOR, source)
    except BatosError as exc:
        findings = getattr(exc, "findings", None) or [exc.message]
        raise ValueError("; ".join(map(str, findings))[:600]) from None
    outcome = sandbox.run_isolated(fn, UvmObject())
    if not outcome.ok:
        raise ValueError("; ".join(outcome.findings or (outcome.summary,))[:600])
    return shown(outcome.value)


#: Figures a program may write without finding them in the question or the facts: counting,
#: calendar and clock constants, powers of ten.
_COMMON = frozenset(
    [float(n) for n in range(13)]
    + [24.0, 30.0, 31.0, 52.0, 60.0, 365.0, 366.0, 3600.0]
    + [100.0, 1000.0, 10000.0, 1000000.0]
)


def _constants(source: str) -> list[int | float]:
    """The numbers written into ``source`` (booleans are no figures), each once, in order;
    none for a program that does not parse (the sandbox's check says what is wrong)."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out: list[int | float] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
            if isinstance(node.value, int | float) and node.value not in out:
                out.append(node.value)
    return out


def _size(value: int | float) -> float | None:
    """``value``'s absolute size as a float; None for an integer too large for one, or a
    float that is not finite (no document states either)."""
    try:
        size = abs(float(value))
    except OverflowError:
        return None
    return size if math.isfinite(size) else None


def unsourced(source: str, given: str) -> list[str]:
    """The figures written into ``source`` that ``given`` (the question and the facts) does
    not hold, beyond common constants: a program about documents that invents its operands
    computes an exact-looking wrong answer."""
    have = {round(value, 9) for value, _ in _figures(given)}
    out = []
    for value in _constants(source):
        size = _size(value)
        if size is None:
            if isinstance(value, int):  # an infinite float is the sandbox's to refuse
                out.append(f"an integer of {value.bit_length()} bits")
        elif size not in _COMMON and round(size, 9) not in have:
            out.append(repr(value))
    return out


def taken(source: str, question: str) -> tuple[str, ...]:
    """The figures written into ``source`` beyond common constants and the question's own:
    those a program about documents took from the facts. Years are left out: a date's year
    is stated by most passages, so it tells none apart."""
    asked = {round(value, 9) for value, _ in _figures(question)}
    out = []
    for value in _constants(source):
        size = _size(value)
        if size is None or size in _COMMON or round(size, 9) in asked:
            continue
        if not (size.is_integer() and _YEAR.match(str(int(size)))):
            out.append(shown(_plain(size)))
    return tuple(out)


def compute(question: str, write: Callable[[list[BaseMessage]], str], facts: str = "") -> Computed:
    """Have ``write`` (one model call: messages in, reply out) write a program for
    ``question`` (taking figures from ``facts`` too) and run it; a repair round is given the
    error."""
    from graph.jit import extract_code

    failed: list[tuple[str, str]] = []
    for attempt in range(1, ATTEMPTS + 1):
        source = extract_code(write(messages_for(question, failed, facts)), SELECTOR)
        try:
            invented = unsourced(source, question + "\n" + facts) if facts else []
            if invented:
                raise ValueError(
                    f"it uses {', '.join(invented[:6])}, which neither the question nor the "
                    "facts give: take every figure from the facts, copied exactly"
                )
            value = magnitude(question, run_program(source))
            figures = taken(source, question) if facts else ()
            return Computed(True, value, source, attempts=attempt, figures=figures)
        except ValueError as exc:
            failed.append((source, str(exc)))
    source, reason = failed[-1]
    return Computed(False, source=source, reason=reason, attempts=ATTEMPTS)


_FIGURE = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
_ISO_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
_MONTH_NAMES = (
    "january february march april may june july august september october november december"
).split()


# -- a difference of two figures the passages give ----------------------------------------

#: What BABS may spend copying the two figures, and the longest reply read.
PAIR_TOKENS = 200
MAX_PAIR_REPLY = 4000
MAX_QUOTE_CHARS = 300
_FIGURE_SCHEMA = {
    "type": "object",
    "properties": {
        "words": {"type": "string", "maxLength": 160},
        "value": {"type": "number"},
    },
    "required": ["words", "value"],
}
#: The reply's shape: each figure with the passage's words that state it, then the figure.
PAIR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"first": _FIGURE_SCHEMA, "second": _FIGURE_SCHEMA},
    "required": ["first", "second"],
}


def asks_difference(question: str) -> bool:
    """Whether ``question`` asks for the size of a difference (how many more, fewer, by how
    much, the difference between)."""
    return bool(_MAGNITUDE.search(question))


def pair_messages(question: str, facts: str) -> list[BaseMessage]:
    """What BABS is asked: the passages, then the question and what to copy."""
    template = prompt_files.load("compute")["pair"]
    return [HumanMessage(template.format(facts=facts, question=question))]


def _figure(data: Any, which: str) -> tuple[str, float]:
    if not isinstance(data, dict):
        raise ValueError(f"the {which} figure is not an object")
    words, value = data.get("words"), data.get("value")
    if not isinstance(words, str) or isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the {which} figure has no words and number")
    if not math.isfinite(float(value)):
        raise ValueError(f"the {which} figure is not a finite number")
    return " ".join(words.split())[:MAX_QUOTE_CHARS], float(value)


def difference(
    question: str,
    facts: str,
    read: Callable[[list[BaseMessage]], str],
    evidence: str | None = None,
) -> Computed:
    """The difference ``question`` asks for, from two figures ``read`` (one model call:
    messages in, JSON reply out) copies from ``facts``: each must be a figure ``evidence``
    (the passages' own text; ``facts`` when not given, whose citations carry offsets that are
    no figures of the documents) states, and the two must differ. Arithmetic is done here, not
    by the model; the working is the result's source. Not ``ok`` (with the reason) when the
    reply cannot be trusted."""
    evidence = facts if evidence is None else evidence
    reply = read(pair_messages(question, facts))
    try:
        data = _json_object(reply)
        (first_words, first), (second_words, second) = (
            _figure(data.get("first"), "first"),
            _figure(data.get("second"), "second"),
        )
        for which, words, value in (
            ("first", first_words, first),
            ("second", second_words, second),
        ):
            _check_copied(which, words, value, evidence)
        if first == second:
            raise ValueError("the two figures are the same")
    except (ValueError, RecursionError) as exc:
        return _refused(reply, exc)
    result = shown(_plain(abs(first - second)))
    working = (
        f"first = {shown(_plain(first))}  # {first_words}\n"
        f"second = {shown(_plain(second))}  # {second_words}\n"
        f"difference = abs(first - second)  # {result}\n"
    )
    figures = (shown(_plain(first)), shown(_plain(second)))
    return Computed(True, result, working, attempts=1, figures=figures)


def _json_object(reply: str) -> dict[str, Any]:
    """A reader's bounded reply as a JSON object; ValueError (or RecursionError, for one
    nested deeper than the parser recurses) when it is none."""
    if len(reply) > MAX_PAIR_REPLY:
        raise ValueError(f"the reply is longer than {MAX_PAIR_REPLY} characters")
    # strict=False: a line break copied inside the words is no reason to refuse them
    data = strict_json(reply, strict=False)
    if not isinstance(data, dict):
        raise ValueError("the reply is not a JSON object")
    return data


def _refused(reply: str, exc: ValueError | RecursionError) -> Computed:
    """No result from a reply that cannot be trusted, with the reason. json.JSONDecodeError
    is a ValueError; a reply nested too deeply (a server with no grammar can send one) is as
    untrustworthy, not a crash."""
    reason = str(exc) if isinstance(exc, ValueError) else "the reply is nested too deeply"
    return Computed(False, source=reply[:MAX_RESULT_CHARS], reason=reason, attempts=1)


def _check_copied(which: str, words: str, value: float, evidence: str) -> None:
    """Refuse a figure copied from the passages that they do not give, or that the words
    copied with it do not state."""
    if not gives(evidence, shown(_plain(value))):
        raise ValueError(f"{shown(_plain(value))} is not a figure the passages give")
    # A figure copied with another sentence's words (379 "from" a line that says 17.50 a
    # month) is not the figure those words name. Words that state no figure of their own
    # ("carried … passengers in 2024": a year names the figure) are let through.
    if not _words_allow(words, value):
        raise ValueError(f"the {which} figure's words do not state {shown(_plain(value))}")


# -- a total of figures the passages give -------------------------------------------------

#: What BABS may spend listing the figures of a total, the most it may list, and the largest
#: count of one figure (three nights, two tickets…) taken.
TOTAL_TOKENS = 320
MAX_TERMS = 6
MAX_TIMES = 1000
_COUNT_WORDS = "two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
#: A count written in digits: at most three, so a year ("the 2025 permits") is none.
_COUNT = r"(?<![\w.,£$€])\d{1,3}(?!\d|[.,]\d)"
#: Things bought or counted by the unit: "for 3 nights", "two adult tickets", "4 people".
#: Durations (years, hours) are left out: "someone who has worked there for three years" and
#: "within 12 hours" name a condition, not a count to multiply.
_UNITS = (
    r"nights?|tickets?|adults?|child(ren)?|kids?|people|persons?|guests?|sessions?|visits?|"
    r"lessons?|classes|class|passes|cars?|permits?|seats?|places?|rooms?|pitch(es)?|bags?|"
    r"boxes|copies|meals?|items?|(adult|child|concession|student) tickets?"
)
#: Words of a question about memory whose answer adds figures the passages give: "in total",
#: "what do the tickets add up to", "how much will that come to", "permits for both", "all
#: three events", "for 3 nights".
_TOTAL = re.compile(
    rf"\b(in total|altogether|combined|add(s|ed)? up|comes? to|came to|for both|both of "
    rf"(us|them|these|those)|all (of )?(the )?({_COUNT_WORDS})|(for )?({_COUNT}|{_COUNT_WORDS}) "
    rf"((adult|child|concession|student|family|single|return|day|weekend) )?({_UNITS}))\b",
    re.IGNORECASE,
)
_TERM_SCHEMA = {
    "type": "object",
    "properties": {
        "words": {"type": "string", "maxLength": 160},
        "value": {"type": "number"},
        "times": {"type": "integer"},
    },
    "required": ["words", "value", "times"],
}
#: The reply's shape: each figure added, with the passage's words stating it and how many
#: times it is counted.
TOTAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "terms": {"type": "array", "items": _TERM_SCHEMA, "minItems": 1, "maxItems": MAX_TERMS}
    },
    "required": ["terms"],
}


#: A question that asks for an amount: "on which day does the physiotherapist come to the
#: island?" has "come to" and asks for nothing to add.
_AMOUNT = re.compile(
    r"\b(how (much|many)|cost|costs|add(s|ed)? up|total|sum|price|pay|spend)\b", re.IGNORECASE
)


def asks_total(question: str) -> bool:
    """Whether ``question`` asks for figures added up (in total, add up to, come to, for
    both, all three, for 3 nights…) and not for the size of a difference."""
    return bool(_TOTAL.search(question) and _AMOUNT.search(question)) and not asks_difference(
        question
    )


def _counts(question: str) -> set[int]:
    """The counts ``question`` states, as digits or words ("3 nights", "two tickets",
    "both"): the only ones a figure of a total may be taken times."""
    found = {int(n) for n in re.findall(_COUNT, question)}
    words = re.findall(r"[a-z]+", question.lower())
    found |= {_NUMBER_WORDS[w] for w in words if w in _NUMBER_WORDS}
    if "both" in words:
        found.add(2)
    return found


def total_messages(question: str, facts: str) -> list[BaseMessage]:
    """What BABS is asked: the passages, then the question and what to list."""
    template = prompt_files.load("compute")["total"]
    return [HumanMessage(template.format(facts=facts, question=question))]


def total(
    question: str,
    facts: str,
    read: Callable[[list[BaseMessage]], str],
    evidence: str | None = None,
) -> Computed:
    """The total ``question`` asks for, from the figures ``read`` (one model call: messages
    in, JSON reply out) lists from ``facts``, each with how many times it counts. Each figure
    must be one ``evidence`` (the passages' own text) states, stated by the words copied
    with it; a count above one must be a count the question states; and there must be
    something to add (two figures, or one taken more than once). The sum is done here, not
    by the model; the working is the result's source. Not ``ok`` (with the reason) when the
    reply cannot be trusted."""
    evidence = facts if evidence is None else evidence
    reply = read(total_messages(question, facts))
    try:
        data = _json_object(reply)
        if not isinstance(data.get("terms"), list):
            raise ValueError("the reply is not a JSON object with a list of terms")
        raw_terms = data["terms"]
        if not 1 <= len(raw_terms) <= MAX_TERMS:
            raise ValueError(f"the reply lists {len(raw_terms)} figures, not 1 to {MAX_TERMS}")
        counts = _counts(question)
        terms: list[tuple[str, float, int]] = []
        for n, item in enumerate(raw_terms, start=1):
            which = f"term {n}'s"
            words, value = _figure(item, which)
            times = item.get("times", 1)
            if isinstance(times, bool) or not isinstance(times, int | float):
                raise ValueError(f"{which} count is not a number")
            if times != int(times) or not 1 <= times <= MAX_TIMES:
                raise ValueError(f"{which} count {times} is not a whole number from 1")
            if times > 1 and int(times) not in counts:
                raise ValueError(f"{which} count {int(times)} is not one the question states")
            _check_copied(which, words, value, evidence)
            terms.append((words, value, int(times)))
        if len(terms) == 1 and terms[0][2] == 1:
            raise ValueError("one figure taken once is nothing to add up")
    except (ValueError, RecursionError) as exc:
        return _refused(reply, exc)
    result = shown(_plain(math.fsum(value * times for _, value, times in terms)))
    lines = []
    for n, (words, value, times) in enumerate(terms, start=1):
        counted = f" * {times}" if times > 1 else ""
        lines.append(f"term{n} = {shown(_plain(value))}{counted}  # {words}")
    names = " + ".join(f"term{n}" for n in range(1, len(terms) + 1))
    lines.append(f"total = {names}  # {result}")
    figures = tuple(dict.fromkeys(shown(_plain(value)) for _, value, _ in terms))
    return Computed(True, result, "\n".join(lines) + "\n", attempts=1, figures=figures)


#: Numbers documents spell out ("two weeks' paid leave"), for copied words that state them so.
_NUMBER_WORDS = {
    word: n
    for n, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}


def _words_allow(words: str, value: float) -> bool:
    """Whether ``words`` copied with a figure can be where ``value`` was read: they state it,
    as digits or a spelled-out number, or they state no figure but dates and years (which
    name a figure: "passengers in 2024", "before 1 April 2025: 2 weeks")."""
    if gives(words, shown(_plain(value))):
        return True
    if any(_NUMBER_WORDS.get(w) == value for w in re.findall(r"[a-z]+", words.lower())):
        return True
    return all(
        decimals == 0 and _YEAR.match(str(int(figure)))
        for figure, decimals in _figures(_DATE.sub(" ", words))
    )


def _plain(value: float) -> int | float:
    """A whole float as an int, so 36.0 reads "36"; others rounded off their binary noise."""
    return int(value) if value.is_integer() and abs(value) < 2**53 else round(value, 9)


def _figures(text: str) -> list[tuple[float, int]]:
    """Each number in ``text`` with the count of its decimals ("1,036" → (1036.0, 0))."""
    out = []
    for m in _FIGURE.finditer(text):
        raw = m.group().replace(",", "")
        try:
            out.append((float(raw), len(raw.split(".")[1]) if "." in raw else 0))
        except ValueError:
            continue
    return out


def gives(text: str, value: str) -> bool:
    """Whether an answer states the computed ``value``: a number as itself or rounded to the
    answer's own precision ("71.8175" is given by "71.82"); a date, weekday or other text by
    each of its words and numbers ("2025-03-20" by "20 March 2025")."""
    value = value.strip()
    try:
        number = float(value.replace(",", ""))
    except ValueError:
        number = None
    if number is not None and math.isfinite(number):
        for figure, decimals in _figures(text):
            unit = 10.0**-decimals
            if abs(figure - number) <= unit / 2 + 1e-9 * max(1.0, abs(number)):
                return True
        return False
    iso = _ISO_DATE.match(value)
    if iso:
        year, month, day = (int(g) for g in iso.groups())
        if not 1 <= month <= 12:
            return value in text
        tokens: list[str] = [str(year), _MONTH_NAMES[month - 1], str(day)]
        if value in text:
            return True
    else:
        tokens = re.findall(r"[A-Za-z]+|\d+", value)
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", text)}
    numbers = {str(int(n)) for n in re.findall(r"\d+", text) if len(n) <= 12}
    for token in tokens:
        if token.isdigit():
            if str(int(token)) not in numbers:
                return False
        elif token.lower() not in words and not (
            len(token) > 3 and any(w.startswith(token.lower()[:3]) for w in words)
        ):
            return False
    return bool(tokens)


def stated(value: str, source: str) -> str:
    """The answer when the model, twice, would not state what its program computed: the result
    and the program that computed it, which is the working a reader can check."""
    return (
        f"{value}\n\nWorked out by this program, run in the sandbox:\n"
        f"```python\n{source.strip()}\n```\nResult: {value}"
    )
