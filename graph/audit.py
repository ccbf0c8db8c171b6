"""The audit: ALFRED reads the Composite Entropy Metric and writes a report into the image.

A LangGraph graph of three nodes — ``measure`` (``graph.cem`` over the newest
``audit_window`` cycles, compared with the previous report), ``narrate`` (ALFRED's model says
what moved, in his voice) and ``record`` (the report, one transaction). A failure in any node
writes nothing: the report is committed by ``record`` alone, so a failed audit leaves the
image as it was, and the heartbeat logs it.

The verdict rule, on the weighted CEM: **decay** when it fell by more than ``audit_decay``
since the previous report; **stagnation** when it moved by less than ``audit_decay / 10`` over
each of the last three reports; **steady** otherwise; **unknown** with no previous reading.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

from BTrees.IOBTree import IOBTree
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph

from batos import settings
from batos.errors import BatosError
from graph import cem, prompts
from store.image import LivingImage

#: Root key of the audit reports: report number → report dict.
AUDIT_KEY = "audit_reports"
#: Characters of ALFRED's narrative a report keeps.
MAX_NARRATIVE_CHARS = 4000
STAGNANT_REPORTS = 3


class AuditError(BatosError):
    """An audit report that is not in the image."""


class AuditState(TypedDict, total=False):
    metrics: dict[str, Any]
    previous: dict[str, Any] | None
    deltas: dict[str, float | None]
    verdict: str
    narrative: str
    report_id: int


def verdict(history: list[float | None], current: float | None, decay: float) -> str:
    """The rule of the module docstring; ``history`` is the earlier CEMs, oldest first."""
    known = [h for h in history if h is not None]
    if current is None or not known:
        return "unknown"
    if known[-1] - current > decay:
        return "decay"
    recent = (known + [current])[-(STAGNANT_REPORTS + 1) :]
    if len(recent) == STAGNANT_REPORTS + 1 and all(
        abs(b - a) < decay / 10 for a, b in zip(recent, recent[1:], strict=False)
    ):
        return "stagnation"
    return "steady"


def reports(root: Any) -> Any:
    return root.get(AUDIT_KEY) or IOBTree()


def _table(metrics: Mapping[str, Any], deltas: Mapping[str, float | None]) -> str:
    lines = []
    for name in (*cem.COMPONENTS, "cem"):
        value, delta = metrics.get(name), deltas.get(name)
        shown = "n/a" if value is None else f"{value:.3f}"
        moved = "" if delta is None else f" ({delta:+.3f})"
        lines.append(f"{name}: {shown}{moved}")
    for persona, terms in (metrics.get("by_persona") or {}).items():
        lines.append(f"{persona}: share {terms['share']:.2f}, novelty {terms['H_sol_mean']}")
    return "\n".join(lines)


def build_graph(image: LivingImage, models: Callable[..., Any] | None = None) -> Any:
    """The audit graph over ``image``; ``models(persona)`` replaces the configured backends."""

    def measure(state: AuditState) -> AuditState:
        weights = cem.parse_weights(settings.get_str("cem_weights"))
        with image.read() as root:
            metrics = cem.measure(root, settings.get_int("audit_window"), weights).as_dict()
            found = reports(root)
            previous = dict(found[found.maxKey()]) if len(found) else None
            history = [found[k]["metrics"]["cem"] for k in list(found.keys())[-STAGNANT_REPORTS:]]
        old = previous["metrics"] if previous else {}
        deltas = {
            name: None
            if metrics.get(name) is None or old.get(name) is None
            else round(metrics[name] - old[name], 6)
            for name in (*cem.COMPONENTS, "cem")
        }
        rule = verdict(history, metrics["cem"], settings.get_float("audit_decay"))
        return {"metrics": metrics, "previous": previous, "deltas": deltas, "verdict": rule}

    def narrate(state: AuditState) -> AuditState:
        if models is not None:
            model = models("ALFRED")
        else:
            from graph.llm import chat_model

            model = chat_model("ALFRED")
        prompt = prompts.load("audit")
        reply = model.invoke(
            [
                SystemMessage(prompt["system"]),
                HumanMessage(
                    prompt["user"].format(
                        cycles=state["metrics"]["cycles"],
                        verdict=state["verdict"],
                        table=_table(state["metrics"], state["deltas"]),
                    )
                ),
            ]
        )
        return {"narrative": str(reply.content).strip()[:MAX_NARRATIVE_CHARS]}

    def record(state: AuditState) -> AuditState:
        report = {
            "time": time.time(),
            "metrics": state["metrics"],
            "deltas": state["deltas"],
            "verdict": state["verdict"],
            "narrative": state["narrative"],
            "previous": state["previous"]["id"] if state.get("previous") else None,
        }

        def write(root: Any) -> int:
            found = root.get(AUDIT_KEY)
            if found is None:
                found = root[AUDIT_KEY] = IOBTree()
            number = found.maxKey() + 1 if len(found) else 1
            found[number] = {**report, "id": number}
            return number

        number = image.transact(write, note=f"audit: CEM {state['metrics']['cem']}")
        return {"report_id": number}

    builder = StateGraph(AuditState)
    builder.add_node("measure", measure)
    builder.add_node("narrate", narrate)
    builder.add_node("record", record)
    builder.add_edge(START, "measure")
    builder.add_edge("measure", "narrate")
    builder.add_edge("narrate", "record")
    builder.add_edge("record", END)
    return builder.compile()


def run(image: LivingImage, models: Callable[..., Any] | None = None) -> dict[str, Any]:
    """One audit; the report as written."""
    final = build_graph(image, models).invoke({})
    return show(image, final["report_id"])


def history(image: LivingImage) -> list[dict[str, Any]]:
    with image.read() as root:
        return [dict(r) for r in reports(root).values()]


def show(image: LivingImage, report_id: int) -> dict[str, Any]:
    with image.read() as root:
        found = reports(root).get(report_id)
        if found is None:
            raise AuditError(
                f"no audit report {report_id} in the image",
                hint="list them with 'batos audit report'",
            )
        return dict(found)


def graph() -> Any:
    """The audit graph for ``langgraph dev`` / ``batos serve``, over the configured image
    (shared with the server's other graphs, opened once per process)."""
    from store.image import acquire_shared, default_uri

    return build_graph(acquire_shared(default_uri()))
