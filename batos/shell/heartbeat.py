"""The heartbeat: APScheduler runs the image's upkeep unattended.

Six jobs, each on an interval set in settings — ``audit`` (ALFRED's self-audit,
``graph.audit``), ``facets`` (the codex's facet methods the image lacks, written off the user's
clock: ``graph.facet_writing``), ``curate`` (memory curation, what ``batos curate`` does),
``prune`` (the checkpoints of every thread trimmed to ``heartbeat_prune_keep``) and ``methods``
(every generated method's stored examples run again; one that fails them is taken out:
``graph.rejection``) and ``learn`` (a persona with enough new accepted lessons gets its adapter
retrained, served only if better: ``graph.learning``). They live in the image
(``store.core.jobstore.ImageJobStore``), so they survive restarts; missed runs are coalesced
into one, a job never overlaps itself (``max_instances=1``), and a job that raises is logged while
the scheduler goes on. Only the holder of the image's lease runs jobs: a second heartbeat waits
for it (or, with ``once``, says who holds it and stops).

Each job returns what it decided (``Decided``: a sentence and the same facts as data); each run
becomes one ``Outcome`` — job, start, duration, ok, decision — handed to ``on_outcome`` as it
ends, which ``batos heartbeat`` prints as a line or a JSON object. A job's interval is its
setting unless ``intervals`` names it (``--every``), which holds for this heartbeat alone: the
image keeps the setting's. A changed interval never delays a job: its next run is the sooner
of the one stored and a full interval from the start. ``plan()`` says what will run and when
without writing to the image.

The image may be served by ZEO beside ``batos serve``; when it cannot be reached, lease renewal
is retried with doubling pauses (up to a minute) and each failure is logged, and APScheduler
retries reading its job store on its own; neither crashes the process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_SUBMITTED,
    JobExecutionEvent,
    JobSubmissionEvent,
)
from apscheduler.executors.base import run_job as run_scheduled
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED
from apscheduler.triggers.interval import IntervalTrigger

from batos import settings
from batos.errors import BatosError, ConfigurationError
from store.core.image import LivingImage, shown_uri
from store.core.jobstore import (
    ImageJobStore,
    acquire_lease,
    job_running,
    lease_holder,
    release_lease,
)

log = logging.getLogger("batos.heartbeat")

#: Longest pause between two attempts to reach an unreachable image.
MAX_BACKOFF_S = 60.0


class LeaseHeld(BatosError):
    """Another heartbeat acts on this image."""

    exit_code = 3


@dataclass
class Decided:
    """What one job run decided: a sentence for people and the same facts as data."""

    said: str
    facts: dict[str, Any] = field(default_factory=dict)


def _audit(image: LivingImage, models: Callable[..., Any] | None) -> Decided:
    from graph import audit

    report = audit.run(image, models)
    cem = report["metrics"]["cem"]
    said = f"audit report {report['id']}: CEM {'n/a' if cem is None else f'{cem:.3f}'}"
    said += f" ({report['verdict']}" + (f": {report['reason']})" if report.get("reason") else ")")
    for number, status in (report.get("judged") or {}).items():
        said += f"; mission {number} {status}"
    if report.get("mission"):
        said += f"; mission {report['mission']} started"
    facts = {
        "report": report["id"],
        "cem": cem,
        "verdict": report["verdict"],
        "reason": report.get("reason"),
        "judged": {str(k): v for k, v in (report.get("judged") or {}).items()},
        "mission": report.get("mission"),
    }
    return Decided(said, facts)


def _curate(image: LivingImage, models: Callable[..., Any] | None) -> Decided:
    from graph.curation import babs_summarizer
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.curator import Curator

    catalog = KnowledgeCatalog.open(image)
    try:
        report = Curator(catalog, babs_summarizer(models)).run()
    finally:
        catalog.close()
    return Decided(
        f"curated: {report.archived_chunks} chunk(s) folded into {len(report.archives)}",
        {"archived_chunks": report.archived_chunks, "archives": len(report.archives)},
    )


def _prune(image: LivingImage, models: Callable[..., Any] | None) -> Decided:
    from store.checkpoint.saver import ZODBSaver

    keep = settings.get_int("heartbeat_prune_keep")
    with ZODBSaver(image) as saver:
        deleted = saver.trim(None, keep=keep)
    return Decided(
        f"pruned {deleted} checkpoint(s), kept {keep} per namespace",
        {"deleted": deleted, "keep": keep},
    )


def _facets(image: LivingImage, models: Callable[..., Any] | None) -> Decided:
    from graph import facet_writing

    todo = facet_writing.due(image)
    if not todo:
        return Decided("facets: none due", {"due": 0, "wrote": [], "failed": []})
    done = facet_writing.write_all(image, models, todo[: facet_writing.PER_RUN])
    wrote = [w.key for w in done if w.ok]
    failed = [w.key for w in done if not w.ok]
    said = f"facets: wrote {len(wrote)}" + (f" ({', '.join(wrote)})" if wrote else "")
    if failed:
        said += f"; {len(failed)} could not be written ({', '.join(failed)}): tried again later"
    left = len(todo) - len(done)
    said += f"; {left} still due" if left else ""
    return Decided(said, {"due": len(todo), "wrote": wrote, "failed": failed})


def _methods(image: LivingImage, models: Callable[..., Any] | None) -> Decided:
    from graph import rejection

    report = rejection.check_methods(image)
    said = f"methods: {report.checked} checked against their examples"
    removed = [f"{r.path}.{r.selector}" for r in report.removed]
    if removed:
        said += f"; took out {len(removed)} that fail them ({', '.join(removed)})"
    if report.unchecked:
        said += f"; {len(report.unchecked)} could not be checked ({report.unchecked[0]})"
    return Decided(
        said,
        {"checked": report.checked, "removed": removed, "unchecked": len(report.unchecked)},
    )


def _learn(image: LivingImage, models: Callable[..., Any] | None) -> Decided:
    from graph import learning

    restored = learning.reconcile(image)
    todo = learning.due(image)
    if not todo:
        return Decided("learn: no persona has enough new accepted lessons", {"due": []})
    persona, count = todo[0]  # one retraining per run: it is the heaviest job there is
    mission = learning.retrain_mission(image, persona)
    said = f"learn: mission {mission['id']} retrained {persona} on {count} new lessons, "
    said += mission["status"]
    said += f" ({mission['start']} start)" if mission.get("start") else ""
    why = (mission.get("evaluation") or {}).get("why") or mission.get("error")
    said += f" ({why})" if why else ""
    facts = {
        "due": [p for p, _ in todo],
        "mission": mission["id"],
        "status": mission["status"],
        "start": mission.get("start"),
        "evaluation": mission.get("evaluation"),
        "restored": restored,
    }
    return Decided(said, facts)


#: job id → (what it does, the setting holding its interval in seconds).
JOBS: dict[str, tuple[Callable[[LivingImage, Callable[..., Any] | None], Decided], str]] = {
    "audit": (_audit, "heartbeat_audit_seconds"),
    "facets": (_facets, "heartbeat_facets_seconds"),
    "curate": (_curate, "heartbeat_curate_seconds"),
    "prune": (_prune, "heartbeat_prune_seconds"),
    "methods": (_methods, "heartbeat_methods_seconds"),
    "learn": (_learn, "heartbeat_learn_seconds"),
}

#: The heartbeat acting in this process; the stored jobs name ``run_job`` by reference (that is
#: what APScheduler can pickle), and it finds the image and model factory here.
_ACTIVE: dict[str, Heartbeat] = {}
#: The one function a stored job may call: a job naming any other is skipped, never imported.
JOB_FUNCTION = f"{__name__}:run_job"


def run_job(name: str) -> str | None:
    """What a stored job calls: job ``name`` of the heartbeat acting in this process."""
    beat = _ACTIVE.get("beat")
    if beat is None:
        raise BatosError(f"job {name!r} ran with no heartbeat acting in this process")
    try:
        return beat.run(name)
    except Exception:
        # Already logged and reported by run(); raised on, APScheduler's executor would log
        # it a second time (and its traceback a third, with -v).
        return None


def _one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces made single spaces."""
    return " ".join(text.split())


@dataclass
class Outcome:
    """One job run: the record behind both the terminal line and the JSON line."""

    job: str
    ok: bool
    said: str
    seconds: float
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    decided: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "time": self.started.isoformat(timespec="seconds"),
            "job": self.job,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "said": self.said,
            "decided": self.decided,
        }

    def line(self) -> str:
        """The record as one line for people: local time, ✓/✗, job, duration, decision."""
        when = self.started.astimezone().strftime("%Y-%m-%d %H:%M:%S")
        return f"{when} {'✓' if self.ok else '✗'} {self.job} ({self.seconds:.1f}s): {self.said}"


@dataclass(frozen=True)
class Interval:
    """A job's interval in seconds and where it came from: ``--every``, a variable, default."""

    seconds: float
    source: str


@dataclass(frozen=True)
class Planned:
    """A job as the heartbeat will run it: ``next_run`` None means due as soon as it starts
    (a job new to the image); ``from_start`` that its next run is a full interval after the
    start (now, for a plan), sooner than the one stored; ``stored`` is the interval in the
    image when the heartbeat writes another one there."""

    job: str
    interval: Interval
    next_run: datetime | None
    stored: float | None = None
    corrupt: str | None = None
    from_start: bool = False


def _seconds(job: Any) -> float | None:
    """A stored job's interval in seconds; None for a job with no interval trigger."""
    interval = getattr(getattr(job, "trigger", None), "interval", None)
    return None if interval is None else interval.total_seconds()


def _next_run(stored: datetime | None, now: datetime, interval: timedelta) -> datetime | None:
    """A stored job's next run under ``interval`` from ``now``: the one stored, unless a whole
    interval from now comes sooner. None (a paused job) stays None."""
    return None if stored is None else min(stored, now + interval)


#: Seconds before the scheduler tries again after it could not read or write its jobs.
SCHEDULER_RETRY_S = 5.0


class _Scheduler(BackgroundScheduler):
    """APScheduler's background scheduler, minus one pass too many at shutdown.

    ``shutdown()`` stops the executors, then wakes the scheduler's thread, which processes the
    due jobs once more before it sees the stop: every due job fails to reach the stopped
    executor ("Error submitting job") and is moved to its next interval without having run.
    Stopping a heartbeat (or Ctrl-C in ``--once``) while jobs were due pushed them back by
    an interval; here a stopped scheduler processes nothing, so they stay due.
    """

    def _process_jobs(self) -> float | None:
        if self.state == STATE_STOPPED:
            return None
        try:
            return super()._process_jobs()
        except Exception as exc:
            # The job store writes each job's next run into the image: with the image out of
            # reach (a ZEO or PostgreSQL server restarting) that raised out of APScheduler's
            # loop and ended its thread, and the heartbeat went on holding the lease with no
            # job ever running again. A job handed over before the failure may run again.
            log.warning(
                "could not schedule the jobs in the image (%s); trying again in %.0f s",
                _one_line(str(exc)),
                SCHEDULER_RETRY_S,
            )
            return SCHEDULER_RETRY_S


class _Executor(ThreadPoolExecutor):
    """APScheduler's thread pool, whose shutdown drops the runs still waiting for a worker.

    Its own shutdown lets the pool run every queued job before it returns: on a new image,
    where every job is due at once and two run at a time, a first Ctrl-C ("stop once the
    running job has finished") waited for all of them, the model's included. Here the queued
    runs are cancelled and never start; the heartbeat leaves them due (``_leave_due``)."""

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        def callback(future: Any) -> None:
            if future.cancelled():  # dropped at shutdown, never run: neither success nor error
                return
            exc = future.exception()
            if exc is not None:
                self._run_job_error(job.id, exc, exc.__traceback__)
            else:
                self._run_job_success(job.id, future.result())

        future = self._pool.submit(
            run_scheduled, job, job._jobstore_alias, run_times, self._logger.name
        )
        future.add_done_callback(callback)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait, cancel_futures=True)


@dataclass
class Heartbeat:
    """The scheduler over ``image``'s job store. ``intervals`` (job → seconds) overrides the
    interval settings; ``on_outcome`` hears every job run as it ends, from the job's thread."""

    image: LivingImage
    models: Callable[..., Any] | None = None
    holder: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )
    intervals: Mapping[str, float] = field(default_factory=dict)
    on_outcome: Callable[[Outcome], None] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.intervals) - set(JOBS))
        if unknown:
            raise ConfigurationError(
                f"no heartbeat job {', '.join(map(repr, unknown))}",
                hint=f"the jobs are {', '.join(JOBS)}",
            )
        low, high = settings.MIN_INTERVAL_SECONDS, settings.MAX_INTERVAL_SECONDS
        bad = [f"{k}={v}" for k, v in self.intervals.items() if not low <= v <= high]
        if bad:
            raise ConfigurationError(
                f"a job's interval must be a number of seconds from {low:g} to {high:.0f}, "
                f"not {', '.join(bad)}",
                hint="for example --every audit=600",
            )
        for name in JOBS:  # a setting it cannot use is refused before anything is written
            self.interval(name)
        # An interval from --every holds for this heartbeat alone: stored, it would come back
        # at the next one, and stay until a heartbeat without it changed it again.
        self.store = ImageJobStore(
            self.image,
            functions={JOB_FUNCTION},
            overrides={
                name: (self._trigger(self.interval(name)), self._trigger(self.kept(name)))
                for name in self.intervals
            },
        )
        self.scheduler = _Scheduler(
            jobstores={"default": self.store},
            executors={"default": _Executor(max_workers=2)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=UTC,
        )
        self.outcomes: list[Outcome] = []
        #: (job, when it was due) → its runs handed to the executor that have not ended: the
        #: scheduler moves a job to its next run as it hands it over, so these are what
        #: ``abandon`` must leave due. Counted both ways, the events coming from two threads.
        self._held: dict[tuple[str, datetime], int] = {}
        self._held_lock = threading.Lock()
        self.scheduler.add_listener(
            self._track, EVENT_JOB_SUBMITTED | EVENT_JOB_EXECUTED | EVENT_JOB_ERROR
        )

    # -- the jobs -------------------------------------------------------------------------

    def interval(self, name: str) -> Interval:
        """Job ``name``'s interval: the ``intervals`` given, else its setting."""
        if name in self.intervals:
            return Interval(float(self.intervals[name]), "--every")
        return self.kept(name)

    def kept(self, name: str) -> Interval:
        """Job ``name``'s interval as the image keeps it: its setting, whatever ``intervals``
        says."""
        setting = settings.SETTINGS[JOBS[name][1]]
        return Interval(settings.get_float(setting.name), settings.origin(setting.name))

    @staticmethod
    def _trigger(interval: Interval) -> IntervalTrigger:
        return IntervalTrigger(seconds=interval.seconds, timezone=UTC)

    def run(self, name: str) -> str:
        started, clock = datetime.now(UTC), time.monotonic()
        marked = borrowed = False
        try:
            if not job_running(self.image, self.holder, name, True):
                # Its own lease lapsed unrenewed (the process was stopped, the image out of
                # its reach), or a job run by hand, outside forever() and once(): the lease
                # is taken if nobody else has it (and given back after, for one by hand).
                borrowed = self._lease() is not None and _ACTIVE.get("beat") is not self
            if not job_running(self.image, self.holder, name, True):
                # Another heartbeat took the lease over meanwhile: one acts at a time.
                held = lease_holder(self.image) or {}
                raise LeaseHeld(
                    f"not run: heartbeat {held.get('holder')} holds the lease on "
                    f"{shown_uri(self.image.uri)} now",
                    hint="this heartbeat stops; the other runs the jobs",
                )
            marked = True  # a heartbeat killed from here on leaves the job to the next one
            decided = JOBS[name][0](self.image, self.models)
        except Exception as exc:
            seconds = time.monotonic() - clock
            # One line, as every run's record is: a BatosError's text carries its hint on a
            # line of its own, which is kept apart here.
            message = exc.message if isinstance(exc, BatosError) else str(exc)
            hint = exc.hint if isinstance(exc, BatosError) else None
            error = _one_line(f"{type(exc).__name__}: {message}")
            hint = _one_line(hint) if hint else None
            facts = {"error": error, "hint": hint}
            self._heard(Outcome(name, False, error, seconds, started, facts))
            log.error(
                "job %s failed after %.1f s: %s%s",
                name,
                seconds,
                error,
                f" (hint: {hint})" if hint else "",
                exc_info=True,  # shown with -v alone
            )
            raise
        finally:
            if marked:
                self._ended(name)
            if borrowed:
                try:
                    release_lease(self.image, self.holder)
                except Exception as exc:  # it expires by itself
                    log.warning("could not give the lease back (%s)", exc)
        outcome = Outcome(name, True, decided.said, time.monotonic() - clock, started)
        outcome.decided = decided.facts
        self._heard(outcome)
        log.info("job %s (%.1f s): %s", name, outcome.seconds, decided.said)
        return decided.said

    def _ended(self, name: str) -> None:
        try:
            job_running(self.image, self.holder, name, False)
        except Exception as exc:  # the job's outcome stands; the mark goes with the lease
            log.warning("could not record that job %s ended (%s)", name, exc)

    def _take_over(self, lease: Mapping[str, Any]) -> None:
        """Make due the jobs a killed heartbeat left started and unfinished (``lease``'s
        ``orphaned``): the scheduler had moved each to its next interval as it ran it."""
        now = datetime.now(UTC)
        for name in lease.get("orphaned") or {}:
            job = self.store.stored_job(name) if name in JOBS else None
            if job is not None and job.next_run_time is not None and job.next_run_time > now:
                log.warning("job %s was left unfinished by a heartbeat that ended: due now", name)
                self.scheduler.modify_job(name, next_run_time=now)

    def _heard(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        if self.on_outcome is None:
            return
        try:
            self.on_outcome(outcome)
        except Exception as exc:  # whoever listens must not make a job that ran look failed
            log.warning("could not report job %s: %s", outcome.job, exc)

    def _track(self, event: JobSubmissionEvent | JobExecutionEvent) -> None:
        if isinstance(event, JobSubmissionEvent):
            runs, step = event.scheduled_run_times, 1
        else:
            runs, step = [event.scheduled_run_time], -1
        with self._held_lock:
            for when in runs:
                key = (event.job_id, when)
                count = self._held.get(key, 0) + step
                if count:
                    self._held[key] = count
                else:
                    self._held.pop(key, None)

    def abandon(self) -> None:
        """Leave every job run that has not ended (running, or waiting for a worker) due as it
        was, each in a short transaction of its own, then give the lease back: for a process
        about to end without waiting for them, whose next heartbeat should run them at once,
        not an interval later."""
        self._leave_due()
        try:
            release_lease(self.image, self.holder)
        except Exception as exc:
            log.warning("could not release the lease (%s); it expires by itself", exc)

    def _leave_due(self) -> None:
        """Put each job run handed to the executor that has not ended back to when it was
        due (the scheduler had moved the job on as it handed the run over)."""
        with self._held_lock:
            due: dict[str, datetime] = {}
            for (job_id, when), count in self._held.items():
                if count > 0:
                    due[job_id] = min(when, due.get(job_id, when))
        for job_id, when in due.items():
            try:
                job = self.store.stored_job(job_id)
                if job is not None and job.next_run_time is not None and job.next_run_time > when:
                    job._modify(next_run_time=when)
                    self.store.update_job(job)
            except Exception as exc:
                log.warning(
                    "could not leave job %s due (%s); it waits for its next run", job_id, exc
                )

    def ensure_jobs(self) -> None:
        """Add the jobs the image lacks (due at once); give changed intervals to the others,
        never putting a run off. Call with the scheduler started (paused or not) so the
        changes reach the image."""
        now = datetime.now(UTC)
        for name in JOBS:
            trigger = self._trigger(self.interval(name))
            job = self.store.stored_job(name)
            if job is None and name not in self.store.corrupt:
                self.scheduler.add_job(
                    JOB_FUNCTION,
                    trigger,
                    args=[name],
                    id=name,
                    name=name,
                    next_run_time=now,
                )
                continue
            if job is None:
                continue
            # The image holds another interval than the setting's (a variable changed since).
            retrigger = job.trigger.interval != self._trigger(self.kept(name)).interval
            next_run = _next_run(job.next_run_time, now, trigger.interval)
            if retrigger or next_run != job.next_run_time:
                # Rescheduling from now would move a due job a whole interval away unrun: a
                # changed interval keeps a job due, and can only bring its next run closer.
                self.scheduler.modify_job(name, trigger=trigger, next_run_time=next_run)

    def plan(self) -> list[Planned]:
        """What the heartbeat will run and when, read from the image without changing it: every
        job with its interval in force, then any stored record that is not one of them."""
        stored = {
            job_id: (job, self.store.corrupt.get(job_id)) for job_id, _, job in self.store.records()
        }
        now = datetime.now(UTC)
        rows = []
        for name in JOBS:
            job, corrupt = stored.pop(name, (None, None))
            interval = self.interval(name)
            if job is None:
                rows.append(Planned(name, interval, None, corrupt=corrupt))
                continue
            had = _seconds(job)
            # What ensure_jobs will do, as if the heartbeat started now.
            next_run = _next_run(job.next_run_time, now, self._trigger(interval).interval)
            rows.append(
                Planned(
                    name,
                    interval,
                    next_run,
                    # Compared as the triggers hold them (timedeltas, whole microseconds),
                    # as ensure_jobs compares them: a float setting may differ below that.
                    stored=None
                    if job.trigger.interval == self._trigger(self.kept(name)).interval
                    else had,
                    from_start=next_run != job.next_run_time,
                )
            )
        for job_id, (job, corrupt) in stored.items():  # written by another version of BAT OS
            rows.append(
                Planned(
                    job_id,
                    Interval(_seconds(job) or 0.0, "image"),
                    job.next_run_time if job is not None else None,
                    corrupt=corrupt or "not a job this version runs",
                )
            )
        return rows

    # -- running --------------------------------------------------------------------------

    def _lease(self) -> dict[str, Any] | None:
        return acquire_lease(self.image, self.holder, settings.get_float("heartbeat_lease_seconds"))

    def once(self) -> list[Outcome]:
        """Run every due job once, in this thread, then stop; LeaseHeld if another acts. The
        lease is renewed from a helper thread meanwhile: a job may run for longer than it lasts
        (facets on a slow model, for minutes), and a lease left to expire would let a second
        heartbeat start its jobs beside this one's."""
        ttl = settings.get_float("heartbeat_lease_seconds")
        lease = self._lease()
        if lease is None:
            held = lease_holder(self.image) or {}
            raise LeaseHeld(
                f"another heartbeat ({held.get('holder')}) acts on {shown_uri(self.image.uri)}",
                hint="stop it, or wait until its lease expires "
                f"({max(0, held.get('expires', 0) - time.time()):.0f} s)",
            )
        _ACTIVE["beat"] = self
        done = threading.Event()
        renewer = threading.Thread(
            target=self._hold, args=(done, ttl), name="heartbeat-lease", daemon=True
        )
        started = False
        try:  # from here on, whatever fails, the lease is given back
            renewer.start()
            self.scheduler.start(paused=True)
            started = True
            self.ensure_jobs()
            self._take_over(lease)
            now = datetime.now(UTC)
            for job in self.store.get_due_jobs(now):
                if not renewer.is_alive():  # the lease was lost: another heartbeat may act now
                    log.error(
                        "the lease on %s was taken over; no more jobs run",
                        shown_uri(self.image.uri),
                    )
                    break
                try:
                    self.run(job.id)
                except Exception:  # logged and recorded in outcomes; the other jobs still run
                    pass
                runs = job._get_run_times(now)  # the missed runs, coalesced into this one
                after = job.trigger.get_next_fire_time(runs[-1] if runs else now, now)
                self.scheduler.modify_job(job.id, next_run_time=after)
        finally:
            done.set()
            if renewer.ident is not None:
                renewer.join()  # no renewal after the release below
            if started:
                self.scheduler.shutdown(wait=True)
            _ACTIVE.pop("beat", None)
            release_lease(self.image, self.holder)
        return self.outcomes

    def forever(self, stop: threading.Event) -> bool:
        """Wait for the lease, run the jobs until ``stop`` is set, then let the running job
        finish and give the lease up. False when it stopped for another reason: the lease was
        taken over, or its scheduler ended."""
        ttl = settings.get_float("heartbeat_lease_seconds")
        pause = 1.0
        lease: dict[str, Any] | None = None
        while not stop.is_set():
            try:
                lease = self._lease()
                if lease is not None:
                    break
                held = lease_holder(self.image) or {}
                log.warning("heartbeat %s holds the image; waiting", held.get("holder"))
                pause = min(ttl / 3, MAX_BACKOFF_S)
            except Exception as exc:  # the image is out of reach: say so, try again
                log.warning(
                    "image %s unreachable (%s); retrying in %.0f s",
                    shown_uri(self.image.uri),
                    exc,
                    pause,
                )
                pause = min(pause * 2, MAX_BACKOFF_S)
            stop.wait(pause)
        if stop.is_set():
            return True
        _ACTIVE["beat"] = self
        self.scheduler.start(paused=True)
        try:
            self.ensure_jobs()
            self._take_over(lease or {})
            self.scheduler.resume()
            log.info("heartbeat %s acting on %s", self.holder, shown_uri(self.image.uri))
            self._hold(stop, ttl)
            if not stop.is_set():
                log.error("heartbeat %s stopping: it no longer runs the jobs", self.holder)
                return False
            return True
        finally:
            self._shut_down(ttl)
            _ACTIVE.pop("beat", None)
            try:
                release_lease(self.image, self.holder)
            except Exception as exc:
                log.warning("could not release the lease (%s); it expires by itself", exc)

    def _shut_down(self, ttl: float) -> None:
        """Stop the scheduler, letting a running job finish (jobs waiting for a worker do not
        start, and stay due), and keep the lease renewed until it has: a lease left to expire
        meanwhile would let another heartbeat start its jobs beside one still writing."""
        finished = threading.Event()

        def shut_down() -> None:
            try:
                self.scheduler.shutdown(wait=True)
            finally:
                finished.set()

        threading.Thread(target=shut_down, name="heartbeat-stop", daemon=True).start()
        if not finished.wait(min(1.0, ttl / 3)):
            log.warning(
                "heartbeat stopping once its running job has finished (stop it again to "
                "abandon the job)"
            )
        # Renew first: the last renewal before the stop can be up to ttl/3 old already.
        while not finished.is_set():
            try:
                self._lease()
            except Exception as exc:
                log.warning("could not renew the lease while the last job ends: %s", exc)
            finished.wait(ttl / 3)
        self._leave_due()  # the runs the executor dropped unstarted, due for the next heartbeat

    def _hold(self, stop: threading.Event, ttl: float) -> None:
        """Renew the lease every third of ``ttl`` until ``stop`` is set, or until another
        holder has taken it over."""
        pause = ttl / 3
        while not stop.wait(pause):
            thread = getattr(self.scheduler, "_thread", None)
            if thread is not None and not thread.is_alive():
                # A lease held by a heartbeat whose scheduler ended runs no job, and keeps
                # every other heartbeat waiting for ever.
                log.error("the heartbeat's scheduler ended; giving the lease up")
                return
            try:
                if self._lease() is None:
                    log.error("the lease on %s was taken over", shown_uri(self.image.uri))
                    return
                pause = ttl / 3
            except Exception as exc:
                pause = min(pause * 2, MAX_BACKOFF_S)
                log.warning(
                    "image %s unreachable (%s); retrying in %.0f s",
                    shown_uri(self.image.uri),
                    exc,
                    pause,
                )
