"""The heartbeat's job store and lease in the image, with the real APScheduler."""

from __future__ import annotations

import io
import pickle
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED
from apscheduler.schedulers.background import BackgroundScheduler
from images import open_laid_out

from store.core import layout
from store.core.image import LivingImage
from store.core.jobstore import (
    ImageJobStore,
    acquire_lease,
    lease_holder,
    release_lease,
)

TRIGGER_MODULE = "apscheduler.triggers.interval"
RUNS: dict[str, list[float]] = {}
ACTIVE = {"now": 0, "most": 0}
LOCK = threading.Lock()


def tick(name: str) -> None:
    RUNS.setdefault(name, []).append(time.monotonic())


def slow(name: str) -> None:
    with LOCK:
        ACTIVE["now"] += 1
        ACTIVE["most"] = max(ACTIVE["most"], ACTIVE["now"])
    time.sleep(0.5)
    tick(name)
    with LOCK:
        ACTIVE["now"] -= 1


def boom() -> None:
    raise RuntimeError("a job that raises")


def scheduler(image: LivingImage) -> BackgroundScheduler:
    return BackgroundScheduler(
        jobstores={"default": ImageJobStore(image)},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        timezone=UTC,
    )


def wait_for(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def _clear() -> None:
    RUNS.clear()
    ACTIVE.update(now=0, most=0)


def test_jobs_run_unattended_and_survive_a_restart(file_uri: str) -> None:
    image = open_laid_out(file_uri, create=True)
    s = scheduler(image)
    s.add_job(f"{__name__}:tick", "interval", seconds=0.3, args=["a"], id="a")
    s.start()
    try:
        wait_for(lambda: len(RUNS.get("a", [])) >= 3)
    finally:
        s.shutdown()
        image.close()
    # A new process's scheduler over the reopened image finds the job and runs it.
    before = len(RUNS["a"])
    image = open_laid_out(file_uri)
    s = scheduler(image)
    assert [j.id for j in s._jobstores["default"].get_all_jobs()] == ["a"]
    s.start()
    try:
        wait_for(lambda: len(RUNS["a"]) >= before + 2)
        assert s.get_job("a").trigger.interval == timedelta(seconds=0.3)
    finally:
        s.shutdown()
        image.close()


def test_a_job_never_overlaps_itself(memory_image: LivingImage) -> None:
    s = scheduler(memory_image)
    s.add_job(f"{__name__}:slow", "interval", seconds=0.1, args=["s"], id="s")
    s.start()
    try:
        wait_for(lambda: len(RUNS.get("s", [])) >= 3)
    finally:
        s.shutdown()
    assert ACTIVE["most"] == 1


def test_missed_runs_are_coalesced(memory_image: LivingImage) -> None:
    store = ImageJobStore(memory_image)
    s = scheduler(memory_image)
    # Last due a minute ago on a one-second interval: sixty missed runs, run once.
    past = datetime.now(UTC) - timedelta(seconds=60)
    s.add_job(f"{__name__}:tick", "interval", seconds=1, args=["c"], id="c", next_run_time=past)
    s.start()
    try:
        wait_for(lambda: len(RUNS.get("c", [])) >= 1)
        time.sleep(0.5)
    finally:
        s.shutdown()
    assert len(RUNS["c"]) == 1
    assert store.lookup_job("c").next_run_time > datetime.now(UTC)


def test_a_job_that_raises_does_not_stop_the_scheduler(memory_image: LivingImage) -> None:
    s = scheduler(memory_image)
    errors: list[object] = []
    s.add_listener(lambda e: errors.append(e), EVENT_JOB_ERROR)
    s.add_job(f"{__name__}:boom", "interval", seconds=0.2, id="boom")
    s.add_job(f"{__name__}:tick", "interval", seconds=0.2, args=["ok"], id="ok")
    done: list[object] = []
    s.add_listener(lambda e: done.append(e), EVENT_JOB_EXECUTED)
    s.start()
    try:
        wait_for(lambda: len(errors) >= 2 and len(RUNS.get("ok", [])) >= 2)
    finally:
        s.shutdown()


def test_a_corrupt_job_record_is_reported_and_skipped(memory_image: LivingImage) -> None:
    s = scheduler(memory_image)
    s.start(paused=True)
    s.add_job(f"{__name__}:tick", "interval", seconds=0.2, args=["fine"], id="fine")
    s.add_job(f"{__name__}:tick", "interval", seconds=0.2, args=["bad"], id="bad")

    def damage(root) -> None:
        root[layout.HEARTBEAT]["jobs"]["bad"] = {"next": 0.0, "state": b"not a pickle"}

    memory_image.transact(damage)
    store = s._jobstores["default"]
    s.resume()
    try:
        wait_for(lambda: len(RUNS.get("fine", [])) >= 2)
    finally:
        s.shutdown()
    assert "bad" not in RUNS
    assert "bad" in store.corrupt
    rows = {job_id: job for job_id, _, job in store.records()}
    assert rows["bad"] is None and rows["fine"] is not None


class _Call:
    """A value that pickles as a call of ``function(*args)``: what a forged record holds."""

    def __init__(self, function, *args) -> None:
        self.call = (function, args)

    def __reduce__(self):
        return self.call


def _forge(image: LivingImage, job_id: str, change) -> None:
    """Rewrite job ``job_id``'s stored state with ``change(state)``, as anything that can write
    the image can."""

    def forge(root) -> None:
        jobs = root[layout.HEARTBEAT]["jobs"]
        state = pickle.loads(jobs[job_id]["state"])
        jobs[job_id] = {"next": 0.0, "state": pickle.dumps(change(state))}

    image.transact(forge)


def test_a_job_state_that_calls_code_is_skipped_and_nothing_runs(memory_image, tmp_path):
    marker = tmp_path / "marker"
    s = scheduler(memory_image)
    s.start(paused=True)
    s.add_job(f"{__name__}:tick", "interval", seconds=0.2, args=["fine"], id="fine")
    s.add_job(f"{__name__}:tick", "interval", seconds=0.2, args=["bad"], id="bad")
    _forge(memory_image, "bad", lambda state: {**state, "name": _Call(open, marker, "w")})
    store = s._jobstores["default"]
    s.resume()
    try:
        wait_for(lambda: len(RUNS.get("fine", [])) >= 2)
    finally:
        s.shutdown()
    assert "bad" not in RUNS and not marker.exists()
    assert "io.open" in store.corrupt["bad"]


def _global(module: str, name: str) -> bytes:
    """A protocol 4 pickle of one global, named as the record names it (STACK_GLOBAL)."""
    m, n = module.encode(), name.encode()
    return b"\x80\x04\x8c" + bytes([len(m)]) + m + b"\x8c" + bytes([len(n)]) + n + b"\x93."


@pytest.mark.parametrize(
    "name",
    [
        # Python's find_class follows the dots: the function type, then the code type, and
        # with both a record builds and calls code of its own
        "IntervalTrigger.__init__.__class__",
        "IntervalTrigger.__init__.__code__.__class__",
        "timedelta",  # a type the trigger module imported: a type, and no trigger
    ],
)
def test_a_job_state_names_triggers_only(name: str) -> None:
    from store.core.jobstore import _JobState

    assert _JobState(io.BytesIO(_global(TRIGGER_MODULE, "IntervalTrigger"))).load().__name__ == (
        "IntervalTrigger"
    )
    with pytest.raises(pickle.UnpicklingError):
        _JobState(io.BytesIO(_global(TRIGGER_MODULE, name))).load()


def test_a_store_given_its_functions_runs_no_other(memory_image, tmp_path):
    marker = tmp_path / "marker"
    s = BackgroundScheduler(
        jobstores={"default": ImageJobStore(memory_image, functions={f"{__name__}:tick"})},
        timezone=UTC,
    )
    s.start(paused=True)
    s.add_job(f"{__name__}:tick", "interval", seconds=0.2, args=["fine"], id="fine")
    s.add_job(f"{__name__}:tick", "interval", seconds=0.2, args=["bad"], id="bad")
    forged = {"func": "os:system", "args": (f"touch {marker}",)}
    _forge(memory_image, "bad", lambda state: {**state, **forged})
    store = s._jobstores["default"]
    s.resume()
    try:
        wait_for(lambda: len(RUNS.get("fine", [])) >= 3)
    finally:
        s.shutdown()
    assert not marker.exists()
    assert "'os:system', not a heartbeat job" in store.corrupt["bad"]


def test_one_lease_for_two_holders(memory_image: LivingImage) -> None:
    assert acquire_lease(memory_image, "one", 5.0) is not None
    assert acquire_lease(memory_image, "two", 5.0) is None
    assert acquire_lease(memory_image, "one", 5.0) is not None  # renewed
    assert lease_holder(memory_image)["holder"] == "one"
    release_lease(memory_image, "two")  # not the holder: nothing happens
    assert lease_holder(memory_image)["holder"] == "one"
    release_lease(memory_image, "one")
    assert acquire_lease(memory_image, "two", 0.1) is not None
    time.sleep(0.2)  # expired: free for the next one
    assert acquire_lease(memory_image, "one", 5.0)["holder"] == "one"


def test_racing_holders_one_wins(file_uri: str) -> None:
    image = open_laid_out(file_uri, create=True)
    won: list[str] = []
    barrier = threading.Barrier(4)

    def race(name: str) -> None:
        barrier.wait()
        if acquire_lease(image, name, 30.0) is not None:
            won.append(name)

    threads = [threading.Thread(target=race, args=(f"h{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    image.close()
    assert len(won) == 1
