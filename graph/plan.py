"""How deep the mind thinks about a request, and the plan it writes when it thinks hard.

``depth_for`` is the fast-path rule: a short request routed to one persona, with nothing in it
that asks for a plan, is answered in one model call. Otherwise the lead persona's model writes
a *plan*: facet sub-queries, each naming a facet (``PERSONA.facet_selector``) of a routed
persona. ``plan_schema`` is the JSON schema the model is held to by constrained decoding where
the backend has it; ``parse_plan`` checks a reply against the same rules (a backend without
constrained decoding can still return anything) and says what is wrong in words a model can
act on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prototypes.bounded import strict_json
from prototypes.codex import load_codex

#: Words that ask for more than a one-breath answer, whatever the request's length.
PLAN_CUES = re.compile(
    r"\b(step|steps|plan|compare|contrast|design|explain|analy[sz]e|list|pros|cons|"
    r"research|sources?|cite|audit|why and how|how and why|first|then|trade-?offs?)\b",
    re.IGNORECASE,
)
#: A list marker a small model puts before its sub-queries ("2. plan the rows").
_ENUMERATION = re.compile(r"^\s*(?:\d{1,2}[.):]|[-*•]|step \d{1,2}[.:]?)\s+", re.IGNORECASE)
#: Longest sub-query a plan may give a facet, in characters.
MAX_QUERY_CHARS = 400


@dataclass(frozen=True)
class Depth:
    """How a cycle proceeds: 'fast' (one model call) or 'full' (plan, facets, synthesis)."""

    mode: str
    rule: str

    def as_dict(self) -> dict[str, str]:
        return {"mode": self.mode, "rule": self.rule}


def words(text: str) -> int:
    return len(text.split())


def depth_for(request: str, chosen: Sequence[str], fast_words: int, forced: str | None) -> Depth:
    """The fast-path rule: one persona, at most ``fast_words`` words, no planning cue.

    ``forced`` ('fast' or 'full', from the caller) wins; a forced fast path with several
    personas routed is answered by the first alone.
    """
    if forced in ("fast", "full"):
        return Depth(forced, f"depth {forced!r} asked for by the caller")
    count = words(request)
    cue = PLAN_CUES.search(request)
    if len(chosen) != 1:
        return Depth("full", f"{len(chosen)} personas routed: their answers are woven")
    if count > fast_words:
        return Depth("full", f"{count} words > {fast_words}")
    if cue:
        return Depth("full", f"planning cue {cue.group(0)!r}")
    return Depth("fast", f"1 persona, {count} words <= {fast_words}, no planning cue")


def facets_of(personas: Sequence[str]) -> dict[str, str]:
    """``PERSONA.selector`` → intent for every facet the codex gives these personas."""
    codex = load_codex()
    return {
        f"{name}.{selector}": intent
        for name in personas
        for selector, intent in codex.persona(name).facets.items()
    }


def plan_schema(facets: Sequence[str], most: int) -> dict[str, Any]:
    """The JSON schema of a plan over ``facets`` with 1 to ``most`` steps.

    No length bounds on strings: llama.cpp expands each into a grammar rule per character;
    ``parse_plan`` bounds them instead.
    """
    return {
        "type": "object",
        "properties": {
            "steps": {
                "type": "array",
                "minItems": 1,
                "maxItems": most,
                "items": {
                    "type": "object",
                    "properties": {
                        "facet": {"type": "string", "enum": list(facets)},
                        "query": {"type": "string"},
                    },
                    "required": ["facet", "query"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["steps"],
        "additionalProperties": False,
    }


def _cut(query: str) -> str:
    """``query`` within ``MAX_QUERY_CHARS``, cut at the last word that fits.

    A small model writing under a grammar tends to spell its sub-queries out at length (the
    default model wrote 400+ characters for one step on a plain request); cutting them keeps a
    good plan, where rejecting it failed the whole cycle after two tries.
    """
    if len(query) <= MAX_QUERY_CHARS:
        return query
    head = query[: MAX_QUERY_CHARS + 1]
    space = head.rfind(" ")
    return (head[:space] if space > MAX_QUERY_CHARS // 2 else head[:MAX_QUERY_CHARS]).rstrip()


class PlanRejected(ValueError):
    """A plan reply that breaks the rules; the message is fed back to the model."""


#: Words that say nothing of what a request is about.
_STOP = frozenset(
    """a about above after again all also am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers him his how i if in into is it its itself just me
    more most my myself no nor not now of off on once only or other our ours out over own same
    she should so some such than that the their theirs them then there these they this those
    through to too under until up very was we were what when where which while who whom why
    will with would you your yours yourself please tell give want need know make get way ways
    thing things step steps first next part parts one two three best good help question
    answer""".split()
)
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
#: Two sub-queries sharing this share of their content words ask the same thing.
NEAR_DUPLICATE = 0.7


def content_words(text: str) -> set[str]:
    """The words of ``text`` that carry its subject, lower-cased and cut to five letters (so
    'gardens' and 'gardening' meet)."""
    return {w[:5] for w in (t.lower() for t in _TOKEN.findall(text)) if w not in _STOP}


def near_duplicate(a: str, b: str) -> bool:
    wa, wb = content_words(a), content_words(b)
    if not wa or not wb:  # nothing to weigh: the same words in the same order, or not
        return [t.lower() for t in _TOKEN.findall(a)] == [t.lower() for t in _TOKEN.findall(b)]
    return len(wa & wb) / len(wa | wb) >= NEAR_DUPLICATE


def off_request(query: str, request: str) -> bool:
    """Whether ``query`` shares no content word with ``request``: a generic question such as
    "What is the first step?" that could belong to any request."""
    return not content_words(query) & content_words(request)


@dataclass(frozen=True)
class PlanQuality:
    """How well a plan decomposes its request: steps that repeat an earlier one (same or
    nearly the same sub-query), and steps with no word of the request."""

    steps: int
    duplicates: int
    off_request: int

    def as_dict(self) -> dict[str, int]:
        return {"steps": self.steps, "duplicates": self.duplicates, "off_request": self.off_request}


def plan_quality(steps: Sequence[Mapping[str, str]], request: str) -> PlanQuality:
    queries = [str(s.get("query") or "") for s in steps]
    duplicates = sum(
        any(near_duplicate(q, earlier) for earlier in queries[:i]) for i, q in enumerate(queries)
    )
    generic = sum(off_request(q, request) for q in queries)
    return PlanQuality(len(queries), duplicates, generic)


def parse_plan(
    reply: str, facets: Mapping[str, str], most: int, request: str | None = None
) -> list[dict[str, str]]:
    """The plan's steps as ``{"persona", "facet", "query"}``; ``PlanRejected`` says why not.

    A step that repeats an earlier one (the same or nearly the same sub-query) is dropped. With
    ``request``, a step with no word of substance is dropped, and a plan none of whose steps
    shares a word with the request is rejected (a list of generic questions, not a
    decomposition).
    """
    text = reply.strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1).strip()
    try:
        # strict=False: the grammar lets a raw newline or tab into a string; it is harmless.
        data = strict_json(text, strict=False)
    except RecursionError:  # a server with no grammar can nest deeper than the parser recurses
        raise PlanRejected("the reply is not JSON (nested too deeply)") from None
    except ValueError as exc:  # a JSONDecodeError, NaN, or a number past its bounds
        reason = f"{exc.msg}, character {exc.pos}" if isinstance(exc, json.JSONDecodeError) else exc
        raise PlanRejected(f"the reply is not JSON ({reason})") from None
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list) or not steps:
        raise PlanRejected('the JSON needs a non-empty list under "steps"')
    if len(steps) > most:
        raise PlanRejected(f"the plan has {len(steps)} steps; at most {most} are allowed")
    plan: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for number, step in enumerate(steps, start=1):
        if not isinstance(step, dict):
            raise PlanRejected(f"step {number} is not an object with facet and query")
        facet, query = step.get("facet"), step.get("query")
        if not isinstance(facet, str) or facet not in facets:
            raise PlanRejected(
                f"step {number} names facet {facet!r}; choose one of {', '.join(facets)}"
            )
        if not isinstance(query, str) or not query.strip():
            raise PlanRejected(f"step {number} has no query text")
        query = _cut(_ENUMERATION.sub("", " ".join(query.split())))
        if not query:
            raise PlanRejected(f"step {number} has no query text")
        if (facet, query) in seen or any(near_duplicate(query, q) for _, q in seen):
            continue
        seen.add((facet, query))
        persona, selector = facet.split(".", 1)
        plan.append({"persona": persona, "facet": selector, "query": query})
    if request is not None:
        # A step with no word of substance ("What is the first step?") could belong to any
        # request: dropped. A specific step in other words ("prepare the soil") is a real
        # sub-task; a plan none of whose steps touches the request is a list of generic ones.
        plan = [step for step in plan if content_words(step["query"])]
        if not any(not off_request(step["query"], request) for step in plan):
            raise PlanRejected(
                "no step names anything from the request: each query must say which part of "
                "the request it is about, in the request's own words"
            )
    return plan
