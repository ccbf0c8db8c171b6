"""The Synaptic Bridge on a real ZeroMQ socket on loopback, with the scripted model: a
streamed conversation, requests in flight side by side, the client example of docs/serving.md,
and malformed requests answered with the server's errors while the image stays as it was."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from fakes import FakeEmbedder, FakeModels, FakeRouter, image_digest
from langchain_core.messages import HumanMessage
from test_mind import responder

from batos.shell.bridge import MAX_BODY_BYTES, MAX_MESSAGE_BYTES, MAX_PER_CLIENT, PROTOCOL, Bridge
from batos.shell.cli import main
from batos.shell.runtime import Runtime, open_image
from graph import cycle
from graph.mind import MindServices
from store.core.image import LivingImage

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def image() -> Iterator[LivingImage]:
    living = open_image("memory://")
    yield living
    living.close()


#: Answers wait until the test opens it (it is open unless a test closes it).
GATE = threading.Event()


def gated_answer(call: Any) -> str:
    assert GATE.wait(30), "the test never opened the gate"
    return f"About {call.text.split('Request: ')[-1].splitlines()[0]}: here is the answer."


@pytest.fixture
def bridge(image: LivingImage) -> Iterator[Bridge]:
    GATE.set()
    services = MindServices(
        models=FakeModels(responder(answer=gated_answer)),
        router=FakeRouter(("ROBIN",)),
        embedder=FakeEmbedder(),
    )
    server = Bridge(Runtime.of(image), "tcp://127.0.0.1:*", services)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    assert server.bound.wait(10) and server.endpoint.startswith("tcp://127.0.0.1:")
    yield server
    GATE.set()
    server.stop()
    thread.join(10)
    assert not thread.is_alive()


@pytest.fixture
def client(bridge: Bridge) -> Iterator[zmq.Socket]:
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(bridge.endpoint)
    yield socket
    socket.close()


def request(text: str = "hello there", **body: Any) -> dict[str, Any]:
    return {"input": {"messages": [{"role": "user", "content": text}]}, **body}


def send(socket: zmq.Socket, request_id: bytes, body: Any) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    socket.send_multipart([PROTOCOL, request_id, data])


def replies(socket: zmq.Socket, wanted: set[bytes]) -> dict[bytes, list[tuple[str, dict]]]:
    """Every reply until each wanted request ended (``result`` or ``error``)."""
    got: dict[bytes, list[tuple[str, dict]]] = {rid: [] for rid in wanted}
    open_ = set(wanted)
    while open_:
        assert socket.poll(30_000), f"no reply for {open_}"
        rid, kind, data = socket.recv_multipart()
        got[rid].append((kind.decode(), json.loads(data)))
        if kind in (b"result", b"error"):
            open_.discard(rid)
    return got


def frames_until(socket: zmq.Socket, request_id: bytes, kind: str) -> list[tuple[bytes, str, dict]]:
    """Every reply, of any request, up to and including ``request_id``'s first ``kind``."""
    seen: list[tuple[bytes, str, dict]] = []
    while not seen or seen[-1][:2] != (request_id, kind):
        assert socket.poll(30_000), f"no {kind} for {request_id!r}"
        rid, got, data = socket.recv_multipart()
        seen.append((rid, got.decode(), json.loads(data)))
    return seen


def test_a_streamed_conversation_through_the_bridge(bridge, client, image) -> None:
    send(client, b"r1", request("hello there", thread_id="kitchen"))
    frames = replies(client, {b"r1"})[b"r1"]
    kinds = [kind for kind, _ in frames]
    assert kinds[0] == "accepted" and kinds[-1] == "result"
    assert [d["node"] for k, d in frames if k == "update"] == [
        "route",
        "synthesize",
        "gate",
        "complete",
    ]
    result = frames[-1][1]
    assert result["status"] == "COMPLETE" and result["thread_id"] == "kitchen"
    tokens = "".join(d["text"] for k, d in frames if k == "token" and d["node"] == "synthesize")
    assert tokens == result["response"] == "About hello there: here is the answer."
    with image.read() as root:
        assert cycle.get(root, result["cycle"])["status"] == "COMPLETE"

    send(client, b"r2", request("and again", thread_id="kitchen"))
    second = replies(client, {b"r2"})[b"r2"][-1][1]
    assert second["status"] == "COMPLETE" and second["cycle"] != result["cycle"]
    state = bridge.graph.get_state({"configurable": {"thread_id": "kitchen"}}).values
    assert [m.type for m in state["messages"]] == ["human", "ai", "human", "ai"]


def test_requests_in_flight_side_by_side_each_get_their_own_replies(bridge, client) -> None:
    wanted = {f"q{n}".encode() for n in range(6)}
    for rid in sorted(wanted):
        send(client, rid, request(f"question number {rid.decode()}"))
    got = replies(client, wanted)
    for rid, frames in got.items():
        result = frames[-1][1]
        assert result["status"] == "COMPLETE"
        assert f"question number {rid.decode()}" in result["response"]
    assert len({frames[-1][1]["thread_id"] for frames in got.values()}) == 6


def test_a_second_request_on_a_thread_answering_one_is_refused(bridge, client) -> None:
    """Both used to run from the same checkpoint: the thread forked and the conversation kept
    one of the two exchanges, though both clients were told COMPLETE."""
    GATE.clear()  # the first answer waits
    send(client, b"first", request("how do cats purr?", thread_id="same"))
    seen = frames_until(client, b"first", "accepted")
    send(client, b"second", request("when to plant tomatoes?", thread_id="same"))
    seen += frames_until(client, b"second", "error")
    assert [kind for rid, kind, _ in seen if rid == b"second"] == ["error"]
    assert "thread same is answering another request" in seen[-1][2]["message"]
    GATE.set()
    assert replies(client, {b"first"})[b"first"][-1][1]["status"] == "COMPLETE"
    send(client, b"third", request("when to plant tomatoes?", thread_id="same"))
    assert replies(client, {b"third"})[b"third"][-1][1]["status"] == "COMPLETE"
    state = bridge.graph.get_state({"configurable": {"thread_id": "same"}}).values
    said = [m.content for m in state["messages"] if m.type == "human"]
    assert said == ["how do cats purr?", "when to plant tomatoes?"]  # one line, both kept


def test_a_stop_lets_running_requests_finish_and_refuses_those_waiting(bridge, client) -> None:
    """A stop used to wait for every queued request too: minutes on a real model, and a
    second Ctrl-C did nothing (the command now exits at once on it)."""
    GATE.clear()  # the first four (one per worker) wait in their answers; two wait for a worker
    wanted = {f"s{n}".encode() for n in range(6)}
    for rid in sorted(wanted):
        send(client, rid, request(f"question {rid.decode()}"))
    started: set[bytes] = set()
    while len(started) < 4:  # each running request says so first; its route update may follow
        assert client.poll(10_000), started
        rid, kind, _ = client.recv_multipart()
        assert kind in (b"accepted", b"update"), kind
        started.add(rid)
    bridge.stop()
    GATE.set()
    got = replies(client, wanted)
    for rid, frames in got.items():
        if rid in started:
            assert frames[-1][0] == "result" and frames[-1][1]["status"] == "COMPLETE"
        else:
            assert [kind for kind, _ in frames] == ["error"]
            assert "the bridge is stopping" in frames[0][1]["message"]


def test_a_request_that_comes_while_the_bridge_stops_is_refused_not_left_unread(
    bridge, client
) -> None:
    """Requests reaching the socket after ``stop()`` were never read: no reply, ever."""
    GATE.clear()  # one request keeps the bridge stopping, not stopped
    send(client, b"running", request("question running"))
    assert client.poll(10_000)
    assert client.recv_multipart()[:2] == [b"running", b"accepted"]
    bridge.stop()
    time.sleep(0.5)  # past the main loop's poll: the late one meets the stopping bridge
    send(client, b"late", request("question late"))
    time.sleep(0.3)
    GATE.set()
    got = replies(client, {b"running", b"late"})
    assert got[b"running"][-1][1]["status"] == "COMPLETE"
    assert [kind for kind, _ in got[b"late"]] == ["error"]
    assert "the bridge is stopping" in got[b"late"][0][1]["message"]


def test_a_req_socket_is_answered_too(bridge) -> None:
    socket = zmq.Context.instance().socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(bridge.endpoint)
    try:
        send(socket, b"only", request("hi"))
        assert socket.poll(30_000)
        rid, kind, data = socket.recv_multipart()  # a REQ socket reads one reply per request
        assert (rid, kind) == (b"only", b"accepted") and json.loads(data)["thread_id"]
    finally:
        socket.close()


MALFORMED = [
    ("not-json", b"{not json", "GraphRequestError", "the request body is not JSON"),
    ("a-list", b"[1, 2]", "GraphRequestError", "a JSON array, not an object"),
    ("null", b"null", "GraphRequestError", "the request body is JSON null, not an object"),
    ("nan", b'{"input": {"n": NaN}}', "GraphRequestError", "NaN is not a JSON value"),
    ("huge-int", b'{"input": {"n": ' + b"9" * 5000 + b"}}", "GraphRequestError", "100 digits"),
    ("overflow", b'{"input": {"n": 1e400}}', "GraphRequestError", "1e400 is beyond the largest"),
    ("no-input", {"context": {}}, "GraphRequestError", "the request has no 'input'"),
    ("extra-field", request(graph="jit"), "GraphRequestError", "unknown request field(s): 'graph'"),
    ("input-a-string", {"input": "hello"}, "GraphRequestError", "'input' must be a JSON object"),
    (
        "context-typo",
        {"input": {}, "context": {"depht": "fast"}},
        "GraphRequestError",
        "unknown context key(s): 'depht'",
    ),
    ("bad-thread", request(thread_id="../etc"), "MindError", "thread id '../etc' is malformed"),
    (
        "bad-message",
        {"input": {"messages": [{"role": "robot", "content": "x"}]}},
        "GraphRequestError",
        "the messages are malformed",
    ),
    ("nested", b"[" * 100_000, "GraphRequestError", "nested too deeply"),
    ("huge", b" " * (MAX_BODY_BYTES + 1), "GraphRequestError", "the bridge accepts 1,048,576"),
]


def test_malformed_requests_get_the_servers_errors_and_change_nothing(
    bridge, client, image
) -> None:
    before = image_digest(image.db, exclude=("checkpoints",))
    for name, body, error, message in MALFORMED:
        send(client, name.encode(), body)
        frames = replies(client, {name.encode()})[name.encode()]
        kind, payload = frames[-1]
        assert kind == "error", (name, frames)
        assert payload["error"] == error and message in payload["message"], (name, payload)
        assert payload["hint"], name
    client.send_multipart([b"HTTP/1.1", b"x", b"{}"])
    kind, payload = replies(client, {b"x"})[b"x"][-1]
    assert kind == "error" and "starting with BATOS/1" in payload["message"]
    assert image_digest(image.db, exclude=("checkpoints",)) == before


def test_a_request_the_mind_cannot_answer_ends_failed_with_its_reason(bridge, client) -> None:
    send(client, b"p", request("hi", context={"persona": "joker"}))
    result = replies(client, {b"p"})[b"p"][-1][1]
    assert result["status"] == "FAILED"
    assert "unknown persona 'joker'" in result["failure"]["reason"]
    assert "ROBIN" in result["failure"]["hint"]


class AnsweredMeanwhile:
    """The bridge's graph, but each run is followed on its thread by another client's run that
    FAILED (an unknown persona) before the bridge reads its result: what another process, the
    LangGraph server or a chat on the same image over ZEO, can do at that moment."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph

    def stream(self, input: Any, config: Any, **options: Any) -> Iterator[Any]:
        yield from self.graph.stream(input, config, **options)
        thread = {"configurable": {"thread_id": config["configurable"]["thread_id"]}}
        elsewhere = {"messages": [HumanMessage("meanwhile")]}
        assert self.graph.invoke(elsewhere, thread, context={"persona": "joker"})["failure"]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.graph, name)


def test_the_result_is_the_requests_own_cycle_though_another_ran_since(
    bridge, client, monkeypatch
) -> None:
    monkeypatch.setattr(bridge, "graph", AnsweredMeanwhile(bridge.graph))
    send(client, b"r", request("hello there", thread_id="shared"))
    result = replies(client, {b"r"})[b"r"][-1][1]
    assert result["status"] == "COMPLETE" and result["failure"] is None
    assert result["response"] == "About hello there: here is the answer."
    messages = bridge.graph.get_state({"configurable": {"thread_id": "shared"}}).values["messages"]
    assert messages[-2].content == "meanwhile"  # the thread's latest is the other client's


def test_the_readme_client_example_talks_to_the_bridge(bridge, capsys) -> None:
    spec = importlib.util.spec_from_file_location(
        "bridge_client", REPO / "examples" / "bridge_client.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    code = example.ask(
        bridge.endpoint, "hello there", persona="robin", thread_id=None, timeout_s=30
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.strip() == "About hello there: here is the answer."
    assert "[complete]" in err


def test_the_bridge_binds_to_loopback_only(capsys) -> None:
    assert main(["--image", "memory://", "bridge", "--bind", "tcp://0.0.0.0:5555"]) == 1
    err = capsys.readouterr().err
    assert "loopback only" in err and "ssh -L" in err


def test_an_800_frame_message_is_dropped_frame_by_frame_never_gathered(bridge, client) -> None:
    """The bridge once gathered every frame of a message into one list before looking at it:
    800 frames of a client's one reused buffer became 800 copies. Now it counts frames as it
    reads them, without copying, and releases each one past the bounds at once."""
    frame = b"x" * (64 * 1024)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        client.send_multipart([PROTOCOL, b"wide", *[frame] * 798], copy=False)
        kind, payload = replies(client, {b"wide"})[b"wide"][-1]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # What the bridge itself held: at most the bounds, not the 52 MB the client sent.
    assert peak < 4 * MAX_MESSAGE_BYTES, f"{peak:,} bytes"
    assert kind == "error" and payload["error"] == "GraphRequestError"
    assert "it has more than 5 frames (801 frames, 52,297," in payload["message"]
    send(client, b"after", request("still there?"))
    assert replies(client, {b"after"})[b"after"][-1][1]["status"] == "COMPLETE"


def test_a_message_over_the_byte_bound_is_dropped(bridge, client) -> None:
    body = json.dumps(request("x" * (MAX_BODY_BYTES - 200))).encode()
    client.send_multipart([PROTOCOL, b"fat", body, b"y" * 8192])
    kind, payload = replies(client, {b"fat"})[b"fat"][-1]
    assert kind == "error"
    assert f"it is over {MAX_MESSAGE_BYTES:,} bytes (5 frames" in payload["message"]
    assert payload["hint"]


def test_one_client_has_at_most_a_bounded_number_of_requests_in_flight(bridge, client) -> None:
    GATE.clear()  # every answer waits: the requests stay in flight
    wanted = {f"q{n:02d}".encode() for n in range(MAX_PER_CLIENT + 12)}
    for rid in sorted(wanted):
        send(client, rid, request(f"question {rid.decode()}"))
    other = zmq.Context.instance().socket(zmq.DEALER)
    other.setsockopt(zmq.LINGER, 0)
    other.connect(bridge.endpoint)
    try:
        # Refusals come at once, from the socket thread; the accepted requests wait on the gate.
        busy: set[bytes] = set()
        while len(busy) < 12:
            assert client.poll(10_000), busy
            rid, kind, data = client.recv_multipart()
            if kind == b"error":
                assert "this client has 8 requests in flight" in json.loads(data)["message"]
                busy.add(rid)
        accepted = wanted - busy
        assert len(accepted) == MAX_PER_CLIENT and busy == set(sorted(wanted)[MAX_PER_CLIENT:])
        # Another client is not refused (a refusal comes at once, from the socket thread): its
        # request waits for a worker.
        send(other, b"mine", request("another client"))
        assert not other.poll(300)
        GATE.set()
        done = replies(client, accepted)
        assert all(frames[-1][1]["status"] == "COMPLETE" for frames in done.values())
        assert replies(other, {b"mine"})[b"mine"][-1][1]["status"] == "COMPLETE"
        send(client, b"later", request("and now?"))  # its slots are free again
        assert replies(client, {b"later"})[b"later"][-1][1]["status"] == "COMPLETE"
    finally:
        other.close()


#: A bridge in a process of its own, answering one client that pipelines 1 MiB messages; it
#: prints how much its peak resident memory grew, in MiB.
FLOOD = """
import resource, sys, threading, zmq
from fakes import FakeEmbedder, FakeModels, FakeRouter
from batos.shell.runtime import open_runtime
from batos.shell.bridge import Bridge
from graph.mind import MindServices

services = MindServices(models=FakeModels(lambda call: "x"), router=FakeRouter(("ROBIN",)),
                        embedder=FakeEmbedder())
server = Bridge(open_runtime("memory://"), "tcp://127.0.0.1:*", services)
threading.Thread(target=server.serve, daemon=True).start()
assert server.bound.wait(10)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
client = zmq.Context.instance().socket(zmq.DEALER)
client.connect(server.endpoint)
body = b" " * (1 << 20)  # no JSON: each is answered with an error at once
count = int(sys.argv[1])
for n in range(count):
    client.send_multipart([b"BATOS/1", b"r%d" % n, body], copy=False)
for n in range(count):
    assert client.recv_multipart()[1] == b"error"
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_client_pipelining_messages_cannot_fill_the_bridges_memory() -> None:
    """libzmq queued up to 1,000 whole messages per connection (1 GB of bodies) while the
    socket thread worked through them; now RECEIVE_QUEUE of them, then it stops reading."""
    path = os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", FLOOD, "400"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    grown = int(done.stdout.split()[-1])
    assert grown < 120, f"the bridge grew by {grown} MiB for 400 MiB sent"


SLOW_BRIDGE = """
import sys, time
sys.path.insert(0, sys.argv[3])
from fakes import FakeModels
from test_mind import responder
from batos.shell.cli import main

def slow(call):
    print("answering", flush=True)
    time.sleep(600)

assert main(["--image", sys.argv[1], "init"]) == 0
models = FakeModels(responder(answer=slow))
sys.exit(main(["--image", sys.argv[1], "bridge", "--bind", sys.argv[2]], models=models))
"""


def test_a_second_stop_abandons_the_running_requests_and_exits_at_once(tmp_path) -> None:
    """The first Ctrl-C waits for the running requests, which can take minutes on a slow
    model; the second stopped nothing, and only SIGKILL ended the bridge."""
    import signal
    import socket as sockets
    import time

    with sockets.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"file://{tmp_path / 'image' / 'live_image.fs'}"
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_BRIDGE, uri, f"tcp://127.0.0.1:{port}", str(REPO / "tests")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        assert process.stdout is not None
        while "bridge on" not in (line := process.stdout.readline()):
            assert process.poll() is None and line, "the bridge ended before it was bound"
        socket.connect(f"tcp://127.0.0.1:{port}")
        send(socket, b"slow", request("hello there", context={"persona": "robin"}))
        while "answering" not in (line := process.stdout.readline()):
            assert process.poll() is None and line, "the bridge ended before it answered"
        process.send_signal(signal.SIGTERM)  # the first: waits for the request
        time.sleep(2.0)
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)  # the second: at once
        out, _ = process.communicate(timeout=30)
    finally:
        socket.close()
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, out
    assert "bridge stopping once the running requests are answered" in out
    assert "stopping now: the running requests are abandoned" in out
    with LivingImage.open(uri) as img:  # the file opens again, unlocked
        assert img is not None
