"""The JIT graph: doesNotUnderstand as LangGraph steps (brief, examples, draft, check, choose…).

A chat model (the receiver's persona, or BRICK) first writes input → output examples from the
intent (structured output held to ``prototypes.examples.schema``), then ``jit_drafts``
independent drafts of the missing method (sampled with different seeds). ``prototypes.kernel``
gates each draft (audit, isolated trial on the call's arguments) and runs it on the examples;
``choose`` picks by agreement × examples passed; when no two drafts agree and the best fails its
examples it asks for one more batch of independent drafts; a best draft still failing them goes
back with the failures once; the winner is installed and then runs for real. Rounds (the first
drafts, that second batch, then one repair each) are bounded by ``jit_attempts``; out of them
with no working draft, the graph ends in ``failed`` and the entry point raises
``MissionFailed`` (the image is unchanged).
Objects, the model and the mission travel in the run's context (``JitContext``); the state
holds only what Studio can show.

This is the one pipeline that writes methods: facets (``graph.facets.writer``) and
self-improvement missions (``graph.missions``) run it too, differing only in its parameters —
who writes, whether examples are asked for, the trust threshold, whether the user may be asked.
The winner is installed through ``prototypes.install``, as every method is.

    enable()                      # obj.unknown(1, 2) now writes, installs and runs 'unknown'
    JitRunner(model=m).send(obj, "unknown", (1, 2), {})
    await JitRunner(model=m).asend(obj, "unknown", (1, 2), {})
"""

from __future__ import annotations

import ast
import asyncio
import json
import keyword
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableLambda
from langgraph.errors import GraphInterrupt
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import get_runtime
from langgraph.types import interrupt

# Pydantic renders the schemas of typing_extensions' TypedDicts on Python 3.11 (for Studio).
from typing_extensions import TypedDict

from batos import settings
from batos.errors import BatosError, GraphRequestError, ModelError
from graph import prompts as prompt_files
from prototypes import examples as examples_module
from prototypes import guardian, kernel, tools, trust
from prototypes.bounded import bounded_repr, strict_json
from prototypes.codex import load_codex
from prototypes.examples import schema as examples_schema
from prototypes.kernel import AttemptRecord, Mission, MissionBrief
from prototypes.uvm import Method, UvmObject

log = logging.getLogger("batos.jit")

#: Longest reply a draft may be, in tokens (a method is short; this bounds a rambling model).
DRAFT_MAX_TOKENS = 600
#: Longest examples reply, in tokens.
EXAMPLES_MAX_TOKENS = 700
#: Sampling temperature of every draft after the first of a round, and of repairs: warm
#: enough that independent drafts differ (at a persona's low code temperature they repeat),
#: no hotter. bench/jit_ceiling.py on unseen10 and unseen11, four drafts per intent: a draft
#: at 0.4 was right 0.45 and 0.44 of the time, at 0.8 0.35 and 0.28, with as many intents
#: (0.61 and 0.60 against 0.61 and 0.48) having a right one among three. Kept after the
#: fresh set unseen12: 0.68 installed right against 0.64 at 0.8 (one intent; no worse).
SAMPLE_TEMPERATURE = 0.4
#: Repetition penalty of those drafts: none. Code repeats names and the call's own values on
#: purpose; the same measurement found the Modelfile's 1.1 neither helped nor hurt at 0.8.
SAMPLE_REPEAT_PENALTY = 1.0
#: Temperature of the examples: expected outputs should be worked out, not sampled.
EXAMPLES_TEMPERATURE = 0.1

#: ``factory(persona, **options)`` → chat model; options as ``batos.models.chat_model`` takes.
ModelFactory = Callable[..., BaseChatModel]


@dataclass
class JitContext:
    """Run context: what cannot live in graph state (objects, the model, the mission)."""

    receiver: UvmObject | None = None
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    model: BaseChatModel | None = None
    model_factory: ModelFactory | None = None
    attempts: int = 3
    drafts: int = 1
    examples: bool = True
    transaction: Any = None
    acceptance: Callable[[Any], bool | str] | None = None
    mission: Mission | None = None
    #: A served run's own connection: committed when the method works, else aborted.
    connection: Any = None
    #: The trust score a chosen method must reach to be installed (None: install it).
    trust: float | None = None
    #: Whether to read the chosen draft back with the reviewer even with no threshold
    #: (its verdict is then kept in the method's audit, as the bench needs).
    review: bool = False
    reviewer: Any = None
    #: How a mission whose method is not trusted asks the user for one example: a callable
    #: (question → answer, as ``batos send`` prompts), "interrupt" (LangGraph's interrupt():
    #: Studio and the Python API with a checkpointer), or None: it refuses.
    ask: Callable[[dict[str, Any]], Any] | str | None = None
    #: How a draft's model call is made when the caller measures its calls (the mind streams
    #: them and counts their tokens): ``call(model, messages)`` → the reply's text.
    call: Callable[[BaseChatModel, list[BaseMessage]], str] | None = None
    #: The thread of a served run resumed after its question (its question is then spent).
    resumed_thread: str = ""
    #: The image a served run holds (``acquire_shared``) until it ends (``_finish_served``).
    shared_image: str = ""


class JitRequest(TypedDict, total=False):
    """Run context a client sends (JSON): the receiver by dotted path, as 'batos inspect'
    names it (``brick``, ``robin.parent*``), and the message's arguments."""

    receiver: str
    args: list[Any]
    kwargs: dict[str, Any]


class JitInput(TypedDict):
    """What a client sends as the run's input (Studio's form): the message's selector."""

    selector: str


class JitState(TypedDict, total=False):
    selector: str
    #: A served run's request (receiver path, args, kwargs): what a resumed run rebuilds from.
    request: dict[str, Any]
    #: Every draft so far (a resumed run gates them again rather than asking the model).
    drafted: list[str]
    #: The question put to the user when the method could not be trusted, and the answer.
    question: dict[str, Any]
    answer: Any
    brief: dict[str, Any]
    attempt: int
    sources: list[str]
    examples: list[dict[str, Any]]
    decision: str
    chosen: int
    findings: list[str]
    history: list[dict[str, Any]]
    status: str
    result: str
    error: str


def prompts() -> dict[str, Any]:
    return prompt_files.load("jit")


def default_model_factory(persona: str, **options: Any) -> BaseChatModel:
    """The model that writes the persona's methods (``batos.models.author_model``): the
    ``author_model`` setting's, else the persona's own."""
    from batos.models import author_model

    return author_model(persona, **options)


#: The key of the run context under which Python callers pass a live ``JitContext``.
LIVE = "live"
_REQUEST_HINT = (
    'send context {"receiver": "brick", "args": [[3, 5]], "kwargs": {}} (the receiver\'s '
    'dotted path, JSON arguments) and input {"selector": "estimate"}'
)


#: Live contexts of served runs resumed after a question, by thread: a resuming request
#: carries no receiver, and its run context may not be a dict the nodes can write to.
_RESUMED: dict[str, JitContext] = {}
#: The questions this process asked and is waiting on, by thread: a digest of what the run
#: stood on when it asked (request, selector, drafts, examples). A resumed run rebuilds its
#: mission from the thread's state, which a server's client can write (``update_state``):
#: rebuilt from anything else — its own code as a draft, with an example it passes — it
#: would install the client's method as the model's, trusted. Bounded: the oldest question
#: is forgotten first, and its answer then asks for the request again.
_ASKED: dict[str, str] = {}
MAX_ASKED = 256


def _asked_digest(state: JitState) -> str:
    import hashlib

    held = [state.get(k) for k in ("request", "selector", "drafted", "examples")]
    text = json.dumps(held, sort_keys=True, default=repr, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _remember_question(state: JitState) -> None:
    thread = _thread()
    _ASKED.pop(thread, None)
    _ASKED[thread] = _asked_digest(state)
    while len(_ASKED) > MAX_ASKED:
        del _ASKED[next(iter(_ASKED))]


def _thread() -> str:
    from langgraph.config import get_config

    return str(get_config().get("configurable", {}).get("thread_id", ""))


def _context() -> JitContext:
    context = get_runtime().context
    live = context.get(LIVE) if isinstance(context, dict) else None
    if not isinstance(live, JitContext) and not isinstance(context, dict):
        # A run context the nodes cannot write to: the thread's resumed run (a dict one
        # holds its own, so no other run's — one stopped before it ended — is taken for it).
        live = _RESUMED.get(_thread())
    if not isinstance(live, JitContext) or live.receiver is None:
        raise GraphRequestError(
            "the JIT graph has no receiver in its run context", hint=_REQUEST_HINT
        )
    return live


def _served(context: Any, state: JitState) -> JitContext:
    """A client's request (``JitRequest``) as a live context on its own image connection."""
    import transaction

    from prototypes.paths import resolve
    from store.core.image import acquire_shared, release_shared

    request = context if isinstance(context, dict) else {}
    path, args, kwargs = request.get("receiver"), request.get("args", []), request.get("kwargs", {})
    selector = state.get("selector")
    if not isinstance(selector, str) or not selector.isidentifier() or selector.startswith("_"):
        raise GraphRequestError(
            f"selector {bounded_repr(selector, 80)} is not a public name", hint=_REQUEST_HINT
        )
    if keyword.iskeyword(selector):
        raise GraphRequestError(
            f"selector {selector!r} is a Python keyword, which no method can be named",
            hint=_REQUEST_HINT,
        )
    if not isinstance(path, str) or not path.strip():
        raise GraphRequestError("the run context names no receiver", hint=_REQUEST_HINT)
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise GraphRequestError("args must be a JSON list and kwargs an object", hint=_REQUEST_HINT)
    uri = settings.get_str("image")
    image = acquire_shared(uri)
    tm = transaction.TransactionManager()
    conn = image.db.open(transaction_manager=tm)
    try:
        receiver = resolve(conn.root(), path)
        if not isinstance(receiver, UvmObject):
            raise GraphRequestError(
                f"{bounded_repr(path, 80)} is a {type(receiver).__name__}, not a prototype object",
                hint="name an object as 'batos inspect' lists them",
            )
        found = receiver._lookup(selector)
        if found is not None and not isinstance(found[1], Method):
            raise GraphRequestError(
                f"{selector!r} is a data slot of {bounded_repr(path, 80)}, not a method",
                hint="read it with 'batos inspect', or send another selector",
            )
    except BaseException:
        tm.abort()
        conn.close()
        release_shared(uri)
        raise
    live = JitContext(
        receiver=receiver,
        args=tuple(args),
        kwargs=dict(kwargs),
        attempts=settings.get_int("jit_attempts"),
        drafts=settings.get_int("jit_drafts"),
        transaction=tm.get(),
        connection=conn,
        shared_image=uri,
        trust=trust.threshold(),
        ask="interrupt",
    )
    context[LIVE] = live  # the run's later nodes find it here
    return live


def _finish_served(context: JitContext, *, commit: bool) -> None:
    conn = context.connection
    if conn is None:
        return
    if commit and context.mission is not None:
        # Named in the image's history as every other change is, so it can be found to undo.
        from store.core.image import actor
        from store.core.transactions import note_text

        txn = conn.transaction_manager.get()
        txn.user = actor()
        txn.note(note_text(f"jit: {_receiver_name(context)}.{context.mission.selector} installed"))
    context.connection = None
    for thread, resumed in list(_RESUMED.items()):
        if resumed is context:
            del _RESUMED[thread]
    if context.resumed_thread:
        _ASKED.pop(context.resumed_thread, None)
    try:
        if commit:
            conn.transaction_manager.commit()
    finally:
        conn.transaction_manager.abort()
        conn.close()
        if context.shared_image:  # held once per served run, given back once
            from store.core.image import release_shared

            uri, context.shared_image = context.shared_image, ""
            release_shared(uri)


def _receiver_name(context: JitContext) -> str:
    receiver = context.receiver
    name = receiver._slots().get("name") if isinstance(receiver, UvmObject) else None
    return name if isinstance(name, str) and name else type(receiver).__name__


def _mission() -> Mission:
    mission = _context().mission
    assert mission is not None, "the brief node runs first"
    return mission


# -- prompting -----------------------------------------------------------------------------


def _call_text(brief: MissionBrief) -> str:
    return ", ".join([*brief.args, *(f"{k}={v}" for k, v in brief.kwargs.items())])


def messages_for(
    brief: MissionBrief,
    attempts: list[AttemptRecord],
    feedback: AttemptRecord | None = None,
    user_examples: list[Any] | tuple[Any, ...] = (),
    answers: list[str] | tuple[str, ...] = (),
) -> list[BaseMessage]:
    """The conversation a persona model sees for one draft: rules, examples, task, feedback
    (``feedback``, else the last attempt's, if any); for a tool, ``answers``: what the
    service answered earlier drafts' requests (``Mission.answers_seen``)."""
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
    if brief.tool:
        task += "\n\n" + tool_text(p["tool_task"], brief.slots.get("about", ""))
        if answers:
            task += "\n\n" + p["tool_answers"].format(answers="\n".join(answers))
    last = feedback or (attempts[-1] if attempts else None)
    if last is not None:
        template = p["dispute"] if last.stage == "examples" else p["feedback"]
        task += "\n\n" + template.format(
            source=last.source, findings="\n".join(f"- {f}" for f in last.findings)
        )
    if user_examples:
        task += "\n\n" + "\n".join(
            f"The user says: {e.call_text(brief.selector)} must return {json.dumps(e.returns)}"
            + (f" and leave the slots {json.dumps(e.slots_after)}" if e.slots_after else "")
            + "."
            for e in user_examples
        )
    messages.append(HumanMessage(task))
    return messages


def tool_text(template: str, about: str = "") -> str:
    """The tool section of a draft's task: the capability, what the policy allows now, and
    an example on the service's own address (``example_base``)."""
    policy = tools.ToolPolicy.from_settings()
    return template.format(
        allowed=policy.described(),
        secrets=", ".join(f"env:{name}" for name in sorted(policy.secrets)) or "none",
        base=example_base(policy, about),
    )


_URL = re.compile(r"https?://[^\s\"'<>{}|\\^`\[\]]+")
#: The example's address when neither the 'about' slot nor the policy gives one.
EXAMPLE_BASE = "https://api.example.org"


def example_base(policy: tools.ToolPolicy, about: str) -> str:
    """Where the prompt's example sends its request: the first address in the tool's 'about'
    text that the policy allows, else the first allowed origin, else a neutral one. A small
    author copies the example's host whatever it is told, so the example's host is one the
    policy lets through rather than one it refuses."""
    allowed = sorted(policy.allow)
    for match in _URL.finditer(about or ""):
        try:
            origin = tools.origin_of(match.group(0))
        except ValueError:
            continue
        if origin in policy.allow:
            return _origin_text(origin)
    return _origin_text(allowed[0]) if allowed else EXAMPLE_BASE


def _origin_text(origin: tuple[str, str, int]) -> str:
    scheme, host, port = origin
    default = {"https": 443, "http": 80}.get(scheme)
    return f"{scheme}://{host}" + ("" if port == default else f":{port}")


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(reply: str, selector: str) -> str:
    """The method source in a model reply: the fenced block that defines ``selector``, with
    whatever else the model put at its top level (example calls, prints, a ``__main__``
    block) left out; only imports and the method itself are kept."""
    blocks = _FENCE.findall(reply) or [reply]
    chosen = next((b for b in blocks if f"def {selector}(" in b), blocks[0])
    method = _method_only(chosen.strip() + "\n", selector)
    return with_slots_assigned(with_imports(with_request_returned(method, selector)))


#: Names a draft may use without importing them, and the import that binds each: the allowed
#: modules, and their members whose names say where they come from.
_IMPORTABLE: dict[str, str] = {
    **{module: f"import {module}" for module in guardian.ALLOWED_IMPORTS},
    **{
        name: f"from {module} import {name}"
        for module, names in guardian.ALLOWED_IMPORTS.items()
        if module in ("collections", "itertools", "functools")
        for name in names
    },
    "timedelta": "from datetime import timedelta",
}


def with_imports(source: str) -> str:
    """``source`` with the imports it forgot: an allowed module (or a collections, itertools
    or functools member) named but bound nowhere in it gets its import line on top.

    Small models write ``collections.Counter(words)`` with no import about one time in three;
    the import is the one the guardian allows anyway, so adding it is a fix, not a guess.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source  # the audit reports it, with its line
    bound: set[str] = set()
    used: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                used.append(node.id)
            else:
                bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    missing = dict.fromkeys(
        _IMPORTABLE[name] for name in used if name in _IMPORTABLE and name not in bound
    )
    return "".join(f"{line}\n" for line in missing) + source if missing else source


def with_slots_assigned(source: str) -> str:
    """``source`` with each statement that changes a slot's container in place
    (``self.queue.append(x)``, ``items[k] = v`` after ``items = self.items``) followed by the
    assignment of that slot the persistence covenant asks for (``self.queue = self.queue``).

    Small models keep writing the in-place change after being told the covenant's rule, draft
    after draft; the added line is the one the rule asks for and changes nothing else the
    method does. A change inside a ``return`` or on the line of an ``if`` is left as written:
    the audit reports it.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source  # the audit reports it, with its line
    lines = source.splitlines(keepends=True)
    added: dict[int, str] = {}
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        changes: dict[int, list[guardian.InPlaceChange]] = {}
        for change in guardian.in_place_slot_changes(fn):
            changes.setdefault(id(change.node), []).append(change)
        simple = (ast.Expr, ast.Assign, ast.AugAssign, ast.Delete)
        for stmt in ast.walk(fn):
            if not isinstance(stmt, simple) or stmt.end_lineno is None:
                continue
            # Simple statements hold no statements, so each node is walked once in all.
            assign = {c.slot: c.via for node in ast.walk(stmt) for c in changes.get(id(node), ())}
            indent = lines[stmt.lineno - 1][: stmt.col_offset]
            if assign and not indent.strip():
                text = "".join(f"{indent}self.{slot} = {via}\n" for slot, via in assign.items())
                added[stmt.end_lineno] = added.get(stmt.end_lineno, "") + text
    if not added:
        return source
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    out = "".join(line + added.get(number, "") for number, line in enumerate(lines, 1))
    try:
        ast.parse(out)
    except SyntaxError:
        return source
    return out


def with_request_returned(source: str, selector: str) -> str:
    """A tool method's source with ``response = request(...)`` under ``if response is None:``
    written as ``return request(...)``.

    Small authors take ``request`` for a fetch and assign its answer, then read it in the same
    call, when there is none yet; told the two-call rule, their repairs repeat it. Under that
    test the only meaning the protocol gives the line is the return it asks for, so the
    rewrite is a fix of the slip, not a guess, and the draft is audited and tried as ever.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source  # the audit reports it, with its line
    lines = source.splitlines(keepends=True)
    changed = False
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name != selector:
            continue
        for node in ast.walk(fn):
            if not (isinstance(node, ast.If) and _is_response_none(node.test)):
                continue
            for stmt in node.body:
                if not (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id == tools.RESPONSE_PARAM
                    and isinstance(stmt.value, ast.Call)
                    and isinstance(stmt.value.func, ast.Name)
                    and stmt.value.func.id == "request"
                    and stmt.value.lineno == stmt.lineno
                ):
                    continue
                line = lines[stmt.lineno - 1]
                head, rest = line[: stmt.col_offset], line[stmt.value.col_offset :]
                lines[stmt.lineno - 1] = f"{head}return {rest}"
                changed = True
    if not changed:
        return source
    out = "".join(lines)
    try:
        ast.parse(out)
    except SyntaxError:
        return source
    return out


def _is_response_none(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == tools.RESPONSE_PARAM
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Is)
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value is None
    )


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


def examples_messages(brief: MissionBrief) -> list[BaseMessage]:
    """The conversation that asks for input → output examples of the intent (no code)."""
    p = prompts()
    messages: list[BaseMessage] = [SystemMessage(p["examples_system"])]
    for shot in p.get("examples_shots", []):
        messages += [HumanMessage(shot["task"]), AIMessage(shot["answer"])]
    fields = _task_fields(brief, spelling="json")
    messages.append(HumanMessage(p["examples_task"].format(**fields)))
    return messages


def _task_fields(brief: MissionBrief, spelling: str = "python") -> dict[str, Any]:
    """The task's fields; ``spelling="json"`` shows the call and the slots as JSON (the
    examples are JSON, and with Python's reprs in view the model copies their quotes and
    True/False into them). A brief without JSON texts keeps the Python spelling."""
    call, slots = _call_text(brief), brief.slots or "(none)"
    if spelling == "json" and (brief.args_json or brief.kwargs_json or brief.slots_json):
        call = ", ".join([*brief.args_json, *(f"{k}={v}" for k, v in brief.kwargs_json.items())])
        shown = ", ".join(f"{json.dumps(k)}: {v}" for k, v in brief.slots_json.items())
        slots = "{" + shown + "}" if shown else "(none)"
    return {
        "receiver": brief.receiver,
        "slots": slots,
        "parents": ", ".join(brief.parents) or "(none)",
        "inherited": ", ".join(brief.inherited) or "(none)",
        "selector": brief.selector,
        "call": call,
        "count": len(brief.args) + len(brief.kwargs),
        "intent": brief.intent or f"infer it from the name {brief.selector!r} and the arguments",
    }


def _model(context: JitContext, persona: str, **options: Any) -> BaseChatModel:
    if context.model is not None:
        return context.model
    if context.model_factory is not None:
        return context.model_factory(persona, **options)
    return default_model_factory(persona, **options)


def _draft_options(sample: int, repair: bool) -> dict[str, Any]:
    """The first draft at the persona's own temperature; the others sampled hotter, each with
    its own seed, so independent drafts differ."""
    options: dict[str, Any] = {"num_predict": DRAFT_MAX_TOKENS}
    if sample or repair:
        options.update(
            temperature=SAMPLE_TEMPERATURE,
            repeat_penalty=SAMPLE_REPEAT_PENALTY,
            seed=1_000 + sample,
        )
    return options


# -- nodes ------------------------------------------------------------------------------------


def brief(state: JitState) -> JitState:
    runtime_context: Any = get_runtime().context
    try:
        live = runtime_context.get(LIVE) if isinstance(runtime_context, dict) else None
        context = live if isinstance(live, JitContext) else _served(runtime_context, state)
    except BatosError as exc:
        # A malformed request ends the run at once with the reason in its state: the thread
        # stays usable, with no task left pending.
        return {"status": "failed", "error": str(exc), "history": []}
    context.mission = Mission(
        context.receiver,  # type: ignore[arg-type]  # _served and a live run's caller set it
        state["selector"],
        context.args,
        context.kwargs,
        transaction=context.transaction,
        acceptance=context.acceptance,
    )
    # "error" is cleared: the state is the thread's, and an earlier run may have failed.
    update: JitState = {
        "brief": context.mission.brief().as_dict(),
        "attempt": 0,
        "status": "drafting",
        "error": "",
        "drafted": [],
        "question": {},
        "answer": None,
    }
    if context.connection is not None:
        update["request"] = {
            "receiver": runtime_context.get("receiver"),
            "args": runtime_context.get("args", []),
            "kwargs": runtime_context.get("kwargs", {}),
        }
    return update


def _examples_from(reply: BaseMessage) -> JitState:
    mission = _mission()
    mission.set_examples(_text(reply))
    return {"examples": [e.as_dict() for e in mission.examples]}


def _examples_call(context: JitContext) -> tuple[BaseChatModel, list[BaseMessage]]:
    mission = _mission()
    model = _model(
        context,
        mission.author,
        num_predict=EXAMPLES_MAX_TOKENS,
        temperature=EXAMPLES_TEMPERATURE,
        format=examples_schema(arity=len(mission.args) + len(mission.kwargs)),
    )
    return model, examples_messages(mission.brief())


def write_examples(state: JitState) -> JitState:
    model, messages = _examples_call(_context())
    try:
        reply = model.invoke(messages)
    except ModelError as exc:
        return _no_examples(exc)
    return _examples_from(reply)


async def awrite_examples(state: JitState) -> JitState:
    model, messages = _examples_call(_context())
    try:
        reply = await model.ainvoke(messages)
    except ModelError as exc:
        return _no_examples(exc)
    return _examples_from(reply)


def _no_examples(exc: ModelError) -> JitState:
    # Examples help choose among drafts; without them the drafts are still gated and chosen
    # by agreement, so a model that fails here (a timeout on a loaded machine) stops nothing.
    log.warning("no examples for %r: %s", _mission().selector, exc.message)
    return {"examples": []}


def _round(state: JitState) -> tuple[list[tuple[BaseChatModel, list[BaseMessage]]], int]:
    """The model calls of this round: a batch of independent drafts (the first round, or
    when ``choose`` asked for more), or one repair."""
    context, mission = _context(), _mission()
    first = state["attempt"] == 0
    fresh = first or state.get("decision") == "sample"
    feedback = mission.last_failure if not fresh else None
    repair = state.get("findings") if not fresh else None
    if repair is not None and state.get("decision") == "repair":
        record = next(r for r in mission.attempts if r.number == state["chosen"])
        feedback = AttemptRecord(record.number, record.source, "examples", list(repair))
    count = context.drafts if fresh else 1
    calls = [
        (
            _model(context, mission.author, **_draft_options(i + len(mission.attempts), not first)),
            messages_for(
                mission.brief(),
                [] if fresh else mission.attempts,
                feedback,
                mission.user_examples,
                mission.answers_seen(),
            ),
        )
        for i in range(count)
    ]
    return calls, state["attempt"] + 1


def _served_failure(node: str, exc: Exception) -> JitState:
    """A served run's node failed: its reason (and hint) in the state, for ``fail`` to end on.

    An exception escaping the graph would reach the client as the server's "An internal error
    occurred" and leave the thread with the node pending; Python callers get the exception.
    """
    if not isinstance(exc, BatosError):
        log.exception("jit node %s failed", node)
        return {"error": f"{node} failed: {type(exc).__name__}: {exc}\n  hint: see the server log"}
    return {"error": f"{node} failed: {exc}"}


def _reply(context: JitContext, model: BaseChatModel, messages: list[BaseMessage]) -> str:
    if context.call is not None:
        return context.call(model, messages)
    return _text(model.invoke(messages))


async def _areply(context: JitContext, model: BaseChatModel, messages: list[BaseMessage]) -> str:
    if context.call is not None:
        return await asyncio.to_thread(context.call, model, messages)
    return _text(await model.ainvoke(messages))


def _drafted(state: JitState, sources: list[str], attempt: int) -> JitState:
    """A round's drafts as the state update of ``draft`` and ``adraft`` alike."""
    return {
        "sources": sources,
        "attempt": attempt,
        "findings": [],
        "drafted": [*state.get("drafted", []), *sources],
    }


def draft(state: JitState) -> JitState:
    context = _context()
    try:
        calls, attempt = _round(state)
        sources = [extract_code(_reply(context, m, msgs), state["selector"]) for m, msgs in calls]
    except Exception as exc:
        if context.connection is None:
            raise
        return _served_failure("draft", exc)
    return _drafted(state, sources, attempt)


async def adraft(state: JitState) -> JitState:
    context = _context()
    try:
        calls, attempt = _round(state)
        sources = [
            extract_code(await _areply(context, m, msgs), state["selector"]) for m, msgs in calls
        ]
    except Exception as exc:
        if context.connection is None:
            raise
        return _served_failure("draft", exc)
    return _drafted(state, sources, attempt)


def check(state: JitState) -> JitState:
    """Audit and try every draft of the round; those that pass join the candidates."""
    mission = _mission()
    for source in state["sources"]:
        if not mission.audit(source):
            mission.trial(source)
    return {}


def _verdict(context: JitContext, mission: Mission) -> trust.Verdict:
    """The chosen group's evidence, read back by the reviewer when it is wanted."""
    choice = mission.choice
    assert choice is not None, "decide() chose a group"
    review = None
    if context.trust is not None or context.review:
        if context.reviewer is None:
            from graph.review import Reviewer

            context.reviewer = Reviewer(
                _model(context, mission.author),
                mission.selector,
                mission.intent,
                messages_for(mission.brief(), []),
            )
        review = context.reviewer.review(choice.candidate.source)
    evidence = trust.Evidence(
        support=choice.support,
        drafts=len(mission.attempts),
        examples=len(mission.examples),
        failed=len(choice.failed),
        groups=len({c.key() for c in mission.candidates}),
        review=review,
        refuted=mission.refuted,
        asked=len(mission.user_examples),
        policy_refused=sum(1 for r in mission.attempts if r.stage == "policy"),
    )
    return trust.assess(evidence, context.trust)


def choose(state: JitState) -> JitState:
    context, mission = _context(), _mission()
    decision, candidate, findings = mission.decide(state["attempt"] < context.attempts)
    if decision == "install":
        mission.verdict = _verdict(context, mission)
        mission.verdicts.append(mission.verdict)
        evidence = mission.verdict.evidence
        split = evidence.support < evidence.standing
        if (
            mission.tool
            and split
            and not mission.verdict.trusted
            and not mission.resampled
            and state["attempt"] < context.attempts
        ):
            # A tool's drafts are split: one more batch of independent drafts (once) gives
            # agreement more to count before anyone is asked. Tool drafts agree on what they
            # read from the service's real answer; other methods' drafts agree on examples
            # their author wrote, and there a second batch installed one more wrong method
            # and no right one on a fresh set (bench/RESULTS.md), so it is not drawn.
            mission.resampled = True
            return {"decision": "sample", "chosen": 0, "findings": []}
        if not mission.verdict.trusted:
            # Refused before anything is installed (the image is unchanged), unless the user
            # can be asked for an example.
            decision = "ask" if _can_ask(context, mission) else "refuse"
            findings = list(mission.verdict.reasons)
    return {
        "decision": decision,
        "chosen": candidate.number if candidate is not None else 0,
        "findings": findings,
    }


def install(state: JitState) -> JitState:
    context, mission = _context(), _mission()
    # What is installed is what this run's mission chose and trusted, never what the state
    # names: a served run's client can write the state (update_state) and resume at install.
    choice, verdict = mission.choice, mission.verdict
    if (
        choice is None
        or choice.candidate.number != state.get("chosen")
        or (context.trust is not None and (verdict is None or not verdict.trusted))
    ):
        raise GraphRequestError(
            "the run's state names a method its mission did not choose and trust, so nothing "
            "was installed",
            hint="send the request again (a new run)",
        )
    mission.install(choice.candidate.source, choice.candidate.number)
    return {}


def invoke(state: JitState) -> JitState:
    mission = _mission()
    findings = mission.invoke()
    if findings:
        candidate = next(c for c in mission.candidates if c.number == state["chosen"])
        mission.discard(candidate)
        return {"findings": findings, "decision": "invoke failed"}
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
        update["error"] = str(_failure(mission))
    return update


#: Longest answer to a question, in characters, before it is parsed (it is hostile input).
MAX_ANSWER_CHARS = 20_000
#: How often a user is asked for the example when the answers cannot be used.
ASKS = 3


def question_for(mission: Mission) -> dict[str, Any]:
    """What the user is asked when the method cannot be trusted: one example, as JSON."""
    verdict = mission.verdict
    brief = mission.brief()
    arity = len(mission.args) + len(mission.kwargs)
    return {
        "kind": "example_needed",
        "receiver": brief.receiver,
        "selector": mission.selector,
        "intent": mission.intent,
        "call": f"self.{mission.selector}({_call_text(brief)})",
        "why": list(verdict.reasons) if verdict is not None else [],
        "question": (
            f"The method {mission.selector!r} written for {brief.receiver} is not trusted "
            "enough to install. Give one example of input and the expected output: "
            f'{{"args": [{arity} argument(s)], "returns": value}} (add "slots_before" and '
            '"slots_after" objects when it reads or changes slots), or null to refuse.'
        ),
    }


def example_from_answer(answer: Any, mission: Mission) -> tuple[Any, str]:
    """(the example, '') from a user's answer (JSON text or an object), or (None, why)."""
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        return None, "no example was given"
    if isinstance(answer, str):
        if len(answer) > MAX_ANSWER_CHARS:
            return None, f"the answer is over {MAX_ANSWER_CHARS} characters"
        try:
            # integers held to the examples' own bound, so that a long one is said to be
            # too large for an example rather than not JSON
            answer = strict_json(answer, parse_int=examples_module.bounded_int)
        except examples_module.ExampleRejected as exc:
            return None, f"the example cannot be used: {exc}"
        except (ValueError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
            return None, f"the answer is not JSON: {reason}"
    arity = len(mission.args) + len(mission.kwargs)
    try:
        return examples_module.example_from(answer, arity), ""
    except (examples_module.ExampleRejected, RecursionError) as exc:
        return None, f"the example cannot be used: {exc}"


def _can_ask(context: JitContext, mission: Mission) -> bool:
    # A tool's drafts are checked on what they read from the service's answer; a user's
    # example of input and output cannot be checked without sending each draft's request,
    # and a person rarely knows a live service's answer: a tool mission refuses instead.
    return context.ask is not None and not mission.user_examples and not mission.tool


def _rebuild(runtime_context: Any, state: JitState) -> JitContext:
    """A resumed served run: the request from the state, the drafts gated again (no model
    call), the author's examples read again as hostile data — once the state is what the run
    stood on when this process asked its question (``_ASKED``)."""
    thread = _thread()
    if _ASKED.get(thread) != _asked_digest(state):
        raise GraphRequestError(
            "this JIT run's question was not asked by this server as the run's state now "
            "stands: its state was changed since, or the server restarted, or the question was "
            "asked too long ago",
            hint="send the request again (a new run); its drafts are written and checked anew",
        )
    stale = _RESUMED.pop(thread, None)
    if stale is not None:  # a resumed run of this thread that was stopped before it ended
        _finish_served(stale, commit=False)
    context = _served(dict(state.get("request") or {}), state)
    try:
        return _rebuilt(context, runtime_context, state, thread)
    except BaseException:  # its connection (and the image it holds) go back at once
        _finish_served(context, commit=False)
        raise


def _rebuilt(context: JitContext, runtime_context: Any, state: JitState, thread: str) -> JitContext:
    """``_rebuild``'s mission, on the connection ``_served`` opened for ``context``."""
    mission = Mission(
        context.receiver,  # type: ignore[arg-type]  # _served sets it
        state["selector"],
        context.args,
        context.kwargs,
        transaction=context.transaction,
    )
    arity = len(context.args) + len(context.kwargs)
    found = []
    for data in state.get("examples") or []:
        try:
            found.append(examples_module.example_from(data, arity))
        except (examples_module.ExampleRejected, RecursionError):
            continue
    mission.examples = found
    for source in state.get("drafted") or []:
        if not mission.audit(source):
            mission.trial(source)
    mission.resampled = True
    mission.decide(False)  # the choice and its verdict, as the first run had them
    if mission.choice is not None:
        mission.verdict = _verdict(context, mission)
    context.mission = mission
    context.resumed_thread = thread
    if isinstance(runtime_context, dict):
        runtime_context[LIVE] = context
    else:
        _RESUMED[thread] = context
        while len(_RESUMED) > MAX_ASKED:
            # A resumed run stopped before it ended (a client's cancel) left its entry, and
            # its image connection, until its thread resumed again: the oldest go back.
            _finish_served(_RESUMED[next(iter(_RESUMED))], commit=False)
    return context


def ask(state: JitState) -> JitState:
    """Ask the user for one example; with it, every draft is judged again (and new ones
    drawn if none survives). Without one, the mission ends refused."""
    runtime_context = get_runtime().context
    live = runtime_context.get(LIVE) if isinstance(runtime_context, dict) else None
    if not isinstance(live, JitContext):
        try:
            live = _rebuild(runtime_context, state)
        except BatosError as exc:  # the run ends with the reason; the thread stays usable
            return {"status": "failed", "error": str(exc), "decision": "refuse"}
    context = live
    mission = _mission()
    question = question_for(mission)
    # An answer that cannot be read (a typo in its JSON) is asked for again, saying why,
    # rather than ending the mission and its drafting: null or nothing refuses at once.
    why = ""
    for asked in range(ASKS):
        if asked:
            question = {**question, "again": f"that answer could not be used: {why}"}
        if callable(context.ask):
            answer = context.ask(question)
        else:
            try:
                answer = interrupt(question)  # the n-th call takes the n-th answer on resume
            except GraphInterrupt:
                # The run stops here until the user answers: nothing it wrote is kept meanwhile.
                _finish_served(context, commit=False)
                _remember_question(state)
                raise
        example, why = example_from_answer(answer, mission)
        if example is not None or answer is None or not str(answer).strip():
            break
    if example is None:
        if mission.verdict is not None:
            mission.verdict.reasons.append(why)
        return {"question": question, "answer": _short_answer(answer), "decision": "refuse"}
    refuted = mission.learn(example)
    log.info("%r: the user's example refuted %d draft(s)", mission.selector, refuted)
    # One more round, so drafts can be written with the example when none survives it.
    context.attempts = max(context.attempts, state["attempt"] + 1)
    return {
        "question": question,
        "answer": example.as_dict(),
        "examples": [e.as_dict() for e in mission.examples],
        "decision": "asked",
    }


def _short_answer(answer: Any) -> Any:
    if answer is None or isinstance(answer, int | float | bool):
        return answer
    return bounded_repr(answer, 200)


def _after_ask(state: JitState) -> str:
    if state.get("status") == "failed":  # no mission to end: it could not be rebuilt
        return END
    return "fail" if state["decision"] == "refuse" else "choose"


def _failure(mission: Mission) -> kernel.MissionFailed:
    """Why the mission ended with nothing installed: a refusal, or no working draft."""
    verdict = mission.verdict
    if verdict is not None and not verdict.trusted:
        return trust.refusal(mission.receiver, mission.selector, verdict)
    return mission.failure()


def _after_choose(state: JitState) -> str:
    return {"install": "install", "fail": "fail", "refuse": "fail", "ask": "ask"}.get(
        state["decision"], "draft"
    )


def _after_draft(state: JitState) -> str:
    return "fail" if state.get("error") else "check"


def _after_invoke(state: JitState) -> str:
    return END if state.get("status") == "installed" else "choose"


def _after_brief(state: JitState) -> str:
    if state.get("status") == "failed":
        return END
    # A tool method's result is a request description: examples of input → output would
    # ask the author to guess it twice; its drafts are judged by agreement and the policy.
    return "examples" if _context().examples and not _mission().tool else "draft"


def build_graph(checkpointer: Any = None) -> Any:
    builder = StateGraph(JitState, context_schema=JitRequest, input_schema=JitInput)
    builder.add_node("brief", brief)
    builder.add_node(
        "examples", RunnableLambda(write_examples, afunc=awrite_examples, name="examples")
    )
    builder.add_node("draft", RunnableLambda(draft, afunc=adraft, name="draft"))
    builder.add_node("check", check)
    builder.add_node("choose", choose)
    builder.add_node("install", install)
    builder.add_node("invoke", invoke)
    builder.add_node("fail", fail)
    builder.add_node("ask", ask)
    builder.add_edge(START, "brief")
    builder.add_conditional_edges("brief", _after_brief, ["examples", "draft", END])
    builder.add_edge("examples", "draft")
    builder.add_conditional_edges("draft", _after_draft, ["check", "fail"])
    builder.add_edge("check", "choose")
    builder.add_conditional_edges("choose", _after_choose, ["install", "draft", "fail", "ask"])
    builder.add_conditional_edges("ask", _after_ask, ["choose", "fail", END])
    builder.add_edge("install", "invoke")
    builder.add_conditional_edges("invoke", _after_invoke, [END, "choose"])
    builder.add_edge("fail", END)
    return builder.compile(name="jit", checkpointer=checkpointer)


graph = build_graph()
#: The graph the runner below invokes: with no checkpointer of its own, and none borrowed when
#: it runs inside another graph's node (a mind cycle writing a facet): a mission's state is
#: its caller's to keep, never a checkpoint in the caller's thread.
_embedded = build_graph(checkpointer=False)


# -- entry points -------------------------------------------------------------------------------


class JitRunner:
    """Runs doesNotUnderstand missions through the graph (a ``kernel.MissionRunner``)."""

    def __init__(
        self,
        model: BaseChatModel | None = None,
        *,
        model_factory: ModelFactory | None = None,
        attempts: int | None = None,
        acceptance: Callable[[Any], bool | str] | None = None,
        drafts: int | None = None,
        examples: bool = True,
        trust: float | None | str = "setting",
        review: bool = False,
        ask: Callable[[dict[str, Any]], Any] | None = None,
        call: Callable[[BaseChatModel, list[BaseMessage]], str] | None = None,
    ) -> None:
        #: Asked for one example (``question_for``'s question → an answer, JSON text or an
        #: object, or None) when the method is not trusted; None: refuse at once.
        self.ask = ask
        #: The trust threshold: a number, None (install the best draft), or "setting"
        #: (the ``jit_trust`` setting when the mission starts).
        self.trust = trust
        self.review = review
        self.model = model
        self.model_factory = model_factory
        self.attempts = attempts
        self.acceptance = acceptance
        self.drafts = drafts
        self.examples = examples
        #: ``call(model, messages)`` → reply text, when the caller makes the drafts' model
        #: calls itself (to stream and measure them); None: the model is invoked.
        self.call = call

    def _start(
        self, receiver: UvmObject, selector: str, args: tuple, kwargs: dict
    ) -> tuple[JitState, dict[str, JitContext], dict[str, Any]]:
        attempts = self.attempts or settings.get_int("jit_attempts")
        drafts = self.drafts or settings.get_int("jit_drafts")
        context = JitContext(
            receiver=receiver,
            args=tuple(args),
            kwargs=dict(kwargs),
            model=self.model,
            model_factory=self.model_factory,
            attempts=attempts,
            drafts=drafts,
            examples=self.examples,
            acceptance=self.acceptance,
            trust=trust.threshold() if self.trust == "setting" else self.trust,  # type: ignore[arg-type]
            review=self.review,
            ask=self.ask,
            call=self.call,
            # Captured here, in the caller's thread: nodes may run in worker threads.
            transaction=kernel.current_transaction(receiver),
        )
        config = {"recursion_limit": 8 * (attempts + drafts) + 10, "run_name": f"jit:{selector}"}
        return {"selector": selector}, {LIVE: context}, config

    @staticmethod
    def _finish(state: dict[str, Any], context: dict[str, JitContext]) -> Any:
        mission = context[LIVE].mission
        assert mission is not None
        if state.get("status") != "installed":
            raise _failure(mission)
        return mission.result

    def send(
        self, receiver: UvmObject, selector: str, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """Write, install and run ``selector`` for ``receiver``; its result."""
        state, context, config = self._start(receiver, selector, args, kwargs or {})
        return self._finish(_embedded.invoke(state, config=config, context=context), context)

    async def asend(
        self, receiver: UvmObject, selector: str, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        state, context, config = self._start(receiver, selector, args, kwargs or {})
        return self._finish(await _embedded.ainvoke(state, config=config, context=context), context)


def enable(
    model: BaseChatModel | None = None,
    *,
    model_factory: ModelFactory | None = None,
    attempts: int | None = None,
    drafts: int | None = None,
) -> JitRunner:
    """Turn doesNotUnderstand on for every UvmObject in this process; returns the runner."""
    runner = JitRunner(model, model_factory=model_factory, attempts=attempts, drafts=drafts)
    kernel.install_handler(runner)
    return runner


def disable() -> None:
    """Unknown messages raise ``DoesNotUnderstand`` again."""
    kernel.install_handler(None)
