"""The one layout owner and the one assembly point: ``store.core.layout`` and ``open_runtime``."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import pytest
from fakes import FakeEmbedder, FakeModels, FakeRouter
from langchain_core.messages import HumanMessage
from test_mind import responder

from batos.errors import (
    CheckpointError,
    GraphRequestError,
    ImageCorruptError,
    ImageError,
    ImageNotFoundError,
    ImageURIError,
)
from batos.shell import runtime
from batos.shell.cli import main
from batos.shell.runtime import Runtime, open_runtime, upgrade_steps
from graph import cycle
from graph.mind import MindServices, build_graph, run_config
from store.checkpoint import effects
from store.checkpoint.saver import ZODBSaver
from store.core import layout
from store.core.image import LivingImage, acquire_shared, release_shared
from store.core.schema import applied

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("batos", "graph", "prototypes", "store")


def _product_modules() -> list[Path]:
    return [path for room in PRODUCT for path in sorted((REPO / room).rglob("*.py"))]


def _root_key_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Each string literal of a root key this module defines (``NAME = "key"``) or reads
    and writes on a root (``root["key"]``, ``root.get("key")``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            named = all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
            if named and node.value.value in layout.KEYS:
                found.append((node.lineno, node.value.value))
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if _is_root(node.value) and node.slice.value in layout.KEYS:
                found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            first = node.args[0] if node.args else None
            if (
                node.func.attr in ("get", "setdefault", "pop")
                and _is_root(node.func.value)
                and isinstance(first, ast.Constant)
                and first.value in layout.KEYS
            ):
                found.append((node.lineno, first.value))
    return found


def _is_root(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "root"
    return isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "root"


def test_each_root_key_is_defined_once_in_the_layout_module() -> None:
    seen: dict[str, list[str]] = {key: [] for key in layout.KEYS}
    for path in _product_modules():
        for line, key in _root_key_literals(ast.parse(path.read_text(), str(path))):
            seen[key].append(f"{path.relative_to(REPO)}:{line}")
    owner = "store/core/layout.py"
    assert {key: places for key, places in seen.items() if len(places) != 1} == {}
    assert {key: places[0].split(":")[0] for key, places in seen.items()} == dict.fromkeys(
        layout.KEYS, owner
    )


def test_the_key_scan_finds_a_root_key_written_outside_the_layout() -> None:
    stray = 'CYCLES_KEY = "cycles"\nroot["missions"] = 1\nx = conn.root().get("memory")\n'
    assert [key for _, key in _root_key_literals(ast.parse(stray))] == [
        "cycles",
        "missions",
        "memory",
    ]


def test_no_product_module_finds_the_image_through_langgraphs_checkpointer_key() -> None:
    # One read is allowed: whether a served run has a checkpointer at all (a stateless run
    # has none, and its commit must then be applied by the node), never to find the image.
    users = {
        str(path.relative_to(REPO)): path.read_text().count("CONFIG_KEY_CHECKPOINTER")
        for path in _product_modules()
        if "CONFIG_KEY_CHECKPOINTER" in path.read_text()
    }
    assert users == {"graph/mind_nodes.py": 2}  # the import and the one yes-or-no read
    source = (REPO / "graph/mind_nodes.py").read_text()
    reader = source.index("def _carried_by_checkpointer")
    assert (
        reader
        < source.index(").get(CONFIG_KEY_CHECKPOINTER)")
        < source.index("\n    def ", reader + 1)
    )


def test_accessors_create_nothing_and_say_what_to_do_on_a_bare_image() -> None:
    with LivingImage.open("memory://") as image:
        with image.read() as root:
            assert layout.find(root, layout.CYCLES) is None
            with pytest.raises(ImageError, match="'cycles'") as raised:
                layout.cycles(root)
            assert "open_runtime" in (raised.value.hint or "")
        with pytest.raises(ImageError, match="checkpoints-1"):
            ZODBSaver(image)  # a component refuses the image rather than lay it out
        with image.read() as root:
            assert list(root.keys()) == []


def test_open_runtime_lays_out_every_container_once(file_uri: str) -> None:
    with open_runtime(file_uri, create=True) as first:
        with first.image.read() as root:
            assert set(applied(root)) == {step.name for step in upgrade_steps()}
            # every key but the router's record, which training writes
            assert set(root.keys()) == set(layout.KEYS) - {layout.ROUTER}
            assert len(layout.objects(root)["tools"]._slots()) > 0
        transactions = len(first.image.history(100))
    with open_runtime(file_uri) as second:
        assert len(second.image.history(100)) == transactions  # nothing left to upgrade
        assert second.saver is second.saver  # made once
        assert set(second.saver.effect_kinds) == set(cycle.EFFECT_KINDS)


def test_open_runtime_closes_the_image_when_it_cannot_be_brought_up_to_date(
    file_uri: str, tmp_path: Path
) -> None:
    garbage = tmp_path / "garbage.fs"
    garbage.write_bytes(b"this is not a FileStorage" * 10)
    with pytest.raises(ImageCorruptError):
        open_runtime(f"file://{garbage}")
    with pytest.raises(ImageURIError):
        open_runtime("nosuch://x")
    from prototypes.codex import load_codex

    shipped = load_codex()

    def written_by_a_later_codex(root: object) -> None:
        layout.objects(root)["traits"].codex_version = shipped.version + 1
        del layout.need(root, layout.SCHEMA)[f"codex-{shipped.version}"]

    with open_runtime(file_uri, create=True) as opened:
        opened.image.transact(written_by_a_later_codex)
    with pytest.raises(ImageError, match="newer than"):  # the incarnation step refuses it
        open_runtime(file_uri)
    with LivingImage.open(file_uri):  # and the failed open closed the image: no lock is left
        pass


def test_a_saver_applies_only_the_effect_kinds_it_was_handed(memory_image: LivingImage) -> None:
    commit = {"id": "c1", "effects": [{"kind": "persona_stats", "persona": "ROBIN", "facets": {}}]}
    with pytest.raises(CheckpointError, match="nothing applies") as refused:
        effects.check(commit, {})
    assert "the saver was given no graph's kinds" in (refused.value.hint or "")
    with ZODBSaver(memory_image) as saver:
        assert saver.effect_kinds == {}
        build_graph(checkpointer=saver)  # the mind's assembly hands the saver its kinds
        assert set(saver.effect_kinds) == set(cycle.EFFECT_KINDS)


def _services(models: FakeModels) -> MindServices:
    return MindServices(models=models, router=FakeRouter(("ROBIN",)), embedder=FakeEmbedder())


def test_the_cli_answers_through_the_runtime_on_an_image_it_brings_up_to_date(
    capsys, file_uri: str
) -> None:
    with LivingImage.open(file_uri, create=True):  # an image no step was ever applied to
        pass
    models = FakeModels(responder())
    code = main(["--image", file_uri, "ask", "hello there", "--json"], models=models)
    out, err = capsys.readouterr()
    assert code == 0, err
    with LivingImage.open(file_uri) as image, image.read() as root:
        assert set(applied(root)) == {step.name for step in upgrade_steps()}
        assert len(layout.cycles(root)) == 1  # committed with its checkpoint


@pytest.mark.parametrize("text", [None, 5, ["hello"]])
def test_ask_refuses_a_request_that_is_not_text(memory_image: LivingImage, text) -> None:
    with pytest.raises(GraphRequestError, match="must be text") as info:
        runtime.ask(text, image=memory_image, services=_services(FakeModels(responder())))
    assert "ask('" in info.value.hint
    with memory_image.read() as root:
        assert not layout.cycles(root)  # nothing ran


def test_ask_refuses_arguments_of_the_wrong_kind_before_anything_runs(
    memory_image: LivingImage,
) -> None:
    # image=5 raised "argument of type 'int' is not iterable" from deep in the URI parser;
    # services="x" ran the cycle and ended it FAILED at synthesize with an AttributeError.
    with pytest.raises(GraphRequestError, match="image must be an open image or its URI"):
        runtime.ask("hi", image=5)  # type: ignore[arg-type]
    with pytest.raises(GraphRequestError, match="services must be MindServices") as info:
        runtime.ask("hi", image=memory_image, services="x")  # type: ignore[arg-type]
    assert "leave it out" in info.value.hint
    with memory_image.read() as root:
        assert not layout.cycles(root)


def test_ask_on_an_image_the_caller_keeps(memory_image: LivingImage) -> None:
    state = runtime.ask(
        "hello there", image=memory_image, services=_services(FakeModels(responder()))
    )
    assert state["status"] == "COMPLETE"
    with memory_image.read() as root:  # still open, and the cycle committed
        assert effects.applied(root, state["cycle"]["id"])


def test_a_mind_assembled_without_an_image_fails_the_cycle_clearly() -> None:
    graph = build_graph(_services(FakeModels(responder())))
    state = graph.invoke({"messages": [HumanMessage("hello")]}, run_config("t"))
    assert state["status"] == "FAILED"
    assert "assembled without an image" in state["failure"]["reason"]


def _load_as_the_server_does(name: str) -> object:
    """``batos/shell/served.py`` loaded by path, under a module name of its own."""
    spec = importlib.util.spec_from_file_location(name, REPO / "batos" / "shell" / "served.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _as_under_langgraph_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    """What 'langgraph dev' sets before the server's configuration is read at import."""
    for name, value in (("REDIS_URI", "fake"), ("DATABASE_URI", ":memory:")):
        monkeypatch.setenv(name, os.environ.get(name, value))
    monkeypatch.setenv("MIGRATIONS_PATH", os.environ.get("MIGRATIONS_PATH", "__inmem"))


def _as_the_server_hands_it(saver: ZODBSaver, monkeypatch: pytest.MonkeyPatch) -> object:
    """The checkpointer as the LangGraph server gives it to a run: inside its own adapter."""
    _as_under_langgraph_dev(monkeypatch)
    from langgraph_api._checkpointer._adapter import (
        CheckpointerCapabilities,
        _CustomCheckpointerAdapter,
    )

    return _CustomCheckpointerAdapter(saver, CheckpointerCapabilities.from_type(ZODBSaver))


@pytest.mark.parametrize("handed", ["bare", "adapted"])
def test_a_served_mind_finds_its_image_in_the_runtime_the_checkpointer_factory_opened(
    file_uri: str, monkeypatch: pytest.MonkeyPatch, handed: str
) -> None:
    """As under ``langgraph dev``: the server enters the checkpointer and store factories,
    then runs the served graph with that checkpointer; the graph gets no image of its own."""
    monkeypatch.setenv("BATOS_IMAGE", file_uri)
    open_runtime(file_uri, create=True).close()
    served = _load_as_the_server_does("__served_mind__")
    models = FakeModels(responder())

    async def serve() -> dict:
        async with served.checkpointer() as saver, served.store() as memory:
            assert memory.image is saver.image  # one runtime: the image is opened once
            carrier = saver if handed == "bare" else _as_the_server_hands_it(saver, monkeypatch)
            graph = served.MIND.copy(update={"checkpointer": carrier})
            return await graph.ainvoke(
                {"messages": [HumanMessage("hello there")]},
                run_config("served"),
                context={"services": _services(models)},
            )

    try:
        state = asyncio.run(serve())
    finally:
        del sys.modules["__served_mind__"]
        while runtime._SERVED._open:  # the served graph keeps its image for the process
            runtime._SERVED.release(next(iter(runtime._SERVED._open)))
    assert state["status"] == "COMPLETE"
    with LivingImage.open(file_uri) as image, image.read() as root:  # and the lock is free
        assert effects.applied(root, state["cycle"]["id"])
        assert cycle.get(root, state["cycle"]["id"])["status"] == "COMPLETE"
        history = image.history(3)
        # the commit travelled with the checkpoint that records COMPLETE: one transaction,
        # recorded against that checkpoint (COMPLETE applying it alone records none)
        thread, _, checkpoint_id = layout.applied_commits(root)[state["cycle"]["id"]][1:]
    assert thread == "served" and checkpoint_id
    assert any(entry.description.startswith("mind cycle") for entry in history)


def test_a_served_run_from_an_unknown_checkpoint_writes_nothing(
    file_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's made-up checkpoint_id: the checkpoint is refused, and so is the cycle's
    commit that travels with it; the client is told why (a ValueError's message reaches it)."""
    monkeypatch.setenv("BATOS_IMAGE", file_uri)
    open_runtime(file_uri, create=True).close()
    served = _load_as_the_server_does("__served_unknown__")
    models = FakeModels(responder())
    config = run_config("served")
    config["configurable"]["checkpoint_id"] = "1f1f20b1-ef52-6234-bfff-000000000000"

    async def serve() -> None:
        async with served.checkpointer() as saver, served.store():
            graph = served.MIND.copy(
                update={"checkpointer": _as_the_server_hands_it(saver, monkeypatch)}
            )
            await graph.ainvoke(
                {"messages": [HumanMessage("hello there")]},
                config,
                context={"services": _services(models)},
            )

    try:
        with pytest.raises(ValueError, match="nothing was written") as info:
            asyncio.run(serve())
        assert isinstance(info.value, CheckpointError) and "batos threads" in info.value.hint
    finally:
        del sys.modules["__served_unknown__"]
        while runtime._SERVED._open:
            runtime._SERVED.release(next(iter(runtime._SERVED._open)))
    with LivingImage.open(file_uri) as image, image.read() as root:
        assert not layout.cycles(root) and not layout.applied_commits(root)


def test_a_stateless_served_run_still_commits_its_cycle(
    file_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run without a thread (``runs.wait(None, ...)``) gets no checkpointer from the server:
    its commit cannot travel with a checkpoint, so COMPLETE applies it to the image itself."""
    monkeypatch.setenv("BATOS_IMAGE", file_uri)
    open_runtime(file_uri, create=True).close()
    served = _load_as_the_server_does("__served_stateless__")
    models = FakeModels(responder())

    async def serve() -> dict:
        async with served.checkpointer(), served.store():
            return await served.MIND.ainvoke(  # no checkpointer: as the server runs it
                {"messages": [HumanMessage("hello there")]},
                run_config("stateless"),
                context={"services": _services(models)},
            )

    try:
        state = asyncio.run(serve())
    finally:
        del sys.modules["__served_stateless__"]
        while runtime._SERVED._open:
            runtime._SERVED.release(next(iter(runtime._SERVED._open)))
    assert state["status"] == "COMPLETE"
    with LivingImage.open(file_uri) as image, image.read() as root:
        assert effects.applied(root, state["cycle"]["id"])
        assert cycle.get(root, state["cycle"]["id"])["status"] == "COMPLETE"


async def test_served_factories_share_one_runtime_and_close_it(file_uri: str) -> None:
    LivingImage.open(file_uri, create=True).close()
    served = _load_as_the_server_does("__served_factories__")
    try:
        async with served.checkpointer(file_uri) as first:
            async with served.checkpointer(file_uri) as second:  # another server thread
                assert first is second
            async with served.store(file_uri) as memory:
                await memory.aput(("s",), "k", {"v": 1})
            assert (await first.aget_tuple(run_config("none"))) is None  # still open
    finally:
        del sys.modules["__served_factories__"]
    with LivingImage.open(file_uri) as image, image.read() as root:  # the lock was released
        assert ("s",) in layout.memory(root)


async def test_a_server_never_creates_a_missing_image(tmp_path: Path) -> None:
    """A server started on a mistyped path would otherwise serve a new, empty image."""
    typo = tmp_path / "typo" / "live_image.fs"
    served = _load_as_the_server_does("__served_missing__")
    try:
        with pytest.raises(ImageNotFoundError, match="no image at") as info:
            async with served.checkpointer(typo.as_uri()):
                pass
        assert "init" in info.value.hint
        assert not (tmp_path / "typo").exists()
        assert not runtime._SERVED._open
    finally:
        del sys.modules["__served_missing__"]


async def test_one_file_image_is_one_shared_image_however_its_uri_is_spelled(
    tmp_path: Path,
) -> None:
    path = tmp_path / "my images" / "live_image.fs"
    LivingImage.open(path.as_uri(), create=True).close()
    shouted = "FILE" + path.as_uri()[len("file") :]
    (tmp_path / "link").symlink_to(path.parent)
    around = (tmp_path / "elsewhere" / ".." / "link" / "live_image.fs").as_uri()
    first = acquire_shared(path.as_uri())
    try:
        for spelled in (shouted, around):  # not a second opening, which the lock refuses
            assert acquire_shared(spelled) is first
            release_shared(spelled)
    finally:
        release_shared(path.as_uri())
    assert first.closed


def test_the_runtime_of_an_image_kept_by_its_caller_leaves_it_open(
    memory_image: LivingImage,
) -> None:
    with Runtime.of(memory_image) as kept:
        assert kept.saver.image is memory_image
    with memory_image.read() as root:
        assert layout.objects(root)["robin"] is not None


_MID_CYCLE_WRITER = """
import sys
from fakes import FakeEmbedder, FakeModels, FakeRouter
from langchain_core.messages import HumanMessage
from test_mind import responder
from batos.shell.runtime import open_runtime
from graph.mind import MindServices, build_graph, run_config

services = MindServices(
    models=FakeModels(responder()), router=FakeRouter(("ROBIN",)), embedder=FakeEmbedder()
)
with open_runtime(sys.argv[1]) as opened:
    graph = build_graph(services, checkpointer=opened.saver)
    config = {**run_config("stopped"), "metadata": {"run_id": sys.argv[2]}}
    graph.invoke({"messages": [HumanMessage("hello")]}, config, interrupt_before=["synthesize"])
    print("stored", flush=True)
    sys.stdin.readline()  # alive, as a server answering, until the test lets it go
"""


def test_the_served_factory_refuses_a_run_on_a_busy_thread_but_not_a_retry_of_its_own(
    shared_image_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server retrying the runs its stopped predecessor left running met its own first
    attempt's last step as another process's, and the run ended in ThreadBusy for good."""
    import subprocess

    from langgraph.store.memory import InMemoryStore

    from batos.errors import ThreadBusy
    from store.checkpoint.saver import EXPECT_KEY

    monkeypatch.setenv("BATOS_IMAGE", shared_image_uri)
    open_runtime(shared_image_uri, create=True).close()
    script = tmp_path / "writer.py"
    script.write_text(_MID_CYCLE_WRITER)
    paths = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    writer = subprocess.Popen(
        [sys.executable, str(script), shared_image_uri, "server-run-1"],
        env={**os.environ, "PYTHONPATH": paths},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    _as_under_langgraph_dev(monkeypatch)
    from langgraph_api._factory_utils import build_server_runtime

    served = _load_as_the_server_does("__served_factory__")
    running = build_server_runtime("threads.create_run", InMemoryStore())
    reading = build_server_runtime("threads.read", InMemoryStore())

    def run(run_id: str) -> dict:
        return {"configurable": {"thread_id": "stopped", "run_id": run_id}}

    async def check() -> str:
        assert await served.mind(run("another"), reading) is served.MIND  # a read: as it is
        with pytest.raises(ThreadBusy, match="answering another request"):
            await served.mind(run("another"), running)
        retried = await served.mind(run("server-run-1"), running)
        return str(retried.config["configurable"][EXPECT_KEY])

    try:
        assert writer.stdout is not None and writer.stdout.readline() == "stored\n"
        seen = asyncio.run(check())
        with open_runtime(shared_image_uri) as opened:
            assert seen == opened.saver.get_tuple(run_config("stopped")).checkpoint["id"]
    finally:
        writer.kill()
        writer.wait(30)
        del sys.modules["__served_factory__"]
        while runtime._SERVED._open:  # the served graph keeps its image for the process
            runtime._SERVED.release(next(iter(runtime._SERVED._open)))
