"""The heartbeat, the audit and their commands: real APScheduler, scripted models."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from fakes import FakeModels, ScriptedChatModel
from test_mind import responder

from batos.shell.cli import main
from batos.shell.heartbeat import Heartbeat, LeaseHeld
from graph import audit
from graph.cycle import CYCLES_KEY
from store.core.image import LivingImage
from store.core.jobstore import acquire_lease
from store.knowledge.embeddings import to_bytes


def run(capsys, *argv: str, models=None) -> tuple[int, str, str]:
    code = main(list(argv), models=models)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def image(capsys, file_uri: str) -> str:
    assert run(capsys, "--image", file_uri, "init")[0] == 0
    return file_uri


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

        cycles = root.get(CYCLES_KEY)
        if cycles is None:
            cycles = root[CYCLES_KEY] = OOBTree()
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
    assert code == 0 and "audit" in out and "interval[1:00:00]" in out


def test_a_second_heartbeat_with_once_is_told_who_acts(capsys, image: str) -> None:
    with LivingImage.open(image) as img:
        assert acquire_lease(img, "the-other", 30.0)
    code, _, err = run(capsys, "--image", image, "heartbeat", "--once", models=alfred())
    assert code == LeaseHeld.exit_code and "the-other" in err


def test_forever_runs_unattended_waits_for_the_lease_and_stops_cleanly(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_HEARTBEAT_AUDIT_SECONDS", "0.3")
    monkeypatch.setenv("BATOS_HEARTBEAT_LEASE_SECONDS", "1.5")
    with LivingImage.open(image) as img:
        first = Heartbeat(img, alfred(*["Steady."] * 50))
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
        deadline = time.monotonic() + 20
        while not any(o.job == "audit" for o in second.outcomes):  # it takes over
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stop_second.set()
        b.join(10)
        assert not b.is_alive()
        assert all(o.ok for o in first.outcomes + second.outcomes)


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
