"""The hostile-input corpus: every case in ``tests/data/hostile/*.toml`` meets a clear error
and leaves the image as it was.

Surfaces: ``cli`` (``batos.shell.cli.main``: exit code, message and hint, no traceback, output
bounded whatever the input's size), ``mind`` and ``jit`` (the graphs as the LangGraph server
runs them: input and run context from JSON), ``retrieval`` (document text handed to a model
stays inside its fence), ``bridge`` (messages on the Synaptic Bridge's ZeroMQ socket),
``effects`` (a commit a server client writes into a thread's state), ``output`` (what the CLI
prints of hostile text in the image: shown, never obeyed). Before and after each case but the
``output`` ones, which set a slot on purpose, the image's reachable records are digested; a
case passes only when the digests are equal.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from fakes import FakeEmbedder, FakeModels, FakeRouter, image_digest
from images import open_laid_out
from test_mind import responder

import batos.errors
from batos.shell.bridge import PROTOCOL, Bridge
from batos.shell.cli import main
from batos.shell.runtime import Runtime, open_image
from graph.mind import MindServices, build_graph
from graph.retrieval import cited_context
from store.checkpoint.saver import ZODBSaver
from store.core.image import LivingImage, acquire_shared, release_shared
from store.knowledge.catalog import Hit, KnowledgeCatalog

CORPUS = Path(__file__).parent / "data" / "hostile"
#: Characters a failing command may print: an error must not echo an input of any size.
MAX_OUTPUT = 4000


def _cases() -> list[Any]:
    params = []
    for path in sorted(CORPUS.glob("*.toml")):
        for case in tomllib.loads(path.read_text(encoding="utf-8")).get("case", []):
            params.append(pytest.param(case, id=case["id"]))
    return params


CASES = _cases()


def _setup() -> dict[str, Any]:
    merged: dict[str, Any] = {"methods": []}
    for path in sorted(CORPUS.glob("*.toml")):
        setup = tomllib.loads(path.read_text(encoding="utf-8")).get("setup", {})
        merged["methods"].extend(setup.get("methods", []))
    return merged


def expand(value: Any, case: dict[str, Any], tmp: Path) -> Any:
    """``<NAME>`` → the case's ``expand.NAME`` (``[unit, count]``), ``<tmp>`` → its folder."""
    if isinstance(value, list):
        return [expand(v, case, tmp) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, case, tmp) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    for name, (unit, count) in case.get("expand", {}).items():
        value = value.replace(f"<{name}>", unit * count)
    return value.replace("<tmp>", str(tmp))


def write_files(case: dict[str, Any], tmp: Path) -> None:
    for name, spec in case.get("files", {}).items():
        if "hex" in spec:
            data = bytes.fromhex(spec["hex"])
        elif "base64" in spec:
            data = base64.b64decode(spec["base64"])
        else:
            text = expand(spec["text"], case, tmp)
            data = text.encode(spec.get("encoding", "utf-8"), errors="surrogatepass")
        (tmp / name).write_bytes(data * spec.get("repeat", 1))


def flat(text: str) -> str:
    """Whitespace collapsed: rich wraps long lines wherever the terminal width falls."""
    return " ".join(text.split())


def digest_of(uri: str, exclude: list[str]) -> str:
    with open_laid_out(uri) as image:
        return image_digest(image.db, exclude=exclude)


def test_the_corpus_is_large_and_ids_are_unique() -> None:
    ids = [p.id for p in CASES]
    assert len(ids) >= 100
    assert len(set(ids)) == len(ids)
    surfaces = {p.values[0]["surface"] for p in CASES}
    assert surfaces == {"cli", "mind", "jit", "retrieval", "bridge", "effects", "output"}


@pytest.fixture(scope="module")
def cli_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = f"file://{tmp_path_factory.mktemp('hostile-cli') / 'live_image.fs'}"
    assert main(["--image", uri, "init"]) == 0
    with open_image(uri) as image:
        from prototypes import kernel

        def install(root: Any) -> None:
            for method in _setup()["methods"]:
                target = root["objects"][method["path"]]
                kernel.add_method(target, method["selector"], method["source"])

        image.transact(install, note="hostile corpus: methods that misbehave when run")
        # Layouts a first use writes (the catalog's, the checkpoints'), before any case runs.
        KnowledgeCatalog.open(image).close()
    assert main(["--image", uri, "threads"]) == 0
    return uri


def _mind_services() -> MindServices:
    return MindServices(
        models=FakeModels(responder()), router=FakeRouter(), embedder=FakeEmbedder()
    )


@pytest.fixture(scope="module")
def mind_image() -> Iterator[LivingImage]:
    image = open_image("memory://")
    with ZODBSaver(image) as saver:  # one cycle first: what a first cycle lays out is done
        state = build_graph(_mind_services(), checkpointer=saver).invoke(
            {"messages": [("user", "hello")]}, {"configurable": {"thread_id": "warm"}}
        )
        assert state["status"] == "COMPLETE", state.get("failure")
    yield image
    image.close()


@pytest.fixture(scope="module")
def jit_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    uri = f"file://{tmp_path_factory.mktemp('hostile-jit') / 'live_image.fs'}"
    open_image(uri, create=True).close()
    image = acquire_shared(uri)
    yield uri
    del image
    release_shared(uri)


def _run_cli(case: dict[str, Any], uri: str, tmp: Path, capsys: Any) -> None:
    argv = expand(case["argv"], case, tmp)
    exclude = case.get("digest_exclude", [])
    before = digest_of(uri, exclude)
    capsys.readouterr()  # what the fixtures printed
    code = main(["--image", uri, *argv], models=FakeModels(responder()))
    out, err = capsys.readouterr()
    shown = out + err
    assert "Traceback" not in shown, shown[-3000:]
    assert code == case["exit"], shown[-3000:]
    assert flat(case["message"]) in flat(shown), shown[-3000:]
    # Every error says what to do: a hint, or for a usage error where to find the usage.
    assert "hint:" in shown or "--help' for help" in shown, shown[-3000:]
    if "hint" in case:
        assert flat(case["hint"]) in flat(shown), shown[-3000:]
    assert len(shown) <= case.get("max_output", MAX_OUTPUT), shown[:3000]
    assert digest_of(uri, exclude) == before, "the image changed"


def _check_raised(case: dict[str, Any], exc: BaseException) -> None:
    expected = getattr(batos.errors, case["raises"])
    assert isinstance(exc, expected), repr(exc)
    assert isinstance(exc, batos.errors.BatosError) and exc.hint, repr(exc)
    assert case["message"] in exc.message, exc.message
    if "hint" in case:
        assert case["hint"] in exc.hint, exc.hint
    assert len(str(exc)) <= MAX_OUTPUT


def _run_mind(case: dict[str, Any], image: LivingImage, tmp: Path) -> None:
    payload = json.loads(expand(case["input"], case, tmp))
    context = json.loads(expand(case.get("context", "{}"), case, tmp))
    thread = expand(case.get("thread", case["id"]), case, tmp)
    services = _mind_services()
    before = image_digest(image.db, exclude=["checkpoints"])
    with ZODBSaver(image) as saver:
        graph = build_graph(services, checkpointer=saver)
        config = {"configurable": {"thread_id": thread}}
        if "raises" in case:
            with pytest.raises(Exception) as raised:
                graph.invoke(payload, config, context=context)
            _check_raised(case, raised.value)
            if isinstance(raised.value, batos.errors.GraphRequestError):
                # the refused input is the start task's error: the thread still reads
                state = graph.get_state(config)
                assert not state.values.get("messages")
                assert [task.name for task in state.tasks] == ["__start__"]
        else:
            state = graph.invoke(payload, config, context=context)
            assert state["status"] == case["status"], state.get("failure")
            failure = state["failure"]
            assert case["message"] in failure["reason"], failure
            assert failure["hint"] and case.get("hint", "") in failure["hint"], failure
            assert len(failure["reason"]) <= MAX_OUTPUT
            assert graph.get_state(config).next == ()  # the thread is idle for its next request
    assert image_digest(image.db, exclude=["checkpoints"]) == before, "the image changed"


def _run_jit(case: dict[str, Any], uri: str, tmp: Path, monkeypatch: Any) -> None:
    from graph import jit

    monkeypatch.setenv("BATOS_IMAGE", uri)
    image = acquire_shared(uri)
    try:
        before = image_digest(image.db)
        selector = json.loads(expand(case.get("selector", '"estimate"'), case, tmp))
        context = json.loads(expand(case["context"], case, tmp))
        state = jit.graph.invoke({"selector": selector}, context=context)
        assert state["status"] == case["status"], state
        assert case["message"] in state["error"], state["error"]
        assert "hint:" in state["error"] and case.get("hint", "") in state["error"]
        assert len(state["error"]) <= MAX_OUTPUT
        assert image_digest(image.db) == before, "the image changed"
    finally:
        release_shared(uri)


class _OneHitCatalog:
    """A catalog whose search finds one document: what ``cited_context`` fences."""

    def __init__(self, text: str) -> None:
        self.text = text

    def search(self, query: str, k: int, **_: Any) -> list[Hit]:
        return [Hit(1, "hostile.md", 0, len(self.text), self.text, 1.0)]


def _run_retrieval(case: dict[str, Any], tmp: Path) -> None:
    text = expand(case["text"], case, tmp)
    context = cited_context(_OneHitCatalog(text), "anything").text
    # One fence opens and one closes, whatever the passage holds: it cannot end its quote
    # early and speak as the prompt.
    assert context.count("<<<") == 1 and context.count(">>>") == 1, context
    assert context.index("<<<") < context.index(">>>")
    assert context.rstrip().endswith(">>>")


@pytest.fixture(scope="module")
def bridge() -> Iterator[tuple[Bridge, LivingImage]]:
    image = open_image("memory://")
    server = Bridge(Runtime.of(image), "tcp://127.0.0.1:*", _mind_services())
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    assert server.bound.wait(10)
    yield server, image
    server.stop()
    thread.join(10)
    image.close()


def _frame(text: str) -> bytes:
    return bytes.fromhex(text[4:]) if text.startswith("hex:") else text.encode("utf-8")


def _last_reply(socket: zmq.Socket, request_id: bytes) -> tuple[bytes, dict[str, Any]]:
    while True:
        assert socket.poll(30_000), f"no reply to {request_id!r}"
        rid, kind, data = socket.recv_multipart()
        if rid == request_id and kind in (b"result", b"error"):
            return kind, json.loads(data)


def _run_bridge(case: dict[str, Any], server: Bridge, image: LivingImage, tmp: Path) -> None:
    frames = [_frame(expand(f, case, tmp)) for f in case["frames"]]
    frames += frames[-1:] * (case.get("repeat", 1) - 1)
    before = image_digest(image.db, exclude=["checkpoints"])
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(server.endpoint)
    try:
        client.send_multipart(frames, copy=False)
        rid = frames[1] if len(frames) > 1 and len(frames[1]) <= 64 else b"?"
        kind, payload = _last_reply(client, rid)
        assert kind == b"error", payload
        assert case["message"] in payload["message"], payload
        assert payload["hint"] and len(json.dumps(payload)) <= MAX_OUTPUT, payload
        assert image_digest(image.db, exclude=["checkpoints"]) == before, "the image changed"
        # The bridge goes on: a well-formed request is answered (and commits its cycle).
        ok = {"input": {"messages": [{"role": "user", "content": "hello"}]}}
        client.send_multipart([PROTOCOL, b"after", json.dumps(ok).encode()])
        kind, payload = _last_reply(client, b"after")
        assert (kind, payload["status"]) == (b"result", "COMPLETE"), payload
    finally:
        client.close()


def _run_effects(case: dict[str, Any], image: LivingImage, tmp: Path) -> None:
    from batos.errors import CheckpointError

    config = {"configurable": {"thread_id": "warm"}}
    with ZODBSaver(image) as saver:
        graph = build_graph(_mind_services(), checkpointer=saver)
        if "record" in case:
            commit = copy.deepcopy(graph.get_state(config).values["commit"])
            commit["id"] = case["id"]
            (effect,) = [e for e in commit["effects"] if e["kind"] == "cycle_record"]
            effect["record"].update(json.loads(expand(case["record"], case, tmp)))
        else:
            commit = json.loads(expand(case["commit"], case, tmp))
        before = image_digest(image.db, exclude=["checkpoints"])
        with pytest.raises(CheckpointError) as refused:
            graph.update_state(config, {"commit": commit}, as_node="complete")
    assert case["message"] in refused.value.message, refused.value.message
    assert "nothing was written" in refused.value.message and refused.value.hint
    assert len(str(refused.value)) <= MAX_OUTPUT
    assert image_digest(image.db, exclude=["checkpoints"]) == before, "the image changed"


#: Characters a terminal acts on: none may be printed raw.
TERMINAL_CONTROLS = {chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))} - {"\n", "\t"}
TERMINAL_CONTROLS |= {"\u202e", "\u2066", "\u200f"}


def _run_output(case: dict[str, Any], uri: str, tmp: Path, capsys: Any) -> None:
    from prototypes import kernel

    with open_laid_out(uri) as image:

        def put(root: Any) -> None:
            brick = root["objects"]["brick"]
            if "method" in case:
                name = case["method"].split("(")[0].removeprefix("def ")
                kernel.add_method(brick, name, case["method"])
            else:
                brick.hostile = 2 ** case["value_bits"] if "value_bits" in case else case["value"]

        image.transact(put, note=f"hostile corpus: {case['id']}")
    capsys.readouterr()
    code = main(["--image", uri, *case["argv"]])
    out, err = capsys.readouterr()
    shown = out + err
    assert "Traceback" not in shown, shown[-3000:]
    assert code == case["exit"], shown[-3000:]
    assert not set(shown) & TERMINAL_CONTROLS, sorted(set(shown) & TERMINAL_CONTROLS)
    if "shows" in case:
        assert case["shows"] in shown, shown[-3000:]
    else:
        assert flat(case["message"]) in flat(shown) and "hint:" in shown, shown[-3000:]
        assert flat(case["hint"]) in flat(shown), shown[-3000:]
        assert len(shown) <= MAX_OUTPUT


@pytest.fixture(scope="module")
def output_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = f"file://{tmp_path_factory.mktemp('hostile-output') / 'live_image.fs'}"
    assert main(["--image", uri, "init"]) == 0
    return uri


@pytest.mark.parametrize("case", CASES)
def test_hostile_input(case, request, tmp_path, capsys, monkeypatch) -> None:
    for name, value in case.get("env", {}).items():
        monkeypatch.setenv(name, expand(value, case, tmp_path))
    write_files(case, tmp_path)
    surface = case["surface"]
    if surface == "cli":
        _run_cli(case, request.getfixturevalue("cli_image"), tmp_path, capsys)
    elif surface == "mind":
        _run_mind(case, request.getfixturevalue("mind_image"), tmp_path)
    elif surface == "jit":
        _run_jit(case, request.getfixturevalue("jit_image"), tmp_path, monkeypatch)
    elif surface == "retrieval":
        _run_retrieval(case, tmp_path)
    elif surface == "bridge":
        _run_bridge(case, *request.getfixturevalue("bridge"), tmp_path)
    elif surface == "effects":
        _run_effects(case, request.getfixturevalue("mind_image"), tmp_path)
    elif surface == "output":
        _run_output(case, request.getfixturevalue("output_image"), tmp_path, capsys)
    else:
        raise AssertionError(f"unknown surface {surface!r}")
