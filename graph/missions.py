"""Self-improvement missions: what an audit changes when the CEM falls, and how the next one
keeps or undoes the change.

**Which component** (``targets``). On a *decay* verdict, the defined components ordered by
their weighted fall since the previous report, ``w_c · Δ_c``, most negative first; on
*stagnation*, by their weighted shortfall ``w_c · (1 - H_c)``, largest first. The first
component a mission kind can act on is the mission's target; none on other verdicts, none
while an earlier mission still waits for its judgement, and none at the audit that judged one
(one at a time, each starting from a reading no other mission's change is in, so that a
change in the numbers can be put down to one mission). A change that one of the last
``AVOID_UNDONE`` missions made and had undone is not tried again.

**What it does** (``plan``), by target:

- ``H_struc`` → ``write_facet``: a facet called in the window whose persona has no method for
  it (most called first), else a declared facet of the least-used persona that has none; the
  model that writes its persona's methods (``batos.models.author_model``) writes it through the
  JIT graph (draft, guardian, sandbox trial), and it is installed. Every facet already
  written: the next component is tried.
- ``H_cog`` → ``raise_prior``: the least-used persona's routing prior (``graph.router``) rises
  by ``mission_prior_step``, so the router sends it more requests.
- ``H_sol`` → ``raise_prior`` for the less-used of BRICK and BABS, the personas whose
  protocols (invention, research) the seeds tie to solution novelty.
- ``H_rel``: no mission kind acts on relevance yet; the next component is tried.

**The record.** Each mission is kept in the image (``layout.MISSIONS``) with its hypothesis —
the component, its reading when the mission started, the gain expected
(``mission_min_gain``) and by when (the first audit after ``mission_cycles`` new cycles) —
and the id of the one transaction that made its change (note ``mission N: …``). The record
and the change are separate transactions on purpose: ``batos undo`` reverts a whole
transaction, and undoing the change must not take the record with it.

**Judgement** (``judge``). The first audit that has seen ``mission_cycles`` new cycles since
the mission started compares its reading with the mission's baseline: the mission is *kept*
when its component rose by at least ``mission_min_gain`` and the CEM (both readings weighted
alike, over the components both define: ``cem.comparable``) fell by no more than
``audit_decay``; otherwise its transaction is undone
(``LivingImage.undo``, what ``batos undo TID`` runs) and it is *undone*. An undo that ZODB
refuses — a later transaction changed the same objects — leaves the change in place and the
mission *undo-failed*, with ZODB's reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from BTrees.IOBTree import IOBTree

from batos import settings
from batos.errors import BatosError, ImageError
from graph import cem, records
from graph.router import MAX_PRIOR
from prototypes.codex import FACET_PREFIX, INTENTS_SLOT, PERSONAS
from prototypes.incarnation import personas
from prototypes.install import install_method
from prototypes.uvm import Method
from store.core import layout
from store.core.image import LivingImage, shown_uri
from store.core.transactions import note_text

log = logging.getLogger("batos.audit")

#: Transactions searched for a mission's change (newest first).
HISTORY_SEARCHED = 1000
#: Characters of a request used as a facet's trial sub-query.
MAX_QUERY_CHARS = 400
#: Statuses of a mission that an audit has still to judge.
OPEN = ("running", "pending")
#: Missions looked back over for undone changes not to try again.
AVOID_UNDONE = 3
#: Mission kinds that judge themselves as they end, not at an audit: a retraining
#: (``graph.learning.MISSION_KIND``) is kept or declined on its persona's voice, no CEM
#: component, and is 'running' for as long as it trains.
SELF_JUDGED = ("retrain_adapter",)


class MissionError(BatosError):
    """A self-improvement mission could not make its change; the image is as it was."""


@dataclass(frozen=True)
class Plan:
    """The mission an audit decided on: which change, aimed at which component, and why."""

    kind: str
    target: str
    persona: str
    reason: str
    selector: str | None = None
    query: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- choosing ---------------------------------------------------------------------------------


def targets(
    verdict: str,
    metrics: Mapping[str, Any],
    deltas: Mapping[str, float | None],
    weights: Mapping[str, float],
) -> list[str]:
    """The components a mission should aim at, best first (the module docstring's rule)."""
    defined = [c for c in cem.COMPONENTS if metrics.get(c) is not None]
    if verdict == "decay":
        fell = [c for c in defined if (deltas.get(c) or 0.0) < 0]
        return sorted(fell, key=lambda c: weights.get(c, 0.0) * deltas[c])  # type: ignore[operator]
    if verdict == "stagnation":
        return sorted(defined, key=lambda c: -weights.get(c, 0.0) * (1 - metrics[c]))
    return []


def _least_used(metrics: Mapping[str, Any], among: Sequence[str]) -> list[str]:
    shares = metrics.get("by_persona") or {}
    return sorted(among, key=lambda p: ((shares.get(p) or {}).get("share", 0.0), among.index(p)))


def _undone(root: Any) -> set[tuple[str, str, str | None]]:
    recent = valid_missions(root, AVOID_UNDONE)
    return {(m["kind"], m["persona"], m.get("selector")) for m in recent if m["status"] == "undone"}


def _prior_plan(root: Any, metrics: Mapping[str, Any], target: str) -> Plan | None:
    among = list(PERSONAS) if target == "H_cog" else ["BRICK", "BABS"]
    priors = layout.find(root, layout.ROUTER_PRIORS) or {}
    avoid = _undone(root)
    for persona in _least_used(metrics, among):
        if ("raise_prior", persona, None) in avoid:
            continue
        if float(priors.get(persona, 0.0)) < MAX_PRIOR:
            share = ((metrics.get("by_persona") or {}).get(persona) or {}).get("share", 0.0)
            return Plan(
                "raise_prior",
                target,
                persona,
                f"{target} fell short; {persona} answered {share:.0%} of the window",
            )
    return None


def _facet_plan(root: Any, metrics: Mapping[str, Any], records: Sequence[Mapping]) -> Plan | None:
    found = personas(root)
    avoid = _undone(root)

    def missing(persona: str, selector: str) -> bool:
        receiver = found.get(persona)
        if ("write_facet", persona, selector) in avoid:
            return False
        if receiver is None or selector not in (receiver._slots().get(INTENTS_SLOT) or {}):
            return False
        held = receiver._lookup(selector)
        return held is None or not isinstance(held[1], Method)

    requests = [str(r.get("request") or "") for r in records if r.get("request")]
    query = (requests[-1] if requests else "")[:MAX_QUERY_CHARS]
    for name, _ in cem.facet_uses(records).most_common():
        persona, _, selector = name.partition(".")
        if missing(persona, selector):
            reason = f"{name} was called in the window but {persona} has no method for it"
            return Plan("write_facet", "H_struc", persona, reason, selector, query)
    for persona in _least_used(metrics, list(PERSONAS)):
        receiver = found.get(persona)
        intents = receiver._slots().get(INTENTS_SLOT) or {} if receiver is not None else {}
        for selector in sorted(s for s in intents if s.startswith(FACET_PREFIX)):
            if missing(persona, selector):
                reason = f"{persona} is the least-used persona with a facet not yet written"
                return Plan("write_facet", "H_struc", persona, reason, selector, query)
    return None


def plan(
    root: Any,
    verdict: str,
    metrics: Mapping[str, Any],
    deltas: Mapping[str, float | None],
    weights: Mapping[str, float],
    records: Sequence[Mapping[str, Any]],
) -> Plan | None:
    """The mission this audit starts, or None (module docstring)."""
    for target in targets(verdict, metrics, deltas, weights):
        if target == "H_struc":
            found = _facet_plan(root, metrics, records)
        elif target in ("H_cog", "H_sol"):
            found = _prior_plan(root, metrics, target)
        else:
            found = None
        if found is not None:
            return found
    return None


# -- the record ---------------------------------------------------------------------------------


def missions(root: Any) -> Any:
    """The missions (mission number → record dict); empty in an image without them."""
    return layout.find(root, layout.MISSIONS) or IOBTree()


def valid_missions(root: Any, newest: int | None = None) -> list[dict[str, Any]]:
    """The mission records, oldest first (of the ``newest`` only, when given); a malformed one
    is skipped with a warning, and the audit goes on without it."""
    found = missions(root)
    keys = list(found.keys())
    chosen = keys if newest is None else keys[-newest:] if newest > 0 else []
    checked = (records.readable(records.Mission, "mission", k, found[k]) for k in chosen)
    return [m for m in checked if m is not None]


def _update(image: LivingImage, number: int, note: str, **changes: Any) -> dict[str, Any]:
    def write(root: Any) -> dict[str, Any]:
        found = layout.missions(root)
        record = {**found[number], **changes}
        found[number] = record
        return record

    return image.transact(write, note=f"mission {number}: {note}")


def find_tid(image: LivingImage, note: str) -> str | None:
    """The id of the newest transaction whose note is ``note``; None if none is found."""
    recorded = note_text(note)  # as the transaction wrote it
    for entry in image.history(HISTORY_SEARCHED):
        if entry.description == recorded:
            return entry.tid
    return None


def _change_note(number: int, chosen: Plan) -> str:
    what = f"{chosen.persona}.{chosen.selector}" if chosen.selector else chosen.persona
    return f"mission {number}: {chosen.kind} {what} for {chosen.target}"


# -- the changes --------------------------------------------------------------------------------


def _raise_prior(
    image: LivingImage, chosen: Plan, note: str, models: Callable[..., Any] | None
) -> dict[str, Any]:
    step = settings.get_float("mission_prior_step")

    def change(root: Any) -> dict[str, Any]:
        priors = layout.router_priors(root)
        before = float(priors.get(chosen.persona, 0.0))
        after = min(MAX_PRIOR, before + step)
        priors[chosen.persona] = after
        return {"prior_before": before, "prior_after": after}

    return image.transact(change, note=note)


def _is_instruction(result: Any) -> bool:
    from graph.facets import instruction_from

    try:
        instruction_from(result)
    except ValueError:
        return False
    return True


def _write_facet(
    image: LivingImage, chosen: Plan, note: str, models: Callable[..., Any] | None
) -> dict[str, Any]:
    from graph.jit import JitRunner

    selector = str(chosen.selector)
    query = chosen.query or f"a request for {chosen.persona}'s {selector}"
    # Written and tried on a connection that is always aborted; only the approved source
    # leaves it, to be installed in a transaction of its own (the one an undo reverts).
    with image.connection() as conn:
        receiver = personas(conn.root()).get(chosen.persona)
        if receiver is None:
            raise MissionError(f"the image has no persona {chosen.persona}")
        runner = JitRunner(model_factory=models, acceptance=_is_instruction)
        runner.send(receiver, selector, (query,))
        written = receiver._slots()[selector]
        source, intent, author = written.source, written.intent, written.author
        attempts = int(written.audit.get("attempt") or 1)

    image.transact(
        lambda root: _install_facet(
            root, chosen.persona, selector, source, intent, author, note, attempts
        ),
        note=note,
    )
    return {"source": source, "attempts": attempts, "query": query}


def _install_facet(
    root: Any,
    persona: str,
    selector: str,
    source: str,
    intent: str,
    author: str,
    note: str,
    attempts: int,
) -> None:
    """Install the facet method a mission wrote (``prototypes.install``: the guardian and the
    sandbox compiler again), unless the persona has one by now."""
    target = personas(root)[persona]
    held = target._lookup(selector)
    if held is not None and isinstance(held[1], Method):
        raise MissionError(f"{persona}.{selector} was written meanwhile")
    install_method(
        target,
        selector,
        source,
        intent=intent,
        author=author,
        audit={"mission": note, "attempts": attempts},
    )


#: Mission kind → the function that makes its change in one transaction noted ``note``.
KINDS: dict[str, Callable[..., dict[str, Any]]] = {
    "raise_prior": _raise_prior,
    "write_facet": _write_facet,
}


def start(
    image: LivingImage,
    chosen: Plan,
    *,
    report_id: int,
    metrics: Mapping[str, Any],
    models: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Record the mission, make its change, record the change's transaction id; the record.

    A change that fails leaves the image as it was and the mission ``failed`` with why.
    """
    if not image.db.supportsUndo():
        raise MissionError(
            f"the storage behind {shown_uri(image.uri)} keeps no undo history, so a mission "
            "could not be taken back",
            hint="use a file:// image or a ZEO server over one",
        )
    gain = settings.get_float("mission_min_gain")
    wait = settings.get_int("mission_cycles")
    # H_cog's parts too: the judgement compares H_cog on one definition (cem.comparable).
    baseline = {
        c: metrics.get(c) for c in (*cem.COMPONENTS, "cem", "H_cog_personas", "H_cog_facets")
    }

    def begin(root: Any) -> int:
        found = layout.missions(root)
        number = found.maxKey() + 1 if len(found) else 1
        cycles = layout.find(root, layout.CYCLES)
        found[number] = {
            "id": number,
            "started": time.time(),
            "report": report_id,
            **chosen.as_dict(),
            "status": "running",
            "hypothesis": {
                "component": chosen.target,
                "baseline": metrics.get(chosen.target),
                "gain": gain,
                "cycles": wait,
                "text": f"{chosen.target} rises by at least {gain:g} from "
                f"{metrics.get(chosen.target)} within the first audit after {wait} new cycles",
            },
            "baseline": baseline,
            "cycles_at_start": len(cycles) if cycles is not None else 0,
            "tids": [],
        }
        return number

    number = image.transact(begin, note=f"mission: {chosen.kind} for {chosen.target}")
    note = _change_note(number, chosen)
    try:
        change = KINDS[chosen.kind](image, chosen, note, models)
    except Exception as exc:  # whatever the change raised, nothing of it was committed
        log.warning("mission %d (%s) failed: %s", number, chosen.kind, exc)
        return _update(image, number, "failed", status="failed", error=_short(exc))
    tid = find_tid(image, note)
    log.info("mission %d: %s made in transaction %s", number, chosen.kind, tid)
    return _update(image, number, "pending", status="pending", tids=[tid] if tid else [], **change)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


# -- judging ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """What an audit decided about one open mission (``outcome`` None: not yet judged)."""

    mission: int
    outcome: str | None
    why: str
    changes: dict[str, float | None]
    cem_change: float | None
    tids: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tids": list(self.tids)}


def open_missions(root: Any) -> list[dict[str, Any]]:
    """The missions an audit has still to judge. Not a retraining (``SELF_JUDGED``): judged
    here while it trained, it read as 'interrupted before its change', and once its swap was
    committed, voice being no component the audit measures, the swap would be undone."""
    return [m for m in valid_missions(root) if m["status"] in OPEN and m["kind"] not in SELF_JUDGED]


def assess(
    root: Any, metrics: Mapping[str, Any], weights: Mapping[str, float], image: LivingImage
) -> list[Judgement]:
    """The judgement of every open mission on this reading (module docstring); reads only."""
    gain = settings.get_float("mission_min_gain")
    decay = settings.get_float("audit_decay")
    cycles = layout.find(root, layout.CYCLES)
    now = len(cycles) if cycles is not None else 0
    out = []
    for m in open_missions(root):
        tids = tuple(t for t in m.get("tids") or [] if t)
        if m["status"] == "running":  # the process stopped between the change and its record
            found = find_tid(image, _change_note(m["id"], Plan(**_plan_fields(m))))
            if found is None:
                out.append(Judgement(m["id"], "failed", "interrupted before its change", {}, None))
                continue
            tids = (found,)
        new = now - int(m.get("cycles_at_start") or 0)
        wait = int(m["hypothesis"]["cycles"])
        baseline = m["baseline"]
        # Like for like (cem.comparable): a component defined in only one of the readings,
        # such as H_struc once a facet is called, would move the CEM by entering the mean.
        changes = cem.changes(baseline, metrics)
        cem_change = cem.change(baseline, metrics, weights)
        if new < wait:
            out.append(
                Judgement(m["id"], None, f"{new} of {wait} new cycles", changes, cem_change, tids)
            )
            continue
        moved = changes.get(m["target"])
        if m["target"] == "H_cog" and cem.cog_redefined(baseline, metrics):
            # Said, since the change is not that of the H_cog the two reports show.
            changes_on = " (its persona entropy: facet calls came or went)"
        else:
            changes_on = ""
        if moved is None:
            outcome, why = "undone", f"{m['target']} cannot be measured now"
        elif moved < gain:
            outcome = "undone"
            why = f"{m['target']}{changes_on} moved {moved:+.3f}, under {gain:+.3f}"
        elif cem_change is not None and cem_change < -decay:
            outcome, why = "undone", f"the CEM fell {cem_change:+.3f}"
        else:
            outcome, why = "kept", f"{m['target']}{changes_on} rose {moved:+.3f}"
        out.append(Judgement(m["id"], outcome, why, changes, cem_change, tids))
    return out


def _plan_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: record.get(k) for k in Plan.__dataclass_fields__}


def apply(image: LivingImage, judgements: Sequence[Judgement], report_id: int) -> list[dict]:
    """Carry the judgements out: undo what was not kept, record every outcome on its mission."""
    done = []
    for j in judgements:
        if j.outcome is None:
            continue
        status, error = j.outcome, None
        if j.outcome == "undone":
            try:
                if not j.tids:
                    raise ImageError("the mission's transaction was not found in the history")
                for tid in reversed(j.tids):
                    image.undo(tid)
            except ImageError as exc:
                status, error = "undo-failed", exc.message
                log.warning("mission %d could not be undone: %s", j.mission, exc.message)
        judged = {**j.as_dict(), "report": report_id, "time": time.time(), "error": error}
        done.append(
            _update(image, j.mission, status, status=status, tids=list(j.tids), judged=judged)
        )
    return done


def evidence(judgements: Sequence[Judgement]) -> list[tuple[float, dict[str, float | None]]]:
    """(+1 kept / -1 undone, component changes) of the decided judgements, for the weights."""
    sign = {"kept": 1.0, "undone": -1.0}
    return [(sign[j.outcome], j.changes) for j in judgements if j.outcome in sign]


def history(image: LivingImage) -> list[dict[str, Any]]:
    """Every well-formed mission record, oldest first (malformed ones skipped, with a warning)."""
    with image.read() as root:
        return valid_missions(root)
