"""ZODBSaver across processes: a run killed with SIGKILL resumes, and ``langgraph dev`` uses it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from images import open_laid_out
from servers import serving

from batos.shell.cli import main as batos
from store.checkpoint.saver import ZODBSaver
from store.core.zeo import free_port

REPO = Path(__file__).resolve().parents[1]

GRAPH_MODULE = """
import os, time, operator
from pathlib import Path
from typing import Annotated, TypedDict
from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    n: int
    log: Annotated[list, operator.add]


def slow(state):
    signal_file = os.environ.get("SIGNAL_FILE")
    if signal_file:
        Path(signal_file).write_text("in slow")
        time.sleep(60)
    return {"n": state["n"] * 10, "log": ["slow"]}


builder = StateGraph(State)
builder.add_node("first", lambda s: {"n": s["n"] + 1, "log": ["first"]})
builder.add_node("slow", slow)
builder.add_node("last", lambda s: {"n": s["n"] + 2, "log": ["last"]})
builder.add_edge(START, "first")
builder.add_edge("first", "slow")
builder.add_edge("slow", "last")
builder.add_edge("last", END)
graph = builder.compile()
"""

RUNNER = """
import json, sys
from store.core.image import LivingImage
from store.core.schema import upgrade
from store.upgrades import STORE_STEPS
from store.checkpoint.saver import ZODBSaver
from tiny_graph import builder

uri, thread, payload = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with LivingImage.open(uri) as image:
    upgrade(image, STORE_STEPS)
    saver = ZODBSaver(image)
    graph = builder.compile(checkpointer=saver)
    print(json.dumps(graph.invoke(payload, {"configurable": {"thread_id": thread}})))
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        **extra,
    }


def test_run_killed_mid_step_resumes_from_its_last_checkpoint(
    tmp_path: Path, file_uri: str
) -> None:
    (tmp_path / "tiny_graph.py").write_text(GRAPH_MODULE)
    (tmp_path / "runner.py").write_text(RUNNER)
    signal_file = tmp_path / "in-slow"
    victim = subprocess.Popen(
        [sys.executable, str(tmp_path / "runner.py"), file_uri, "k9", '{"n": 1, "log": []}'],
        env=_env(tmp_path, SIGNAL_FILE=str(signal_file)),
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 60
    while not signal_file.exists():
        assert victim.poll() is None, "the run ended before reaching the slow node"
        assert time.monotonic() < deadline, "the run never reached the slow node"
        time.sleep(0.05)
    time.sleep(0.3)  # let the background checkpoint writes of the step before finish
    victim.send_signal(signal.SIGKILL)
    victim.wait()

    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        latest = saver.get_tuple({"configurable": {"thread_id": "k9"}})
        assert latest is not None
        assert latest.checkpoint["channel_values"]["n"] == 2
        # every stored checkpoint is whole and readable: input, after START, after "first"
        history = list(saver.list({"configurable": {"thread_id": "k9"}}))
        assert [item.metadata["step"] for item in history] == [1, 0, -1]
        assert history[0].checkpoint["channel_values"]["log"] == ["first"]

    resumed = subprocess.run(
        [sys.executable, str(tmp_path / "runner.py"), file_uri, "k9", "null"],
        env=_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"n": 22, "log": ["first", "slow", "last"]}


def test_cli_lists_prunes_and_packs(
    file_uri: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sys.path.insert(0, str(tmp_path))
    (tmp_path / "tiny_graph.py").write_text(GRAPH_MODULE)
    try:
        from tiny_graph import builder
    finally:
        sys.path.remove(str(tmp_path))
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        graph = builder.compile(checkpointer=saver)
        for thread in ("alpha", "beta"):
            graph.invoke({"n": 1, "log": ["x" * 5000]}, {"configurable": {"thread_id": thread}})
    size_before = Path(file_uri[len("file://") :]).stat().st_size

    assert batos(["--image", file_uri, "threads"]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "beta" in out
    assert batos(["--image", file_uri, "threads", "alpha"]) == 0
    assert "input" in capsys.readouterr().out
    narrow = subprocess.run(  # a narrow terminal lists the checkpoints instead of folding
        [sys.executable, "-m", "batos.shell.cli", "--image", file_uri, "threads", "alpha"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "40"},
        timeout=120,
    )
    assert narrow.returncode == 0, narrow.stderr
    assert all(len(line) <= 40 for line in narrow.stdout.splitlines()), narrow.stdout
    ids = [line for line in narrow.stdout.splitlines() if len(line) == 36 and line.count("-") == 4]
    assert len(ids) == 5 and "step -1 · input" in narrow.stdout
    # the ids a user copies come whole, in the table as in JSON
    long_id = "chat-" + "1f1f1f79-81af-6c5e-8c1d-" * 2
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        builder.compile(checkpointer=saver).invoke(
            {"n": 1, "log": []}, {"configurable": {"thread_id": long_id}}
        )
    assert batos(["--image", file_uri, "threads"]) == 0
    assert any(long_id in line for line in capsys.readouterr().out.splitlines())
    assert batos(["--image", file_uri, "threads", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {row["thread_id"] for row in rows} == {"alpha", "beta", long_id}
    assert batos(["--image", file_uri, "threads", long_id, "--json"]) == 0
    points = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert points and all(len(p["checkpoint"]) == 36 for p in points)
    assert points[-1]["parent"] is None and points[0]["parent"] == points[1]["checkpoint"]
    assert batos(["--image", file_uri, "threads", "gamma"]) == 8
    assert "batos threads" in capsys.readouterr().err

    assert batos(["--image", file_uri, "prune", "--keep", "2"]) == 0
    assert "deleted 9 checkpoints" in capsys.readouterr().out  # 3 of each of 3 threads
    assert batos(["--image", file_uri, "prune", "--keep", "1", "gamma"]) == 8
    assert batos(["--image", file_uri, "pack"]) == 0
    assert "packed" in capsys.readouterr().out
    assert Path(file_uri[len("file://") :]).stat().st_size < size_before
    assert not Path(file_uri[len("file://") :] + ".old").exists()  # the space is given back
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        assert len(list(saver.list({"configurable": {"thread_id": "alpha"}}))) == 2
        assert (
            saver.get_tuple({"configurable": {"thread_id": "beta"}}).checkpoint["channel_values"][
                "n"
            ]
            == 22
        )


@pytest.mark.slow
def test_langgraph_dev_uses_the_checkpointer_without_warnings(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "tiny_graph.py").write_text(GRAPH_MODULE)
    for room in ("batos", "graph", "prototypes", "store"):  # the factories' runtime needs all
        shutil.copytree(REPO / room, project / room, ignore=shutil.ignore_patterns("__pycache__"))
    config = json.loads((REPO / "langgraph.json").read_text())
    config["graphs"] = {"tiny": "./tiny_graph.py:graph"}
    (project / "langgraph.json").write_text(json.dumps(config))
    image = tmp_path / "image" / "live_image.fs"
    open_laid_out(f"file://{image}").close()  # a server never creates the image it serves
    port = free_port()
    log_path = tmp_path / "server.log"
    env = {
        **os.environ,
        "BATOS_IMAGE": f"file://{image}",
        "LANGSMITH_TRACING": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "PYTHONPATH": str(project),
    }
    command = [str(REPO / ".venv" / "bin" / "langgraph"), "dev", "--no-browser", "--no-reload"]
    with (
        serving(
            [*command, "--port", str(port), "--host", "127.0.0.1"],
            port=port,
            cwd=project,
            env=env,
            log_path=log_path,
            timeout=120,
        ) as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        thread = client.post("/threads", json={}).json()["thread_id"]
        result = client.post(
            f"/threads/{thread}/runs/wait",
            json={"assistant_id": "tiny", "input": {"n": 1, "log": []}},
        )
        assert result.status_code == 200, result.text
        assert result.json()["n"] == 22
        history = client.post(f"/threads/{thread}/history", json={"limit": 10}).json()
        assert len(history) == 5
        copy = client.post(f"/threads/{thread}/copy").json()["thread_id"]
        assert client.get(f"/threads/{copy}/state").json()["values"]["n"] == 22
    text = log_path.read_text()
    assert "Using custom checkpointer: ZODBSaver" in text, text[-4000:]
    assert "Custom checkpointer missing" not in text, text[-4000:]
    warnings = [
        line
        for line in text.splitlines()
        if "checkpointer" in line.lower() and ("warn" in line.lower() or "error" in line.lower())
    ]
    assert not warnings, warnings
    with open_laid_out(f"file://{image}") as reopened, ZODBSaver(reopened) as saver:
        threads = {s.thread_id for s in saver.threads()}
        assert {thread, copy} <= threads
