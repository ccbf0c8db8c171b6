"""Facets: small generated methods through which a persona takes on one sub-query.

A facet is a method of a persona prototype (``facet_*``), declared by an intent in the codex and
written by the JIT's mission (``writer``) ahead of use — ``batos init --prepare`` or the heartbeat's
``facets`` job (``graph.facet_writing``), never on the user's clock unless asked. It runs in the
sandbox like every generated method and turns the sub-query into an *instruction* for the
persona's model, with sampling options; the mind's DELEGATING node then uses it, so every model
call happens in a graph node while facets stay small, audited, persisted code.

A facet degrades, it does not fail: one whose method is missing, cannot be written, raises or
returns something unusable hands its sub-query to the persona directly (``fallback``), and the
reason travels with the partial answer.

Nothing here commits. A facet method is written and tried on a connection whose transaction
is always aborted: the approved source comes back as data (``WrittenMethod``), installed by the
caller through ``prototypes.install`` (the cycle at COMPLETE, in the checkpoint's transaction;
the writer in its own).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage

from batos.errors import GeneratedCodeError, MindError, MissionFailed, ToolError
from graph import jit
from prototypes import install, kernel, sandbox, tools
from prototypes.codex import FACET_PREFIX, INTENTS_SLOT
from prototypes.incarnation import personas
from prototypes.uvm import Method, UvmObject
from store.core import layout

#: Longest instruction a facet may return, in characters.
MAX_INSTRUCTION_CHARS = 2000
#: Bounds of the sampling options a facet may ask for.
TEMPERATURE_RANGE = (0.0, 1.5)
NUM_PREDICT_RANGE = (16, 1024)

#: ``call(model, messages)`` → the reply's text: how the mind makes (and measures) a draft's call.
ModelCall = Callable[[BaseChatModel, list[BaseMessage]], str]


class FacetError(MindError):
    """A facet could not turn its sub-query into an instruction; ``findings`` say why."""

    def __init__(self, message: str, findings: list[str] | None = None, *, hint: str = ""):
        self.findings = list(findings or [])
        listed = "".join(f"\n  - {f}" for f in self.findings)
        super().__init__(message + listed, hint=hint or None)


@dataclass(frozen=True)
class Instruction:
    """What a facet returned: the model's instruction and sampling options, bounded."""

    text: str
    options: dict[str, Any] = field(default_factory=dict)
    #: A tool call the facet asked the host to make; its answer joins the instruction.
    tool: tools.ToolCall | None = None


def instruction_from(result: Any) -> Instruction:
    """A facet's result as an ``Instruction``; ``ValueError`` saying what is wrong.

    Accepted: a non-empty string, or a dict with 'instruction' and optionally 'temperature'
    and 'num_predict' within bounds, and 'tool': a call of a tool proxy the host makes for
    the facet (``{"name": "weather", "selector": "today", "args": ["Oslo"]}``). Nothing else
    crosses from generated code to the model: a dict's other keys are never read.
    """
    if isinstance(result, str):
        result = {"instruction": result}
    if not isinstance(result, Mapping):
        raise ValueError(
            f"a facet must return a dict with 'instruction', not a {type(result).__name__}"
        )
    # Other keys ('intent', 'details': drafts add them) are dropped unread: only these four
    # cross from generated code to the model.
    text = result.get("instruction")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a facet's 'instruction' must be a non-empty string")
    if len(text) > MAX_INSTRUCTION_CHARS:
        raise ValueError(f"a facet's instruction is over {MAX_INSTRUCTION_CHARS} characters")
    options: dict[str, Any] = {}
    temperature = result.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise ValueError("'temperature' must be a number")
        low, high = TEMPERATURE_RANGE
        if not (math.isfinite(temperature) and low <= temperature <= high):
            raise ValueError(f"'temperature' must be between {low} and {high}")
        options["temperature"] = float(temperature)
    num_predict = result.get("num_predict")
    if num_predict is not None:
        low, high = NUM_PREDICT_RANGE
        if isinstance(num_predict, bool) or not isinstance(num_predict, int):
            raise ValueError("'num_predict' must be an integer")
        if not low <= num_predict <= high:
            raise ValueError(f"'num_predict' must be between {low} and {high}")
        options["num_predict"] = num_predict
    tool = tools.read_call(result["tool"]) if result.get("tool") is not None else None
    return Instruction(text.strip(), options, tool)


@dataclass(frozen=True)
class WrittenMethod:
    """A facet method approved during a cycle, as the effect that installs it at COMPLETE."""

    persona: str
    selector: str
    source: str
    intent: str
    author: str
    audit: dict[str, Any]
    attempts: int

    def effect(self) -> dict[str, Any]:
        return {
            "kind": "install_method",
            "persona": self.persona,
            "selector": self.selector,
            "source": self.source,
            "intent": self.intent,
            "author": self.author,
            "audit": self.audit,
            "attempts": self.attempts,
        }


@dataclass
class _Writing:
    """One cycle's writing of one facet: what came of it, and whether a branch has taken the
    effect that installs it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    made: WrittenMethod | FacetError | None = None
    claimed: bool = False


class FacetWriters:
    """Facet methods written by each running cycle, so parallel branches write each once.

    The first branch that needs a missing facet writes it while the others wait; they then use
    its method, or — when it could not be written — fall back at once with its reason rather
    than each trying again on the user's clock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str, str], _Writing] = {}

    def slot(self, cycle_id: str, persona: str, selector: str) -> _Writing:
        with self._lock:
            return self._entries.setdefault((cycle_id, persona, selector), _Writing())

    def forget(self, cycle_id: str) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == cycle_id]:
                del self._entries[key]


@dataclass(frozen=True)
class Prepared:
    """A facet's instruction; the method written for it in this cycle (if one was); and, when
    the facet's own method could not serve, why (the instruction is then the fallback)."""

    instruction: Instruction
    written: WrittenMethod | None = None
    degraded: str = ""


#: What a facet method is tried on before it is installed: two unrelated questions, so that a
#: method must use its argument, and no user's request is ever shown to the author (a method
#: written from one embedded it).
SAMPLE_QUERIES = (
    "how do I keep a small vegetable patch watered through a dry summer?",
    "what should I check before I buy a second-hand bicycle?",
)
NOT_WRITTEN = "its method is not written yet"


def fallback(query: str) -> Instruction:
    """The persona takes the sub-query directly: what a facet degrades to."""
    from graph.answer import prompts

    return Instruction(prompts()["facet_fallback"] + query)


def facet_key(persona: str, selector: str) -> str:
    return f"{persona}.{selector}"


def _receiver(root: Any, persona: str, selector: str) -> UvmObject:
    receiver = personas(root).get(persona)
    if receiver is None:
        raise FacetError(f"the image has no persona {persona}", hint="run 'batos init'")
    intents = receiver._slots().get(INTENTS_SLOT) or {}
    if not selector.startswith(FACET_PREFIX) or selector not in intents:
        raise FacetError(
            f"{persona} has no facet {selector!r}",
            hint=f"facets of {persona}: "
            + ", ".join(s for s in intents if s.startswith(FACET_PREFIX)),
        )
    return receiver


def prepare(
    root: Any,
    persona: str,
    selector: str,
    query: str,
    *,
    models: Callable[..., BaseChatModel],
    attempts: int,
    cycle_id: str,
    writers: FacetWriters,
    write: bool = False,
    call: ModelCall | None = None,
) -> Prepared:
    """Facet ``selector`` of ``persona`` on ``query``, run in the sandbox. A facet whose method
    is missing is written here only when ``write`` (otherwise it waits for ``batos init
    --prepare`` or the heartbeat); one that is missing, cannot be written or fails degrades to
    ``fallback``. ``models(persona, **options)`` writes it, through ``call`` when given (see
    ``write_facet``). ``root`` is from a connection the caller aborts."""
    receiver = _receiver(root, persona, selector)
    found = receiver._lookup(selector)
    if found is not None and isinstance(found[1], Method):
        return _run_or_fall_back(found[1], receiver, query, persona, selector)
    if not write:
        return Prepared(fallback(query), None, NOT_WRITTEN)
    writing = writers.slot(cycle_id, persona, selector)
    with writing.lock:
        if writing.made is None:
            try:
                writing.made = write_facet(root, persona, selector, models, attempts, call)
            except FacetError as exc:
                writing.made = exc
            except Exception as exc:  # its model failed: no other branch tries again
                writing.made = FacetError(
                    f"the method for facet {persona}.{selector} could not be written: "
                    f"{type(exc).__name__}: {exc}"
                )
        if isinstance(writing.made, FacetError):
            return Prepared(fallback(query), None, writing.made.message)
        try:
            method = _install_here(receiver, writing.made)
        except GeneratedCodeError as exc:  # refused by the install step's gate: degrade
            return Prepared(fallback(query), None, exc.message)
        prepared = _run_or_fall_back(method, receiver, query, persona, selector)
        # The first branch to use it carries the effect that installs it at COMPLETE.
        effect, writing.claimed = (None if writing.claimed else writing.made), True
        return Prepared(prepared.instruction, effect, prepared.degraded)


def _run_or_fall_back(
    method: Method, receiver: UvmObject, query: str, persona: str, selector: str
) -> Prepared:
    try:
        return Prepared(_call(method, receiver, query, persona, selector))
    except FacetError as exc:
        return Prepared(fallback(query), None, exc.message)


def writer(
    models: Callable[..., BaseChatModel],
    attempts: int,
    call: ModelCall | None = None,
    intent: str = "",
) -> jit.JitRunner:
    """The JIT's mission as facets use it: ``models(persona, **options)`` (the author model,
    or a test double) writes one draft a round, each retry told the last one's findings, for
    at most ``attempts`` rounds; no examples are asked for (the trial on ``SAMPLE_QUERIES``
    judges a facet), and the method passing the gate is installed without a trust threshold
    or a question to the user — it is written ahead of use, with nobody to ask."""
    return jit.JitRunner(
        model_factory=models,
        attempts=attempts,
        drafts=1,
        examples=False,
        trust=None,
        ask=None,
        acceptance=_carries(SAMPLE_QUERIES[0], intent),
        call=call,
    )


def write_facet(
    root: Any,
    persona: str,
    selector: str,
    models: Callable[..., BaseChatModel],
    attempts: int,
    call: ModelCall | None = None,
) -> WrittenMethod:
    """Write facet ``selector`` of ``persona`` (``writer``) and try it on ``SAMPLE_QUERIES``
    (an approved method must return an instruction that carries each); the method is
    installed on ``root``'s connection only, which the caller aborts: the approved source
    comes back as data. ``FacetError`` with the findings when no draft passes."""
    receiver = _receiver(root, persona, selector)
    intent = str((receiver._slots().get(INTENTS_SLOT) or {}).get(selector) or "")
    try:
        writer(models, attempts, call, intent).send(receiver, selector, (SAMPLE_QUERIES[0],))
    except MissionFailed as exc:
        raise FacetError(
            f"the method for facet {persona}.{selector} could not be written",
            exc.findings,
            hint="give the facet a clearer intent in prototypes/codex.toml, or add the "
            f"method by hand: 'batos methods add {persona.lower()} {selector} FILE'",
        ) from exc
    method = receiver._slots()[selector]
    for sample in SAMPLE_QUERIES[1:]:
        result = _call(method, receiver, sample, persona, selector)
        wrong = _as_stated(result, sample, intent)
        if wrong:
            raise FacetError(
                f"the method for facet {persona}.{selector} does not do what its intent says",
                [f"called with {sample!r} it returned {result.text[:200]!r}: {wrong}"],
            )
    return WrittenMethod(
        persona=persona,
        selector=selector,
        source=method.source,
        intent=method.intent,
        author=method.author,
        audit=_plain(method.audit),
        attempts=int(method.audit.get("attempt") or 1),
    )


#: A facet intent of the codex's form states the whole of what its method returns: "…
#: {'instruction': '<text>' + question, 'temperature': <t>} …" (and, before codex version 4,
#: "… 'instruction' is the text '<text>' followed by the question; 'temperature' is <t>.").
_STATED_TEXT = re.compile(
    r"'instruction': '(?P<text>.+)' \+ question"
    r"|'instruction' is the text '(?P<old>.+)' followed by the question"
)
_STATED_TEMPERATURE = re.compile(r"'temperature'(?::| is) (?P<t>[0-9]+(?:\.[0-9]+)?)")


def stated(intent: str) -> tuple[str | None, float | None]:
    """The instruction text and temperature an intent of the codex's form states (None for
    what it does not state)."""
    text = _STATED_TEXT.search(intent)
    temperature = _STATED_TEMPERATURE.search(intent)
    return (
        (text["text"] or text["old"]) if text else None,
        float(temperature["t"]) if temperature else None,
    )


def _as_stated(result: Instruction, query: str, intent: str) -> str:
    """Why ``result`` is not what ``intent`` states for ``query`` ("" when it is).

    The question must be in the instruction word for word. An intent of the codex's form
    states the instruction's exact text and temperature, so a draft that reads a placeholder
    into that text ("citing [n]" written as "citing 13") or drops its question is caught
    here, by the intent's own words, before it is installed."""
    if query not in result.text:
        return (
            "the instruction must contain the question the method was called with, "
            "word for word (the intent's text, then the question argument)"
        )
    text, temperature = stated(intent)
    if text is not None:
        wanted = " ".join(f"{text}{query}".split())
        if " ".join(result.text.split()) != wanted:
            return (
                f"the instruction must be exactly {wanted!r}: the intent's text, then the question"
            )
    if temperature is not None and result.options.get("temperature") != temperature:
        return f"'temperature' must be {temperature}, as the intent says"
    return ""


def _carries(query: str, intent: str = "") -> Callable[[Any], bool | str]:
    def accept(result: Any) -> bool | str:
        try:
            instruction = instruction_from(result)
        except ValueError as exc:
            return str(exc)
        return _as_stated(instruction, query, intent) or True

    return accept


def _install_here(receiver: UvmObject, written: WrittenMethod) -> Method:
    return install.install_method(
        receiver,
        written.selector,
        written.source,
        intent=written.intent,
        author=written.author,
        audit=written.audit,
    )


#: Characters of a tool's answer added to a facet's instruction.
MAX_TOOL_ANSWER_CHARS = 2000


def _with_tool_answer(instruction: Instruction, receiver: UvmObject, where: str) -> Instruction:
    """The instruction with the answer of the tool call it names, made by the host now; a
    ``FacetError`` (the facet then degrades) when the call cannot be made."""
    spec = instruction.tool
    if spec is None:
        return instruction
    jar = receiver._p_jar
    toolbox = layout.objects(jar.root()).get(tools.TOOLBOX) if jar is not None else None
    if toolbox is None:
        raise FacetError(f"facet {where} names a tool, but the image has no tools object")
    try:
        answer = tools.call(toolbox, spec)
    except (ToolError, GeneratedCodeError) as exc:
        raise FacetError(f"facet {where}'s tool call {spec.text()} failed", [exc.message]) from exc
    except LookupError as exc:
        raise FacetError(f"facet {where}'s tool call {spec.text()} failed", [str(exc)]) from exc
    shown = kernel.json_text(answer, MAX_TOOL_ANSWER_CHARS)
    text = f"{instruction.text}\n\nThe tool {spec.text()} answered: {shown}"
    return Instruction(text, instruction.options, spec)


def _call(method: Method, receiver: UvmObject, query: str, persona: str, selector: str) -> Any:
    try:
        result = method.bind(receiver)(query)
    except GeneratedCodeError as exc:
        raise FacetError(
            f"facet {persona}.{selector} failed", exc.findings or [exc.reason]
        ) from exc
    except Exception as exc:
        raise FacetError(
            f"facet {persona}.{selector} failed", [sandbox.describe_exception(exc)]
        ) from exc
    try:
        instruction = instruction_from(result)
    except ValueError as exc:
        raise FacetError(
            f"facet {persona}.{selector} returned something the mind cannot use", [str(exc)]
        ) from exc
    return _with_tool_answer(instruction, receiver, f"{persona}.{selector}")


def _plain(value: Any) -> Any:
    """A method's audit record as JSON-able data (it holds only plain values)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)
