"""Examples a generated method is judged by: input → expected output, and the choice among drafts.

The author model writes a few examples from the intent alone (``parse_examples`` reads its reply
as hostile data: sizes, counts, nesting and integers are bounded, and an example that breaks a
rule is dropped with a log line). Every draft that passes the gate is run on the examples' inputs
and on the call's own arguments in the sandbox; ``choose`` then groups drafts whose outputs are
identical and scores each group by its size times the examples' checks it passes (each result
and each expected slot; dual agreement, as in CodeT): independent drafts that agree outweigh a
single example, so a wrong example cannot sink a good draft, while a lone draft that fails its
examples is sent back with the failures.

Outputs are compared in a normal form (``normal``): tuples as lists, sets as sorted lists, dict
keys as text, integral floats as integers; an expected float with few decimals matches an
output rounded to as many.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prototypes.bounded import strict_json
from prototypes.codex import INTENTS_SLOT

log = logging.getLogger("batos.examples")

#: Longest examples reply read, in characters.
MAX_REPLY_CHARS = 12_000
#: Examples kept from one reply (the rest are dropped).
MAX_EXAMPLES = 6
#: Values in one example (its arguments, slots and expected output together).
MAX_NODES = 400
#: Nesting of containers in one example.
MAX_DEPTH = 8
#: Longest string in an example, in characters.
MAX_TEXT = 400
#: Largest integer in an example, in bits.
MAX_INT_BITS = 128
#: Slots one example may set or expect.
MAX_SLOTS = 8
#: Values the normal form of one output may hold; a larger output compares as its digest.
MAX_OUTPUT_NODES = 5_000
#: Longest text of a draft's error on one input, as shown to the model.
MAX_ERROR_CHARS = 1_000
#: Decimals below which an expected float is read as rounded (0.33 for 1/3).
ROUNDED_DECIMALS = 6

_SLOT = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


class ExampleRejected(ValueError):
    """One example breaks a rule; the message says which."""


@dataclass(frozen=True)
class Example:
    """One input → expected output: positional arguments, the slots set before the call,
    the result, and slot values expected after it."""

    args: tuple[Any, ...]
    returns: Any
    slots: dict[str, Any] = field(default_factory=dict)
    slots_after: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "args": list(self.args),
            "returns": self.returns,
            "slots": dict(self.slots),
            "slots_after": dict(self.slots_after),
        }

    def call_text(self, selector: str) -> str:
        shown = ", ".join(json.dumps(a) for a in self.args)
        state = f" with slots {json.dumps(self.slots)}" if self.slots else ""
        return f"self.{selector}({shown}){state}"


#: Any JSON value, spelled so that llama.cpp's grammar converter reads it so: it turns an empty
#: schema ``{}`` into "an object" (every expected output was then forced into a JSON object,
#: ``{"hms": "1:02:05"}``), and applies an array's item bounds only when its items are given.
ANY_VALUE: dict[str, Any] = {
    "type": ["string", "number", "integer", "boolean", "array", "object", "null"]
}


def schema(most: int = MAX_EXAMPLES, arity: int | None = None) -> dict[str, Any]:
    """The JSON schema of an examples reply (no string bounds: llama.cpp would expand each
    into a grammar rule per character; ``parse_examples`` bounds them instead).

    With ``arity``, every "args" list must hold exactly that many items: small models spread
    a one-list call's list over "args" (``[1, 2, 3]`` for ``f([1, 2, 3])``), and decoding
    held to the count leaves them no room to."""
    args: dict[str, Any] = {"type": "array", "items": ANY_VALUE}
    if arity is not None:
        args.update(minItems=arity, maxItems=arity)
    return {
        "type": "object",
        "properties": {
            "examples": {
                "type": "array",
                "minItems": 1,
                "maxItems": most,
                "items": {
                    "type": "object",
                    "properties": {
                        "args": args,
                        "slots_before": {"type": "object"},
                        "returns": ANY_VALUE,
                        "slots_after": {"type": "object"},
                    },
                    "required": ["args", "slots_before", "returns", "slots_after"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["examples"],
        "additionalProperties": False,
    }


def bounded_int(text: str) -> int:
    """An example's integer literal, within ``MAX_INT_BITS``; ``ExampleRejected`` otherwise."""
    if len(text) > MAX_INT_BITS // 3 + 2:
        raise ExampleRejected(f"an integer of {len(text)} digits (at most {MAX_INT_BITS} bits)")
    value = int(text)
    if value.bit_length() > MAX_INT_BITS:
        raise ExampleRejected(f"an integer over {MAX_INT_BITS} bits")
    return value


def _check(value: Any, budget: list[int], depth: int) -> Any:
    """``value`` (parsed JSON) if it is within the limits, else ``ExampleRejected``."""
    budget[0] -= 1
    if budget[0] < 0:
        raise ExampleRejected(f"more than {MAX_NODES} values")
    if depth > MAX_DEPTH:
        raise ExampleRejected(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ExampleRejected(f"a string of {len(value)} characters (at most {MAX_TEXT})")
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ExampleRejected("a number that is not finite")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, list):
        return [_check(v, budget, depth + 1) for v in value]
    if isinstance(value, dict):
        return {
            _check(k, budget, depth + 1): _check(v, budget, depth + 1) for k, v in value.items()
        }
    raise ExampleRejected(f"a {type(value).__name__} value")


def _slots(value: Any, what: str, budget: list[int]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ExampleRejected(f"{what} is not an object of slot names")
    if len(value) > MAX_SLOTS:
        raise ExampleRejected(f"{what} names {len(value)} slots (at most {MAX_SLOTS})")
    for name in value:
        if not _SLOT.fullmatch(name):
            raise ExampleRejected(f"{what} names {name!r}, not a public slot")
    # The declared intents are never set or checked by an example; a model that copies the
    # object's slots copies them too, and the rest of its example is still worth keeping.
    value = {name: v for name, v in value.items() if name != INTENTS_SLOT}
    return _check(value, budget, 1)


def example_from(data: Any, arity: int | None = None) -> Example:
    """One example from parsed JSON (a reply's, or one stored with a method)."""
    if not isinstance(data, dict):
        raise ExampleRejected("an example is not an object")
    budget = [MAX_NODES]
    args = data.get("args")
    if not isinstance(args, list):
        raise ExampleRejected('"args" is not a list')
    if arity is not None and len(args) != arity:
        raise ExampleRejected(f"{len(args)} argument(s) where the call has {arity}")
    if "returns" not in data:
        raise ExampleRejected('no "returns"')
    return Example(
        args=tuple(_check(args, budget, 0)),
        returns=_check(data["returns"], budget, 0),
        # A reply names the state before the call "slots_before" (a bare "slots" was read by
        # small models as the state after it, as often as not); stored examples say "slots".
        slots=_slots(data.get("slots_before", data.get("slots")) or {}, '"slots_before"', budget),
        slots_after=_slots(data.get("slots_after") or {}, '"slots_after"', budget),
    )


def parse_examples(
    reply: str, arity: int | None = None, selector: str | None = None
) -> tuple[list[Example], list[str]]:
    """The examples in a model's reply and why each dropped one was dropped.

    Never raises: a reply that is not JSON gives no examples (the drafts are then chosen by
    agreement alone). Repeated inputs keep their first example. When every example's
    "returns" is an object whose one key is the method's name (``{"hms": "1:02:05"}``, a
    habit of small models), the values are read as the returns.
    """
    dropped: list[str] = []
    text = reply.strip()[:MAX_REPLY_CHARS]
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = strict_json(text, parse_int=bounded_int)
    except (ValueError, RecursionError, ExampleRejected) as exc:
        reason = f"the examples reply is not usable JSON: {str(exc)[:200]}"
        log.warning("examples dropped: %s", reason)
        return [], [reason]
    items = data.get("examples") if isinstance(data, dict) else data
    if not isinstance(items, list):
        log.warning("examples dropped: the reply has no list of examples")
        return [], ["the reply has no list of examples"]
    examples: list[Example] = []
    seen: set[str] = set()
    for number, item in enumerate(items, start=1):
        if len(examples) >= MAX_EXAMPLES:
            dropped.append(f"example {number}: more than {MAX_EXAMPLES} examples")
            continue
        try:
            example = example_from(item, arity)
        except (ExampleRejected, RecursionError) as exc:
            dropped.append(f"example {number}: {str(exc)[:200]}")
            continue
        key = json.dumps([example.args, example.slots], sort_keys=True)
        if key in seen:
            dropped.append(f"example {number}: the same input as an earlier one")
            continue
        seen.add(key)
        examples.append(example)
    for reason in dropped:
        log.warning("example dropped: %s", reason)
    return _unwrapped(examples, selector), dropped


def _unwrapped(found: list[Example], selector: str | None) -> list[Example]:
    # Only when all are wrapped: one method that really returns {name: value} for some inputs
    # and not others keeps its examples as written.
    if not found or selector is None:
        return found
    if not all(isinstance(e.returns, dict) and list(e.returns) == [selector] for e in found):
        return found
    return [dataclasses.replace(e, returns=e.returns[selector]) for e in found]


# -- outputs ---------------------------------------------------------------------------------


class _Budget(Exception):
    pass


def normal(value: Any, nodes: int = MAX_OUTPUT_NODES) -> Any:
    """``value`` as plain JSON data to compare outputs by, bounded by ``nodes`` values (a
    larger value becomes a digest of its bounded repr, so it still compares)."""
    budget = [nodes]
    try:
        return _normal(value, budget, 0)
    except (_Budget, RecursionError):
        from prototypes.bounded import bounded_repr

        text = bounded_repr(value, 20_000, nodes=nodes * 4)
        return {"large": hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()}


def _normal(value: Any, budget: list[int], depth: int) -> Any:
    budget[0] -= 1
    if budget[0] < 0 or depth > 50:
        raise _Budget
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if value.bit_length() <= 1024:
            return value
        return {"int": hashlib.sha256(format(value, "x").encode()).hexdigest()}
    if isinstance(value, float):
        if not math.isfinite(value):
            return {"float": repr(value)}
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, Mapping):
        return {
            (k if isinstance(k, str) else _key(_normal(k, budget, depth + 1))): _normal(
                v, budget, depth + 1
            )
            for k, v in list(value.items())
        }
    if isinstance(value, (set, frozenset)):
        members = [_normal(v, budget, depth + 1) for v in value]
        return sorted(members, key=_key)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [_normal(v, budget, depth + 1) for v in list(value)]
    return {"object": type(value).__name__}


def _key(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def signature(value: Any) -> str:
    """Text equal for equal normal forms (the key drafts are grouped by)."""
    return json.dumps(value, sort_keys=True, default=str)


def matches(expected: Any, observed: Any) -> bool:
    """Whether an observed output (normal form) is what an example expects; never raises, so
    an output that cannot be compared fails its example instead of stopping the mission."""
    if isinstance(expected, bool) or isinstance(observed, bool):
        return expected is observed
    if isinstance(expected, (int, float)) and isinstance(observed, (int, float)):
        return _numbers_match(expected, observed)
    if isinstance(expected, list) and isinstance(observed, list):
        return len(expected) == len(observed) and all(
            matches(e, o) for e, o in zip(expected, observed, strict=True)
        )
    if isinstance(expected, dict) and isinstance(observed, dict):
        expected = {_key(k): v for k, v in expected.items()}
        return expected.keys() == observed.keys() and all(
            matches(v, observed[k]) for k, v in expected.items()
        )
    return expected == observed


def _numbers_match(expected: float, observed: float) -> bool:
    try:
        if isinstance(expected, float):
            decimals = _decimals(expected)
            if decimals < ROUNDED_DECIMALS and round(observed, decimals) == expected:
                return True
        return math.isclose(expected, observed, rel_tol=1e-9, abs_tol=1e-9)
    except OverflowError:  # an integer past every float is close to no example's number
        return False


def _decimals(number: float) -> int:
    text = repr(number)
    if "e" in text or "." not in text:
        return ROUNDED_DECIMALS
    return len(text.split(".", 1)[1])


# -- observations and the choice -------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """What one draft did on one input: its result and slots (normal forms) or its error."""

    ok: bool
    result: Any = None
    slots: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def key(self) -> str:
        if not self.ok:
            return "error: " + self.error.split(":", 1)[0]
        return signature([self.result, self.slots])

    def shown(self) -> str:
        if not self.ok:
            return self.error
        return f"returned {signature(self.result)[:300]}"


def passes(example: Example, seen: Observation) -> bool:
    """Whether ``seen`` passes every check of the example (``checks_passed``)."""
    return checks_passed(example, seen) == 1 + len(example.slots_after)


def checks_passed(example: Example, seen: Observation) -> int:
    """How many of an example's checks ``seen`` passes: its result, and each slot it expects.

    Counted apart because an example is often half right: a model that miscounts what a
    call returns still says which slot the call must change, and a draft that never saves
    that slot should not win on its agreement with other drafts that forgot it too."""
    if not seen.ok:
        return 0
    return int(matches(normal(example.returns), seen.result)) + sum(
        name in seen.slots and matches(normal(value), seen.slots[name])
        for name, value in example.slots_after.items()
    )


def failure_text(selector: str, example: Example, seen: Observation) -> str:
    """A failed example as a finding the author model can act on."""
    wanted = f"return {json.dumps(example.returns)}"
    if example.slots_after:
        wanted += f" and leave slots {json.dumps(example.slots_after)}"
        got = seen.shown()
        if seen.ok:
            got += f" with slots {signature({k: seen.slots.get(k) for k in example.slots_after})}"
    else:
        got = seen.shown()
    return f"example {example.call_text(selector)} should {wanted}, but it {got}"


@dataclass
class Candidate:
    """A draft that passed the gate, and what it did on the call and on every example."""

    number: int
    source: str
    call: Observation
    observed: list[Observation]

    def key(self) -> str:
        return "|".join([self.call.key(), *(o.key() for o in self.observed)])

    def failures(self, examples: Sequence[Example]) -> list[int]:
        return [
            i
            for i, (e, o) in enumerate(zip(examples, self.observed, strict=True))
            if not passes(e, o)
        ]

    def checks_passed(self, examples: Sequence[Example]) -> int:
        """The examples' checks this draft passes: each example's result, and each slot it
        expects after the call, counted apart."""
        return sum(checks_passed(e, o) for e, o in zip(examples, self.observed, strict=True))


@dataclass(frozen=True)
class Choice:
    """The winning group: its first draft, how many drafts agree, and what it fails."""

    candidate: Candidate
    support: int
    passed: int
    failed: tuple[int, ...]
    score: int

    def summary(self, total: int) -> str:
        return (
            f"draft {self.candidate.number}: {self.support} draft(s) agree, "
            f"{self.passed}/{total} examples pass, score {self.score}"
        )


def choose(candidates: Sequence[Candidate], examples: Sequence[Example]) -> Choice | None:
    """The group with the best score = drafts agreeing × the examples' checks passed (each
    result and each expected slot, ``checks_passed``); ties go to more agreement, then to the
    earlier draft. None when there is no candidate."""
    groups: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        groups.setdefault(candidate.key(), []).append(candidate)
    best: tuple[tuple[int, int, int], Choice] | None = None
    for members in groups.values():
        first = members[0]
        failed = tuple(first.failures(examples))
        passed = len(examples) - len(failed)
        score = len(members) * first.checks_passed(examples)
        rank = (score, len(members), -first.number)
        if best is None or rank > best[0]:
            best = (rank, Choice(first, len(members), passed, failed, score))
    return None if best is None else best[1]
