"""Mind cycles across processes: killed mid-cycle and resumed, killed right after the commit,
and cycles of two processes sharing one image through ZEO."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import image_digest
from images import open_laid_out

from batos.shell.runtime import open_image
from graph import cycle
from prototypes.incarnation import personas
from store.checkpoint.saver import ZODBSaver
from store.core.zeo import ZeoServer

REPO = Path(__file__).resolve().parents[1]

RUNNER = """
import json, logging, os, re, signal, sys, time
from pathlib import Path
from fakes import FakeEmbedder, FakeModels, FakeRouter, call_kind
from langchain_core.messages import HumanMessage
from batos.shell.runtime import open_image
from graph import facets
from graph.mind import MindServices, build_graph, refuse_if_busy, run_config
from batos.errors import ThreadBusy
from prototypes.codex import load_codex
from store.checkpoint.saver import ThreadMovedOn, ZODBSaver

INTENTS = {s: i for spec in load_codex().personas.values() for s, i in spec.intents.items()}
uri, mode, threads = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
PLAN = json.dumps({"steps": [
    {"facet": "BRICK.facet_steps", "query": "which steps build a shed"},
    {"facet": "BRICK.facet_design", "query": "what shed design"},
]})


def respond(call):
    kind = call_kind(call)
    if kind == "plan":
        return PLAN
    if kind == "draft":
        selector = re.search(r"Write the method `(\\w+)`", call.text).group(1)
        # a right facet: the text and temperature its codex intent states
        text, temperature = facets.stated(INTENTS[selector])
        body = f"{{'instruction': {text!r} + query, 'temperature': {temperature}}}"
        return f"```python\\ndef {selector}(self, query):\\n    return {body}\\n```"
    if kind == "facet":
        return "1. measure 2. cut 3. build"
    if mode == "hang" and os.environ.get("SIGNAL_FILE"):
        Path(os.environ["SIGNAL_FILE"]).write_text("synthesizing")
        time.sleep(120)
    return "To build the shed: measure, cut, build."


class KillAfterCommit(logging.Handler):
    def emit(self, record):
        if json.loads(record.getMessage()).get("event") == "commit":
            os.kill(os.getpid(), signal.SIGKILL)


if mode == "kill-after-commit":
    logging.getLogger("batos.mind").setLevel(logging.INFO)
    logging.getLogger("batos.mind").addHandler(KillAfterCommit())
services = MindServices(models=FakeModels(respond), router=FakeRouter(("BRICK",)),
                        embedder=FakeEmbedder())
with open_image(uri, create=True) as image, ZODBSaver(image) as saver:
    graph = build_graph(services, checkpointer=saver)
    for thread in threads:
        payload = None if mode == "resume" else {
            "messages": [HumanMessage("plan the steps to build a shed")]}
        try:
            config = run_config(thread)
            if payload is not None:  # as every entry point sends a request
                config = refuse_if_busy(graph, config)
            state = graph.invoke(payload, config)
        except (ThreadBusy, ThreadMovedOn) as refused:
            print(json.dumps({"thread": thread, "status": type(refused).__name__}), flush=True)
            continue
        print(json.dumps({"thread": thread, "status": state["status"],
                          "cycle": state["cycle"]["id"]}), flush=True)
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    paths = [str(REPO / "tests"), str(REPO)]
    # Facets written by the cycle itself: the kill lands between their checkpoint and COMPLETE.
    inline = {"BATOS_MIND_WRITE_FACETS": "inline"}
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **inline, **extra}


def _runner(tmp_path: Path) -> str:
    path = tmp_path / "mind_runner.py"
    path.write_text(RUNNER)
    return str(path)


def _run(tmp_path: Path, uri: str, mode: str, threads: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, _runner(tmp_path), uri, mode, threads],
        env=_env(tmp_path, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stats(uri: str) -> dict:
    with open_laid_out(uri) as image, image.read() as root:
        return dict(personas(root)["BRICK"].stats)


@pytest.mark.slow
def test_a_cycle_killed_mid_cycle_resumes_and_commits_once(tmp_path: Path, file_uri: str) -> None:
    with open_image(file_uri, create=True) as image, ZODBSaver(image):  # every layout in place
        before = image_digest(image.db, exclude=("checkpoints",))
    signal_file = tmp_path / "in-synthesis"
    victim = _run(tmp_path, file_uri, "hang", "k9", SIGNAL_FILE=str(signal_file))
    deadline = time.monotonic() + 120
    while not signal_file.exists():
        assert victim.poll() is None, victim.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the cycle never reached synthesis"
        time.sleep(0.05)
    time.sleep(0.5)  # the facet step's checkpoint is written in the background
    victim.send_signal(signal.SIGKILL)
    victim.wait()

    with open_laid_out(file_uri) as image:
        # killed mid-cycle: the facet method was written and its effect checkpointed, but the
        # image itself is as it was
        assert image_digest(image.db, exclude=("checkpoints",)) == before
        with ZODBSaver(image) as saver:
            latest = saver.get_tuple({"configurable": {"thread_id": "k9"}})
            values = latest.checkpoint["channel_values"]
            assert [e["kind"] for e in values["effects"]] == ["install_method"] * 2
            assert values["status"] == "DELEGATING" and not values["response"]

    resumed = _run(tmp_path, file_uri, "resume", "k9")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])
    assert result["status"] == "COMPLETE"
    stats = _stats(file_uri)
    assert stats["cycles"] == 1 and stats["facets"] == {"facet_steps": 1, "facet_design": 1}
    with open_laid_out(file_uri) as image:
        with image.read() as root:
            written = cycle.get(root, result["cycle"])["methods_written"]
            assert sorted(written) == ["BRICK.facet_design", "BRICK.facet_steps"]
            assert "facet_steps" in personas(root)["BRICK"]._slots()
        commits = [r for r in image.history(50) if r.description.startswith("mind cycle")]
        assert len(commits) == 1

    # Resuming a thread whose cycle is complete changes nothing.
    again = _run(tmp_path, file_uri, "resume", "k9")
    again.communicate(timeout=120)
    assert _stats(file_uri)["cycles"] == 1


@pytest.mark.slow
def test_a_process_killed_right_after_its_commit_keeps_both(tmp_path: Path, file_uri: str) -> None:
    victim = _run(tmp_path, file_uri, "kill-after-commit", "k1")
    victim.communicate(timeout=120)
    assert victim.returncode == -signal.SIGKILL
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        latest = saver.get_tuple({"configurable": {"thread_id": "k1"}})
        # the checkpoint that records COMPLETE and the cycle's changes: both there
        assert latest.checkpoint["channel_values"]["status"] == "COMPLETE"
        cycle_id = latest.checkpoint["channel_values"]["cycle"]["id"]
        with image.read() as root:
            assert cycle.get(root, cycle_id) is not None
    resumed = _run(tmp_path, file_uri, "resume", "k1")
    resumed.communicate(timeout=120)
    assert _stats(file_uri)["cycles"] == 1


@pytest.mark.slow
def test_concurrent_cycles_through_zeo_lose_no_update(tmp_path: Path) -> None:
    with ZeoServer(tmp_path / "shared.fs") as server:
        with open_image(server.uri):
            pass  # incarnated once, before the racers start
        racers = [
            _run(tmp_path, server.uri, "ask", ",".join(f"{name}{i}" for i in range(4)))
            for name in ("a", "b")
        ]
        results = [r.communicate(timeout=300) for r in racers]
        for racer, (_, err) in zip(racers, results, strict=True):
            assert racer.returncode == 0, err[-3000:]
        lines = [json.loads(line) for out, _ in results for line in out.splitlines()]
        assert [line["status"] for line in lines] == ["COMPLETE"] * 8
        stats = _stats(server.uri)
        assert stats["cycles"] == 8  # every cycle's increment survived the conflicts
        assert stats["facets"]["facet_steps"] == 8
        with open_laid_out(server.uri) as image, image.read() as root:
            assert {r["id"] for r in cycle.recent(root, 20)} == {line["cycle"] for line in lines}


@pytest.mark.slow
def test_cycles_of_two_processes_on_one_thread_keep_whole_exchanges(tmp_path: Path) -> None:
    # Two processes asking on the same thread at once: a request either completes, or is
    # refused before it starts while the other's run is mid-cycle (ThreadBusy), or is told the
    # thread moved on (ThreadMovedOn: both read the same latest checkpoint, and the other
    # stored first); the thread's state holds whole exchanges. Before, both completed and the
    # thread kept one of each pair.
    with ZeoServer(tmp_path / "shared.fs") as server:
        with open_image(server.uri):
            pass
        racers = [_run(tmp_path, server.uri, "ask", "one,one,one") for _ in range(2)]
        results = [r.communicate(timeout=300) for r in racers]
        for racer, (_, err) in zip(racers, results, strict=True):
            assert racer.returncode == 0, err[-3000:]
        lines = [json.loads(line) for out, _ in results for line in out.splitlines()]
        statuses = {line["status"] for line in lines}
        assert len(lines) == 6 and statuses <= {"COMPLETE", "ThreadBusy", "ThreadMovedOn"}
        done = [line["cycle"] for line in lines if line["status"] == "COMPLETE"]
        assert done
        with open_laid_out(server.uri) as image, ZODBSaver(image) as saver:
            state = saver.get_tuple({"configurable": {"thread_id": "one"}})
            messages = state.checkpoint["channel_values"]["messages"]
            with image.read() as root:
                recorded = {r["id"] for r in cycle.recent(root, 20)}
        assert set(done) <= recorded
        kinds = [m.type for m in messages]
        assert kinds == ["human", "ai"] * (len(kinds) // 2), kinds
        answered = [m.additional_kwargs.get("batos_cycle") for m in messages if m.type == "ai"]
        assert set(answered) <= recorded and len(answered) == len(set(answered))
        assert set(done) <= set(answered)  # every answer a request got is on the thread
