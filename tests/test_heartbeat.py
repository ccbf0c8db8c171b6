"""The heartbeat, the audit and their commands: real APScheduler, scripted models."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from fakes import FakeModels, ScriptedChatModel
from test_mind import responder

from batos.errors import ConfigurationError
from batos.shell.cli import main
from batos.shell.cli.heartbeat import draw_chart
from batos.shell.heartbeat import JOBS, Decided, Heartbeat, LeaseHeld
from graph import audit
from store.core import layout
from store.core.image import LivingImage
from store.core.jobstore import acquire_lease, lease_holder
from store.knowledge.embeddings import to_bytes


def run(capsys, *argv: str, models=None) -> tuple[int, str, str]:
    code = main(list(argv), models=models)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def image(capsys, file_uri: str) -> str:
    assert run(capsys, "--image", file_uri, "init")[0] == 0
    return file_uri


def piped(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``batos ARGV`` in a process of its own, its output a pipe 80 columns wide."""
    return subprocess.run(
        [sys.executable, "-m", "batos.shell.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80", **env},
        timeout=120,
    )


def fits_80_columns(out: str, *whole: str) -> None:
    """Every line of ``out`` fits in 80 columns, but a line holding one of ``whole`` alone:
    a value (a path, a URI) is kept whole on its own line rather than broken."""
    assert out.strip()
    for line in out.splitlines():
        assert len(line) <= 80 or line.strip() in whole, line
    assert "…" not in out  # nothing cut short to fit


def alfred(*replies: str):
    def models(persona: str, **options):
        # Curation makes BABS's model too; with no catalog it is never called.
        return ScriptedChatModel().enqueue(*(replies if persona == "ALFRED" else ()))

    return models


def vector(*xs: float) -> bytes:
    v = np.zeros(384, dtype=np.float32)
    v[: len(xs)] = xs
    return to_bytes(v / np.linalg.norm(v))


def add_cycles(image: LivingImage, rows: list[tuple[str, tuple[float, ...]]]) -> None:
    def write(root) -> None:
        from BTrees.OOBTree import OOBTree

        cycles = root.get(layout.CYCLES)
        if cycles is None:
            cycles = root[layout.CYCLES] = OOBTree()
        for persona, answer in rows:
            cycles[f"{len(cycles):08d}"] = {
                "personas": [persona],
                "facets": [],
                "methods_written": [],
                "request_vector": vector(1, 0, 0),
                "response_vector": vector(*answer),
            }

    image.transact(write)


def test_verdict_rule() -> None:
    assert audit.verdict([], 0.5, 0.05) == "unknown"
    assert audit.verdict([0.6], 0.5, 0.05) == "decay"
    assert audit.verdict([0.5], 0.52, 0.05) == "steady"
    assert audit.verdict([0.5, 0.501, 0.5], 0.5, 0.05) == "stagnation"


def test_audits_record_the_cem_and_see_a_decay(image: str) -> None:
    with LivingImage.open(image) as img:
        # Varied answers first (BRICK and ROBIN), then ALFRED repeating one answer.
        add_cycles(img, [("BRICK", (1, 0, 0)), ("ROBIN", (0, 1, 0)), ("BRICK", (0, 0, 1))])
        first = audit.run(img, alfred("All four components are within bounds."))
        assert first["id"] == 1 and first["verdict"] == "unknown"
        assert first["metrics"]["H_sol"] == 1.0
        assert first["narrative"] == "All four components are within bounds."
        add_cycles(img, [("ALFRED", (1, 0, 0))] * 6)
        second = audit.run(img, alfred("Novelty has fallen; ALFRED repeats himself."))
        assert second["verdict"] == "decay" and second["deltas"]["H_sol"] < 0
        assert second["metrics"]["by_persona"]["ALFRED"]["H_sol_mean"] == 0.0
        assert [r["id"] for r in audit.history(img)] == [1, 2]


def test_a_failed_audit_writes_nothing(image: str) -> None:
    with LivingImage.open(image) as img:
        add_cycles(img, [("BRICK", (1, 0, 0))])
        before = len(img.history(100))

        def broken(persona: str, **options):
            return ScriptedChatModel().enqueue(RuntimeError("model is down"))

        with pytest.raises(RuntimeError):
            audit.run(img, broken)
        assert audit.history(img) == [] and len(img.history(100)) == before


def test_once_runs_due_jobs_then_none_and_lists_them(capsys, image: str) -> None:
    models = alfred("Steady.")
    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=models)
    assert code == 0, out + err
    assert "✓ audit" in out and "✓ curate" in out and "✓ prune" in out
    # Every job now waits for its interval: nothing is due.
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--once", models=alfred())
    assert code == 0 and "no job was due" in out
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--list")
    audit_row = next(line for line in out.splitlines() if line.startswith("audit "))
    assert code == 0 and "1 h" in audit_row and "default" in audit_row


def test_a_second_heartbeat_with_once_is_told_who_acts(capsys, image: str) -> None:
    with LivingImage.open(image) as img:
        assert acquire_lease(img, "the-other", 30.0)
    code, _, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred())
    assert code == LeaseHeld.exit_code and "the-other" in err


def test_forever_runs_unattended_waits_for_the_lease_and_stops_cleanly(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_HEARTBEAT_AUDIT_SECONDS", "1")  # the shortest of each
    monkeypatch.setenv("BATOS_HEARTBEAT_LEASE_SECONDS", "3")
    with LivingImage.open(image) as img:
        heard = []
        first = Heartbeat(img, alfred(*["Steady."] * 50), on_outcome=heard.append)
        second = Heartbeat(img, alfred(*["Steady."] * 50))
        stop_first, stop_second = threading.Event(), threading.Event()
        a = threading.Thread(target=first.forever, args=(stop_first,))
        a.start()
        deadline = time.monotonic() + 20
        while len([o for o in first.outcomes if o.job == "audit"]) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        b = threading.Thread(target=second.forever, args=(stop_second,))
        b.start()
        time.sleep(1.0)
        assert second.outcomes == []  # the second waits while the first holds the lease
        stop_first.set()
        a.join(10)
        assert not a.is_alive()
        assert heard == first.outcomes  # the scheduler's threads report every run as it ends
        deadline = time.monotonic() + 20
        while not any(o.job == "audit" for o in second.outcomes):  # it takes over
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stop_second.set()
        b.join(10)
        assert not b.is_alive()
        assert all(o.ok for o in first.outcomes + second.outcomes)


def test_a_job_whose_lease_another_heartbeat_took_runs_nothing(image: str) -> None:
    """A heartbeat that lost its lease (stopped, or cut off from the image, past the lease)
    ran the job it had already started scheduling beside the new holder's."""
    with LivingImage.open(image) as img:
        add_cycles(img, [("BRICK", (1, 0, 0))])
        beat = Heartbeat(img, alfred("Steady."))
        assert acquire_lease(img, "the-other", 30.0)
        with pytest.raises(LeaseHeld, match="the-other holds the lease"):
            beat.run("audit")
        assert audit.history(img) == []
        [outcome] = beat.outcomes
        assert not outcome.ok and "not run" in outcome.said


def test_a_job_whose_own_lease_lapsed_unclaimed_takes_it_again_and_runs(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease that lapsed with nobody else claiming it (a laptop asleep, a process stopped)
    made the job skip, named the heartbeat itself as 'another' holder."""
    from batos.shell import heartbeat as heartbeat_module

    with LivingImage.open(image) as img:
        add_cycles(img, [("BRICK", (1, 0, 0))])
        beat = Heartbeat(img, alfred("Steady.", "Steady."))
        monkeypatch.setitem(heartbeat_module._ACTIVE, "beat", beat)  # as forever() runs it
        assert acquire_lease(img, beat.holder, 0.2)
        time.sleep(0.3)
        beat.run("audit")
        assert [r["id"] for r in audit.history(img)] == [1]
        assert lease_holder(img)["holder"] == beat.holder  # it acts on: it keeps the lease
        # A job run by hand, by a heartbeat that is not acting, borrows the lease and gives
        # it back: a second one after it runs as well.
        monkeypatch.delitem(heartbeat_module._ACTIVE, "beat")
        from store.core.jobstore import release_lease

        release_lease(img, beat.holder)
        add_cycles(img, [("ROBIN", (0, 1, 0))])
        Heartbeat(img, alfred("Steady.")).run("audit")
        assert lease_holder(img) is None
        Heartbeat(img, alfred("Steady.")).run("prune")


def test_a_lease_record_a_stranger_wrote_is_read_as_data(image: str) -> None:
    from store.core.jobstore import job_running

    with LivingImage.open(image) as img:
        for stored in (
            {"holder": "gone", "expires": 1.0, "since": 0.0, "running": {"audit": 10**400}},
            {"holder": "gone", "expires": 1.0, "running": 5},
            {"holder": 7, "expires": "soon"},
            ["not", "a", "lease"],
        ):

            def write(root, stored=stored):
                layout.find(root, layout.HEARTBEAT)["lease"] = stored

            img.transact(write)
            taken = acquire_lease(img, "me", 30.0)  # an expired or malformed lease is taken
            assert taken is not None and taken["holder"] == "me"
            assert job_running(img, "me", "audit", True)
            assert acquire_lease(img, "me", 30.0)["running"].keys() == {"audit"}
            assert lease_holder(img)["holder"] == "me"


def test_the_scheduler_outlives_an_image_out_of_reach(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job store writes each job's next run into the image: a failure there (a ZEO or
    PostgreSQL server restarting) ended APScheduler's thread, and the heartbeat went on
    holding the lease with no job ever running again."""
    from batos.errors import TransactionFailed
    from batos.shell import heartbeat as heartbeat_module

    monkeypatch.setenv("BATOS_HEARTBEAT_AUDIT_SECONDS", "1")
    monkeypatch.setenv("BATOS_HEARTBEAT_LEASE_SECONDS", "3")
    monkeypatch.setattr(heartbeat_module, "SCHEDULER_RETRY_S", 0.2)
    with LivingImage.open(image) as img:
        beat = Heartbeat(img, alfred(*["Steady."] * 50))
        update = beat.store.update_job
        failures = iter(range(3))

        def out_of_reach(job: object) -> None:
            if next(failures, None) is not None:
                raise TransactionFailed("the ZEO server cannot be reached", hint="retry")
            update(job)

        monkeypatch.setattr(beat.store, "update_job", out_of_reach)
        stop = threading.Event()
        running = threading.Thread(target=beat.forever, args=(stop,), daemon=True)
        running.start()
        try:
            deadline = time.monotonic() + 20
            while len([o for o in beat.outcomes if o.job == "audit"]) < 3:
                assert time.monotonic() < deadline, beat.outcomes
                time.sleep(0.05)
            assert next(failures, None) is None  # every failure met, and the jobs went on
        finally:
            stop.set()
            running.join(10)


def test_a_heartbeat_whose_lease_was_taken_over_stops_and_says_so(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from store.core.jobstore import release_lease

    monkeypatch.setenv("BATOS_HEARTBEAT_LEASE_SECONDS", "3")
    with LivingImage.open(image) as img:
        beat = Heartbeat(img, alfred(*["Steady."] * 50))
        ended: list[bool] = []
        stop = threading.Event()
        running = threading.Thread(target=lambda: ended.append(beat.forever(stop)), daemon=True)
        running.start()
        try:
            deadline = time.monotonic() + 20
            while lease_holder(img) is None or lease_holder(img)["holder"] != beat.holder:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            release_lease(img, beat.holder)  # as a lease that expired while it could not renew
            assert acquire_lease(img, "the-other", 30.0)
            running.join(20)
            assert ended == [False]
        finally:
            stop.set()
            running.join(10)


def test_a_job_a_killed_heartbeat_left_unfinished_runs_at_the_next_one(capsys, image) -> None:
    """The scheduler moves a job to its next interval as it hands the run over: a heartbeat
    killed mid-job (SIGKILL, the OOM killer) left it waiting a whole interval (six hours
    for a retraining) though it never finished."""
    from store.core.jobstore import job_running

    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred("Ok."))
    assert code == 0 and "✓ audit" in out, out + err
    with LivingImage.open(image) as img:  # a heartbeat killed inside its audit
        assert acquire_lease(img, "killed", 0.5)
        assert job_running(img, "killed", "audit", True)
        assert not job_running(img, "someone-else", "prune", True)  # only the holder marks
    time.sleep(0.6)  # its lease expires
    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred("Ok."))
    assert code == 0 and "✓ audit" in out and "curate" not in out, out + err
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--once", models=alfred("Ok."))
    assert code == 0 and "no job was due" in out  # and once it ran, it waits as before
    with LivingImage.open(image) as img:
        assert lease_holder(img) is None  # given back, with nothing left marked


def test_end_to_end_ask_heartbeat_report(capsys, image: str, tmp_path) -> None:
    models = FakeModels(responder())
    for question in ("what is a living image", "tell me about persistence", "why ZODB"):
        code, _, err = run(capsys, "--image", image, "ask", question, models=models)
        assert code == 0, err
    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=models)
    assert code == 0, out + err
    code, out, _ = run(capsys, "--image", image, "audit", "report", "--json")
    rows = json.loads(out)["audits"]
    assert rows[0]["metrics"]["cycles"] == 3 and rows[0]["metrics"]["H_rel"] is not None
    chart = tmp_path / "cem.png"
    code, out, _ = run(capsys, "--image", image, "audit", "report", "--png", str(chart))
    assert code == 0 and "H_rel" in out and chart.read_bytes()[:4] == b"\x89PNG"
    code, out, _ = run(capsys, "--image", image, "audit", "show", "1")
    assert code == 0 and "verdict:" in out and "ALFRED:" in out
    code, _, err = run(capsys, "--image", image, "audit", "show", "9")
    assert code != 0 and "no audit report 9" in err


def test_list_on_a_new_image_says_what_will_run_and_when(
    capsys, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LivingImage.open(image) as img:
        before = len(img.history(100))
    listed = piped(
        "--image",
        image,
        "heartbeat",
        "--list",
        "--every",
        "audit=600",
        BATOS_HEARTBEAT_AUDIT_SECONDS="120",
        BATOS_HEARTBEAT_METHODS_SECONDS="300",
    )
    assert listed.returncode == 0, listed.stderr
    fits_80_columns(listed.stdout, image)
    rows = {line.split()[0]: line for line in listed.stdout.splitlines() if line.split()}
    for job in JOBS:
        assert "at start" in rows[job], listed.stdout
    assert "10 min" in rows["audit"] and "--every" in rows["audit"]  # the option wins
    assert "5 min" in rows["methods"] and "BATOS_HEARTBEAT_METHODS_SECONDS" in rows["methods"]
    assert "15 min" in rows["facets"] and "default" in rows["facets"]
    with LivingImage.open(image) as img:
        assert len(img.history(100)) == before  # listing wrote nothing
    code, out, err = run(capsys, "--image", image, "heartbeat", "--list", "--json")
    planned = {r["job"]: r for r in map(json.loads, out.splitlines())}
    assert code == 0 and set(planned) == set(JOBS), out + err
    assert planned["audit"]["seconds"] == 3600 and planned["audit"]["source"] == "default"
    assert all(r["due_at_start"] and r["next_run"] is None for r in planned.values())

    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred("Ok."))
    assert code == 0, out + err
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--list", "--json")
    planned = {r["job"]: r for r in map(json.loads, out.splitlines())}
    assert all(not r["due_at_start"] and r["next_run"] for r in planned.values())
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--list", "--every", "audit=60")
    assert code == 0 and "start + 1 min" in out and "changes it" not in out  # not stored
    monkeypatch.setenv("BATOS_HEARTBEAT_AUDIT_SECONDS", "60")
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--list")
    assert code == 0 and "start + 1 min" in out and "changes it to every 1 min" in out
    # A difference below the trigger's microseconds is none: no heartbeat would store it.
    monkeypatch.setenv("BATOS_HEARTBEAT_AUDIT_SECONDS", "3600.0000001")
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--list")
    assert code == 0 and "changes it" not in out


def _ran(out: str) -> set[str]:
    return set(re.findall(r"^\S+ \S+ [✓✗] (\w+) ", out, re.MULTILINE))


def _planned(capsys, image: str, *every: str) -> dict[str, dict]:
    code, out, err = run(capsys, "--image", image, "heartbeat", "--list", "--json", *every)
    assert code == 0, out + err
    return {r["job"]: r for r in map(json.loads, out.splitlines())}


def test_the_help_and_the_operations_page_name_every_job() -> None:
    """Both named five jobs: 'learn' and its interval setting were left out."""
    from pathlib import Path

    helped = piped("heartbeat", "--help", COLUMNS="300")
    assert helped.returncode == 0, helped.stderr
    text = " ".join(helped.stdout.split())
    page = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    section = " ".join(page.split("## The heartbeat", 1)[1].split("###", 1)[0].split())
    for job, (_, setting) in JOBS.items():
        assert f"{job} (" in text, job
        assert f"(`{job}`" in section, job
        assert f"`{setting}`" in section, setting


def test_a_changed_interval_leaves_a_due_job_due(
    capsys, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed interval (--every, a variable) moved each due job a whole interval away,
    unrun: --once then said 'no job was due'."""

    def interrupted(image, models):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # the jobs are written, and left due
        patch.setitem(JOBS, "audit", (interrupted, JOBS["audit"][1]))
        code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred())
    assert code == 130 and _ran(out) == set(), out + err
    every = ("--every", "facets=901", "--every", "prune=86401")
    monkeypatch.setenv("BATOS_HEARTBEAT_METHODS_SECONDS", "3601")
    planned = _planned(capsys, image, *every)
    assert all(r["due_at_start"] and not r.get("from_start") for r in planned.values()), planned
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--list", *every)
    assert code == 0 and "start +" not in out and out.count("(due)") == len(JOBS), out

    code, out, err = run(
        capsys, "--image", image, "heartbeat", "--once", *every, models=alfred("Steady.")
    )
    assert code == 0 and _ran(out) == set(JOBS), out + err
    # --every held for that heartbeat: the image keeps the settings' intervals, so the next
    # heartbeat without it changes nothing; the variable's interval is the image's.
    planned = _planned(capsys, image)
    assert planned["facets"]["stored_seconds"] is None and planned["facets"]["seconds"] == 900
    assert planned["prune"]["stored_seconds"] is None
    assert planned["methods"]["stored_seconds"] is None and planned["methods"]["seconds"] == 3601
    assert not any(r["due_at_start"] for r in planned.values())


def test_alternating_intervals_do_not_put_a_job_off(
    capsys, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each heartbeat with another interval rescheduled every job from its start: two
    heartbeats taking turns, each with its own, kept a job from ever coming due."""
    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred("Ok."))
    assert code == 0, out + err
    before = _planned(capsys, image)
    for seconds in ("3601", "3599", "3601"):
        monkeypatch.setenv("BATOS_HEARTBEAT_AUDIT_SECONDS", seconds)
        code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred())
        assert code == 0 and "no job was due" in out, out + err
    after = _planned(capsys, image)
    assert after["audit"]["next_run"] <= before["audit"]["next_run"]  # never later
    assert after["audit"]["stored_seconds"] is None and after["audit"]["seconds"] == 3601


@pytest.mark.parametrize(
    "every",
    [
        *("nope=5", "audit=-1", "audit", "audit=soon", "audit=1e99", "audit=1e12", "audit=inf"),
        *("audit=0", "audit=0.01", "audit=1e-7", "audit=nan"),
    ],
)
def test_every_refuses_what_is_not_a_job_and_an_interval(capsys, image: str, every) -> None:
    code, _, err = run(capsys, "--image", image, "heartbeat", "--list", "--every", every)
    assert code != 0 and "--every" in err and "hint:" in err


@pytest.mark.parametrize(
    ("variable", "value", "shortest"),
    [
        ("BATOS_HEARTBEAT_AUDIT_SECONDS", "0.01", "at least 1 "),
        ("BATOS_HEARTBEAT_FACETS_SECONDS", "1e-7", "at least 1 "),
        ("BATOS_HEARTBEAT_LEASE_SECONDS", "0.01", "at least 3 "),
        ("BATOS_HEARTBEAT_LEASE_SECONDS", "2.9", "at least 3 "),
    ],
)
def test_intervals_and_leases_too_short_to_mean_anything_are_refused(
    capsys, image: str, monkeypatch: pytest.MonkeyPatch, variable, value, shortest
) -> None:
    """An audit every 0.01 s wrote 504 idle reports in 10 s, a 0.01 s lease grew the image
    tenfold in 10 s of renewals, and 1e-7 s was listed but ran about once a second."""
    monkeypatch.setenv(variable, value)
    with LivingImage.open(image) as img:
        before = len(img.history(100))
    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred("Ok."))
    assert code == 2 and variable in err and shortest in err and "Traceback" not in err, out
    with LivingImage.open(image) as img:
        assert len(img.history(100)) == before  # refused before any job or lease was written


def test_a_heartbeat_refuses_an_interval_under_a_second(image: str) -> None:
    with LivingImage.open(image) as img:
        with pytest.raises(ConfigurationError, match="from 1 to"):
            Heartbeat(img, intervals={"audit": 0.01})
        assert Heartbeat(img, intervals={"audit": 1}).interval("audit").seconds == 1


def test_an_interval_setting_beyond_a_year_is_refused(capsys, image: str, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_HEARTBEAT_PRUNE_SECONDS", "1e99")
    code, _, err = run(capsys, "--image", image, "heartbeat", "--list")
    assert code != 0 and "BATOS_HEARTBEAT_PRUNE_SECONDS" in err and "Traceback" not in err


def test_each_job_run_is_one_line_or_one_json_object(capsys, image: str, tmp_path) -> None:
    code, out, err = run(
        capsys, "--image", image, "heartbeat", "--once", "--json", models=alfred("Ok.")
    )
    assert code == 0, out + err
    records = [json.loads(line) for line in out.splitlines()]  # stdout holds records only
    assert sorted(r["job"] for r in records) == sorted(JOBS)
    for r in records:
        assert r["ok"] and r["seconds"] >= 0 and r["said"] and r["time"]
    audited = next(r for r in records if r["job"] == "audit")
    assert audited["decided"]["report"] == 1 and audited["decided"]["verdict"] == "unknown"
    assert audited["decided"]["mission"] is None
    pruned = next(r for r in records if r["job"] == "prune")
    assert pruned["decided"]["keep"] == 50

    other = f"file://{tmp_path / 'other' / 'live_image.fs'}"
    assert run(capsys, "--image", other, "init")[0] == 0
    code, out, err = run(capsys, "--image", other, "heartbeat", "--once", models=alfred("Ok."))
    assert code == 0, out + err
    lines = out.splitlines()
    pattern = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ✓ (\w+) \(\d+\.\ds\): (.+)"
    matched = [re.fullmatch(pattern, line) for line in lines]
    assert all(matched) and sorted(m.group(1) for m in matched) == sorted(JOBS), out
    said = {m.group(1): m.group(2) for m in matched}
    assert said["audit"] == "audit report 1: CEM n/a (unknown)"


def test_ctrl_c_in_once_leaves_the_jobs_not_run_due(
    capsys, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(image, models):
        raise KeyboardInterrupt

    def ran(out: str) -> set[str]:
        return set(re.findall(r"^\S+ \S+ [✓✗] (\w+) ", out, re.MULTILINE))

    with monkeypatch.context() as patch:
        patch.setitem(JOBS, "prune", (interrupted, JOBS["prune"][1]))
        code, out, err = run(
            capsys, "--image", image, "heartbeat", "--once", models=alfred("Steady.")
        )
    assert code == 130 and "interrupted" in out and "stay due" in out, out + err
    assert "Error submitting job" not in out + err
    first = ran(out)
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--list", "--json")
    due = {r["job"] for r in map(json.loads, out.splitlines()) if r["due_at_start"]}
    assert "prune" in due and due == set(JOBS) - first  # none moved to its next interval unrun
    code, out, _ = run(capsys, "--image", image, "heartbeat", "--once", models=alfred("Steady."))
    assert code == 0 and ran(out) == due


def test_sigterm_in_once_stops_as_ctrl_c_does_and_gives_the_lease_back(
    capsys, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def terminated(image, models):
        os.kill(os.getpid(), signal.SIGTERM)  # as 'kill' or a service manager sends it
        time.sleep(10)  # the handler interrupts this

    monkeypatch.setitem(JOBS, "prune", (terminated, JOBS["prune"][1]))
    started = time.monotonic()
    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred("Steady."))
    assert code == 143 and "interrupted" in out and "stay due" in out, out + err
    assert time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler was put back
    with LivingImage.open(image) as img:
        assert lease_holder(img) is None  # given back, not left to expire


def test_a_stopped_heartbeat_keeps_its_lease_until_its_running_job_ends(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_HEARTBEAT_LEASE_SECONDS", "3")
    running, release = threading.Event(), threading.Event()
    prune = JOBS["prune"][0]

    def slow(image, models):
        running.set()
        assert release.wait(20)
        return prune(image, models)

    monkeypatch.setitem(JOBS, "prune", (slow, JOBS["prune"][1]))
    with LivingImage.open(image) as img:
        beat = Heartbeat(img, alfred(*["Steady."] * 5))
        stop = threading.Event()
        worker = threading.Thread(target=beat.forever, args=(stop,))
        worker.start()
        assert running.wait(20)
        time.sleep(0.9)  # late in a renewal period: the last renewal is already old
        stop.set()
        lapsed = []
        until = time.time() + 6.0  # twice the lease: unrenewed, it would lapse in this time
        while time.time() < until:
            lease = lease_holder(img)
            if not lease or lease["holder"] != beat.holder or lease["expires"] < time.time():
                lapsed.append(time.time())
            time.sleep(0.02)
        assert not lapsed, f"the lease lapsed for {lapsed[-1] - lapsed[0]:.2f} s"
        assert worker.is_alive()  # still waiting for the job
        release.set()
        worker.join(20)
        assert not worker.is_alive()
        assert lease_holder(img) is None
        assert any(o.job == "prune" and o.ok for o in beat.outcomes)


def test_a_first_stop_starts_no_queued_job_and_leaves_them_due(
    capsys, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a new image every job is due at once and two run at a time; the first stop waited
    for the queued ones as well (the model's among them), not only for the running two."""
    started: list[str] = []
    release = threading.Event()

    def waiting(name: str):
        def job(image, models):
            started.append(name)
            assert release.wait(30)
            return Decided(f"{name} ran")

        return job

    originals = dict(JOBS)
    for name in originals:
        monkeypatch.setitem(JOBS, name, (waiting(name), originals[name][1]))
    with LivingImage.open(image) as img:
        beat = Heartbeat(img, alfred())
        stop = threading.Event()
        worker = threading.Thread(target=beat.forever, args=(stop,))
        worker.start()
        deadline = time.monotonic() + 20
        while len(started) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)  # the others are queued behind the two running
        stop.set()
        time.sleep(0.5)
        release.set()
        worker.join(30)
        assert not worker.is_alive()
        assert len(started) == 2, started  # the two that were running, and no other
        assert lease_holder(img) is None
    planned = _planned(capsys, image)
    queued = set(originals) - set(started)
    assert queued and all(planned[name]["due_at_start"] for name in queued), planned
    assert not any(planned[name]["due_at_start"] for name in started), planned


def test_once_keeps_its_lease_while_a_job_outlasts_it(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--once took the lease once: a job running longer than it (facets, minutes on a slow
    model) let a second heartbeat take the expired lease and run its jobs beside it."""
    monkeypatch.setenv("BATOS_HEARTBEAT_LEASE_SECONDS", "3")
    running, release = threading.Event(), threading.Event()
    prune = JOBS["prune"][0]

    def slow(image, models):
        running.set()
        assert release.wait(30)
        return prune(image, models)

    monkeypatch.setitem(JOBS, "prune", (slow, JOBS["prune"][1]))
    with LivingImage.open(image) as img:
        beat = Heartbeat(img, alfred("Steady."))
        worker = threading.Thread(target=beat.once)
        worker.start()
        try:
            assert running.wait(30)
            taken = []
            # Past the expiry of the lease as it stood when the job began, and a second more.
            until = (lease_holder(img) or {}).get("expires", 0) + 1.0
            while time.time() < until:
                if acquire_lease(img, "another-heartbeat", 3.0) is not None:
                    taken.append(time.time())
                    break
                time.sleep(0.1)
            with pytest.raises(LeaseHeld):
                Heartbeat(img, alfred()).once()
        finally:
            release.set()
            worker.join(30)
        assert not worker.is_alive()
        assert not taken, "another heartbeat took the lease while the job ran"
        assert lease_holder(img) is None  # given back once the jobs ended
        assert any(o.job == "prune" and o.ok for o in beat.outcomes)


def test_once_gives_the_lease_back_when_it_fails_to_start(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure before the jobs (the scheduler's start) left the renewing thread holding the
    lease for as long as the process lived."""
    with LivingImage.open(image) as img:
        beat = Heartbeat(img, alfred())

        def broken(**options: object) -> None:
            raise RuntimeError("the scheduler would not start")

        monkeypatch.setattr(beat.scheduler, "start", broken)
        with pytest.raises(RuntimeError, match="would not start"):
            beat.once()
        assert lease_holder(img) is None
        assert not [t for t in threading.enumerate() if t.name == "heartbeat-lease"]


SLOW_HEARTBEAT = """
import sys, time
from batos.shell import heartbeat
from batos.errors import ConfigurationError
from batos.shell.cli import main

def slow(image, models):
    print("job started", flush=True)
    time.sleep(600)

for name in heartbeat.JOBS:  # every job due on a new image runs for ten minutes
    heartbeat.JOBS[name] = (slow, heartbeat.JOBS[name][1])
sys.exit(main(["--image", sys.argv[1], "heartbeat"]))
"""


def test_a_second_stop_abandons_the_running_job_and_gives_the_lease_back(
    capsys, image: str
) -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_HEARTBEAT, image],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        while "job started" not in process.stdout.readline():
            assert process.poll() is None, "the heartbeat ended before its job began"
        process.send_signal(signal.SIGTERM)  # the first: waits for the job
        time.sleep(2.0)
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)  # the second: at once
        out, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, out
    assert "stopping now: the running job is abandoned" in out
    with LivingImage.open(image) as img:  # the file is free, and so is the lease
        assert lease_holder(img) is None
    # The scheduler had moved each job it started (or queued for a worker) to its next run;
    # abandoned, they are due again, not an interval away.
    planned = _planned(capsys, image)
    assert all(r["due_at_start"] for r in planned.values()), planned


def test_a_failed_job_is_a_line_that_says_why(capsys, image: str) -> None:
    def broken(persona: str, **options):
        return ScriptedChatModel().enqueue(RuntimeError("model is down"))

    with LivingImage.open(image) as img:
        add_cycles(img, [("BRICK", (1, 0, 0))])
    code, out, err = run(capsys, "--image", image, "heartbeat", "--once", "--json", models=broken)
    assert code == 1, out + err
    audited = next(json.loads(line) for line in out.splitlines() if '"audit"' in line)
    assert not audited["ok"] and "model is down" in audited["decided"]["error"]


def test_a_job_that_fails_on_a_setting_is_one_line_and_one_log_record(
    capsys, caplog, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure's line ran on to a second, its hint, in the text and in the JSON 'said'; the
    long-running heartbeat logged it twice, its own record and APScheduler's."""
    monkeypatch.setenv("BATOS_HEARTBEAT_PRUNE_KEEP", "abc")
    images = [f"file://{tmp_path / name / 'live_image.fs'}" for name in ("text", "json", "run")]
    for uri in images:  # each with every job due
        assert run(capsys, "--image", uri, "init")[0] == 0
    code, out, err = run(capsys, "--image", images[0], "heartbeat", "--once", models=alfred("Ok."))
    assert code == 1, out + err
    lines = out.splitlines()
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [✓✗] \w+ ", line) for line in lines), out
    [failed] = [line for line in lines if " prune " in line]
    assert "✗ prune" in failed and "BATOS_HEARTBEAT_PRUNE_KEEP" in failed

    code, out, err = run(
        capsys, "--image", images[1], "heartbeat", "--once", "--json", models=alfred("Ok.")
    )
    [pruned] = [r for r in map(json.loads, out.splitlines()) if r["job"] == "prune"]
    assert not pruned["ok"] and "\n" not in pruned["said"], pruned
    assert pruned["said"].startswith("ConfigurationError: BATOS_HEARTBEAT_PRUNE_KEEP='abc'")
    assert pruned["decided"]["error"] == pruned["said"]
    assert "set BATOS_HEARTBEAT_PRUNE_KEEP to a valid value" in pruned["decided"]["hint"]

    caplog.clear()
    with LivingImage.open(images[2]) as img:
        beat = Heartbeat(img, alfred(*["Steady."] * 5))
        stop = threading.Event()
        worker = threading.Thread(target=beat.forever, args=(stop,))
        worker.start()
        deadline = time.monotonic() + 20
        while not any(o.job == "prune" for o in beat.outcomes):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stop.set()
        worker.join(20)
        assert not worker.is_alive()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].name == "batos.heartbeat", errors
    assert "job prune failed" in errors[0].getMessage() and "\n" not in errors[0].getMessage()


def test_an_audit_without_new_cycles_is_idle_and_starts_nothing(capsys, image: str) -> None:
    with LivingImage.open(image) as img:
        add_cycles(img, [("BRICK", (1, 0, 0)), ("ROBIN", (0, 1, 0)), ("BRICK", (0, 0, 1))])
        first = audit.run(img, alfred("Within bounds."))
        # Three more readings of the same cycles would be stagnation by the verdict rule; with
        # no cycle since, each is idle, and ALFRED's model is not asked (it has no reply).
        assert audit.verdict([first["metrics"]["cem"]] * 3, first["metrics"]["cem"], 0.05) == (
            "stagnation"
        )
        for number in (2, 3, 4):
            idle = audit.run(img, alfred())
            assert idle["id"] == number and idle["verdict"] == "idle"
            assert idle["reason"] == f"no new cycles since audit {number - 1}"
            assert idle.get("mission") is None and idle["judged"] == {}
            assert idle["weights_next"] == first["weights_next"]
        add_cycles(img, [("ROBIN", (0, 1, 0))])
        fresh = audit.run(img, alfred("One new cycle."))
        # Compared with the last reading that measured something: audit 1, not the idle ones.
        assert fresh["verdict"] != "idle" and fresh["previous"] == 1
        assert fresh["narrative"] == "One new cycle."
    code, out, _ = run(capsys, "--image", image, "audit", "show", "3")
    assert code == 0 and "verdict: idle (no new cycles since audit 2)" in out


def _decayed_with_a_mission(image: str) -> None:
    with LivingImage.open(image) as img:
        add_cycles(img, [("BRICK", (1, 0, 0)), ("ROBIN", (0, 1, 0)), ("BRICK", (0, 0, 1))])
        audit.run(img, alfred("Within bounds."))
        add_cycles(img, [("ALFRED", (1, 0, 0))] * 6)
        decayed = audit.run(img, alfred("Novelty has fallen."))
        assert decayed["verdict"] == "decay" and decayed["mission"] == 1
        audit.run(img, alfred())  # idle: nothing since


def test_audit_report_reads_whole_at_80_columns_in_a_pipe(image: str) -> None:
    _decayed_with_a_mission(image)
    shown = piped("--image", image, "audit", "report")
    assert shown.returncode == 0, shown.stderr
    fits_80_columns(shown.stdout)
    lines = shown.stdout.splitlines()
    header = next(line for line in lines if line.startswith("id "))
    assert header.split() == [
        "id",
        "time",
        "cycles",
        "H_rel",
        "H_cog",
        "H_sol",
        "H_struc",
        "CEM",
        "verdict",
    ]
    rows = [line.split() for line in lines if re.match(r"\d+ +\d\d-\d\d ", line)]
    assert [r[0] for r in rows] == ["1", "2", "3"]  # one line per audit
    assert rows[1][-3:] == ["decay", "→", "m1"] and rows[2][-1] == "idle"
    assert rows[0][7] == "n/a"  # H_struc (the time is two words): no facet was called
    assert any(line.startswith("mission 1 (audit 2): raise_prior") for line in lines)
    assert "missions: 1 started, 0 kept, 0 undone" in lines


def test_audit_report_shows_idle_audits_in_a_row_as_one_line(image: str) -> None:
    """An image nobody uses gets an idle audit an hour: 24 lines a day in the report."""
    _decayed_with_a_mission(image)
    with LivingImage.open(image) as img:
        for _ in range(4):
            audit.run(img, alfred())  # audits 4 to 7: idle, as audit 3 was
    shown = piped("--image", image, "audit", "report")
    assert shown.returncode == 0, shown.stderr
    fits_80_columns(shown.stdout)
    rows = [
        line.split() for line in shown.stdout.splitlines() if re.match(r"\d+(-\d+)? +\d\d-", line)
    ]
    assert [r[0] for r in rows] == ["1", "2", "3-7"]
    assert rows[2][-2:] == ["idle", "×5"]
    as_json = piped("--image", image, "audit", "report", "--json")
    assert len(json.loads(as_json.stdout)["audits"]) == 7  # the data keeps every audit


def test_audit_report_last_shows_the_recent_audits_and_their_missions(image: str) -> None:
    """Audited hourly, an image holds thousands of audits; the report printed every one."""
    _decayed_with_a_mission(image)  # audit 2 started mission 1
    with LivingImage.open(image) as img:
        for _ in range(4):
            audit.run(img, alfred())
    shown = piped("--image", image, "audit", "report", "-n", "3")
    assert shown.returncode == 0, shown.stderr
    assert "Audits (the last 3 of 7)" in shown.stdout
    rows = [
        line.split() for line in shown.stdout.splitlines() if re.match(r"\d+(-\d+)? +\d\d-", line)
    ]
    assert [r[0] for r in rows] == ["5-7"]
    assert "missions: none started yet" in shown.stdout  # mission 1 began before audit 5
    as_json = json.loads(piped("--image", image, "audit", "report", "--json", "--last", "6").stdout)
    assert [a["id"] for a in as_json["audits"]] == [2, 3, 4, 5, 6, 7]
    assert [m["report"] for m in as_json["missions"]] == [2]
    everything = piped("--image", image, "audit", "report", "--last", "70")
    assert "Audits\n" in everything.stdout and "Audits (the last" not in everything.stdout
    refused = piped("--image", image, "audit", "report", "--last", "0")
    assert refused.returncode == 2 and "--last" in refused.stderr


def test_audit_show_wraps_alfreds_account_at_80_columns_in_a_pipe(image: str) -> None:
    account = "Novelty has fallen across every persona this week, " * 4 + "so I propose a mission."
    with LivingImage.open(image) as img:
        add_cycles(img, [("BRICK", (1, 0, 0)), ("ROBIN", (0, 1, 0))])
        audit.run(img, alfred(account))
    shown = piped("--image", image, "audit", "show", "1")
    assert shown.returncode == 0, shown.stderr
    fits_80_columns(shown.stdout)
    told = shown.stdout.split("ALFRED: ", 1)[1]
    assert " ".join(told.split()) == account


def test_config_reads_whole_at_80_columns_in_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    from batos import settings
    from batos.settings import SETTINGS

    monkeypatch.setenv("BATOS_AUDIT_WINDOW", "7")
    shown = piped("config")
    assert shown.returncode == 0, shown.stderr
    blocks = [b.splitlines() for b in shown.stdout.strip("\n").split("\n\n")]
    assert [b[0].split(" = ")[0] for b in blocks] == list(SETTINGS)  # one block per setting
    for block in blocks:
        name, value = block[0].split(" = ", 1)
        setting = SETTINGS[name]
        # The value stays whole on its first line, however long; the rest fits in 80.
        assert value == ("***" if "key" in name and value else str(settings.get(name)))
        assert block[1] in (f"    (from {setting.env})", f"    (default; {setting.env} overrides)")
        assert all(len(line) <= 80 and line.startswith("    ") for line in block[1:]), block
        assert " ".join(line.strip() for line in block[2:]) == setting.help  # wrapped, not cut
    by_name = {b[0].split(" = ")[0]: b for b in blocks}
    assert by_name["audit_window"][:2] == ["audit_window = 7", "    (from BATOS_AUDIT_WINDOW)"]
    assert by_name["audit_decay"][0] == "audit_decay = 0.05"


def test_config_shows_the_settings_named(capsys) -> None:
    code, out, _ = run(capsys, "config", "audit_window", "heartbeat_audit_seconds")
    assert code == 0 and out.startswith("audit_window = 50\n")
    assert [line for line in out.splitlines() if " = " in line] == [
        "audit_window = 50",
        "heartbeat_audit_seconds = 3600.0",
    ]
    code, _, err = run(capsys, "config", "audit_windows")
    assert code != 0 and "unknown setting 'audit_windows'" in err and "audit_window" in err


def test_config_checks_every_name_before_it_shows_a_block(capsys) -> None:
    code, out, err = run(capsys, "config", "model", "bogus", "audit_windows")
    assert code == 2 and out == ""
    assert "unknown settings 'bogus', 'audit_windows'" in err and "audit_window" in err


def test_config_flags_a_bad_value_with_its_reason_and_shows_the_rest(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batos.settings import SETTINGS

    monkeypatch.setenv("BATOS_AUDIT_WINDOW", "abc")
    monkeypatch.setenv("BATOS_LEARNING_VOICE_MARGIN", "-1")
    code, out, err = run(capsys, "config")
    assert code == 2  # after every block, not at the first bad one
    blocks = [b.splitlines() for b in out.strip("\n").split("\n\n")]
    assert [b[0].split(" = ")[0] for b in blocks] == list(SETTINGS)
    by_name = {b[0].split(" = ")[0]: b for b in blocks}
    assert by_name["audit_window"][:3] == [
        "audit_window = abc",
        "    (from BATOS_AUDIT_WINDOW)",
        "    NOT VALID: invalid literal for int() with base 10: 'abc'",
    ]
    assert by_name["learning_voice_margin"][2] == "    NOT VALID: must be a number from 0 to 1"
    assert sum("NOT VALID" in line for line in out.splitlines()) == 2
    assert "2 settings not valid: BATOS_AUDIT_WINDOW, BATOS_LEARNING_VOICE_MARGIN" in err
    code, out, _ = run(capsys, "config", "audit_decay")
    assert code == 0 and "NOT VALID" not in out


def test_the_chart_labels_its_axes_and_draws_every_legend_entry(image: str) -> None:
    from matplotlib.collections import PolyCollection

    _decayed_with_a_mission(image)
    with LivingImage.open(image) as img:
        rows = audit.history(img)
    assert all(r["metrics"]["H_struc"] is None for r in rows)  # the component with no line
    kept, undone = {"report": 1, "status": "kept"}, {"report": 2, "status": "undone"}
    fig = draw_chart(rows, [kept, undone, {"report": 3, "status": "pending"}])
    try:
        ax, wax = fig.axes[0], fig.axes[1]
        assert ax.get_ylabel() and wax.get_ylabel() and wax.get_xlabel() == "audit"
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels[:5] == ["H_rel", "H_cog", "H_sol", "H_struc (n/a in 3 of 3)", "CEM"]
        for label in labels[:5]:  # one line per component, with something to see
            drawn = [line for line in ax.get_lines() if line.get_label() == label]
            assert len(drawn) == 1, label
            assert any(y == y for y in drawn[0].get_ydata()), label  # not all NaN
        marks = {
            "mission started, kept": 1,
            "mission started, undone": 2,
            "mission started, open or failed": 3,
        }
        for label, report in marks.items():  # the legend explains the dotted lines drawn
            handle = ax.get_legend().legend_handles[labels.index(label)]
            assert any(
                line.get_linestyle() == ":"
                and list(line.get_xdata()) == [report, report]
                and line.get_color() == handle.get_color()
                for line in ax.get_lines()
            ), label
        assert "hollow, under 0: n/a (undefined)" in labels
        bands = [c for c in wax.collections if isinstance(c, PolyCollection)]
        weight_labels = [t.get_text() for t in wax.get_legend().get_texts()]
        assert weight_labels == ["H_rel", "H_cog", "H_sol", "H_struc"] and len(bands) == 4
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
