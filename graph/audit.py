"""The audit: ALFRED reads the Composite Entropy Metric, writes a report into the image, and
starts and judges self-improvement missions (``graph.missions``).

A LangGraph graph of four nodes — ``measure`` (``graph.cem`` over the newest ``audit_window``
cycles with the learnt weights, compared with the previous report; the verdict; the judgement
of the open missions; the next weights; the mission to start), ``narrate`` (ALFRED's model says
what moved, in his voice), ``record`` (the missions judged *undone* are undone, then the report
is written, one transaction) and ``improve`` (the planned mission, if any). A failure in
``measure`` or ``narrate`` writes nothing; a mission whose change fails is recorded as failed
and does not fail the audit.

The verdict rule, on the weighted CEM (the earlier reports' components weighted with this
audit's weights, so a change of weights is never read as a decay; each two readings compared
over the components both define, ``cem.comparable``, so a component that comes or goes is
not read as one either): **decay** when it fell by more than ``audit_decay`` since the
previous report; **stagnation** when it moved by less than
``audit_decay / 10`` over each of the last three reports; **steady** otherwise; **unknown**
with no previous reading; **idle** when no cycle was committed since the previous report. An
idle audit measures nothing new, so it judges no mission, starts none, keeps the weights and
does not ask ALFRED's model to narrate (nor does an audit whose window holds no cycle: its
narrative is fixed too): its report says why (``reason``), and the verdict rule
reads only the reports that are not idle — an image nobody uses is not stagnating.

The weights: the ``cem_weights`` setting until the first report; then each report's
``weights_next`` — ``cem.step_weights`` on the missions it judged — is what the next audit
uses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from BTrees.IOBTree import IOBTree
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.graph import END, START, StateGraph

# Pydantic renders the schemas of typing_extensions' TypedDicts on Python 3.11 (for Studio).
from typing_extensions import TypedDict

from batos import settings
from batos.errors import BatosError
from graph import cem, missions, prompts, records
from store.core import layout
from store.core.image import LivingImage
from store.core.transactions import Unchanged

log = logging.getLogger("batos.audit")

#: Characters of ALFRED's narrative a report keeps.
MAX_NARRATIVE_CHARS = 4000
STAGNANT_REPORTS = 3
#: What an audit whose window holds no cycle says, without asking the model.
NO_CYCLES_NARRATIVE = "Nothing to audit: the image holds no cycles yet. No verdict, no mission."
#: What a report says when ALFRED's narrative was of another reading than the one recorded.
STALE_NARRATIVE = (
    "ALFRED's narrative was of another reading (cycles were committed while he wrote it, or the "
    "run's state was changed); the figures and verdict are this reading's."
)


class AuditError(BatosError):
    """An audit report that is not in the image."""


class AuditState(TypedDict, total=False):
    metrics: dict[str, Any]
    previous: dict[str, Any] | None
    deltas: dict[str, float | None]
    verdict: str
    weights_next: dict[str, float]
    judgements: list[dict[str, Any]]
    plan: dict[str, Any] | None
    narrative: str
    report_id: int
    mission: dict[str, Any] | None
    cycles_total: int
    newest_cycle: str | None
    reason: str | None


class AuditInput(TypedDict, total=False):
    """What a client sends to start an audit: nothing; the nodes measure the image."""


class AuditContext(TypedDict, total=False):
    """The run context an audit takes: none; the thresholds are settings."""


def verdict(history: list[float | None], current: float | None, decay: float) -> str:
    """The rule of the module docstring; ``history`` is the earlier CEMs, oldest first."""
    known = [h for h in history if h is not None]
    if current is None or not known:
        return "unknown"
    readings = [*known, current]
    return verdict_of_moves([b - a for a, b in zip(readings, readings[1:], strict=False)], decay)


def verdict_of_moves(moves: list[float | None], decay: float) -> str:
    """The rule of the module docstring on ``moves``, how far the CEM moved from each reading
    to the next, oldest first, the last one to this audit's (None: no component in common)."""
    if not moves or moves[-1] is None:
        return "unknown"
    if moves[-1] < -decay:
        return "decay"
    recent = moves[-STAGNANT_REPORTS:]
    if len(recent) == STAGNANT_REPORTS and all(
        m is not None and abs(m) < decay / 10 for m in recent
    ):
        return "stagnation"
    return "steady"


def moves(readings: list[Mapping[str, Any]], weights: Mapping[str, float]) -> list[float | None]:
    """How far the CEM moved between consecutive ``readings`` (oldest first, this audit's
    last), each pair weighted with ``weights`` over the components both define
    (``cem.change``): a component that comes or goes is not a move. Readings with no
    component defined are passed over."""
    known = [r for r in readings if cem.weighted(r, weights) is not None]
    return [cem.change(a, b, weights) for a, b in zip(known, known[1:], strict=False)]


def reports(root: Any) -> Any:
    """The audit reports (report number → report dict); empty in an image without them."""
    return layout.find(root, layout.AUDIT_REPORTS) or IOBTree()


def _checked(number: Any, report: Any) -> dict[str, Any] | None:
    return records.readable(records.AuditReport, "audit report", number, report)


def valid_reports(root: Any, newest: int | None = None) -> list[dict[str, Any]]:
    """The audit reports, oldest first (of the ``newest`` only, when given); a malformed one
    is skipped with a warning, and the audit goes on without it."""
    found = reports(root)
    keys = list(found.keys())
    chosen = keys if newest is None else keys[-newest:] if newest > 0 else []
    checked = (_checked(k, found[k]) for k in chosen)
    return [r for r in checked if r is not None]


def measured_reports(root: Any, newest: int) -> list[dict[str, Any]]:
    """The ``newest`` well-formed reports that are not idle, oldest first: the readings the
    verdict rule compares."""
    found = reports(root)
    chosen: list[dict[str, Any]] = []
    for number in reversed(list(found.keys())):
        if len(chosen) >= newest:
            break
        report = _checked(number, found[number])
        if report is not None and report["verdict"] != "idle":
            chosen.append(report)
    return chosen[::-1]


def cycles_seen(root: Any) -> tuple[int, str | None]:
    """How many cycle records the image holds and the newest one's id: what tells an audit
    whether anything happened since the last."""
    cycles = layout.find(root, layout.CYCLES)
    if cycles is None or not len(cycles):
        return 0, None
    return len(cycles), cycles.maxKey()


def idle_since(last: Mapping[str, Any] | None, seen: tuple[int, str | None]) -> str | None:
    """Why an audit with ``seen`` cycles after report ``last`` is idle, or None when it is not
    (a report from before reports recorded what they had seen is never idle's reference)."""
    if last is None or "cycles_total" not in last:
        return None
    if (last["cycles_total"], last.get("newest_cycle")) != seen:
        return None
    return f"no new cycles since audit {last['id']}"


def newest_report(root: Any) -> dict[str, Any] | None:
    """The newest audit report that is well formed, or None."""
    found = reports(root)
    for number in reversed(list(found.keys())):
        report = _checked(number, found[number])
        if report is not None:
            return report
    return None


def current_weights(root: Any) -> dict[str, float]:
    """The weights the next audit uses: the newest report's ``weights_next``, else the
    ``cem_weights`` setting (normalised)."""
    newest = newest_report(root)
    if newest is not None and newest["weights_next"]:
        return dict(newest["weights_next"])
    return cem.normalised(cem.parse_weights(settings.get_str("cem_weights")))


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


def _judged_lines(judgements: list[dict[str, Any]], plan: Mapping[str, Any] | None) -> str:
    lines = []
    for j in judgements:
        if j["outcome"] is not None:
            lines.append(f"mission {j['mission']}: {j['outcome']} ({j['why']})")
    if plan:
        lines.append(f"mission to start: {plan['kind']} {plan['persona']} for {plan['target']}")
    return "\n".join(lines)


def _measure(image: LivingImage) -> AuditState:
    """This audit's reading of the image, what it judges and plans; reads only. The record
    node takes it again rather than trust the run's state: a client of a served audit can
    write any state (``update_state``), and the state decides what is undone and started."""
    size = settings.get_int("audit_window")
    with image.read() as root:
        weights = current_weights(root)
        seen = cycles_seen(root)
        records = cem.window(root, size)
        declared, methods = cem.image_structure(root)
        metrics = cem.compute(
            records, facet_space=declared, methods=methods, weights=weights
        ).as_dict()
        reason = idle_since(newest_report(root), seen)
        recent = measured_reports(root, STAGNANT_REPORTS)
        previous = recent[-1] if recent else None
        # Like for like: a component that came or went (H_struc with the first facet
        # call) or changed definition (H_cog) is no move of the CEM (cem.comparable).
        if previous is None:
            deltas: dict[str, float | None] = dict.fromkeys((*cem.COMPONENTS, "cem"))
        else:
            deltas = {
                **cem.changes(previous["metrics"], metrics),
                "cem": cem.change(previous["metrics"], metrics, weights),
            }
        if reason is not None:  # nothing happened: nothing to judge, learn or mend
            judgements, rule, chosen = [], "idle", None
        else:
            judgements = missions.assess(root, metrics, weights, image)
            readings = [r["metrics"] for r in recent] + [metrics]
            rule = (
                "unknown"
                if metrics["cem"] is None
                else verdict_of_moves(moves(readings, weights), settings.get_float("audit_decay"))
            )
            # One mission at a time, each from a reading no other mission's change is in.
            busy = bool(judgements)
            chosen = None if busy else missions.plan(root, rule, metrics, deltas, weights, records)
    weights_next = cem.step_weights(
        weights,
        missions.evidence(judgements),
        rate=settings.get_float("cem_weight_rate"),
        max_step=settings.get_float("cem_weight_step"),
    )
    measured: AuditState = {
        "metrics": metrics,
        "previous": previous,
        "deltas": deltas,
        "verdict": rule,
        "weights_next": weights_next,
        "judgements": [j.as_dict() for j in judgements],
        "plan": chosen.as_dict() if chosen else None,
        "cycles_total": seen[0],
        "newest_cycle": seen[1],
        "reason": reason,
    }
    if reason is not None:
        measured["narrative"] = f"Nothing to audit: {reason}. No verdict, no mission."
    return measured


def build_graph(image: LivingImage, models: Callable[..., Any] | None = None) -> Any:
    """The audit graph over ``image``; ``models(persona)`` replaces the configured backends."""

    def measure(state: AuditState) -> AuditState:
        return _measure(image)

    def narrate(state: AuditState) -> AuditState:
        state = _measure(image)  # the image's reading, not what a client may have written
        if not state["metrics"]["cycles"]:
            # A new image: every number is n/a, and a model asked about nothing answers with
            # something made up, after seconds of generation.
            return {"narrative": NO_CYCLES_NARRATIVE}
        if models is not None:
            model = models("ALFRED")
        else:
            from batos.models import chat_model

            model = chat_model("ALFRED")
        prompt = prompts.load("audit")
        table = _table(state["metrics"], state["deltas"])
        said = _judged_lines(state.get("judgements") or [], state.get("plan"))
        reply = model.invoke(
            [
                SystemMessage(prompt["system"]),
                HumanMessage(
                    prompt["user"].format(
                        cycles=state["metrics"]["cycles"],
                        verdict=state["verdict"],
                        table=table + ("\n" + said if said else ""),
                    )
                ),
            ]
        )
        return {"narrative": str(reply.content).strip()[:MAX_NARRATIVE_CHARS]}

    def record(state: AuditState) -> AuditState:
        def number_next(root: Any) -> int:
            found = layout.find(root, layout.AUDIT_REPORTS)
            return found.maxKey() + 1 if found is not None and len(found) else 1

        # What is undone, recorded and planned comes from this node's own reading; of the
        # run's state only the narrative is taken, as text, and only while it is of the same
        # reading (cycles committed meanwhile, or an edited state, make it another's).
        fresh = _measure(image)
        narrative = fresh.get("narrative")
        if narrative is None:
            told = state.get("narrative")
            if fresh["metrics"] == state.get("metrics") and isinstance(told, str):
                narrative = told[:MAX_NARRATIVE_CHARS]
            elif not fresh["metrics"]["cycles"]:
                narrative = NO_CYCLES_NARRATIVE
            else:
                narrative = STALE_NARRATIVE
        with image.read() as root:
            upcoming = number_next(root)
        judged = [
            missions.Judgement(**{**j, "tids": tuple(j["tids"])}) for j in fresh["judgements"]
        ]
        outcomes = missions.apply(image, judged, upcoming)
        report = {
            "time": time.time(),
            "metrics": fresh["metrics"],
            "deltas": fresh["deltas"],
            "verdict": fresh["verdict"],
            "narrative": narrative,
            "previous": previous["id"] if (previous := fresh.get("previous")) else None,
            "weights_next": fresh["weights_next"],
            "judged": {o["id"]: o["status"] for o in outcomes},
            "cycles_total": fresh["cycles_total"],
            "newest_cycle": fresh["newest_cycle"],
            "reason": fresh.get("reason"),
            "plan": fresh["plan"],
        }

        def write(root: Any) -> int:
            found = layout.audit_reports(root)
            number = number_next(root)
            found[number] = {**report, "id": number}
            return number

        number = image.transact(write, note=f"audit: CEM {fresh['metrics']['cem']}")
        return {**fresh, "narrative": narrative, "report_id": number}

    def improve(state: AuditState) -> AuditState:
        # The plan its report stored, started once, from the newest report only: the run's
        # state (a report id a client can write) names the report and nothing more.
        number = state.get("report_id")
        with image.read() as root:
            found = reports(root)
            report = found.get(number) if isinstance(number, int) else None
            newest = found.maxKey() if len(found) else None
            checked = _checked(number, report) if report is not None else None
        if (
            not isinstance(number, int)
            or checked is None
            or number != newest
            or checked.get("mission") is not None
        ):
            return {"mission": None}
        chosen = checked.get("plan")
        if not isinstance(chosen, Mapping) or set(chosen) != set(
            missions.Plan.__dataclass_fields__
        ):
            return {"mission": None}

        def claim(root: Any) -> bool:
            # Once: two resumed runs of one report read "no mission yet" alike; the first to
            # commit its claim starts it (a conflict retries the other, which then sees it).
            held = layout.audit_reports(root)[number]
            if held.get("mission") is not None or held.get("mission_claimed"):
                raise Unchanged(False)
            layout.audit_reports(root)[number] = {**held, "mission_claimed": True}
            return True

        if not image.transact(claim, note=f"audit {number}: its mission starts"):
            return {"mission": None}
        try:
            started = missions.start(
                image,
                missions.Plan(**chosen),
                report_id=number,
                metrics=checked["metrics"],
                models=models,
            )
        except missions.MissionError as exc:
            log.warning("no mission started: %s", exc.message)
            return {"mission": None}

        def note(root: Any) -> None:
            found = layout.audit_reports(root)
            found[number] = {**found[number], "mission": started["id"]}

        image.transact(note, note=f"audit {number}: mission {started['id']}")
        return {"mission": started}

    builder = StateGraph(AuditState, input_schema=AuditInput, context_schema=AuditContext)
    builder.add_node("measure", measure)
    builder.add_node("narrate", narrate)
    builder.add_node("record", record)
    builder.add_node("improve", improve)
    builder.add_edge(START, "measure")
    # An idle audit has its narrative from measure: the model is not asked about nothing.
    builder.add_conditional_edges(
        "measure",
        lambda state: "record" if state.get("reason") else "narrate",
        ["narrate", "record"],
    )
    builder.add_edge("narrate", "record")
    builder.add_edge("record", "improve")
    builder.add_edge("improve", END)
    return builder.compile()


def run(image: LivingImage, models: Callable[..., Any] | None = None) -> dict[str, Any]:
    """One audit; the report as written."""
    final = build_graph(image, models).invoke({})
    return show(image, final["report_id"])


def history(image: LivingImage) -> list[dict[str, Any]]:
    """Every well-formed audit report, oldest first (malformed ones skipped, with a warning)."""
    with image.read() as root:
        return valid_reports(root)


def show(image: LivingImage, report_id: int) -> dict[str, Any]:
    with image.read() as root:
        found = reports(root).get(report_id)
        if found is None:
            raise AuditError(
                f"no audit report {report_id} in the image",
                hint="list them with 'batos audit report'",
            )
        report = _checked(report_id, found)
        if report is None:
            raise AuditError(
                f"audit report {report_id} is malformed (the warning above says how)",
                hint="the next audit writes a new one; 'batos audit report' lists the others",
            )
        return report
