"""The heartbeat: APScheduler runs the image's upkeep unattended.

Five jobs, each on an interval set in settings — ``audit`` (ALFRED's self-audit,
``graph.audit``), ``facets`` (the codex's facet methods the image lacks, written off the user's
clock: ``graph.facet_writing``), ``curate`` (memory curation, what ``batos curate`` does),
``prune`` (the checkpoints of every thread trimmed to ``heartbeat_prune_keep``) and ``methods``
(every generated method's stored examples run again; one that fails them is taken out:
``graph.rejection``). They live in the image
(``store.core.jobstore.ImageJobStore``), so they survive restarts; missed runs are coalesced
into one, a job never overlaps itself (``max_instances=1``), and a job that raises is logged while
the scheduler goes on. Only the holder of the image's lease runs jobs: a second heartbeat waits
for it (or, with ``once``, says who holds it and stops).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from batos import settings
from batos.errors import BatosError
from store.core.image import LivingImage
from store.core.jobstore import ImageJobStore, acquire_lease, lease_holder, release_lease

log = logging.getLogger("batos.heartbeat")

#: Longest pause between two attempts to reach an unreachable image.
MAX_BACKOFF_S = 60.0


class LeaseHeld(BatosError):
    """Another heartbeat acts on this image."""

    exit_code = 3


def _audit(image: LivingImage, models: Callable[..., Any] | None) -> str:
    from graph import audit

    report = audit.run(image, models)
    said = f"audit report {report['id']}: CEM {report['metrics']['cem']} ({report['verdict']})"
    for number, status in (report.get("judged") or {}).items():
        said += f"; mission {number} {status}"
    if report.get("mission"):
        said += f"; mission {report['mission']} started"
    return said


def _curate(image: LivingImage, models: Callable[..., Any] | None) -> str:
    from graph.curation import babs_summarizer
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.curator import Curator

    catalog = KnowledgeCatalog.open(image)
    try:
        report = Curator(catalog, babs_summarizer(models)).run()
    finally:
        catalog.close()
    return f"curated: {report.archived_chunks} chunk(s) folded into {len(report.archives)}"


def _prune(image: LivingImage, models: Callable[..., Any] | None) -> str:
    from store.checkpoint.saver import ZODBSaver

    keep = settings.get_int("heartbeat_prune_keep")
    with ZODBSaver(image) as saver:
        deleted = saver.trim(None, keep=keep)
    return f"pruned {deleted} checkpoint(s), kept {keep} per namespace"


def _facets(image: LivingImage, models: Callable[..., Any] | None) -> str:
    from graph import facet_writing

    todo = facet_writing.due(image)
    if not todo:
        return "facets: none due"
    done = facet_writing.write_all(image, models, todo[: facet_writing.PER_RUN])
    wrote = [w.key for w in done if w.ok]
    failed = [w.key for w in done if not w.ok]
    said = f"facets: wrote {len(wrote)}" + (f" ({', '.join(wrote)})" if wrote else "")
    if failed:
        said += f"; {len(failed)} could not be written ({', '.join(failed)}): tried again later"
    left = len(todo) - len(done)
    return said + (f"; {left} still due" if left else "")


def _methods(image: LivingImage, models: Callable[..., Any] | None) -> str:
    from graph import rejection

    report = rejection.check_methods(image)
    said = f"methods: {report.checked} checked against their examples"
    if report.removed:
        names = ", ".join(f"{r.path}.{r.selector}" for r in report.removed)
        said += f"; took out {len(report.removed)} that fail them ({names})"
    if report.unchecked:
        said += f"; {len(report.unchecked)} could not be checked ({report.unchecked[0]})"
    return said


#: job id → (what it does, the setting holding its interval in seconds).
JOBS: dict[str, tuple[Callable[[LivingImage, Callable[..., Any] | None], str], str]] = {
    "audit": (_audit, "heartbeat_audit_seconds"),
    "facets": (_facets, "heartbeat_facets_seconds"),
    "curate": (_curate, "heartbeat_curate_seconds"),
    "prune": (_prune, "heartbeat_prune_seconds"),
    "methods": (_methods, "heartbeat_methods_seconds"),
}

#: The heartbeat acting in this process; the stored jobs name ``run_job`` by reference (that is
#: what APScheduler can pickle), and it finds the image and model factory here.
_ACTIVE: dict[str, Heartbeat] = {}


def run_job(name: str) -> str:
    """What a stored job calls: job ``name`` of the heartbeat acting in this process."""
    beat = _ACTIVE.get("beat")
    if beat is None:
        raise BatosError(f"job {name!r} ran with no heartbeat acting in this process")
    return beat.run(name)


@dataclass
class Outcome:
    job: str
    ok: bool
    said: str
    seconds: float


@dataclass
class Heartbeat:
    image: LivingImage
    models: Callable[..., Any] | None = None
    holder: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )

    def __post_init__(self) -> None:
        self.store = ImageJobStore(self.image)
        self.scheduler = BackgroundScheduler(
            jobstores={"default": self.store},
            executors={"default": {"type": "threadpool", "max_workers": 2}},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            timezone=UTC,
        )
        self.outcomes: list[Outcome] = []

    # -- the jobs -------------------------------------------------------------------------

    def run(self, name: str) -> str:
        started = time.monotonic()
        try:
            said = JOBS[name][0](self.image, self.models)
        except Exception as exc:
            seconds = time.monotonic() - started
            self.outcomes.append(Outcome(name, False, f"{type(exc).__name__}: {exc}", seconds))
            log.error("job %s failed after %.1f s: %s", name, seconds, exc)
            raise
        self.outcomes.append(Outcome(name, True, said, time.monotonic() - started))
        log.info("job %s: %s", name, said)
        return said

    def ensure_jobs(self) -> None:
        """Add the jobs the image lacks (due at once); give changed intervals to the others.
        Call with the scheduler started (paused or not) so the changes reach the image."""
        for name, (_, setting) in JOBS.items():
            trigger = IntervalTrigger(seconds=settings.get_float(setting), timezone=UTC)
            job = self.store.lookup_job(name)
            if job is None and name not in self.store.corrupt:
                self.scheduler.add_job(
                    f"{__name__}:run_job",
                    trigger,
                    args=[name],
                    id=name,
                    name=name,
                    next_run_time=datetime.now(UTC),
                )
            elif job is not None and job.trigger.interval != trigger.interval:
                self.scheduler.reschedule_job(name, trigger=trigger)

    def jobs(self) -> list[tuple[str, str, datetime | None, str | None]]:
        """(id, trigger, next run time, why it is corrupt) of every stored job."""
        rows = []
        for job_id, _, job in self.store.records():
            if job is None:
                rows.append((job_id, "?", None, self.store.corrupt.get(job_id)))
            else:
                rows.append((job_id, str(job.trigger), job.next_run_time, None))
        return rows

    # -- running --------------------------------------------------------------------------

    def _lease(self) -> dict[str, Any] | None:
        return acquire_lease(self.image, self.holder, settings.get_float("heartbeat_lease_seconds"))

    def once(self) -> list[Outcome]:
        """Run every due job once, in this thread, then stop; LeaseHeld if another acts."""
        if self._lease() is None:
            held = lease_holder(self.image) or {}
            raise LeaseHeld(
                f"another heartbeat ({held.get('holder')}) acts on {self.image.uri}",
                hint="stop it, or wait until its lease expires "
                f"({max(0, held.get('expires', 0) - time.time()):.0f} s)",
            )
        _ACTIVE["beat"] = self
        self.scheduler.start(paused=True)
        try:
            self.ensure_jobs()
            now = datetime.now(UTC)
            for job in self.store.get_due_jobs(now):
                try:
                    self.run(job.id)
                except Exception:  # logged and recorded in outcomes; the other jobs still run
                    pass
                runs = job._get_run_times(now)  # the missed runs, coalesced into this one
                after = job.trigger.get_next_fire_time(runs[-1] if runs else now, now)
                self.scheduler.modify_job(job.id, next_run_time=after)
        finally:
            self.scheduler.shutdown(wait=True)
            _ACTIVE.pop("beat", None)
            release_lease(self.image, self.holder)
        return self.outcomes

    def forever(self, stop: threading.Event) -> None:
        """Wait for the lease, run the jobs until ``stop`` is set, then let the running job
        finish and give the lease up."""
        ttl = settings.get_float("heartbeat_lease_seconds")
        pause = 1.0
        while not stop.is_set():
            try:
                if self._lease() is not None:
                    break
                held = lease_holder(self.image) or {}
                log.warning("heartbeat %s holds the image; waiting", held.get("holder"))
                pause = min(ttl / 3, MAX_BACKOFF_S)
            except Exception as exc:  # the image is out of reach: say so, try again
                log.warning(
                    "image %s unreachable (%s); retrying in %.0f s", self.image.uri, exc, pause
                )
                pause = min(pause * 2, MAX_BACKOFF_S)
            stop.wait(pause)
        if stop.is_set():
            return
        _ACTIVE["beat"] = self
        self.scheduler.start(paused=True)
        try:
            self.ensure_jobs()
            self.scheduler.resume()
            log.info("heartbeat %s acting on %s", self.holder, self.image.uri)
            self._hold(stop, ttl)
        finally:
            self.scheduler.shutdown(wait=True)
            _ACTIVE.pop("beat", None)
            try:
                release_lease(self.image, self.holder)
            except Exception as exc:
                log.warning("could not release the lease (%s); it expires by itself", exc)

    def _hold(self, stop: threading.Event, ttl: float) -> None:
        pause = ttl / 3
        while not stop.wait(pause):
            try:
                if self._lease() is None:
                    log.error("the lease on %s was taken over; stopping", self.image.uri)
                    return
                pause = ttl / 3
            except Exception as exc:
                pause = min(pause * 2, MAX_BACKOFF_S)
                log.warning(
                    "image %s unreachable (%s); retrying in %.0f s", self.image.uri, exc, pause
                )
