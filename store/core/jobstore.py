"""The heartbeat's jobs and its lease, kept in the living image.

``ImageJobStore`` is an APScheduler 3 ``BaseJobStore`` over a BTree in the image, so the jobs,
their triggers and next run times survive a restart and every process on the image (through
ZEO) sees the same ones. A job's state is APScheduler's own pickle of ``Job.__getstate__()``,
stored as bytes beside its next run time; a record that no longer unpickles (a renamed job
function, a damaged record) is logged and skipped, never a crash of the scheduler, and stays
in the image for ``batos heartbeat --list`` to report. A job's state is image data like any
other: it is unpickled through the image's allow-list (``store.core.image_globals``, with
APScheduler's triggers), and a store given ``functions`` skips a job that would call any
other function, before its module is imported.

A store may be given triggers that hold in this process alone (``batos heartbeat --every``):
the jobs it hands the scheduler run on them, and what it writes keeps the trigger meant for
the image, so an interval given for one heartbeat is never left behind for the next.

The lease (``acquire_lease``) makes one heartbeat act on an image at a time: a holder id and an
expiry, written in one transaction, so of two heartbeats racing for it ZODB's conflict
detection lets exactly one win; the holder renews it well before it expires, and a holder that
died loses it when it expires.
"""

from __future__ import annotations

import io
import logging
import math
import pickle
import time
from collections.abc import Collection, Iterator, Mapping
from datetime import datetime
from typing import Any

from apscheduler.job import Job
from apscheduler.jobstores.base import BaseJobStore, ConflictingIdError, JobLookupError
from apscheduler.triggers.base import BaseTrigger
from apscheduler.util import datetime_to_utc_timestamp, utc_timestamp_to_datetime
from persistent.mapping import PersistentMapping

from batos import moved
from store.core import layout
from store.core.image import LivingImage, shown_uri
from store.core.image_globals import in_force

log = logging.getLogger("batos.heartbeat")

#: Largest pickled job state accepted, in bytes.
MAX_JOB_BYTES = 64 * 1024
#: The package whose classes a job's state may name beyond the image's allow-list: the
#: triggers APScheduler pickles with each job.
TRIGGERS = "apscheduler.triggers"


class _JobState(pickle.Unpickler):
    """Unpickles a stored job's state through the image's allow-list."""

    def find_class(self, module: str, name: str) -> Any:
        if "." in name:
            # Python's own find_class follows a dotted name attribute by attribute (protocol
            # 4): 'IntervalTrigger.__init__.__class__' is the function type, and with the
            # code type a record could build and call any code. No trigger is named so.
            raise pickle.UnpicklingError(f"a job's state names {module}.{name[:80]}")
        if module == TRIGGERS or module.startswith(TRIGGERS + "."):
            found = super().find_class(module, name)
            if isinstance(found, type) and issubclass(found, BaseTrigger):
                return found
            raise pickle.UnpicklingError(f"{module}.{name} is no trigger")
        return in_force().resolve(module, name)


def _function(ref: object) -> str:
    """A job's ``module:function`` reference under its module's current name."""
    module, colon, name = str(ref).partition(":")
    return f"{moved.current_name(module) or module}{colon}{name}"


def _home(root: Any) -> PersistentMapping:
    """The heartbeat's state: ``jobs`` (id → record) and ``lease``."""
    return layout.heartbeat(root)


def _jobs(root: Any) -> Any:
    home = layout.find(root, layout.HEARTBEAT)
    return home["jobs"] if home is not None and "jobs" in home else {}


class ImageJobStore(BaseJobStore):
    """APScheduler jobs in the image: the heartbeat container's ``jobs[id] = {next, state}``.

    ``overrides`` maps a job id to two triggers: the one its job runs on in this process, and
    the one written to the image whenever the job is. ``functions`` are the ``module:function``
    references its jobs may call; a stored job naming another is skipped as corrupt (None:
    any, for a scheduler of one's own).
    """

    def __init__(
        self,
        image: LivingImage,
        pickle_protocol: int = pickle.HIGHEST_PROTOCOL,
        overrides: Mapping[str, tuple[BaseTrigger, BaseTrigger]] | None = None,
        functions: Collection[str] | None = None,
    ):
        super().__init__()
        self.image = image
        self.pickle_protocol = pickle_protocol
        self.overrides = dict(overrides or {})
        self.functions = None if functions is None else frozenset(functions)
        #: Ids of the records that could not be restored, with why, for the CLI to report.
        self.corrupt: dict[str, str] = {}

    # -- reading --------------------------------------------------------------------------

    def _restore(self, job_id: str, record: Any, stored: bool = False) -> Job | None:
        """The job of ``record``, on the trigger in force here unless ``stored`` (as kept)."""
        try:
            state = _JobState(io.BytesIO(record["state"])).load()
            if self.functions is not None and _function(state["func"]) not in self.functions:
                # Job.__setstate__ imports the function's module, and the scheduler calls it.
                raise ValueError(f"it calls {str(state['func'])[:200]!r}, not a heartbeat job")
            state["jobstore"] = self
            if not stored and job_id in self.overrides:
                state["trigger"] = self.overrides[job_id][0]
            job = Job.__new__(Job)
            job.__setstate__(state)
        except Exception as exc:  # whatever a damaged record raises, it is skipped
            if job_id not in self.corrupt:
                log.error(
                    "job record %r in the image cannot be restored (%s); skipped", job_id, exc
                )
            self.corrupt[job_id] = f"{type(exc).__name__}: {exc}"
            return None
        self.corrupt.pop(job_id, None)
        job._scheduler = self._scheduler
        job._jobstore_alias = self._alias
        return job

    def _select(self, due_before: float | None = None) -> list[Job]:
        with self.image.read() as root:
            rows = [(k, dict(v)) for k, v in _jobs(root).items()]
        rows = [
            (k, r)
            for k, r in rows
            if due_before is None or (r.get("next") is not None and r["next"] <= due_before)
        ]
        # Paused jobs (no next run time) last, as APScheduler's own stores order them.
        rows.sort(key=lambda kr: (kr[1].get("next") is None, kr[1].get("next") or 0, kr[0]))
        return [job for job in (self._restore(k, r) for k, r in rows) if job is not None]

    def lookup_job(self, job_id: str) -> Job | None:
        with self.image.read() as root:
            record = _jobs(root).get(job_id)
            record = dict(record) if record is not None else None
        return self._restore(job_id, record) if record is not None else None

    def get_due_jobs(self, now: datetime) -> list[Job]:
        return self._select(datetime_to_utc_timestamp(now))

    def get_next_run_time(self) -> datetime | None:
        with self.image.read() as root:
            times = [
                r["next"]
                for k, r in _jobs(root).items()
                if r.get("next") is not None and k not in self.corrupt
            ]
        return utc_timestamp_to_datetime(min(times)) if times else None

    def get_all_jobs(self) -> list[Job]:
        jobs = self._select()
        self._fix_paused_jobs_sorting(jobs)
        return jobs

    def records(self) -> Iterator[tuple[str, float | None, Job | None]]:
        """Every record as kept: its id, next run time and the job, or None where it is
        corrupt (its trigger the stored one, whatever overrides hold here)."""
        with self.image.read() as root:
            rows = [(k, dict(v)) for k, v in _jobs(root).items()]
        for job_id, record in rows:
            yield job_id, record.get("next"), self._restore(job_id, record, stored=True)

    def stored_job(self, job_id: str) -> Job | None:
        """Job ``job_id`` as the image keeps it, its stored trigger whatever overrides hold."""
        with self.image.read() as root:
            record = _jobs(root).get(job_id)
            record = dict(record) if record is not None else None
        return self._restore(job_id, record, stored=True) if record is not None else None

    # -- writing --------------------------------------------------------------------------

    def _record(self, job: Job) -> dict[str, Any]:
        state_of = job.__getstate__()
        if job.id in self.overrides:
            state_of["trigger"] = self.overrides[job.id][1]
        state = pickle.dumps(state_of, self.pickle_protocol)
        if len(state) > MAX_JOB_BYTES:
            raise ValueError(
                f"job {job.id!r} pickles to {len(state)} bytes; at most {MAX_JOB_BYTES}"
            )
        return {"next": datetime_to_utc_timestamp(job.next_run_time), "state": state}

    def add_job(self, job: Job) -> None:
        record = self._record(job)

        def add(root: Any) -> None:
            jobs = _home(root)["jobs"]
            if job.id in jobs:
                raise ConflictingIdError(job.id)
            jobs[job.id] = record

        self.image.transact(add, note=f"heartbeat: add job {job.id}")

    def update_job(self, job: Job) -> None:
        record = self._record(job)

        def update(root: Any) -> None:
            jobs = _home(root)["jobs"]
            if job.id not in jobs:
                raise JobLookupError(job.id)
            jobs[job.id] = record

        self.image.transact(update, note=f"heartbeat: job {job.id} next run")
        self.corrupt.pop(job.id, None)

    def remove_job(self, job_id: str) -> None:
        def remove(root: Any) -> None:
            jobs = _home(root)["jobs"]
            if job_id not in jobs:
                raise JobLookupError(job_id)
            del jobs[job_id]

        self.image.transact(remove, note=f"heartbeat: remove job {job_id}")
        self.corrupt.pop(job_id, None)

    def remove_all_jobs(self) -> None:
        self.image.transact(lambda root: _home(root)["jobs"].clear(), note="heartbeat: no jobs")
        self.corrupt.clear()

    def __repr__(self) -> str:
        return f"<ImageJobStore ({shown_uri(self.image.uri)})>"


# -- the lease ----------------------------------------------------------------------------------


def acquire_lease(image: LivingImage, holder: str, seconds: float) -> dict[str, Any] | None:
    """Take or renew the lease for ``seconds``; None when another live holder has it.

    The read and the write are one transaction, so two heartbeats racing for a free lease
    conflict and the retried one finds the winner's lease.
    """

    def take(root: Any) -> dict[str, Any] | None:
        home = _home(root)
        now = time.time()
        lease = _lease_in(home)
        if lease and lease["holder"] != holder and lease["expires"] > now:
            return None
        taken: dict[str, Any] = {"holder": holder, "expires": now + seconds, "since": now}
        if lease and lease["holder"] == holder:
            taken["since"] = lease["since"]
            if _running(lease):
                taken["running"] = _running(lease)
        home["lease"] = taken
        result = dict(taken)
        if lease and lease["holder"] != holder and _running(lease):
            # Jobs the expired holder had started and never finished (it was killed): the
            # new holder runs them again at once, rather than a whole interval later.
            result["orphaned"] = _running(lease)
        return result

    return image.transact(take, note=f"heartbeat: lease for {holder}")


def _finite(value: Any) -> float | None:
    """``value`` as a finite float, or None: image data is a stranger's (an int of 400
    digits does not fit a float, nan never compares)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _lease_in(home: Any) -> dict[str, Any] | None:
    """The lease record of ``home`` as plain checked data, or None when there is none or it
    is not one (a record that is not a lease is no holder's: it is taken over)."""
    lease = home.get("lease")
    if not isinstance(lease, Mapping):
        return None
    holder, expires = lease.get("holder"), _finite(lease.get("expires"))
    if not isinstance(holder, str) or expires is None:
        return None
    since = _finite(lease.get("since"))
    return {
        "holder": holder,
        "expires": expires,
        "since": expires if since is None else since,
        "running": lease.get("running"),
    }


def _running(lease: Mapping[str, Any]) -> dict[str, float]:
    running = lease.get("running")
    if not isinstance(running, Mapping):
        return {}
    jobs: dict[str, float] = {}
    for job, at in list(running.items())[:MAX_RUNNING]:
        when = _finite(at)
        if isinstance(job, str) and len(job) <= 64 and when is not None:
            jobs[job] = when
    return jobs


#: Jobs a lease records as started at most (there are seven; a record of more is not ours).
MAX_RUNNING = 32


def job_running(image: LivingImage, holder: str, job: str, running: bool) -> bool:
    """Record in ``holder``'s lease that ``job`` started (``running``) or ended, renewing
    nothing else; False when ``holder`` does not hold the lease, and nothing was written."""

    def mark(root: Any) -> bool:
        home = _home(root)
        lease = _lease_in(home)
        if not lease or lease["holder"] != holder or lease["expires"] <= time.time():
            return False
        jobs = _running(lease)
        if running:
            jobs[job] = time.time()
        else:
            jobs.pop(job, None)
        home["lease"] = {**lease, "running": jobs}
        return True

    verb = "started" if running else "ended"
    return image.transact(mark, note=f"heartbeat: {holder} {verb} job {job}")


def lease_holder(image: LivingImage) -> dict[str, Any] | None:
    """The lease as it stands (holder, expiry), expired or not; None when never taken (or
    what is stored is no lease)."""
    with image.read() as root:
        home = layout.find(root, layout.HEARTBEAT)
        lease = _lease_in(home) if home is not None else None
        if lease is not None:
            lease["running"] = _running(lease)
        return lease


def release_lease(image: LivingImage, holder: str) -> None:
    """Give the lease up, if ``holder`` still has it."""

    def release(root: Any) -> None:
        home = layout.find(root, layout.HEARTBEAT)
        if home is not None and (_lease_in(home) or {}).get("holder") == holder:
            del home["lease"]

    image.transact(release, note=f"heartbeat: {holder} released the lease")
