"""Personas that learn from accepted cycles: lessons kept in the image, a retraining mission.

**Lessons** (``layout.LESSONS``: persona → cycle id → lesson). Every COMPLETE cycle's commit
carries a ``lesson`` effect: the request and the answer of the persona that led it, with its
provenance (thread, cycle id, time, persona, base model — ``lesson_model``) and ``source``
'cycle'. A cycle the
audit's readings flag — part of it degraded (a facet, the quality gate, retrieval), or its
answer cut short — is kept out. A user marks a cycle good or bad (``mark``: ``/good`` and
``/bad`` in ``batos chat``; a LangGraph client sets the thread's ``feedback`` state, which the
next cycle's commit records); marking a cycle that left no lesson makes one from its cycle
record, with ``source`` 'user'. Bad lessons are never trained on; good ones count twice and
are the last to go when a persona holds more than ``learning_max_lessons``.

**The mission** (``learn``, the heartbeat's ``learn`` job). A persona with at least
``learning_min_examples`` accepted lessons newer than its last retraining gets one
(``batos.training.retrain``): a candidate adapter on its original data plus its lessons,
continuing the served adapter's weights (a warm start; the record's ``start`` says whether it
was warm or cold), judged against the served adapter on held-out prompts, and served only when
it is better by ``learning_voice_margin``. ``batos learn`` shows where each persona stands
(``overview``), runs a mission now and undoes one. The mission is recorded with the others
(``layout.MISSIONS``, kind ``retrain_adapter``, status ``kept`` or ``declined``, both
evaluations, and ``lessons_through``, the newest lesson it learnt; ``failed``, or
``interrupted`` by Ctrl-C or a stop, learnt nothing and moves no mark) and, like them, its
change is one transaction of its own (note ``mission N: retrain_adapter …``): it sets which
adapter version is served (``layout.ADAPTERS``). ``undo`` (or ``batos undo TID``) reverts
that transaction and ``reconcile`` puts the previous version's file back in place; the
versions themselves are never deleted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import psutil
from BTrees.OOBTree import OOBTree
from pydantic import Field

from batos import settings
from batos.errors import BatosError, CheckpointError, ImageError
from graph import records
from prototypes.codex import PERSONAS
from store.checkpoint import effects
from store.core import layout
from store.core.image import LivingImage, shown_uri

log = logging.getLogger("batos.learning")

#: Characters of a lesson's request and answer.
MAX_REQUEST_CHARS = 2000
MAX_ANSWER_CHARS = 4000
#: Characters of a lesson's base model (``lesson_model``).
MAX_MODEL_CHARS = 256
MISSION_KIND = "retrain_adapter"
VERDICTS = ("good", "bad")


class LearningError(BatosError):
    """A lesson or a retraining that cannot be had; nothing was changed."""


@dataclass(frozen=True)
class Retraining:
    """What retraining missions train and judge with: ``trainer`` (a
    ``batos.training.retrain.Trainer``) and ``evaluator`` (an ``Evaluator``); None is the
    real one. ``batos.shell.cli.main(..., retraining=…)`` hands fakes to ``batos learn run``."""

    trainer: Any = None
    evaluator: Any = None


class LessonEffect(records._Closed):
    kind: Literal["lesson"]
    persona: records.Name
    model: Annotated[str, Field(max_length=MAX_MODEL_CHARS)]
    thread_id: records.ThreadId
    request: Annotated[str, Field(min_length=1, max_length=MAX_REQUEST_CHARS)]
    answer: Annotated[str, Field(min_length=1, max_length=MAX_ANSWER_CHARS)]


class FeedbackEffect(records._Closed):
    kind: Literal["feedback"]
    thread_id: records.ThreadId
    cycle: records.Name
    verdict: Literal["good", "bad"]


# -- at commit --------------------------------------------------------------------------------


def lesson_model(model: str) -> str:
    """How a lesson names base ``model`` (a named model, or a path to a GGUF file): as it is
    when it fits ``MAX_MODEL_CHARS``, else by its file name and a digest of the whole path.

    A path can be longer than any bound a record keeps; the key is the same for the same path
    and differs for another, so lessons are found by comparing with ``lesson_model`` of the
    model asked about, whatever its length.
    """
    if len(model) <= MAX_MODEL_CHARS:
        return model
    digest = hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"…/{Path(model).name[: MAX_MODEL_CHARS - 40]} sha256:{digest}"


def flags(cycle_state: Mapping[str, Any]) -> list[str]:
    """Why a cycle is no example to learn from (empty: it is one)."""
    found = [f"{d.get('where')}: {d.get('what')}" for d in cycle_state.get("degraded") or []]
    if cycle_state.get("truncated"):
        found.append("the answer was cut short")
    return found


def effects_for(state: Mapping[str, Any], cycle_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The learning effects of a COMPLETE cycle: its lesson unless it is flagged, and the
    feedback a client left in the thread's state since the previous cycle."""
    out: list[dict[str, Any]] = []
    chosen = (state.get("route") or {}).get("chosen") or []
    request, answer = str(cycle_state.get("request") or ""), str(state.get("response") or "")
    if chosen and request.strip() and answer.strip() and not flags(cycle_state):
        out.append(
            {
                "kind": "lesson",
                "persona": chosen[0],
                "model": lesson_model(settings.get_str("model")),
                "thread_id": cycle_state["thread_id"],
                "request": request.strip()[:MAX_REQUEST_CHARS],
                "answer": answer.strip()[:MAX_ANSWER_CHARS],
            }
        )
    feedback = state.get("feedback")
    if feedback is not None and not (
        isinstance(feedback, Mapping)
        and feedback.get("verdict") in VERDICTS
        and isinstance(feedback.get("cycle"), str)
        and 0 < len(feedback["cycle"]) <= 128
    ):
        log.warning("feedback %.200r in thread %s ignored", feedback, cycle_state["thread_id"])
    elif feedback is not None:
        out.append(
            {
                "kind": "feedback",
                "thread_id": cycle_state["thread_id"],
                "cycle": feedback["cycle"],
                "verdict": feedback.get("verdict"),
            }
        )
    return out


def _lessons(root: Any, persona: str) -> Any:
    """``persona``'s lessons: cycle id → lesson dict (made on its first lesson)."""
    found = layout.lessons(root)
    tree = found.get(persona)
    if tree is None:
        tree = found[persona] = OOBTree()
    return tree


def _bound(tree: Any) -> None:
    """At most ``learning_max_lessons``: the oldest not marked good go first."""
    most = settings.get_int("learning_max_lessons")
    while len(tree) > most:
        victim = next((k for k, v in tree.items() if v.get("verdict") != "good"), tree.minKey())
        del tree[victim]


def _lesson(root: Any, effect: Mapping[str, Any], commit: Mapping[str, Any]) -> None:
    if effect["persona"] not in PERSONAS:
        raise CheckpointError(
            f"a lesson names the unknown persona {effect['persona']!r}; nothing was written",
            hint="effects are written by graph.mind",
        )
    tree = _lessons(root, effect["persona"])
    tree[commit["id"]] = {
        "cycle": commit["id"],
        "thread_id": effect["thread_id"],
        "time": time.time(),
        "persona": effect["persona"],
        "model": effect["model"],
        "request": effect["request"],
        "answer": effect["answer"],
        "source": "cycle",
        "verdict": None,
    }
    _bound(tree)


def _feedback(root: Any, effect: Mapping[str, Any], commit: Mapping[str, Any]) -> None:
    try:
        mark_in(root, effect["thread_id"], effect["cycle"], effect["verdict"])
    except LearningError as exc:  # a client's mistake must not cost the cycle its commit
        log.warning("feedback left in thread %s ignored: %s", effect["thread_id"], exc.message)


#: The effects a cycle's commit carries for learning (``graph.cycle.EFFECT_KINDS`` has them).
EFFECT_KINDS: dict[str, effects.EffectKind] = {
    "lesson": effects.EffectKind(_lesson, LessonEffect),
    "feedback": effects.EffectKind(_feedback, FeedbackEffect),
}


# -- marking ----------------------------------------------------------------------------------


def find(root: Any, cycle_id: str) -> dict[str, Any] | None:
    """The lesson a cycle left, whichever persona holds it."""
    for tree in (layout.find(root, layout.LESSONS) or {}).values():
        found = tree.get(cycle_id)
        if found is not None:
            return dict(found)
    return None


def mark_in(root: Any, thread_id: str, cycle_id: str, verdict: str) -> dict[str, Any]:
    """Mark ``cycle_id`` of ``thread_id`` good or bad in ``root``; the lesson as marked."""
    if verdict not in VERDICTS:
        raise LearningError(f"unknown verdict {verdict!r}", hint="mark a cycle good or bad")
    record = (layout.find(root, layout.CYCLES) or {}).get(cycle_id)
    if record is None or record.get("thread_id") != thread_id:
        raise LearningError(
            f"thread {thread_id!r} has no committed cycle {cycle_id!r}",
            hint="'batos cycles' lists the committed cycles and their threads",
        )
    lesson = find(root, cycle_id)
    if lesson is None:
        route = record.get("route") or {}
        persona = ((route.get("chosen") or []) or record.get("personas") or [None])[0]
        if persona not in PERSONAS:
            raise LearningError(f"cycle {cycle_id} names no persona that answered it")
        lesson = {
            "cycle": cycle_id,
            "thread_id": thread_id,
            "time": time.time(),
            "persona": persona,
            "model": lesson_model(settings.get_str("model")),
            "request": str(record.get("request") or "")[:MAX_REQUEST_CHARS],
            "answer": str(record.get("response") or "")[:MAX_ANSWER_CHARS],
            "source": "user",
        }
    lesson.update(verdict=verdict, marked=time.time())
    tree = _lessons(root, lesson["persona"])
    tree[cycle_id] = lesson
    _bound(tree)
    return lesson


def mark(image: LivingImage, thread_id: str, cycle_id: str, verdict: str) -> dict[str, Any]:
    """Mark one committed cycle good or bad, in a transaction of its own; the lesson.

    Example: ``mark(image, "chat-1", state["cycle"]["id"], "good")``
    """
    return image.transact(
        lambda root: mark_in(root, thread_id, cycle_id, verdict),
        note=f"lesson: cycle {cycle_id} marked {verdict}",
    )


def lessons(root: Any, persona: str) -> list[dict[str, Any]]:
    """Every lesson of ``persona``, oldest first."""
    tree = (layout.find(root, layout.LESSONS) or {}).get(persona)
    return [dict(v) for v in tree.values()] if tree is not None else []


def accepted(root: Any, persona: str, model: str | None = None) -> list[dict[str, Any]]:
    """The lessons to train on: not marked bad, of base ``model`` when given, oldest first."""
    named = None if model is None else lesson_model(model)
    return [
        x
        for x in lessons(root, persona)
        if x.get("verdict") != "bad" and (named is None or x.get("model") == named)
    ]


# -- the mission ------------------------------------------------------------------------------


#: Statuses of a retraining that trained and was judged: its lessons were learnt, whether its
#: adapter was served (kept, later perhaps undone) or not (declined).
LEARNT = ("kept", "declined", "undone", "undo-failed")


def _last_mission(root: Any, persona: str, model: str) -> dict[str, Any] | None:
    """The persona's last retraining on ``model`` that learnt its lessons (``LEARNT``): one
    that failed, was interrupted or is still running learnt nothing, and records written
    before ``lessons_through`` was set only at the end carry it from their start."""
    from graph.missions import valid_missions

    done = [
        m
        for m in valid_missions(root)
        if m["kind"] == MISSION_KIND
        and m["persona"] == persona
        and m.get("model") == model
        and m["status"] in LEARNT
    ]
    return done[-1] if done else None


#: How long past ``learning_train_seconds`` a running retraining is still taken as alive: its
#: evaluation and swap come after the training. Older, its process is taken as gone (killed
#: without a word), so that it does not keep the persona from ever being retrained again. On
#: the host that ran it, a process that has ended is seen at once (``process_ended``).
RUNNING_GRACE_SECONDS = 1800.0


def _this_process() -> dict[str, Any]:
    """Who runs a retraining: host, pid and the process's start time (a pid is reused), and
    where that pid means something: the boot and the pid namespace (containers given one
    host name share it, each with pids of its own)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": psutil.Process().create_time(),
        "pids": _pid_space(),
    }


def _pid_space() -> str:
    """This boot's id and this process's pid namespace, where the system tells them (Linux);
    '' where it does not, and then no process of another is ever taken as ended."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        return f"{boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def process_ended(mission: Mapping[str, Any]) -> bool:
    """True when ``mission`` ran in a process of this host that no longer lives (killed with
    no chance to record how it ended). A mission of another host, or one recorded before
    missions named their process, is never taken as ended here: it is judged by its age."""
    runner = mission.get("process")
    if not isinstance(runner, Mapping) or runner.get("host") != socket.gethostname():
        return False
    space = _pid_space()
    if not space or runner.get("pids") != space:  # its pids are not ours to look up
        return False
    try:
        process = psutil.Process(int(runner["pid"]))
        return abs(process.create_time() - float(runner["since"])) > 1.0  # the pid reused
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def running_mission(root: Any, persona: str, model: str) -> dict[str, Any] | None:
    """The persona's retraining on ``model`` that is running now, if any: a second one would
    train on the same lessons beside it. One whose process has ended (``process_ended``), or
    older than ``RUNNING_GRACE_SECONDS`` past the training time, is not running."""
    alive = time.time() - settings.get_float("learning_train_seconds") - RUNNING_GRACE_SECONDS
    for m in _recorded_running(root, persona, model):
        if float(m.get("started") or 0) > alive and not process_ended(m):
            return m
    return None


def _recorded_running(root: Any, persona: str, model: str) -> list[dict[str, Any]]:
    """The persona's retrainings on ``model`` whose record says running, alive or not."""
    from graph.missions import valid_missions

    return [
        m
        for m in valid_missions(root)
        if m["kind"] == MISSION_KIND
        and m["persona"] == persona
        and m.get("model") == model
        and m["status"] == "running"
    ]


def _close_ended(root: Any, persona: str, model: str) -> None:
    """Record the persona's retrainings on ``model`` whose process ended without a word:
    kept when the image serves their adapter (the swap was committed before the end), else
    interrupted; left 'running', they would read as running in every listing for ever."""
    served = layout.adapters(root).get(_key(model, persona)) or {}
    found = layout.missions(root)
    for m in _recorded_running(root, persona, model):
        if process_ended(m):
            runner = m["process"]
            why = f"its process (pid {runner['pid']} on {runner['host']}) ended without a word"
            kept = served.get("mission") == m["id"]
            found[m["id"]] = {
                **found[m["id"]],
                "status": "kept" if kept else "interrupted",
                "finished": time.time(),
                "error": f"stopped after its swap ({why})" if kept else f"interrupted ({why})",
            }


def new_accepted(root: Any, persona: str, model: str) -> list[dict[str, Any]]:
    """Accepted lessons newer than the persona's last retraining on ``model`` that learnt
    them (``_last_mission``)."""
    last = _last_mission(root, persona, model)
    through = (last or {}).get("lessons_through") or ""
    return [x for x in accepted(root, persona, model) if x["cycle"] > through]


def due(image: LivingImage, model: str | None = None) -> list[tuple[str, int]]:
    """(persona, new accepted lessons) of the personas due a retraining, most first; none
    for a model given as a GGUF path, whose adapters no mission can train (lessons are still
    kept, for the day the same lessons are trained on a named model)."""
    from store.core.model_files import catalog

    model = model or settings.get_str("model")
    if model not in catalog():
        return []
    least = settings.get_int("learning_min_examples")
    with image.read() as root:
        counts = [
            (p, len(new_accepted(root, p, model)))
            for p in PERSONAS
            if running_mission(root, p, model) is None  # being retrained now
        ]
    return sorted(((p, n) for p, n in counts if n >= least), key=lambda x: -x[1])


def _key(model: str, persona: str) -> str:
    return f"{model}/{persona}"


def _note(number: int, persona: str) -> str:
    return f"mission {number}: {MISSION_KIND} {persona} for voice"


def retrain_mission(
    image: LivingImage,
    persona: str,
    *,
    model: str | None = None,
    evaluator: Any = None,
    trainer: Any = None,
    seconds: float | None = None,
    force: bool = False,
    on_step: Callable[[int, int, float], None] | None = None,
    tell: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Retrain ``persona``'s adapter on its lessons and serve it if it is better; the mission.

    Raises ``LearningError`` (recording nothing) when the persona has fewer than
    ``learning_min_examples`` new accepted lessons, unless ``force``. ``seconds`` bounds the
    training (default ``learning_train_seconds``); ``evaluator`` and ``trainer`` replace the
    real ones (``batos.training.retrain``); ``on_step`` and ``tell`` follow its progress.
    The record says whether the candidate started warm, from the served adapter, or cold.
    """
    from batos.training import lora, retrain
    from graph.audit import newest_report

    model = model or settings.get_str("model")
    least = settings.get_int("learning_min_examples")
    if not image.db.supportsUndo():
        raise LearningError(
            f"the storage behind {shown_uri(image.uri)} keeps no undo history, so a swap could "
            "not be taken back",
            hint="use a file:// image or a ZEO server over one",
        )
    with image.read() as root:
        fresh = new_accepted(root, persona, model)
        every = accepted(root, persona, model)
        last = _last_mission(root, persona, model)
    if len(fresh) < least and not force:
        raise LearningError(
            f"{persona} has {len(fresh)} new accepted lessons on {model}, fewer than {least}",
            hint="it is retrained once it has learnt more (BATOS_LEARNING_MIN_EXAMPLES); "
            "'batos learn run PERSONA --force' retrains it now",
        )
    # A forced mission with nothing new keeps the mark where the last one left it.
    through = fresh[-1]["cycle"] if fresh else (last or {}).get("lessons_through") or ""
    served = retrain.served_sha(model, persona)
    margin = settings.get_float("learning_voice_margin")

    def begin(root: Any) -> int:
        _close_ended(root, persona, model)
        # Checked in the transaction that records this one, so two cannot both pass.
        other = running_mission(root, persona, model)
        if other is not None:
            raise LearningError(
                f"{persona}'s adapter on {model} is being retrained already (mission "
                f"{other['id']}); a second retraining would train on the same lessons",
                hint="wait for it to end ('batos learn' shows it)",
            )
        adapters = layout.adapters(root)
        if _key(model, persona) not in adapters and served is not None:
            # What an undo of the swap returns to.
            adapters[_key(model, persona)] = {"sha256": served, "mission": None}
        found = layout.missions(root)
        number = found.maxKey() + 1 if len(found) else 1
        report = newest_report(root)
        found[number] = {
            "id": number,
            "started": time.time(),
            "report": report["id"] if report else 0,
            "kind": MISSION_KIND,
            "target": "voice",
            "persona": persona,
            "reason": f"{len(fresh)} new accepted lessons" + (" (forced)" if force else ""),
            "status": "running",
            "hypothesis": {
                "component": "voice",
                "baseline": None,
                "gain": margin,
                "cycles": 0,
                "text": f"the retrained adapter's voice beats the served one's by {margin:g}",
            },
            "baseline": {},
            "tids": [],
            "model": model,
            "process": _this_process(),
        }
        return number

    number = image.transact(begin, note=f"mission: {MISSION_KIND} {persona}")

    def finish(status: str, **changes: Any) -> dict[str, Any]:
        def write(root: Any) -> dict[str, Any]:
            found = layout.missions(root)
            found[number] = record = {
                **found[number],
                "status": status,
                "finished": time.time(),
                **changes,
            }
            return record

        return image.transact(write, note=f"mission {number}: {status}")

    def example(x: Mapping[str, Any]) -> lora.Example:
        return lora.Example(x["request"], x["answer"])

    note = _note(number, persona)
    result: dict[str, Any] = {}
    try:
        try:
            evaluator = evaluator or retrain.VoiceEvaluator(model)
            done = retrain.retrain(
                model,
                persona,
                [example(x) for x in every if x.get("verdict") != "good"],
                evaluator,
                preferred=[example(x) for x in every if x.get("verdict") == "good"],
                seconds=seconds,
                on_step=on_step,
                tell=tell,
                **({"trainer": trainer} if trainer else {}),
            )
        except Exception as exc:  # nothing served changed: the mission failed, the image is as was
            log.warning("mission %d (%s %s) failed: %s", number, MISSION_KIND, persona, exc)
            return finish("failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        result = done.as_dict()
        # Its lessons are learnt only now, judged: the mark moves with a kept or declined
        # mission, never with one that failed or was stopped.
        if not done.decision.swap:
            return finish("declined", evaluation=result, start=done.start, lessons_through=through)

        def swap(root: Any) -> None:
            layout.adapters(root)[_key(model, persona)] = {
                "sha256": done.candidate_sha256,
                "mission": number,
                "previous": done.current_sha256,
                "entry": dict(done.entry),
                "swapped": time.time(),
            }

        image.transact(swap, note=note)
        from graph.missions import find_tid

        tid = find_tid(image, note)
        reconcile(image)
        return finish(
            "kept",
            evaluation=result,
            start=done.start,
            tids=[tid] if tid else [],
            lessons_through=through,
        )
    except BaseException as exc:
        # Ctrl-C (KeyboardInterrupt), a stop, or the image failing under the record: a mission
        # left 'running' would be running for ever. It is recorded as it ended and what
        # stopped it goes on up.
        _stopped(image, number, note, exc, finish, result, through)
        raise


def _stopped(
    image: LivingImage,
    number: int,
    note: str,
    exc: BaseException,
    finish: Callable[..., dict[str, Any]],
    result: Mapping[str, Any],
    through: str,
) -> None:
    """Record retraining ``number`` that ``exc`` stopped: kept when its swap was committed
    (the image serves the candidate then), else interrupted (not an ``Exception``) or
    failed; a record that cannot be written is logged, ``exc`` matters more."""
    from graph.missions import find_tid

    why = (type(exc).__name__ + (f": {exc}" if str(exc) else ""))[:2000]
    try:
        tid = find_tid(image, note)
        if tid is not None:
            finish(
                "kept",
                evaluation=dict(result),
                start=result.get("start"),
                tids=[tid],
                lessons_through=through,
                error=f"stopped after its swap ({why})",
            )
        else:
            status = "failed" if isinstance(exc, Exception) else "interrupted"
            finish(status, error=why if status == "failed" else f"interrupted ({why})")
        log.warning("mission %d (%s) stopped: %s", number, MISSION_KIND, why)
    except Exception as failed:
        log.warning("mission %d (%s) stopped; its record stays: %s", number, MISSION_KIND, failed)


def overview(image: LivingImage, model: str | None = None, recent: int = 3) -> list[dict[str, Any]]:
    """Where each persona's learning stands on ``model``: its lessons (``lessons``,
    ``accepted``, ``good``, ``bad``, ``new`` since its last retraining), the adapter it serves
    (``served``: sha256 of the file; ``recorded``: the image's record of it, with the
    ``mission`` that swapped it in and when; ``trained``: the manifest's date) and its
    ``recent`` last retraining missions, newest first.

    Example: ``[(p["persona"], p["new"]) for p in overview(image)]``
    """
    from batos.models.modelfile import adapter_path
    from batos.training import lora, retrain
    from graph.missions import valid_missions

    model = model or settings.get_str("model")
    try:
        manifest = lora.read_manifest(adapter_path(model)).get("personas") or {}
    except BatosError as exc:
        log.warning("the adapters' manifest of %s cannot be read: %s", model, exc.message)
        manifest = {}
    out = []
    with image.read() as root:
        done = [m for m in valid_missions(root) if m["kind"] == MISSION_KIND]
        recorded = layout.find(root, layout.ADAPTERS) or {}
        for persona in PERSONAS:
            mine = [x for x in lessons(root, persona) if x.get("model") == lesson_model(model)]
            served = recorded.get(_key(model, persona))
            out.append(
                {
                    "persona": persona,
                    "lessons": len(mine),
                    "accepted": sum(1 for x in mine if x.get("verdict") != "bad"),
                    "good": sum(1 for x in mine if x.get("verdict") == "good"),
                    "bad": sum(1 for x in mine if x.get("verdict") == "bad"),
                    "new": len(new_accepted(root, persona, model)),
                    "served": retrain.served_sha(model, persona),
                    "recorded": dict(served) if served is not None else None,
                    "trained": (manifest.get(persona.lower()) or {}).get("date"),
                    "missions": [
                        m
                        for m in reversed(done)
                        if m["persona"] == persona and m.get("model") == model
                    ][:recent],
                }
            )
    return out


def reconcile(image: LivingImage) -> list[str]:
    """Put in place the adapter version the image says each persona is served with (after an
    undo, or a crash between a swap and its file); what was changed, as 'model/persona'."""
    from batos.training import retrain

    with image.read() as root:
        wanted = {k: dict(v) for k, v in (layout.find(root, layout.ADAPTERS) or {}).items()}
    changed = []
    for key, served in wanted.items():
        model, _, persona = key.partition("/")
        try:
            if retrain.served_sha(model, persona) == served["sha256"]:
                continue
            retrain.install_version(model, persona, served["sha256"], served.get("entry"))
        except BatosError as exc:
            log.warning("cannot serve %s's adapter version: %s", key, exc.message)
            continue
        except OSError as exc:  # a read-only or full Modelfiles folder: serve what is there
            log.warning("cannot serve %s's adapter version: %s", key, exc)
            continue
        changed.append(key)
    return changed


def undo(image: LivingImage, number: int, model: str | None = None) -> dict[str, Any]:
    """Take a kept retraining back: undo its swap, serve the previous adapter again.

    ``model``, when given, is the base model the caller means: a mission that retrained an
    adapter of another one is refused rather than undone behind the caller's back.
    """
    from graph.missions import Judgement, apply, valid_missions

    with image.read() as root:
        found = {m["id"]: m for m in valid_missions(root)}.get(number)
    if found is None or found["kind"] != MISSION_KIND or found["status"] != "kept":
        raise LearningError(
            f"mission {number} is no kept {MISSION_KIND} mission",
            hint="'batos audit report' lists the missions",
        )
    if model is not None and found.get("model") != model:
        raise LearningError(
            f"mission {number} retrained {found['persona']}'s adapter on "
            f"{found.get('model')}, not on {model}",
            hint=f"'batos learn --model {found.get('model')}' lists that model's missions",
        )
    tids = tuple(t for t in found.get("tids") or [] if t)
    done = apply(image, [Judgement(number, "undone", "undone by hand", {}, None, tids)], 0)
    if done and done[0]["status"] == "undo-failed":
        raise ImageError(f"mission {number} could not be undone: {done[0]['judged']['error']}")
    reconcile(image)
    return done[0]
