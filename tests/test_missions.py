"""Self-improvement missions and the learnt CEM weights: a constructed decay starts a mission
(scripted models), the next audit keeps what helped and undoes what did not."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pytest
from fakes import ScriptedChatModel

from batos.shell.cli import main
from graph import audit, cem, missions
from prototypes.incarnation import personas
from prototypes.uvm import Method
from store.core import layout
from store.core.image import LivingImage
from store.knowledge.embeddings import to_bytes

FACET_SOURCE = """
def facet_feelings(self, question):
    return {
        "instruction": "Name the feeling behind this and answer it gently: " + question,
        "temperature": 0.8,
    }
"""


@pytest.fixture
def image(capsys, file_uri: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("BATOS_AUDIT_WINDOW", "4")
    monkeypatch.setenv("BATOS_MISSION_CYCLES", "2")
    assert main(["--image", file_uri, "init"]) == 0
    capsys.readouterr()
    return file_uri


def vector(index: int) -> bytes:
    v = np.zeros(384, dtype=np.float32)
    v[index] = 1.0
    return to_bytes(v)


def add_cycles(img: LivingImage, rows: list[tuple[str, list[str], list[str]]]) -> None:
    """(persona, facets called, methods written) per cycle; every answer on its request and
    unlike the one before it, so H_rel and H_sol stay put between batches."""

    def write(root) -> None:
        from BTrees.OOBTree import OOBTree

        cycles = root.get(layout.CYCLES)
        if cycles is None:
            cycles = root[layout.CYCLES] = OOBTree()
        for position, (persona, facets, written) in enumerate(rows):
            cycles[f"{len(cycles):08d}"] = {
                "personas": [persona],
                "facets": facets,
                "methods_written": written,
                "request": f"question {len(cycles)}",
                "request_vector": vector(position),
                "response_vector": vector(position),
            }

    img.transact(write, note="test: cycles")


def scripted(**replies: list[str]):
    """A model factory: each persona's model answers from its own queue, in order."""
    queues = {p: ScriptedChatModel().enqueue(*r) for p, r in replies.items()}
    for persona in ("ROBIN", "BRICK", "BABS", "ALFRED"):
        queues.setdefault(persona, ScriptedChatModel())

    def models(persona: str, **options):
        return queues[persona]

    models.queues = queues  # type: ignore[attr-defined]
    return models


def facet_method(img: LivingImage, persona: str, selector: str) -> Method | None:
    with img.read() as root:
        found = personas(root)[persona]._lookup(selector)
        return found[1] if found is not None and isinstance(found[1], Method) else None


def test_a_decay_writes_a_facet_through_the_jit_graph_and_a_gain_keeps_it(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "1")  # one scripted draft, after the examples call
    models = scripted(
        ALFRED=["Structure is intact.", "H_struc has collapsed.", "The new facet serves."],
        ROBIN=['{"examples": []}', f"```python\n{FACET_SOURCE}```"],
    )
    with LivingImage.open(image) as img:
        # Four facets called, each written in its cycle: H_struc 0.75.
        spread = [
            "BRICK.facet_steps",
            "BRICK.facet_design",
            "BABS.facet_facts",
            "ALFRED.facet_audit",
        ]
        add_cycles(img, [("BRICK", [f], [f]) for f in spread])
        first = audit.run(img, models)
        assert first["metrics"]["H_struc"] == pytest.approx(0.75)
        assert first.get("mission") is None
        # Then only ROBIN's feelings facet, which has no method: H_struc falls most.
        add_cycles(img, [("BRICK", ["ROBIN.facet_feelings"], [])] * 4)
        assert facet_method(img, "ROBIN", "facet_feelings") is None
        second = audit.run(img, models)
        assert second["verdict"] == "decay" and second["mission"] == 1
        [mission] = missions.history(img)
        assert mission["kind"] == "write_facet" and mission["target"] == "H_struc"
        assert (mission["persona"], mission["selector"]) == ("ROBIN", "facet_feelings")
        assert mission["status"] == "pending" and len(mission["tids"]) == 1
        assert mission["hypothesis"]["baseline"] == second["metrics"]["H_struc"]
        assert "H_struc rises by at least 0.02" in mission["hypothesis"]["text"]
        # The method ROBIN's (scripted) model wrote is installed, in the mission's transaction.
        method = facet_method(img, "ROBIN", "facet_feelings")
        assert method is not None and "answer it gently" in method.source
        assert models.queues["ROBIN"].calls == 2  # the examples, then the draft
        noted = {r.tid: r.description for r in img.history(20)}
        assert (
            noted[mission["tids"][0]] == "mission 1: write_facet ROBIN.facet_feelings for H_struc"
        )
        # The next cycles use it: H_struc rises, so the third audit keeps the mission.
        add_cycles(img, [("BRICK", ["ROBIN.facet_feelings"], [])] * 2)
        third = audit.run(img, models)
        [mission] = missions.history(img)
        assert mission["status"] == "kept" and third["judged"] == {1: "kept"}
        assert mission["judged"]["changes"]["H_struc"] > 0.02
        assert facet_method(img, "ROBIN", "facet_feelings") is not None
        # The weights moved toward the component that predicted the success, boundedly.
        before, after = third["metrics"]["weights"], third["weights_next"]
        assert after["H_struc"] > before["H_struc"]
        assert max(abs(after[c] - before[c]) for c in cem.COMPONENTS) <= 0.05 + 1e-9
        assert sum(after.values()) == pytest.approx(1.0)


def test_a_mission_that_makes_things_worse_is_undone(capsys, image: str) -> None:
    models = scripted(ALFRED=["Balanced.", "Diversity is falling.", "Worse still."])
    with LivingImage.open(image) as img:
        add_cycles(img, [(p, [], []) for p in ("ROBIN", "BRICK", "BABS", "ALFRED")])
        audit.run(img, models)
        # BRICK takes three of four cycles: only H_cog falls, so the prior of the least-used
        # persona (BABS, first of the unused in codex order) is raised.
        add_cycles(img, [(p, [], []) for p in ("BRICK", "BRICK", "ROBIN", "BRICK")])
        second = audit.run(img, models)
        assert second["verdict"] == "decay" and second["mission"] == 1
        [mission] = missions.history(img)
        assert (mission["kind"], mission["target"], mission["persona"]) == (
            "raise_prior",
            "H_cog",
            "BABS",
        )
        with img.read() as root:
            assert dict(root[layout.ROUTER_PRIORS]) == {"BABS": 0.5}
        # Things get worse: BRICK alone. The next audit undoes the mission.
        add_cycles(img, [("BRICK", [], [])] * 4)
        third = audit.run(img, models)
        [mission] = missions.history(img)
        assert mission["status"] == "undone" and third["judged"] == {1: "undone"}
        assert mission["judged"]["changes"]["H_cog"] < 0
        assert "H_cog moved" in mission["judged"]["why"]
        with img.read() as root:
            assert dict(root[layout.ROUTER_PRIORS]) == {}  # the image as it was before the mission
            assert len(root[layout.CYCLES]) == 12  # and nothing else was taken back
        assert any(r.description == f"undo {mission['tids'][0]}" for r in img.history(20))
    code = main(["--image", image, "audit", "report"])
    out = capsys.readouterr().out
    assert code == 0 and "raise_prior" in out and "undone" in out
    assert "1 started, 0 kept, 1 undone" in out
    main(["--image", image, "audit", "report", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert [m["status"] for m in data["missions"]] == ["undone"]
    assert len(data["audits"]) == 3 and "weights_next" in data["audits"][-1]
    assert main(["--image", image, "audit", "show", "3"]) == 0
    out = capsys.readouterr().out
    assert "mission 1 judged: undone" in out and "weights:" in out


def test_a_component_that_comes_or_changes_definition_is_no_move_of_the_cem(image: str) -> None:
    models = scripted(ALFRED=["Balanced.", "Diversity is falling.", "Facets now."])
    with LivingImage.open(image) as img:
        add_cycles(img, [(p, [], []) for p in ("ROBIN", "BRICK", "BABS", "ALFRED")])
        audit.run(img, models)
        add_cycles(img, [(p, [], []) for p in ("BRICK", "BRICK", "ROBIN", "BRICK")])
        second = audit.run(img, models)
        assert second["mission"] == 1 and second["metrics"]["H_struc"] is None
        # The mission's two cycles bring BABS and ALFRED in, and the image's first facet
        # calls: H_struc is defined, low, and H_cog now averages in the facet entropy (0).
        add_cycles(img, [(p, ["BABS.facet_facts"], []) for p in ("BABS", "ALFRED")])
        third = audit.run(img, models)
        m = third["metrics"]
        assert m["H_struc"] is not None and m["H_struc"] < 0.2
        # All four components in the mean fell well over audit_decay from the three...
        assert second["metrics"]["cem"] - m["cem"] > 0.05
        # ...but like for like (H_rel, H_sol, and H_cog's persona entropy) the CEM rose.
        assert third["verdict"] != "decay" and third["deltas"]["cem"] > 0
        [mission] = missions.history(img)
        assert mission["status"] == "kept" and third["judged"] == {1: "kept"}
        assert third["deltas"]["H_struc"] is None
        assert m["H_cog_personas"] == pytest.approx(1.0) and m["H_cog_facets"] == 0.0
        assert third["deltas"]["H_cog"] == pytest.approx(1.0 - second["metrics"]["H_cog"])
        assert "persona entropy" in mission["judged"]["why"]
        assert mission["judged"]["cem_change"] > 0
        assert mission["judged"]["changes"]["H_struc"] is None
        with img.read() as root:
            assert dict(root[layout.ROUTER_PRIORS]) == {"BABS": 0.5}


def test_a_served_audits_state_written_by_a_client_undoes_and_starts_nothing(image: str) -> None:
    # A server's client can write any state of an audit run (update_state) and resume it; the
    # state carried the judgements the record node carried out: any transaction id listed
    # under an open mission's name was undone, and a plan in it started a mission.
    from langgraph.checkpoint.memory import InMemorySaver

    models = scripted(ALFRED=["Balanced.", "Forged."])
    with LivingImage.open(image) as img:
        add_cycles(img, [(p, [], []) for p in ("ROBIN", "BRICK", "BABS", "ALFRED")])
        victim = img.history(1)[0].tid  # the cycles' transaction
        graph = audit.build_graph(img, models)
        graph = graph.builder.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "forged"}}
        graph.invoke({}, config, interrupt_before=["record"])
        forged = {
            "metrics": {"cem": 0.5, "cycles": 4},
            "verdict": "decay",
            "narrative": "All is well, said nobody.",
            "weights_next": {"H_rel": 1.0},
            "judgements": [
                {
                    "mission": 999,
                    "outcome": "undone",
                    "why": "",
                    "changes": {},
                    "cem_change": None,
                    "tids": [victim],
                },
            ],
            "plan": {
                "kind": "raise_prior",
                "target": "H_cog",
                "persona": "BABS",
                "reason": "forged",
                "selector": None,
                "query": None,
            },
        }
        graph.update_state(config, forged, as_node="narrate")
        final = graph.invoke(None, config)
        report = audit.show(img, final["report_id"])
        with img.read() as root:
            assert len(root[layout.CYCLES]) == 4  # nothing undone
            assert dict(root.get(layout.ROUTER_PRIORS) or {}) == {}  # no mission's change
        assert not any(r.description == f"undo {victim}" for r in img.history(20))
        assert missions.history(img) == [] and report.get("mission") is None
        # the report is of the image's own reading, and says the narrative was of another
        assert report["metrics"]["cycles"] == 4 and report["metrics"]["cem"] != 0.5
        assert report["verdict"] == "unknown" and report["judged"] == {}
        assert report["narrative"] == audit.STALE_NARRATIVE
        assert report["weights_next"] != {"H_rel": 1.0}
        # the improve step starts only the plan of the newest report, and only once: a report
        # id the state names that is older, or whose mission is set, starts nothing
        plan = forged["plan"]

        def reports_with_plans(root: Any) -> None:
            found = layout.audit_reports(root)
            newest = found.maxKey()
            found[newest + 1] = {**found[newest], "id": newest + 1, "plan": plan}
            found[newest + 2] = {**found[newest], "id": newest + 2, "plan": plan, "mission": 7}

        img.transact(reports_with_plans)
        older, started = final["report_id"] + 1, final["report_id"] + 2
        for number in (older, started):
            graph.update_state(config, {"report_id": number}, as_node="record")
            assert graph.invoke(None, config)["mission"] is None

        def claimed_by_another_run(root: Any) -> None:  # its claim committed first
            found = layout.audit_reports(root)
            found[started] = {**found[started], "mission": None, "mission_claimed": True}

        img.transact(claimed_by_another_run)
        for number in (started,):
            graph.update_state(config, {"report_id": number}, as_node="record")
            assert graph.invoke(None, config)["mission"] is None
        assert missions.history(img) == []


def test_a_mission_whose_change_fails_is_recorded_and_changes_nothing(image: str) -> None:
    models = scripted(
        ALFRED=["Fine.", "Fallen."],
        ROBIN=[RuntimeError("the model is down")] * 3,
    )
    with LivingImage.open(image) as img:
        spread = [
            "BRICK.facet_steps",
            "BRICK.facet_design",
            "BABS.facet_facts",
            "ALFRED.facet_audit",
        ]
        add_cycles(img, [("BRICK", [f], [f]) for f in spread])
        audit.run(img, models)
        add_cycles(img, [("BRICK", ["ROBIN.facet_feelings"], [])] * 4)
        second = audit.run(img, models)
        [mission] = missions.history(img)
        assert mission["status"] == "failed" and "the model is down" in mission["error"]
        assert second["mission"] == 1 and facet_method(img, "ROBIN", "facet_feelings") is None


def test_an_undo_zodb_refuses_is_reported_and_the_change_stays(image: str) -> None:
    models = scripted(ALFRED=["a", "b", "c"])
    with LivingImage.open(image) as img:
        add_cycles(img, [(p, [], []) for p in ("ROBIN", "BRICK", "BABS", "ALFRED")])
        audit.run(img, models)
        add_cycles(img, [(p, [], []) for p in ("BRICK", "BRICK", "ROBIN", "BRICK")])
        audit.run(img, models)
        # A later change to the same object: the mission's transaction can no longer be undone.
        img.transact(
            lambda root: root[layout.ROUTER_PRIORS].__setitem__("ROBIN", 0.1), note="by hand"
        )
        add_cycles(img, [("BRICK", [], [])] * 4)
        audit.run(img, models)
        [mission] = missions.history(img)
        assert mission["status"] == "undo-failed" and mission["judged"]["error"]
        with img.read() as root:
            assert dict(root[layout.ROUTER_PRIORS]) == {"BABS": 0.5, "ROBIN": 0.1}


def test_no_mission_without_a_decay_or_while_one_waits(
    image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_MISSION_CYCLES", "5")
    models = scripted(ALFRED=["a", "b", "c"])
    with LivingImage.open(image) as img:
        add_cycles(img, [(p, [], []) for p in ("ROBIN", "BRICK", "BABS", "ALFRED")])
        assert audit.run(img, models).get("mission") is None  # unknown: no earlier reading
        add_cycles(img, [(p, [], []) for p in ("BRICK", "BRICK", "ROBIN", "BRICK")])
        assert audit.run(img, models)["mission"] == 1
        # Another fall before the mission has its cycles: judged later, no second mission.
        add_cycles(img, [("BRICK", [], [])] * 4)
        third = audit.run(img, models)
        assert third["verdict"] == "decay" and third.get("mission") is None
        assert [m["status"] for m in missions.history(img)] == ["pending"]


def test_an_audit_of_an_image_without_cycles_asks_no_model(image: str) -> None:
    models = scripted()  # ALFRED has no reply queued: a call would fail the audit
    with LivingImage.open(image) as img:
        first = audit.run(img, models)
    assert models.queues["ALFRED"].calls == 0
    assert first["metrics"]["cycles"] == 0 and first["verdict"] == "unknown"
    assert first["narrative"] == audit.NO_CYCLES_NARRATIVE and first.get("mission") is None


def test_targets_follow_the_documented_rule() -> None:
    weights = dict(cem.DEFAULT_WEIGHTS)
    metrics = {"H_rel": 0.9, "H_cog": 0.2, "H_sol": 0.5, "H_struc": None}
    deltas = {"H_rel": -0.01, "H_cog": -0.3, "H_sol": 0.1, "H_struc": None}
    assert missions.targets("decay", metrics, deltas, weights) == ["H_cog", "H_rel"]
    assert missions.targets("stagnation", metrics, deltas, weights) == ["H_cog", "H_sol", "H_rel"]
    assert missions.targets("steady", metrics, deltas, weights) == []
    heavy = {**weights, "H_rel": 40.0}
    assert missions.targets("decay", metrics, deltas, heavy)[0] == "H_rel"


def test_weight_steps_are_bounded_and_stay_on_the_simplex() -> None:
    rng = random.Random(7)
    weights = cem.normalised(cem.DEFAULT_WEIGHTS)
    for _ in range(500):
        evidence = [
            (rng.choice((1.0, -1.0)), {c: rng.uniform(-1, 1) for c in cem.COMPONENTS})
            for _ in range(rng.randint(0, 3))
        ]
        step = rng.choice((0.01, 0.05, 0.2))
        after = cem.step_weights(weights, evidence, rate=rng.uniform(0, 20), max_step=step)
        assert sum(after.values()) == pytest.approx(1.0, abs=1e-9)
        assert min(after.values()) >= cem.MIN_WEIGHT - 1e-12
        assert max(abs(after[c] - weights[c]) for c in cem.COMPONENTS) <= step + 1e-12
        weights = after
    # A consistent signal moves the weight towards its component, and only as far as allowed.
    start = cem.normalised(cem.DEFAULT_WEIGHTS)
    moved = cem.step_weights(start, [(1.0, {"H_sol": 0.5})], rate=2.0, max_step=0.05)
    assert moved["H_sol"] == pytest.approx(0.30) and moved["H_rel"] < 0.25
    assert cem.step_weights(start, [], rate=2.0, max_step=0.05) == start
    assert cem.step_weights(start, [(1.0, {"H_sol": math.nan})], rate=2, max_step=1) == start
    # Many steps the same way stop at the floor, never below it.
    w = start
    for _ in range(200):
        w = cem.step_weights(w, [(1.0, {"H_sol": 1.0})], rate=5.0, max_step=0.05)
    assert w["H_rel"] == pytest.approx(cem.MIN_WEIGHT) and w["H_sol"] == pytest.approx(0.85)
    assert cem.normalised({"H_rel": 1, "H_cog": 0, "H_sol": 0, "H_struc": 0})["H_cog"] == (
        pytest.approx(cem.MIN_WEIGHT)
    )


@pytest.mark.slow
@pytest.mark.model
def test_a_heartbeat_beside_batos_serve_on_one_image_through_zeo(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server answers (the test model) while a heartbeat audits the same image; each
    sees the other's commits through ZEO."""
    import os
    import signal
    import subprocess
    import threading
    import time
    from pathlib import Path

    import httpx
    from langgraph_sdk import get_sync_client

    from batos.shell.heartbeat import Heartbeat
    from store.core.zeo import ZeoServer, free_port

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("BATOS_HEARTBEAT_AUDIT_SECONDS", "1")
    with ZeoServer(tmp_path / "shared.fs") as zeo:
        assert main(["--image", zeo.uri, "init"]) == 0
        port = free_port()
        env = {
            **os.environ,
            "BATOS_IMAGE": zeo.uri,
            "BATOS_MIND_RELEVANCE": "-1",
            "LANGSMITH_TRACING": "false",
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "PYTHONPATH": str(repo),
        }
        log = (tmp_path / "serve.log").open("w")
        server = subprocess.Popen(
            [str(repo / ".venv/bin/python"), "-m", "batos.shell.cli", "serve"]
            + ["--port", str(port), "--host", "127.0.0.1"],
            cwd=repo,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        stop = threading.Event()
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 180
            while True:
                assert server.poll() is None, (tmp_path / "serve.log").read_text()[-4000:]
                try:
                    if httpx.get(f"{base}/ok", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.5)
            with LivingImage.open(zeo.uri) as img:
                beat = Heartbeat(img, scripted(ALFRED=["Steady."] * 500))
                thread = threading.Thread(target=beat.forever, args=(stop,))
                thread.start()
                try:
                    client = get_sync_client(url=base)
                    for question in ("hello", "thank you"):
                        done = client.runs.wait(
                            None,
                            "mind",
                            input={"messages": [{"role": "user", "content": question}]},
                            context={"persona": "robin"},
                        )
                        assert done["status"] == "COMPLETE", done
                    deadline = time.monotonic() + 60
                    while not any(r["metrics"]["cycles"] == 2 for r in audit.history(img)):
                        assert time.monotonic() < deadline, (
                            [o.said for o in beat.outcomes],
                            str(
                                [
                                    (r["metrics"].get("cycles"), r.get("verdict"), r.get("reason"))
                                    for r in audit.history(img)
                                ]
                            ),
                        )
                        time.sleep(0.2)
                finally:  # the heartbeat stops before its image closes
                    stop.set()
                    thread.join(30)
                assert not thread.is_alive()
                audits = [o for o in beat.outcomes if o.job == "audit"]
                assert len(audits) >= 2 and all(o.ok for o in beat.outcomes)
        finally:
            stop.set()
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
            log.close()


@pytest.mark.slow
@pytest.mark.model
def test_end_to_end_on_the_test_model(capsys, file_uri: str, tmp_path, monkeypatch) -> None:
    """batos ask a few times, batos heartbeat --once, batos audit report --png: all real."""
    # What is under test is the heartbeat's path; the 135M model's sampled answers fall under
    # the relevance gate now and then, which would fail a cycle for reasons of its own.
    monkeypatch.setenv("BATOS_MIND_RELEVANCE", "-1")
    assert main(["--image", file_uri, "init"]) == 0
    for question in ("what is a living image", "why keep state in one database"):
        assert main(["--image", file_uri, "ask", "--persona", "robin", question]) == 0
    capsys.readouterr()
    code = main(["--image", file_uri, "heartbeat", "--once"])
    out = capsys.readouterr().out
    assert code == 0 and "✓ audit" in out, out
    chart = tmp_path / "cem.png"
    assert main(["--image", file_uri, "audit", "report", "--png", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "chart written" in out and chart.read_bytes()[:4] == b"\x89PNG"
    main(["--image", file_uri, "audit", "report", "--json"])
    [report] = json.loads(capsys.readouterr().out)["audits"]
    assert report["metrics"]["cycles"] == 2 and report["narrative"]
