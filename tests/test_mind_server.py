"""The mind and the JIT graph served by ``langgraph dev`` (and ``batos serve``), driven by the
``langgraph_sdk`` client on the test model: a streamed conversation, state, history, a fork,
schemas, and bad requests answered with their reason while the server keeps serving."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from servers import serving

from batos.shell.runtime import open_image
from graph import cycle
from prototypes.codex import load_codex
from store.core.image import LivingImage
from store.core.zeo import free_port

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def _serve(
    command: list[str], tmp_path: Path, image: Path | str, **extra_env: str
) -> Iterator[str]:
    """A server of ``image``: a FileStorage path, or the URI of an image that exists."""
    if isinstance(image, Path) and not image.exists():  # a server never creates its image
        open_image(image.as_uri(), create=True).close()
    port = free_port()
    log_path = tmp_path / "server.log"
    env = {
        **os.environ,
        **extra_env,
        "BATOS_IMAGE": f"file://{image}" if isinstance(image, Path) else image,
        # the tiny test model rambles: the relevance check is tested with scripted models
        "BATOS_MIND_RELEVANCE": "-1",
        "LANGSMITH_TRACING": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "PYTHONPATH": str(REPO),
    }
    with serving(
        [*command, "--port", str(port), "--host", "127.0.0.1"],
        port=port,
        cwd=REPO,
        env=env,
        log_path=log_path,
        timeout=180,
    ) as base:
        yield base
    text = log_path.read_text()
    warnings = [
        line
        for line in text.splitlines()
        if "checkpointer" in line.lower() and ("warn" in line.lower() or "error" in line.lower())
    ]
    assert not warnings, warnings
    assert "Using custom checkpointer: ZODBSaver" in text, text[-4000:]


@pytest.mark.slow
@pytest.mark.model
def test_a_conversation_through_langgraph_dev(tmp_path: Path) -> None:
    from langgraph_sdk import get_sync_client

    image = tmp_path / "image" / "live_image.fs"
    command = [str(REPO / ".venv" / "bin" / "langgraph"), "dev", "--no-browser", "--no-reload"]
    with _serve(command, tmp_path, image) as base:
        client = get_sync_client(url=base)
        mind = client.assistants.search(graph_id="mind")[0]
        schemas = client.assistants.get_schemas(mind["assistant_id"])
        assert "messages" in schemas["input_schema"]["properties"]
        assert set(schemas["context_schema"]["properties"]) == {"persona", "depth"}
        drawing = client.assistants.get_graph(mind["assistant_id"])
        nodes = {node["id"] for node in drawing["nodes"]}
        assert {"route", "decompose", "facet", "synthesize", "gate", "complete", "fail"} <= nodes

        thread = client.threads.create()["thread_id"]
        tokens, updates = [], []
        for part in client.runs.stream(
            thread,
            "mind",
            input={"messages": [{"role": "user", "content": "hello"}]},
            context={"persona": "robin"},
            stream_mode=["messages-tuple", "updates"],
        ):
            if part.event == "messages":
                chunk, meta = part.data
                if meta.get("langgraph_node") == "synthesize":
                    tokens.append(chunk["content"])
            elif part.event == "updates":
                updates.extend(part.data)
            assert part.event != "error", part.data
        assert len(tokens) > 1  # streamed token by token
        assert updates == ["route", "synthesize", "gate", "complete"]
        state = client.threads.get_state(thread)
        values = state["values"]
        assert values["status"] == "COMPLETE"
        assert "".join(tokens).strip() == values["response"].strip()
        assert [m["type"] for m in values["messages"]] == ["human", "ai"]
        first_cycle = values["cycle"]["id"]

        second = client.runs.wait(
            thread,
            "mind",
            input={"messages": [{"role": "user", "content": "thank you"}]},
            context={"persona": "robin"},
        )
        assert second["status"] == "COMPLETE" and len(second["messages"]) == 4

        # fork from the checkpoint that ended the first cycle: the second exchange is gone
        history = client.threads.get_history(thread, limit=50)
        after_first = next(
            h
            for h in history
            if h["values"].get("status") == "COMPLETE"
            and h["values"]["cycle"]["id"] == first_cycle
            and not h["next"]
        )
        forked = client.runs.wait(
            thread,
            "mind",
            input={"messages": [{"role": "user", "content": "good night"}]},
            context={"persona": "robin"},
            checkpoint_id=after_first["checkpoint"]["checkpoint_id"],
        )
        assert [m["content"] for m in forked["messages"] if m["type"] == "human"] == [
            "hello",
            "good night",
        ]

        # bad requests: FAILED with the reason, the thread idle, the server serving on
        bad = client.runs.wait(
            thread, "mind", input={"messages": [{"role": "user", "content": "  "}]}
        )
        assert bad["status"] == "FAILED" and "empty" in bad["failure"]["reason"]
        odd = client.runs.wait(
            thread,
            "mind",
            input={"messages": [{"role": "user", "content": "hi"}]},
            context={"persona": "joker"},
        )
        assert "unknown persona" in odd["failure"]["reason"]
        assert client.threads.get(thread)["status"] == "idle"
        # messages that are no messages: the run ends in error, and the thread still reads
        before = client.threads.get_state(thread)["values"]["messages"]
        refused = client.runs.create(thread, "mind", input={"messages": 5})
        client.runs.join(thread, refused["run_id"])
        assert client.runs.get(thread, refused["run_id"])["status"] == "error"
        assert client.threads.get_state(thread)["values"]["messages"] == before

        jit = client.assistants.search(graph_id="jit")[0]
        jit_schemas = client.assistants.get_schemas(jit["assistant_id"])
        assert set(jit_schemas["context_schema"]["properties"]) == {"receiver", "args", "kwargs"}
        jit_thread = client.threads.create()["thread_id"]
        nothing = client.runs.wait(jit_thread, "jit", input={"selector": "estimate"})
        assert nothing["status"] == "failed" and "no receiver" in nothing["error"]
        assert "hint:" in nothing["error"]
        missing = client.runs.wait(
            jit_thread, "jit", input={"selector": "estimate"}, context={"receiver": "nobody"}
        )
        assert "no 'nobody'" in missing["error"]
        jit_state = client.threads.get_state(jit_thread)
        assert jit_state["next"] == [] and client.threads.get(jit_thread)["status"] == "idle"

    with LivingImage.open(f"file://{image}") as living, living.read() as root:
        committed = cycle.recent(root, 10)
        assert len(committed) == 3  # hello, thank you, good night: the failures left nothing
        assert root["objects"]["robin"].stats["cycles"] == 3


@pytest.mark.slow
def test_batos_serve_serves_every_graph(tmp_path: Path) -> None:
    image = tmp_path / "image" / "live_image.fs"
    command = [str(REPO / ".venv" / "bin" / "python"), "-m", "batos.shell.cli", "serve"]
    open_image(image.as_uri(), create=True).close()  # serve opens images; 'batos init' makes them
    with _serve(command, tmp_path, image) as base:
        found = httpx.post(f"{base}/assistants/search", json={}, timeout=30).json()
        served = json.loads((REPO / "langgraph.json").read_text())["graphs"]
        assert {a["graph_id"] for a in found} == set(served)
        assert {"mind", "jit", "audit"} <= set(served)


@pytest.mark.slow
def test_a_served_jit_run_whose_drafting_fails_reports_why(tmp_path: Path) -> None:
    from langgraph_sdk import get_sync_client

    image = tmp_path / "image" / "live_image.fs"
    command = [str(REPO / ".venv" / "bin" / "python"), "-m", "batos.shell.cli", "serve"]
    # The persona model cannot load: every draft fails before a word is written.
    missing_model = str(tmp_path / "no-such-model.gguf")
    open_image(
        f"file://{image}", create=True
    ).close()  # the personas incarnated, as 'batos init' does
    with _serve(command, tmp_path, image, BATOS_MODEL=missing_model) as base:
        client = get_sync_client(url=base)
        thread = client.threads.create()["thread_id"]
        request = {"receiver": "brick", "args": [[3, 5]]}
        for _ in range(2):  # the same thread takes the next request: nothing was left pending
            failed = client.runs.wait(
                thread, "jit", input={"selector": "estimate"}, context=request
            )
            assert failed["status"] == "failed", failed
            error = failed["error"]
            assert error.startswith("draft failed:") and "neither a known model" in error
            assert "hint: set BATOS_MODEL" in error
            assert "internal error" not in json.dumps(failed).lower()
            state = client.threads.get_state(thread)
            assert state["next"] == [] and all(not t.get("error") for t in state["tasks"])
            assert client.threads.get(thread)["status"] == "idle"
        runs = client.runs.list(thread)
        assert [r["status"] for r in runs] == ["success", "success"]
        # A streamed run reaches the same end, with no error event.
        events = list(
            client.runs.stream(
                thread, "jit", input={"selector": "estimate"}, context=request, stream_mode="values"
            )
        )
        assert all(e.event != "error" for e in events), events
        assert "neither a known model" in events[-1].data["error"]

    with LivingImage.open(f"file://{image}") as living, living.read() as root:
        assert "estimate" not in root["objects"]["brick"]._slots()


def _install_facets(image: Path) -> None:
    """Every facet the codex declares, written by hand as its intent says (the tiny test model
    cannot be relied on to write code): the cycle under test plans, delegates and weaves."""
    from prototypes import kernel
    from prototypes.incarnation import personas

    def install(root) -> None:
        for name, obj in personas(root).items():
            for selector in load_codex().persona(name).facets:
                source = (
                    f"def {selector}(self, query):\n"
                    f"    return {{'instruction': 'As {name}, answer briefly: ' + query, "
                    "'temperature': 0.5}\n"
                )
                kernel.add_method(obj, selector, source, author="test")

    with open_image(f"file://{image}", create=True) as living:
        living.transact(install, note="test: facet methods")


@pytest.mark.slow
@pytest.mark.model
def test_a_full_cycle_through_batos_serve_streams_and_keeps_its_history(tmp_path: Path) -> None:
    from langgraph_sdk import get_sync_client

    image = tmp_path / "image" / "live_image.fs"
    _install_facets(image)
    command = [str(REPO / ".venv" / "bin" / "python"), "-m", "batos.shell.cli", "serve"]
    # Two facets at most: the tiny model writes its plan under a grammar at about a second a
    # token on a loaded machine; parallel facets are tested with scripted models (test_mind.py).
    with _serve(command, tmp_path, image, BATOS_MIND_MAX_FACETS="2") as base:
        client = get_sync_client(url=base)
        thread = client.threads.create()["thread_id"]
        request = "write a python function that sorts a list of numbers"
        tokens: dict[str, list[str]] = {}
        steps_of: dict[str, dict[int, list[str]]] = {}  # a node run twice: each run's own
        updates: list[str] = []
        for part in client.runs.stream(
            thread,
            "mind",
            input={"messages": [{"role": "user", "content": request}]},
            context={"depth": "full"},  # routed by the router, planned, delegated, woven
            stream_mode=["messages-tuple", "updates"],
        ):
            assert part.event != "error", part.data
            if part.event == "messages":
                chunk, meta = part.data
                tokens.setdefault(meta["langgraph_node"], []).append(chunk["content"])
                by_step = steps_of.setdefault(meta["langgraph_node"], {})
                by_step.setdefault(meta["langgraph_step"], []).append(chunk["content"])
            elif part.event == "updates":
                updates.extend(part.data)

        values = client.threads.get_state(thread)["values"]
        assert values["status"] == "COMPLETE", values.get("failure")
        assert updates[:2] == ["route", "decompose"] and updates[-3:] == [
            "synthesize",
            "gate",
            "complete",
        ]
        steps = values["plan"]
        depth = values["cycle"]["depth"]
        # Whatever plan the tiny model writes, the cycle completes: one of two steps or more
        # is delegated; one step, or a plan failing twice, is the fast path.
        if depth["mode"] == "full":
            assert len(steps) == 2 and updates.count("facet") == 2
        else:
            assert depth["rule"] in ("the plan has one step", "the plan failed twice")
            assert updates.count("facet") == 0
        assert {"decompose", "synthesize"} <= set(tokens)  # every model call streamed
        assert len(tokens["synthesize"]) > 1
        # The gate may send the answer back once (another look at the passages, or asked
        # afresh): the answer kept is the last synthesis's, streamed after the first's.
        syntheses = [steps_of["synthesize"][step] for step in sorted(steps_of["synthesize"])]
        assert len(syntheses) == values["cycle"]["synthesis_attempts"] == updates.count("gate")
        streamed = "".join(syntheses[-1]).strip()
        kept = values["response"].strip()
        assert kept == streamed or (values["cycle"]["truncated"] and streamed.startswith(kept))
        route = values["route"]
        assert route["chosen"][0] == "BRICK" and len(route["ranked"]) == 4
        partials = sorted(values["partials"], key=lambda p: p["index"])
        if depth["mode"] == "full":
            assert [(p["persona"], p["facet"]) for p in partials] == [
                (s["persona"], s["facet"]) for s in steps
            ]
            assert all(p["ok"] for p in partials)
        assert len(values["cem"]["request_vector"]) == 384
        assert [m["type"] for m in values["messages"]] == ["human", "ai"]
        cycle_id = values["cycle"]["id"]

        history = client.threads.get_history(thread, limit=50)
        statuses = [h["values"].get("status") for h in reversed(history)]
        for status in ("DECOMPOSING", "DELEGATING", "GATE", "COMPLETE"):
            assert status in statuses
        assert statuses.index("DECOMPOSING") < statuses.index("DELEGATING")
        assert statuses.index("DELEGATING") < statuses.index("COMPLETE")
        assert values["cycle"]["degraded"] == [] or depth["mode"] == "fast"
        assert history[0]["next"] == [] and history[0]["values"]["commit"]["note"]

    with LivingImage.open(f"file://{image}") as living, living.read() as root:
        (committed,) = cycle.recent(root, 10)
        assert committed["id"] == cycle_id and committed["status"] == "COMPLETE"


@pytest.mark.slow
@pytest.mark.model
def test_a_served_run_on_a_thread_another_process_is_answering_is_refused(tmp_path: Path) -> None:
    """A served run went on from another process's half-done cycle, which then failed."""
    from fakes import FakeEmbedder, FakeModels, FakeRouter
    from langchain_core.messages import HumanMessage
    from langgraph_sdk import get_sync_client
    from test_mind import responder

    from graph.mind import MindServices, build_graph, run_config
    from store.checkpoint.saver import ZODBSaver
    from store.core.zeo import ZeoServer

    busy, done = str(uuid.uuid4()), str(uuid.uuid4())
    request = {"messages": [{"role": "user", "content": "hello there"}]}
    with ZeoServer(tmp_path / "zeo" / "live_image.fs") as zeo:
        open_image(zeo.uri, create=True).close()
        # This process answers on two threads of the shared image: one run is stopped before
        # its answer (mid-cycle, as while it works), one ended.
        services = MindServices(
            models=FakeModels(responder()), router=FakeRouter(("ROBIN",)), embedder=FakeEmbedder()
        )
        with open_image(zeo.uri) as living, ZODBSaver(living) as saver:
            graph = build_graph(services, checkpointer=saver)
            hello = {"messages": [HumanMessage("hello there")]}
            graph.invoke(hello, run_config(busy), interrupt_before=["synthesize"])
            graph.invoke(hello, run_config(done))
            stopped = saver.get_tuple(run_config(busy)).checkpoint["id"]
        command = [str(REPO / ".venv" / "bin" / "python"), "-m", "batos.shell.cli", "serve"]
        with _serve(command, tmp_path, zeo.uri) as base:
            client = get_sync_client(url=base)
            for thread in (busy, done):
                client.threads.create(thread_id=thread)
            with pytest.raises(Exception, match="ThreadBusy: .* answering another request"):
                client.runs.wait(busy, "mind", input=request, context={"depth": "fast"})
            answered = client.runs.wait(done, "mind", input=request, context={"depth": "fast"})
            assert answered["status"] == "COMPLETE", answered
            # a state read of the busy thread is no run: it is answered
            assert client.threads.get_state(busy)["next"] == ["synthesize"]
        with open_image(zeo.uri) as living, ZODBSaver(living) as saver:
            assert saver.get_tuple(run_config(busy)).checkpoint["id"] == stopped  # nothing stored
