"""The JIT graph: doesNotUnderstand as LangGraph steps (brief, draft, audit, trial, install…).

A chat model (the receiver's persona, or BRICK) drafts the missing method; ``prototypes.kernel``
gates each draft. A draft that fails audit, trial or invocation loops back to ``draft`` with
its findings until ``jit_attempts`` are used, then the graph ends in ``failed`` and the entry
point raises ``MissionFailed`` (the image is unchanged). Objects, the model and the mission
travel in the run's context (``JitContext``); the state holds only what Studio can show.

    enable()                      # obj.unknown(1, 2) now writes, installs and runs 'unknown'
    JitRunner(model=m).send(obj, "unknown", (1, 2), {})
    await JitRunner(model=m).asend(obj, "unknown", (1, 2), {})
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime

# Pydantic renders the schemas of typing_extensions' TypedDicts on Python 3.11 (for Studio).
from typing_extensions import TypedDict

from batos import settings
from batos.errors import BatosError, GraphRequestError
from graph import prompts as prompt_files
from prototypes import kernel
from prototypes.bounded import bounded_repr
from prototypes.codex import load_codex
from prototypes.kernel import AttemptRecord, Mission, MissionBrief
from prototypes.uvm import UvmObject

log = logging.getLogger("batos.jit")

#: Longest reply a draft may be, in tokens (a method is short; this bounds a rambling model).
DRAFT_MAX_TOKENS = 600
#: Sampling temperature of the second, third… draft with the default models.
RETRY_TEMPERATURES = (0.7, 0.9)

ModelFactory = Callable[[str], BaseChatModel]


@dataclass
class JitContext:
    """Run context: what cannot live in graph state (objects, the model, the mission)."""

    receiver: UvmObject | None = None
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    model: BaseChatModel | None = None
    model_factory: ModelFactory | None = None
    attempts: int = 3
    transaction: Any = None
    acceptance: Callable[[Any], bool] | None = None
    mission: Mission | None = None
    #: A served run's own connection: committed when the method works, else aborted.
    connection: Any = None


class JitRequest(TypedDict, total=False):
    """Run context a client sends (JSON): the receiver by dotted path, as 'batos inspect'
    names it (``brick``, ``robin.parent*``), and the message's arguments."""

    receiver: str
    args: list[Any]
    kwargs: dict[str, Any]


class JitState(TypedDict, total=False):
    selector: str
    brief: dict[str, Any]
    attempt: int
    source: str
    findings: list[str]
    history: list[dict[str, Any]]
    status: str
    result: str
    error: str


def prompts() -> dict[str, Any]:
    return prompt_files.load("jit")


def default_model_factory(persona: str, attempt: int = 0) -> BaseChatModel:
    """The persona's own model; a retry samples hotter, so it does not repeat the draft the
    findings were about (at the persona's low code temperature it often would)."""
    from graph.llm import chat_model

    if attempt == 0:
        return chat_model(persona, num_predict=DRAFT_MAX_TOKENS)
    return chat_model(
        persona,
        num_predict=DRAFT_MAX_TOKENS,
        temperature=RETRY_TEMPERATURES[min(attempt, len(RETRY_TEMPERATURES)) - 1],
    )


#: The key of the run context under which Python callers pass a live ``JitContext``.
LIVE = "live"
_REQUEST_HINT = (
    'send context {"receiver": "brick", "args": [[3, 5]], "kwargs": {}} (the receiver\'s '
    'dotted path, JSON arguments) and input {"selector": "estimate"}'
)


def _context() -> JitContext:
    context = get_runtime().context
    live = context.get(LIVE) if isinstance(context, dict) else None
    if not isinstance(live, JitContext) or live.receiver is None:
        raise GraphRequestError(
            "the JIT graph has no receiver in its run context", hint=_REQUEST_HINT
        )
    return live


def _served(context: Any, state: JitState) -> JitContext:
    """A client's request (``JitRequest``) as a live context on its own image connection."""
    import transaction

    from prototypes.paths import resolve
    from store.image import acquire_shared

    request = context if isinstance(context, dict) else {}
    path, args, kwargs = request.get("receiver"), request.get("args", []), request.get("kwargs", {})
    selector = state.get("selector")
    if not isinstance(selector, str) or not selector.isidentifier() or selector.startswith("_"):
        raise GraphRequestError(
            f"selector {bounded_repr(selector, 80)} is not a public name", hint=_REQUEST_HINT
        )
    if not isinstance(path, str) or not path.strip():
        raise GraphRequestError("the run context names no receiver", hint=_REQUEST_HINT)
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise GraphRequestError("args must be a JSON list and kwargs an object", hint=_REQUEST_HINT)
    image = acquire_shared(settings.get_str("image"))
    tm = transaction.TransactionManager()
    conn = image.db.open(transaction_manager=tm)
    try:
        receiver = resolve(conn.root(), path)
        if not isinstance(receiver, UvmObject):
            raise GraphRequestError(
                f"{bounded_repr(path, 80)} is a {type(receiver).__name__}, not a prototype object",
                hint="name an object as 'batos inspect' lists them",
            )
    except BaseException:
        tm.abort()
        conn.close()
        raise
    live = JitContext(
        receiver=receiver,
        args=tuple(args),
        kwargs=dict(kwargs),
        attempts=settings.get_int("jit_attempts"),
        transaction=tm.get(),
        connection=conn,
    )
    context[LIVE] = live  # the run's later nodes find it here
    return live


def _finish_served(context: JitContext, *, commit: bool) -> None:
    conn = context.connection
    if conn is None:
        return
    context.connection = None
    try:
        if commit:
            conn.transaction_manager.commit()
    finally:
        conn.transaction_manager.abort()
        conn.close()


def _mission() -> Mission:
    mission = _context().mission
    assert mission is not None, "the brief node runs first"
    return mission


# -- prompting -----------------------------------------------------------------------------


def _call_text(brief: MissionBrief) -> str:
    return ", ".join([*brief.args, *(f"{k}={v}" for k, v in brief.kwargs.items())])


def messages_for(brief: MissionBrief, attempts: list[AttemptRecord]) -> list[BaseMessage]:
    """The conversation a persona model sees for one draft: rules, examples, task, feedback."""
    p = prompts()
    identity = load_codex().persona(brief.author).identity
    system = identity + "\n\n" + p["system"].replace("SELECTOR", brief.selector)
    messages: list[BaseMessage] = [SystemMessage(system)]
    for example in p.get("examples", []):
        messages += [HumanMessage(example["task"]), AIMessage(example["answer"])]
    task = p["task"].format(
        receiver=brief.receiver,
        slots=brief.slots or "(none)",
        parents=", ".join(brief.parents) or "(none)",
        inherited=", ".join(brief.inherited) or "(none)",
        selector=brief.selector,
        call=_call_text(brief),
        intent=brief.intent or f"infer it from the name {brief.selector!r} and the arguments",
    )
    if attempts:
        last = attempts[-1]
        task += "\n\n" + p["feedback"].format(
            source=last.source, findings="\n".join(f"- {f}" for f in last.findings)
        )
    messages.append(HumanMessage(task))
    return messages


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(reply: str, selector: str) -> str:
    """The method source in a model reply: the fenced block that defines ``selector``, with
    whatever else the model put at its top level (example calls, prints, a ``__main__``
    block) left out; only imports and the method itself are kept."""
    blocks = _FENCE.findall(reply) or [reply]
    chosen = next((b for b in blocks if f"def {selector}(" in b), blocks[0])
    return _method_only(chosen.strip() + "\n", selector)


def _method_only(source: str, selector: str) -> str:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source  # the audit reports it, with its line
    keep = [
        node
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        or isinstance(node, ast.FunctionDef)
        and node.name == selector
    ]
    if not any(isinstance(node, ast.FunctionDef) for node in keep) or len(keep) == len(tree.body):
        return source
    lines = source.splitlines(keepends=True)
    first = [min([n.lineno, *(d.lineno for d in getattr(n, "decorator_list", []))]) for n in keep]
    return "".join(
        "".join(lines[start - 1 : node.end_lineno]) for start, node in zip(first, keep, strict=True)
    )


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "") if isinstance(part, dict) else str(part) for part in content
    )


def _model(context: JitContext, persona: str, attempt: int) -> BaseChatModel:
    if context.model is not None:
        return context.model
    if context.model_factory is not None:
        return context.model_factory(persona)
    return default_model_factory(persona, attempt)


# -- nodes ------------------------------------------------------------------------------------


def brief(state: JitState) -> JitState:
    runtime_context = get_runtime().context
    try:
        live = runtime_context.get(LIVE) if isinstance(runtime_context, dict) else None
        context = live if isinstance(live, JitContext) else _served(runtime_context, state)
    except BatosError as exc:
        # A malformed request ends the run at once with the reason in its state: the thread
        # stays usable, with no task left pending.
        return {"status": "failed", "error": str(exc), "history": []}
    context.mission = Mission(
        context.receiver,
        state["selector"],
        context.args,
        context.kwargs,
        transaction=context.transaction,
        acceptance=context.acceptance,
    )
    # "error" is cleared: the state is the thread's, and an earlier run may have failed.
    return {
        "brief": context.mission.brief().as_dict(),
        "attempt": 0,
        "status": "drafting",
        "error": "",
    }


def _after_draft(state: JitState, reply: BaseMessage) -> JitState:
    source = extract_code(_text(reply), state["selector"])
    return {"source": source, "attempt": state["attempt"] + 1, "findings": []}


def _served_failure(node: str, exc: Exception) -> JitState:
    """A served run's node failed: its reason (and hint) in the state, for ``fail`` to end on.

    An exception escaping the graph would reach the client as the server's "An internal error
    occurred" and leave the thread with the node pending; Python callers get the exception.
    """
    if not isinstance(exc, BatosError):
        log.exception("jit node %s failed", node)
        return {"error": f"{node} failed: {type(exc).__name__}: {exc}\n  hint: see the server log"}
    return {"error": f"{node} failed: {exc}"}


def draft(state: JitState) -> JitState:
    mission = _mission()
    messages = messages_for(mission.brief(), mission.attempts)
    context = _context()
    try:
        return _after_draft(
            state, _model(context, mission.author, state["attempt"]).invoke(messages)
        )
    except Exception as exc:
        if context.connection is None:
            raise
        return _served_failure("draft", exc)


async def adraft(state: JitState) -> JitState:
    mission = _mission()
    messages = messages_for(mission.brief(), mission.attempts)
    context = _context()
    try:
        model = _model(context, mission.author, state["attempt"])
        return _after_draft(state, await model.ainvoke(messages))
    except Exception as exc:
        if context.connection is None:
            raise
        return _served_failure("draft", exc)


def audit(state: JitState) -> JitState:
    return {"findings": _mission().audit(state["source"])}


def trial(state: JitState) -> JitState:
    return {"findings": _mission().trial(state["source"])}


def install(state: JitState) -> JitState:
    _mission().install(state["source"])
    return {}


def invoke(state: JitState) -> JitState:
    mission = _mission()
    findings = mission.invoke()
    if findings:
        return {"findings": findings}
    _finish_served(_context(), commit=True)
    return {
        "status": "installed",
        "result": kernel._short(mission.result),
        "history": [r.as_dict() for r in mission.attempts],
    }


def fail(state: JitState) -> JitState:
    context, mission = _context(), _mission()
    served = context.connection is not None
    _finish_served(context, commit=False)
    update: JitState = {"status": "failed", "history": [r.as_dict() for r in mission.attempts]}
    if served and not state.get("error"):  # every draft was rejected: say why, with the hint
        update["error"] = str(mission.failure())
    return update


def _route(on_success: str) -> Callable[[JitState], str]:
    def route(state: JitState) -> str:
        if state.get("error"):
            return "fail"
        if not state.get("findings"):
            return on_success
        return "draft" if state["attempt"] < _context().attempts else "fail"

    route.__name__ = f"route_to_{on_success}"
    return route


def build_graph() -> Any:
    builder = StateGraph(JitState, context_schema=JitRequest)
    builder.add_node("brief", brief)
    builder.add_node("draft", RunnableLambda(draft, afunc=adraft, name="draft"))
    builder.add_node("audit", audit)
    builder.add_node("trial", trial)
    builder.add_node("install", install)
    builder.add_node("invoke", invoke)
    builder.add_node("fail", fail)
    builder.add_edge(START, "brief")
    builder.add_conditional_edges(
        "brief", lambda state: END if state.get("status") == "failed" else "draft", ["draft", END]
    )
    builder.add_conditional_edges(
        "draft", lambda state: "fail" if state.get("error") else "audit", ["audit", "fail"]
    )
    builder.add_conditional_edges("audit", _route("trial"), ["trial", "draft", "fail"])
    builder.add_conditional_edges("trial", _route("install"), ["install", "draft", "fail"])
    builder.add_edge("install", "invoke")
    builder.add_conditional_edges("invoke", _route(END), [END, "draft", "fail"])
    builder.add_edge("fail", END)
    return builder.compile(name="jit")


graph = build_graph()


# -- entry points -------------------------------------------------------------------------------


class JitRunner:
    """Runs doesNotUnderstand missions through the graph (a ``kernel.MissionRunner``)."""

    def __init__(
        self,
        model: BaseChatModel | None = None,
        *,
        model_factory: ModelFactory | None = None,
        attempts: int | None = None,
        acceptance: Callable[[Any], bool] | None = None,
    ) -> None:
        self.model = model
        self.model_factory = model_factory
        self.attempts = attempts
        self.acceptance = acceptance

    def _start(
        self, receiver: UvmObject, selector: str, args: tuple, kwargs: dict
    ) -> tuple[JitState, dict[str, JitContext], dict[str, Any]]:
        attempts = self.attempts or settings.get_int("jit_attempts")
        context = JitContext(
            receiver=receiver,
            args=tuple(args),
            kwargs=dict(kwargs),
            model=self.model,
            model_factory=self.model_factory,
            attempts=attempts,
            acceptance=self.acceptance,
            # Captured here, in the caller's thread: nodes may run in worker threads.
            transaction=kernel.current_transaction(receiver),
        )
        config = {"recursion_limit": 6 * attempts + 10, "run_name": f"jit:{selector}"}
        return {"selector": selector}, {LIVE: context}, config

    @staticmethod
    def _finish(state: dict[str, Any], context: dict[str, JitContext]) -> Any:
        mission = context[LIVE].mission
        assert mission is not None
        if state.get("status") != "installed":
            raise mission.failure()
        return mission.result

    def send(
        self, receiver: UvmObject, selector: str, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """Write, install and run ``selector`` for ``receiver``; its result."""
        state, context, config = self._start(receiver, selector, args, kwargs or {})
        return self._finish(graph.invoke(state, config=config, context=context), context)

    async def asend(
        self, receiver: UvmObject, selector: str, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        state, context, config = self._start(receiver, selector, args, kwargs or {})
        return self._finish(await graph.ainvoke(state, config=config, context=context), context)


def enable(
    model: BaseChatModel | None = None,
    *,
    model_factory: ModelFactory | None = None,
    attempts: int | None = None,
) -> JitRunner:
    """Turn doesNotUnderstand on for every UvmObject in this process; returns the runner."""
    runner = JitRunner(model, model_factory=model_factory, attempts=attempts)
    kernel.install_handler(runner)
    return runner


def disable() -> None:
    """Unknown messages raise ``DoesNotUnderstand`` again."""
    kernel.install_handler(None)
