"""The mind: BAT OS's Prototypal State Machine as a LangGraph graph (``mind`` in langgraph.json).

    ROUTE ──fast──────────────────────────────┐
      └──full──> DECOMPOSING ──Send──> DELEGATING (facets, in parallel)
                                              ▼
                                       SYNTHESIZING ──> quality gate ──> COMPLETE
                                              ▲──── one retry ────┘         │
    any node ────────────────────────────────────────────────> FAILED      ▼ commit

ROUTE validates the request, routes it to personas and picks the depth (``graph.plan``: a
short single-persona request takes the fast path, one model call). DECOMPOSING has the lead
persona's model write a plan under a JSON schema; DELEGATING runs one branch per step, each a
facet method (``graph.facets``, written by doesNotUnderstand the first time) and one model call;
SYNTHESIZING weaves the partial answers; the gate checks the answer. No node commits: changes
travel as effects and COMPLETE hands them to the checkpointer as one commit (``graph.cycle``),
applied in the transaction of the checkpoint that records COMPLETE. FAILED keeps the image as
it was. Every model call streams and is measured; each transition logs one JSON line on
``batos.mind``.

    from batos.shell.runtime import ask
    state = ask("how do I plan a garden?", thread_id="t1")   # opens the image, answers once

The graph finds its image through what assembled it (``build_graph``'s checkpointer, services
or ``served_image``), never through LangGraph's internals; ``batos.shell.runtime`` assembles
it for every entry point.

The run context (``MindContext``) holds JSON only: ``persona`` (force one) and ``depth``.
Python callers may add ``services`` (a ``MindServices``: the chat-model factory, the router,
the embedder, the image), which the LangGraph server never passes on from clients.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import StateSnapshot

from batos.errors import BatosError, GraphRequestError, ThreadBusy
from graph import cycle
from graph.mind_nodes import (
    ANSWER_TOKENS,
    FACET_TOKENS,
    MAX_ANSWER_CHARS,
    PLAN_TOKENS,
    REFUSAL,
    Mind,
)
from graph.mind_state import (
    STATUSES,
    MindContext,
    MindInput,
    MindServices,
    MindState,
    ModelFactory,
    accumulate,
)
from graph.request import (
    MAX_MESSAGE_EXTRA_CHARS,
    add_checked_messages,
    admit_checked_input,
    check_thread_id,
    content_text,
    request_text,
)
from store.checkpoint.saver import EXPECT_KEY, ZODBSaver
from store.core.image import LivingImage

__all__ = [
    "ANSWER_TOKENS",
    "FACET_TOKENS",
    "MAX_ANSWER_CHARS",
    "PLAN_TOKENS",
    "REFUSAL",
    "STATUSES",
    "Mind",
    "MindContext",
    "MindInput",
    "MindServices",
    "MindState",
    "ModelFactory",
    "accumulate",
    "build_graph",
    "check_thread_id",
    "content_text",
    "graph",
    "request_text",
    "run_config",
]


#: What a client's Command(update=...) may write to the channels whose reducers check what
#: they are given: held to the same checks before the checkpointer stores it (stored, a value
#: a reducer refuses would break every later read of the thread).
def _client_items(value: Any) -> None:
    """A client's items for a list channel: as ``accumulate`` takes them, and bounded (every
    later checkpoint of the thread carries them)."""
    accumulate([], value)
    size = len(json.dumps(value, default=str, ensure_ascii=False))
    if size > MAX_MESSAGE_EXTRA_CHARS:
        raise GraphRequestError(
            f"a write of {size:,} characters to a list channel is more than a client may send "
            f"({MAX_MESSAGE_EXTRA_CHARS:,})",
            hint="the graph writes these channels itself; send messages instead",
        )


CLIENT_WRITE_CHECKS: dict[str, Callable[[Any], Any]] = {
    "messages": lambda value: add_checked_messages([], value),
    "partials": _client_items,
    "effects": _client_items,
    "metrics": _client_items,
}


def build_graph(
    services: MindServices | None = None,
    *,
    checkpointer: Any = None,
    store: Any = None,
    served_image: Callable[[], LivingImage] | None = None,
) -> Any:
    """The mind graph, compiled; with a ``ZODBSaver`` its commits join the checkpoints (the
    saver is handed the cycle's effect kinds). ``served_image`` is for a graph a server runs
    with its own checkpointer, the ``ZODBSaver`` of the runtime whose image it returns."""
    if isinstance(checkpointer, ZODBSaver):
        checkpointer.accept(cycle.EFFECT_KINDS, CLIENT_WRITE_CHECKS)
    mind = Mind(services, checkpointer=checkpointer, served_image=served_image)
    builder = StateGraph(MindState, context_schema=MindContext, input_schema=MindInput)
    builder.add_node("route", mind.route)
    builder.add_node("decompose", mind.decompose)
    # the facet node is sent its task (Send), not the state
    builder.add_node("facet", mind.facet)  # type: ignore[arg-type]
    builder.add_node("synthesize", mind.synthesize)
    builder.add_node("gate", mind.gate)
    builder.add_node("complete", mind.complete)
    builder.add_node("fail", mind.fail)
    builder.add_edge(START, "route")
    builder.add_conditional_edges("route", mind.after_route, ["decompose", "synthesize", "fail"])
    builder.add_conditional_edges("decompose", mind.delegate, ["facet", "synthesize", "fail"])
    builder.add_edge("facet", "synthesize")
    builder.add_conditional_edges("synthesize", mind.after_synthesize, ["gate", "fail"])
    builder.add_conditional_edges("gate", mind.after_gate, ["complete", "synthesize", "fail"])
    builder.add_edge("complete", END)
    builder.add_edge("fail", END)
    return admit_checked_input(builder.compile(checkpointer=checkpointer, store=store, name="mind"))


#: The graph unassembled: its schemas (Studio's forms); running it needs an image, which an
#: assembly gives (``batos.shell.runtime``, ``batos.shell.served``).
graph = build_graph()


# -- one request, from Python -----------------------------------------------------------------


def run_config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": check_thread_id(thread_id)}, "recursion_limit": 40}


#: A thread whose latest checkpoint still has steps to run, stored by another process less than
#: this long ago, is taken to be answering a request there; stored longer ago, its run is taken
#: to have died (a killed process), and a new request goes on from it. A mind cycle stores a
#: checkpoint after every step, and no step of one takes this long on the default model.
BUSY_SECONDS = 300.0
#: How far ahead of this host's clock a checkpoint's time may be and still count as recent.
CLOCK_SKEW_SECONDS = 60.0


def refuse_if_busy(
    graph: Any, config: RunnableConfig, *, run_id: str | None = None
) -> RunnableConfig:
    """Raise ``ThreadBusy`` if another process is answering on ``config``'s thread now; else
    ``config`` for the run, holding what the check saw (``EXPECT_KEY``): a run another process
    starts between the check and this run's start is then found at its first step.

    Two runs on one thread at once from two processes each go on from what they read: the
    checkpointer lets only one of them store each step (``ThreadMovedOn`` for the other), and
    a request sent while another process's run is mid-cycle would go on from that run's
    half-done state and make it fail. So a new request is refused up front while the thread's
    latest checkpoint was stored by another process, recently, and has steps still to run
    (no interrupt waiting for an answer, no failed step). This process's own runs are its
    own to order (a run it stopped, a breakpoint), a run from a checkpoint named by id (a
    fork) is never refused, and a thread that cannot be read is left to the run to report.
    ``run_id`` names the run about to start when it may be a retry of one another process
    began (a server retrying the runs its stopped predecessor left running): its own earlier
    attempt does not make it wait.
    """
    configurable = config.get("configurable", {})
    saver = getattr(graph, "checkpointer", None)
    if configurable.get("checkpoint_id") or not isinstance(saver, ZODBSaver):
        return config
    try:
        snapshot = graph.get_state({"configurable": {"thread_id": configurable["thread_id"]}})
    except BatosError:
        return config  # a thread holding a client's refused input: its next request mends it
    seen = (snapshot.config or {}).get("configurable", {}).get("checkpoint_id") or ""
    expecting: RunnableConfig = {**config, "configurable": {**configurable, EXPECT_KEY: seen}}
    # A step whose tasks have all written their results shows no next step until the loop
    # stores the checkpoint after it: its tasks still say a run is there.
    steps = snapshot.next or tuple(task.name for task in snapshot.tasks)
    if not steps or not snapshot.created_at or saver.stored_here(seen):
        return expecting
    if any(task.interrupts or task.error for task in snapshot.tasks):
        return expecting  # waiting for the user's answer, or a failed run: nothing runs there
    if run_id is not None and str((snapshot.metadata or {}).get("run_id")) == run_id:
        return expecting  # this run's own earlier attempt
    try:
        age = (datetime.now(UTC) - datetime.fromisoformat(snapshot.created_at)).total_seconds()
    except (TypeError, ValueError):
        return expecting
    # A checkpoint stamped ahead of this host's clock (another host's clock, or a stranger's
    # value) counts from now, not from its stamp: no thread waits longer than BUSY_SECONDS.
    if -CLOCK_SKEW_SECONDS < age < BUSY_SECONDS:
        if saver.writer_gone(snapshot.config):
            return expecting  # its process was killed: no run is there
        raise ThreadBusy(
            f"thread {configurable['thread_id']!r} is answering another request in another "
            f"process (its last step, before {', '.join(steps)}, was stored "
            f"{max(age, 0):.0f} s ago); this one was not sent",
            hint="send it again when that answer is done, or on a thread of its own; a run "
            "whose process died on another host or in another container is taken as ended "
            f"{BUSY_SECONDS:.0f} s after its last step",
        )
    return expecting


def own_run(config: RunnableConfig) -> RunnableConfig:
    """``config`` for one run with an id of its own, which the checkpointer records in the
    metadata of every checkpoint the run writes (``run_state`` finds them by it)."""
    return {**config, "metadata": {**config.get("metadata", {}), "run_id": str(uuid.uuid4())}}


def run_state(graph: Any, config: RunnableConfig) -> StateSnapshot | None:
    """The state the run of ``config`` (``own_run``) left its thread in: the newest checkpoint
    it wrote in the thread's root namespace, its pending writes included; None when it wrote
    none (it was stopped before it stored its input).

    Neither the state at ``config``'s checkpoint nor the thread's latest: a run from a pinned
    checkpoint (a fork: chat's /undo, a client's ``checkpoint_id``) writes a new branch and
    leaves that checkpoint as it was, and on an image shared over ZEO another process's run on
    the same thread may have written the thread's latest checkpoint.
    """
    thread: RunnableConfig = {"configurable": {"thread_id": config["configurable"]["thread_id"]}}
    run_id = config["metadata"]["run_id"]
    return next(iter(graph.get_state_history(thread, filter={"run_id": run_id}, limit=1)), None)
