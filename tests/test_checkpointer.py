"""ZODBSaver: the official conformance suite, LangGraph graphs on it, bad input, concurrency."""

from __future__ import annotations

import asyncio
import operator
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from images import open_laid_out
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from store.checkpoint.layout import Payload
from store.checkpoint.saver import (
    CheckpointConfigError,
    CheckpointNotFound,
    CheckpointSerializationError,
    ThreadMovedOn,
    ZODBSaver,
)
from store.core import layout
from store.core.image import LivingImage
from store.core.zeo import ZeoServer


class State(TypedDict):
    n: int
    log: Annotated[list, operator.add]


def chain_graph(saver: ZODBSaver, nodes: int = 3) -> Any:
    builder = StateGraph(State)
    previous = START
    for i in range(nodes):
        builder.add_node(f"n{i}", lambda s, i=i: {"n": s["n"] + 1, "log": [f"n{i}"]})
        builder.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    builder.add_edge(previous, END)
    return builder.compile(checkpointer=saver)


def cfg(thread: str, **extra: Any) -> dict:
    return {"configurable": {"thread_id": thread, **extra}}


@pytest.fixture
def saver(memory_image: LivingImage) -> Iterator[ZODBSaver]:
    with ZODBSaver(memory_image) as s:
        yield s


@pytest.fixture
def file_saver(file_uri: str) -> Iterator[ZODBSaver]:
    with open_laid_out(file_uri) as image, ZODBSaver(image) as s:
        yield s


@pytest.fixture
def lasting_saver(lasting_image_uri: str) -> Iterator[ZODBSaver]:
    """A saver on a file, a ZEO and a PostgreSQL image in turn."""
    with open_laid_out(lasting_image_uri) as image, ZODBSaver(image) as s:
        yield s


def transactions(image: LivingImage) -> int:
    assert image.db.supportsUndo(), "count transactions on a file or ZEO image, not memory://"
    return len(image.db.undoLog(0, 1_000_000))


def written(saver: ZODBSaver) -> tuple[int, list]:
    """What a "nothing written" test compares: the transaction log and every thread summary."""
    return transactions(saver.image), saver.threads()


# -- the official conformance suite, every capability ------------------------------------


async def _conformance(uri_for_suite: Any) -> None:
    @checkpointer_test(name="ZODBSaver")
    async def factory():
        image = open_laid_out(uri_for_suite())
        saver = ZODBSaver(image)
        try:
            yield saver
        finally:
            saver.close()
            image.close()

    report = await validate(factory)
    failures = {n: r.failures for n, r in report.results.items() if r.passed is not True}
    assert not failures, failures
    assert {name for name, r in report.results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    assert report.conformance_level() == "FULL"


async def test_conformance_memory_image() -> None:
    await _conformance(lambda: "memory://")


async def test_conformance_file_image(tmp_path: Path) -> None:
    counter = iter(range(100))
    await _conformance(lambda: f"file://{tmp_path / str(next(counter))}.fs")


@pytest.mark.slow
async def test_conformance_through_zeo(tmp_path: Path) -> None:
    with ZeoServer(tmp_path / "zeo.fs") as server:
        await _conformance(lambda: server.uri)


async def test_conformance_on_postgres(postgres_cluster: Any) -> None:
    await _conformance(postgres_cluster.uri)


# -- graphs on the saver -----------------------------------------------------------------


def test_graph_state_survives_reopening_the_image(lasting_image_uri: str) -> None:
    with open_laid_out(lasting_image_uri) as image, ZODBSaver(image) as s:
        assert chain_graph(s).invoke({"n": 0, "log": []}, cfg("t1")) == {
            "n": 3,
            "log": ["n0", "n1", "n2"],
        }
    with open_laid_out(lasting_image_uri) as image, ZODBSaver(image) as s:
        graph = chain_graph(s)
        assert graph.get_state(cfg("t1")).values["n"] == 3
        out = graph.invoke({"n": 10, "log": []}, cfg("t1"))
        assert out["n"] == 13 and len(out["log"]) == 6


def test_time_travel_history_update_and_replay(saver: ZODBSaver) -> None:
    graph = chain_graph(saver)
    graph.invoke({"n": 0, "log": []}, cfg("tt"))
    history = list(graph.get_state_history(cfg("tt")))
    assert [h.metadata["step"] for h in history] == [3, 2, 1, 0, -1]
    after_n0 = next(h for h in history if h.next == ("n1",))
    assert after_n0.values == {"n": 1, "log": ["n0"]}

    # replay from the past checkpoint: only n1 and n2 run again, on a new branch
    replayed = graph.invoke(None, after_n0.config)
    assert replayed == {"n": 3, "log": ["n0", "n1", "n2"]}

    # fork: edit the past state, then continue from the edit
    forked = graph.update_state(after_n0.config, {"n": 100})
    assert graph.get_state(forked).values["n"] == 100
    assert graph.invoke(None, forked)["n"] == 102
    assert len(list(graph.get_state_history(cfg("tt")))) > len(history)


def test_interrupt_then_resume(saver: ZODBSaver) -> None:
    def ask(state: State) -> dict:
        answer = interrupt("how many?")
        return {"n": state["n"] + answer, "log": ["ask"]}

    builder = StateGraph(State)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)
    first = graph.invoke({"n": 1, "log": []}, cfg("hitl"))
    assert first["__interrupt__"][0].value == "how many?"
    assert graph.get_state(cfg("hitl")).next == ("ask",)
    assert graph.invoke(Command(resume=41), cfg("hitl")) == {"n": 42, "log": ["ask"]}


async def test_async_runs_side_by_side(file_saver: ZODBSaver) -> None:
    graph = chain_graph(file_saver, nodes=4)
    outs = await asyncio.gather(
        *(graph.ainvoke({"n": i, "log": []}, cfg(f"a{i}")) for i in range(8))
    )
    assert [o["n"] for o in outs] == [i + 4 for i in range(8)]
    states = [await graph.aget_state(cfg(f"a{i}")) for i in range(8)]
    assert all(s.values["log"] == ["n0", "n1", "n2", "n3"] for s in states)


def test_threads_hammering_one_image(lasting_saver: ZODBSaver) -> None:
    file_saver = lasting_saver
    graph = chain_graph(file_saver)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for r in range(3):
                graph.invoke({"n": r, "log": []}, cfg(f"w{k % 3}"))  # threads share ids
        except BaseException as exc:
            errors.append(exc)

    # Runs of one process on one thread are the process's to order (the LangGraph server and
    # the bridge queue them): the checkpointer refuses only another process's newer checkpoint.
    workers = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    for k in range(3):
        assert len(list(file_saver.list(cfg(f"w{k}")))) == 6 * 5


def test_concurrent_writes_to_one_checkpoint_are_all_kept(
    any_image_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    uri = any_image_uri
    image_kind = uri.split(":", 1)[0]
    with open_laid_out(uri) as image, ZODBSaver(image) as saver:
        stored = saver.put(cfg("pw", checkpoint_ns=""), generate_checkpoint(), {"step": 0}, {})
        with caplog.at_level("INFO", logger="batos.checkpointer"):
            _race(*(partial(saver.put_writes, stored, [("ch", i)], f"task-{i}") for i in range(12)))
        writes = saver.get_tuple(stored).pending_writes
        assert sorted(w[2] for w in writes) == list(range(12))
    if image_kind != "memory":  # the storage merges them (CheckpointRecord._p_resolveConflict)
        assert "conflict" not in caplog.text


def test_conflicting_changes_besides_writes_are_not_merged() -> None:
    from ZODB.POSException import ConflictError

    from store.checkpoint.layout import CheckpointRecord

    old = {"metadata": ("json", b"1"), "writes": {}}
    one = {"metadata": ("json", b"1"), "writes": {("a", 0): ("ch", ("json", b"1"), "")}}
    two = {"metadata": ("json", b"1"), "writes": {("b", 0): ("ch", ("json", b"2"), "")}}
    merged = CheckpointRecord._p_resolveConflict(None, old, one, two)
    assert set(merged["writes"]) == {("a", 0), ("b", 0)}
    with pytest.raises(ConflictError):
        CheckpointRecord._p_resolveConflict(None, old, one, {**two, "metadata": ("json", b"2")})


# -- storage layout ----------------------------------------------------------------------


def latest_record(saver: ZODBSaver, thread: str) -> Any:
    with saver._reading() as tree:
        index = tree.threads[thread].namespace("")
        return index[index.maxKey()]


def test_large_values_go_to_blobs_and_small_ones_stay_inline(file_uri: str) -> None:
    big = "x" * 100_000
    with open_laid_out(file_uri) as image, ZODBSaver(image) as s:
        chain_graph(s, nodes=1).invoke({"n": 0, "log": [big]}, cfg("big"))
        assert s.get_tuple(cfg("big")).checkpoint["channel_values"]["log"] == [big, "n0"]
        values = latest_record(s, "big").values
        assert isinstance(values["log"], Payload) and values["log"].blob is not None
        assert isinstance(values["n"], tuple)
    blob_files = list(Path(file_uri[len("file://") :] + ".blobs").rglob("*.blob"))
    assert blob_files


def test_headers_list_a_thread_without_decoding_its_values(memory_image: LivingImage) -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    class Counting(JsonPlusSerializer):
        loads = 0

        def loads_typed(self, data: Any) -> Any:
            Counting.loads += 1
            return super().loads_typed(data)

    with ZODBSaver(memory_image, serde=Counting()) as saver:
        graph = chain_graph(saver)
        for n in range(4):
            graph.invoke({"n": n, "log": ["x" * 100_000]}, cfg("big"))
        listed = list(saver.list(cfg("big"), limit=6))
        Counting.loads = 0
        headers = saver.headers("big", limit=6)
        assert Counting.loads == 6  # each one's metadata, and no value nor write
        assert saver.headers("no such thread") == []
    assert [(h.checkpoint_id, h.namespace, h.metadata, h.writes) for h in headers] == [
        (
            t.config["configurable"]["checkpoint_id"],
            t.config["configurable"]["checkpoint_ns"],
            t.metadata,
            len(t.pending_writes),
        )
        for t in listed
    ]
    assert [h.parent_id for h in headers] == [
        t.parent_config and t.parent_config["configurable"]["checkpoint_id"] for t in listed
    ]


def test_memory_image_keeps_large_values_without_blobs(saver: ZODBSaver) -> None:
    chain_graph(saver, nodes=1).invoke({"n": 0, "log": ["y" * 100_000]}, cfg("m"))
    assert len(saver.get_tuple(cfg("m")).checkpoint["channel_values"]["log"][0]) == 100_000


def test_unchanged_large_values_are_shared_not_copied(saver: ZODBSaver) -> None:
    builder = StateGraph(State)
    builder.add_node("count", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "count")
    builder.add_edge("count", END)
    builder.compile(checkpointer=saver).invoke({"n": 0, "log": ["z" * 2000]}, cfg("same"))
    saver.copy_thread("same", "copy")
    with saver._reading() as tree:
        records = [
            record
            for thread in ("same", "copy")
            for record in tree.threads[thread].namespace("").values()
            if "log" in record.values
        ]
        assert len(records) == 4  # after the input is applied, and after the node
        assert all(record.values["log"] is records[0].values["log"] for record in records)
        assert isinstance(records[0].values["log"], Payload)


def test_unchanged_channels_are_found_without_a_parent_and_emptied_ones_vanish(
    saver: ZODBSaver,
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    first = generate_checkpoint(
        channel_values={"a": "a1", "b": "b1", "c": "c1"},
        channel_versions={"a": "1", "b": "1", "c": "1"},
    )
    saver.put(cfg("v", checkpoint_ns=""), first, {}, {"a": "1", "b": "1", "c": "1"})
    # no parent named: b is looked up by version; c is emptied at version 2
    second = generate_checkpoint(
        channel_values={"a": "a2"}, channel_versions={"a": "2", "b": "1", "c": "2"}
    )
    stored = saver.put(cfg("v", checkpoint_ns=""), second, {}, {"a": "2", "c": "2"})
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"a": "a2", "b": "b1"}
    third = generate_checkpoint(channel_versions={"a": "2", "b": "1", "c": "2"})
    stored = saver.put(stored, third, {}, {})
    assert saver.get_tuple(stored).checkpoint["channel_values"] == {"a": "a2", "b": "b1"}


def test_runs_are_deleted_with_their_checkpoints(saver: ZODBSaver) -> None:
    graph = chain_graph(saver)
    first, second = "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"
    graph.invoke({"n": 0, "log": []}, {**cfg("r"), "run_id": first})
    keep = graph.invoke({"n": 0, "log": []}, {**cfg("r"), "run_id": second})
    saver.delete_for_runs([second])
    assert len(keep["log"]) == 6
    assert len(graph.get_state(cfg("r")).values["log"]) == 3
    with saver._reading() as tree:
        assert second not in tree.runs and first in tree.runs
        records = list(tree.threads["r"].namespace("").values())
        assert len(records) == 5 and {r.run_id for r in records} == {first}
    saver.delete_for_runs([first])
    assert saver.threads() == []


def test_recent_threads_are_those_with_the_newest_checkpoints(saver: ZODBSaver) -> None:
    graph = chain_graph(saver)
    for thread in ("b", "zoo-1", "zoo-2", "a"):
        graph.invoke({"n": 0, "log": []}, cfg(thread))
    graph.invoke({"n": 0, "log": []}, cfg("b"))  # the oldest thread goes on: newest again
    # by time, not by id: the thread ids in order would be a, b, zoo-1, zoo-2
    assert saver.recent_threads(3) == ["b", "a", "zoo-2"]
    assert saver.recent_threads(10) == ["b", "a", "zoo-2", "zoo-1"]
    saver.delete_thread("a")
    assert saver.recent_threads(2) == ["b", "zoo-2"]


def _layout_1_thread(memory: InMemorySaver, thread_id: str) -> Any:
    """The thread as layouts 1 and 2 stored it, built from what InMemorySaver holds."""
    from BTrees.OOBTree import OOBTree

    from store.checkpoint.layout import CheckpointRecord, ThreadRecord, encode

    thread = ThreadRecord()
    thread.values, thread.writes = OOBTree(), OOBTree()
    for ns, checkpoints in memory.storage[thread_id].items():
        old = thread.namespaces[ns] = OOBTree()
        for checkpoint_id, (body, metadata, parent_id) in checkpoints.items():
            versions = memory.serde.loads_typed(body)["channel_versions"]
            record = CheckpointRecord.__new__(CheckpointRecord)
            record.__setstate__(
                {
                    "checkpoint": body,
                    "metadata": metadata,
                    "parent_id": parent_id,
                    "run_id": None,
                    "size": len(body[1]),
                    "versions": tuple((channel, str(v)) for channel, v in versions.items()),
                }
            )
            old[checkpoint_id] = record
    for (tid, ns, channel, version), typed in memory.blobs.items():
        if tid == thread_id:  # layout 1 keyed values (ns, channel, version)
            thread.values[(ns, channel, str(version))] = encode(typed, blob_threshold=None)
    for (tid, ns, checkpoint_id), writes in memory.writes.items():
        if tid == thread_id:
            for (task_id, idx), (_, channel, typed, path) in writes.items():
                stored = encode(typed, blob_threshold=None)
                thread.writes[(ns, checkpoint_id, task_id, idx)] = (channel, stored, path)
    return thread


def test_layout_1_image_is_brought_forward_and_reads_the_same(file_uri: str) -> None:
    from BTrees.OOBTree import OOBTree

    from store.checkpoint.layout import CHECKPOINT_STEPS, ThreadRecord
    from store.core.schema import applied, upgrade

    def ask(state: State) -> dict:
        return {"n": state["n"] + interrupt("more?"), "log": ["asked"]}

    builder = StateGraph(State)
    builder.add_node("first", lambda s: {"n": s["n"] + 1, "log": ["y" * 2000]})
    builder.add_node("ask", ask)
    builder.add_edge(START, "first")
    builder.add_edge("first", "ask")
    builder.add_edge("ask", END)
    memory = InMemorySaver()
    builder.compile(checkpointer=memory).invoke({"n": 0, "log": []}, cfg("old"))

    def history(saver: Any) -> list:
        return [
            (
                c.config,
                c.checkpoint,
                c.metadata,
                c.parent_config,
                sorted(c.pending_writes or [], key=repr),
            )
            for c in saver.list(cfg("old"))
        ]

    expected = history(memory)
    assert any(item[4] for item in expected)  # the interrupt is a pending write
    orphan = ("never-stored", "task", 0)
    with LivingImage.open(file_uri) as image:  # bare: the layout of the first release
        upgrade(image, CHECKPOINT_STEPS[:1])

        def write_layout_1(root: Any) -> None:
            threads = root[layout.CHECKPOINTS].threads
            threads["old"] = _layout_1_thread(memory, "old")
            threads["old"].writes[("", *orphan)] = ("ch", ("json", b"1"), "")
            only_orphans = threads["orphans"] = ThreadRecord()
            only_orphans.values, only_orphans.writes = OOBTree(), OOBTree()
            only_orphans.writes[("", *orphan)] = ("ch", ("json", b"1"), "")

        image.transact(write_layout_1)
    with open_laid_out(file_uri) as image, ZODBSaver(image) as s:
        with image.read() as root:
            assert {"checkpoints-2", "checkpoints-3"} <= set(applied(root))
            assert set(root[layout.CHECKPOINTS].threads) == {"old"}
        assert history(s) == expected
        assert [t.thread_id for t in s.threads()] == ["old"]
        graph = builder.compile(checkpointer=s)
        assert graph.invoke(Command(resume=10), cfg("old"))["n"] == 11
        assert s.trim(["old"], keep=1) == len(expected)
        assert graph.get_state(cfg("old")).values["n"] == 11


def test_trim_keeps_newest_and_copy_keeps_everything(saver: ZODBSaver) -> None:
    graph = chain_graph(saver)
    graph.invoke({"n": 0, "log": ["z" * 2000]}, cfg("src"))
    saver.copy_thread("src", "dst")
    assert graph.get_state(cfg("dst")).values == graph.get_state(cfg("src")).values
    assert [c.metadata for c in saver.list(cfg("dst"))] == [
        {**c.metadata, "thread_id": "dst"} if "thread_id" in c.metadata else c.metadata
        for c in saver.list(cfg("src"))
    ]
    assert saver.trim(["src"], keep=2) == 3
    assert len(list(saver.list(cfg("src")))) == 2
    assert graph.get_state(cfg("src")).values["n"] == 3
    assert len(list(saver.list(cfg("dst")))) == 5


# -- bad input: clear errors, nothing written --------------------------------------------


@pytest.mark.parametrize(
    "config", [{}, {"configurable": {}}, cfg(""), cfg("   "), cfg({"x": 1}), cfg(None), cfg(1.5)]
)
def test_missing_or_malformed_thread_id(file_saver: ZODBSaver, config: dict) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    chain_graph(file_saver).invoke({"n": 0, "log": []}, cfg("other"))
    before = written(file_saver)
    with pytest.raises(CheckpointConfigError) as info:
        file_saver.put(config, generate_checkpoint(), {}, {})
    assert "thread_id" in str(info.value) and info.value.hint
    with pytest.raises(CheckpointConfigError):
        file_saver.put_writes({**config, "checkpoint_id": "x"}, [("ch", 1)], "task")
    with pytest.raises(CheckpointConfigError):
        file_saver.get_tuple(config)
    assert written(file_saver) == before


def test_any_non_empty_thread_id_is_held_and_named_briefly_in_history(file_uri: str) -> None:
    # The transaction note names the thread: a file image refuses a note over 64 KiB, and
    # every storage one that is not UTF-8 (a lone surrogate), which failed every put.
    odd = ["x" * 100_000, "a\ud800b", "line\nbreak", "ünï😀"]
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        for thread in odd:
            chain_graph(saver).invoke({"n": 0, "log": []}, cfg(thread))
            assert saver.get_tuple(cfg(thread)).checkpoint["channel_values"]["n"] == 3
        assert {s.thread_id for s in saver.threads()} == set(odd)
        notes = [record.description for record in image.history(100)]
    assert max(len(note) for note in notes) <= 2_000
    assert any(note.startswith("checkpoint a\\ud800b ") for note in notes)


@pytest.mark.parametrize("config", [{}, cfg(""), cfg("  ")])
def test_graph_without_a_usable_thread_id_writes_nothing(
    file_saver: ZODBSaver, config: dict
) -> None:
    # LangGraph itself refuses a config with no thread_id (and stringifies non-str ones);
    # an empty one reaches the saver, which refuses it.
    chain_graph(file_saver).invoke({"n": 0, "log": []}, cfg("other"))
    before = written(file_saver)
    with pytest.raises(ValueError, match="thread_id"):
        chain_graph(file_saver).invoke({"n": 0, "log": []}, config)
    assert written(file_saver) == before


def test_unknown_checkpoint_id(saver: ZODBSaver) -> None:
    chain_graph(saver).invoke({"n": 0, "log": []}, cfg("k"))
    missing = cfg("k", checkpoint_ns="", checkpoint_id="1ef00000-0000-6000-8000-000000000000")
    assert saver.get_tuple(missing) is None  # LangGraph's contract
    with pytest.raises(CheckpointNotFound, match="1ef00000") as info:
        saver.require(missing)
    assert "batos threads" in info.value.hint
    with pytest.raises(CheckpointNotFound):
        saver.require(cfg("nobody"))


def test_an_empty_checkpoint_id_means_the_latest_as_in_langgraphs_own_saver(
    saver: ZODBSaver,
) -> None:
    # A client that sends checkpoint_id "" for "no particular checkpoint" (LangGraph reads
    # it as falsy) got a CheckpointConfigError from this saver and the latest from InMemorySaver.
    from langgraph.checkpoint.memory import InMemorySaver

    results = []
    for each in (saver, InMemorySaver()):
        graph = chain_graph(each)
        graph.invoke({"n": 0, "log": []}, cfg("e"))
        latest = graph.get_state(cfg("e"))
        empty = graph.get_state(cfg("e", checkpoint_id=""))
        assert (
            empty.config["configurable"]["checkpoint_id"]
            == (latest.config["configurable"]["checkpoint_id"])
        )
        graph.invoke({"n": 10, "log": []}, cfg("e", checkpoint_id=""))
        results.append((empty.values["n"], graph.get_state(cfg("e")).values["n"]))
    assert results[0] == results[1] == (3, 13)


MADE_UP = "1ef00000-0000-6000-8000-000000000000"


@pytest.mark.parametrize("thread", ["k", "new-thread"])
def test_graph_run_from_an_unknown_checkpoint_writes_nothing(
    file_saver: ZODBSaver, thread: str
) -> None:
    graph = chain_graph(file_saver)
    graph.invoke({"n": 0, "log": []}, cfg("k"))
    before = written(file_saver)
    with pytest.raises(CheckpointNotFound, match=MADE_UP) as info:
        graph.invoke({"n": 5, "log": []}, cfg(thread, checkpoint_id=MADE_UP))
    assert "nothing was written" in str(info.value) and "get_state_history" in info.value.hint
    with pytest.raises(CheckpointNotFound, match="made-up"):
        graph.update_state(cfg(thread, checkpoint_id="made-up"), {"n": 100})
    assert written(file_saver) == before
    assert graph.get_state(cfg("k")).values["n"] == 3


def test_put_needs_its_parent_in_the_same_namespace(saver: ZODBSaver) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    root = saver.put(cfg("ns", checkpoint_ns=""), generate_checkpoint(), {}, {})
    parent_id = root["configurable"]["checkpoint_id"]
    with pytest.raises(CheckpointNotFound, match="child"):
        saver.put(
            cfg("ns", checkpoint_ns="child", checkpoint_id=parent_id), generate_checkpoint(), {}, {}
        )
    with pytest.raises(CheckpointNotFound):
        saver.put(
            cfg("other", checkpoint_ns="", checkpoint_id=parent_id), generate_checkpoint(), {}, {}
        )
    saver.put(root, generate_checkpoint(), {}, {})
    assert len(list(saver.list(cfg("ns")))) == 2


def _around(inner: StateGraph, saver: ZODBSaver) -> Any:
    """A graph that doubles ``n``, then runs ``inner`` as its subgraph."""
    outer = StateGraph(State)
    outer.add_node("before", lambda s: {"n": s["n"] * 2, "log": ["before"]})
    outer.add_node("inner", inner.compile())
    outer.add_edge(START, "before")
    outer.add_edge("before", "inner")
    outer.add_edge("inner", END)
    return outer.compile(checkpointer=saver)


def test_subgraphs_interrupts_and_time_travel_keep_their_parents(saver: ZODBSaver) -> None:
    def ask(state: State) -> dict:
        return {"n": state["n"] + interrupt("more?"), "log": ["asked"]}

    inner = StateGraph(State)
    inner.add_node("step", lambda s: {"n": s["n"] + 1, "log": ["inner"]})
    inner.add_node("ask", ask)
    inner.add_edge(START, "step")
    inner.add_edge("step", "ask")
    inner.add_edge("ask", END)
    graph = _around(inner, saver)

    graph.invoke({"n": 1, "log": []}, cfg("sub"))
    assert graph.get_state(cfg("sub"), subgraphs=True).tasks[0].state.next == ("ask",)
    done = graph.invoke(Command(resume=10), cfg("sub"))
    assert done["n"] == 13
    assert any(ns for ns in {c.config["configurable"]["checkpoint_ns"] for c in saver.list(None)})
    past = next(h for h in graph.get_state_history(cfg("sub")) if h.next == ("inner",))
    graph.invoke(None, past.config)  # replay: the subgraph interrupts again
    assert graph.invoke(Command(resume=20), cfg("sub"))["n"] == 23


def test_a_thread_is_listed_newest_first_across_namespaces_and_its_latest_is_the_root_s(
    saver: ZODBSaver,
) -> None:
    inner = StateGraph(State)
    inner.add_node("ask", lambda s: {"n": s["n"] + interrupt("more?"), "log": ["asked"]})
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    graph = _around(inner, saver)
    graph.invoke({"n": 1, "log": []}, cfg("sub"))  # the subgraph waits: its checkpoints are newer

    listed = [c.config["configurable"] for c in saver.list(cfg("sub"))]
    ids = [c["checkpoint_id"] for c in listed]
    assert ids == sorted(ids, reverse=True) and len({c["checkpoint_ns"] for c in listed}) == 2
    assert listed[0]["checkpoint_ns"]  # the newest is the subgraph's
    first_two = saver.list(cfg("sub"), limit=2)
    assert [c.config["configurable"]["checkpoint_id"] for c in first_two] == ids[:2]
    root = graph.get_state(cfg("sub")).config["configurable"]["checkpoint_id"]
    assert saver.thread_summary("sub").latest_id == root != ids[0]


def test_non_serialisable_state_writes_nothing(file_uri: str) -> None:
    class Opaque:
        pass

    def node(state: State) -> dict:
        return {"log": [Opaque()] if state["n"] < 0 else ["fine"]}

    builder = StateGraph(State)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"n": 0, "log": []}, cfg("ok"))
        before = written(saver)
        # The input checkpoint cannot be stored, but with LangGraph's default (async)
        # durability the node still runs and sends its writes for it.
        with pytest.raises(CheckpointSerializationError, match="lock") as info:
            graph.invoke({"n": 0, "log": [threading.Lock()]}, cfg("bad"))
        assert "nothing was written" in str(info.value) and info.value.hint
        assert saver.get_tuple(cfg("bad")) is None
        assert list(saver.list(cfg("bad"))) == []
        assert written(saver) == before
        # LangGraph never sends the puts after a failed one; the writes the node sent for the
        # next checkpoint wait in memory, unseen, until they expire (PARKED_SECONDS)
        # a node that returns one: the run stops at the last good checkpoint
        with pytest.raises(CheckpointSerializationError, match="Opaque"):
            graph.invoke({"n": -1, "log": []}, cfg("bad-node"), durability="sync")
        state = graph.get_state(cfg("bad-node"))
        assert state.next == ("node",) and state.values == {"n": -1, "log": []}
    from batos.shell.cli import main as batos

    assert batos(["--image", file_uri, "threads"]) == 0
    assert batos(["--image", file_uri, "threads", "bad"]) == 8


# -- writes that arrive before their checkpoint ------------------------------------------


def _checkpoint_and_config(thread: str) -> tuple[dict, dict]:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    checkpoint = generate_checkpoint(channel_values={"x": 1}, channel_versions={"x": "1"})
    return checkpoint, cfg(thread, checkpoint_ns="", checkpoint_id=checkpoint["id"])


def test_writes_before_their_checkpoint_are_stored_by_its_put(file_saver: ZODBSaver) -> None:
    checkpoint, config = _checkpoint_and_config("early")
    before = written(file_saver)
    file_saver.put_writes(config, [("ch", "a"), ("other", "b")], "task-1", "path-1")
    file_saver.put_writes(config, [("ch", "c")], "task-2")
    assert written(file_saver) == before
    assert file_saver.get_tuple(config) is None
    assert list(file_saver.list(cfg("early"))) == [] and list(file_saver.list(None)) == []
    with pytest.raises(CheckpointNotFound):
        file_saver.thread_summary("early")

    file_saver.put(cfg("early", checkpoint_ns=""), checkpoint, {}, {"x": "1"})
    assert transactions(file_saver.image) == before[0] + 1  # checkpoint and writes together
    assert file_saver.get_tuple(config).pending_writes == [
        ("task-2", "ch", "c"),
        ("task-1", "ch", "a"),
        ("task-1", "other", "b"),
    ]
    assert file_saver._parking.parked() == 0
    file_saver.put_writes(config, [("ch", "late")], "task-3")  # stored at once now
    assert transactions(file_saver.image) == before[0] + 2
    assert file_saver.thread_summary("early").writes == 4


def test_writes_for_a_checkpoint_whose_put_fails_are_dropped(file_saver: ZODBSaver) -> None:
    checkpoint, config = _checkpoint_and_config("doomed")
    checkpoint["channel_values"]["x"] = threading.Lock()
    before = written(file_saver)
    file_saver.put_writes(config, [("ch", "early")], "task-1")
    with pytest.raises(CheckpointSerializationError):
        file_saver.put(cfg("doomed", checkpoint_ns=""), checkpoint, {}, {"x": "1"})
    file_saver.put_writes(config, [("ch", "late")], "task-2")  # after the failure
    assert file_saver._parking.parked() == 0
    assert written(file_saver) == before


def test_delete_thread_drops_writes_waiting_for_their_checkpoint(file_saver: ZODBSaver) -> None:
    checkpoint, config = _checkpoint_and_config("gone")
    file_saver.put_writes(config, [("ch", 1)], "task")
    file_saver.delete_thread("gone")
    assert file_saver._parking.parked() == 0
    file_saver.put(cfg("gone", checkpoint_ns=""), checkpoint, {}, {"x": "1"})
    assert file_saver.get_tuple(config).pending_writes == []


def test_writes_for_a_deleted_checkpoint_are_dropped(file_saver: ZODBSaver) -> None:
    graph = chain_graph(file_saver)
    graph.invoke({"n": 0, "log": []}, cfg("trimmed"))
    oldest = list(file_saver.list(cfg("trimmed")))[-1].config
    file_saver.trim(["trimmed"], keep=1)
    before = written(file_saver)
    writer = threading.Thread(target=file_saver.put_writes, args=(oldest, [("ch", 1)], "task"))
    writer.start()
    writer.join(timeout=10)
    assert not writer.is_alive()
    assert written(file_saver) == before and file_saver._parking.parked() == 0


def test_writes_whose_put_never_comes_expire(
    saver: ZODBSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    import store.checkpoint.parking

    _, first = _checkpoint_and_config("lost")
    saver.put_writes(first, [("ch", 1)], "task")
    monkeypatch.setattr(store.checkpoint.parking, "PARKED_SECONDS", 0.0)
    _, second = _checkpoint_and_config("lost")
    saver.put_writes(second, [("ch", 1)], "task")
    assert saver._parking.parked() == 0


def _race(*calls: Callable[[], Any]) -> None:
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> None:
        start.wait()
        call()

    workers = [threading.Thread(target=run, args=(call,)) for call in calls]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


# -- two runs on one thread at once --------------------------------------------------------


@pytest.fixture
def two_processes(shared_image_uri: str) -> Iterator[tuple[ZODBSaver, ZODBSaver]]:
    """Two savers on one shared image, each through an image of its own: as two processes."""
    with open_laid_out(shared_image_uri) as one_image, open_laid_out(shared_image_uri) as other:
        with ZODBSaver(one_image) as one, ZODBSaver(other) as two:
            yield one, two


def test_a_run_continuing_a_superseded_latest_stores_nothing(
    two_processes: tuple[ZODBSaver, ZODBSaver],
) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    one, two = two_processes
    chain_graph(one).invoke({"n": 0, "log": []}, cfg("t"))
    read = one.get_tuple(cfg("t"))  # what a run reads as it starts
    assert read is not None
    chain_graph(two).invoke({"n": 10, "log": []}, cfg("t"))  # another process stores first
    latest = two.get_tuple(cfg("t"))
    before = written(one)
    with pytest.raises(ThreadMovedOn, match="moved on while this run was in progress") as err:
        one.put(read.config, generate_checkpoint(), {"step": 9, "source": "loop"}, {})
    assert err.value.hint and "send the request again" in err.value.hint
    assert isinstance(err.value, ValueError)  # the LangGraph server shows a client why
    assert written(one) == before
    assert one.get_tuple(cfg("t")).config == latest.config
    # The same checkpoint named by id is a fork on purpose, and stores.
    fork = cfg("t", checkpoint_ns="", checkpoint_id=read.config["configurable"]["checkpoint_id"])
    chain_graph(one).update_state(fork, {"n": 1})
    assert transactions(one.image) == before[0] + 1


def _pausing(inside: threading.Event, go_on: threading.Event, saver: ZODBSaver) -> Any:
    """A one-step graph on ``saver`` whose step, for the input "first", says it is ``inside``
    and waits until told to ``go_on``: a run caught mid-step, as another process sees it."""

    def step(state: State) -> dict:
        if state["log"][-1] == "first":
            inside.set()
            assert go_on.wait(30)
        return {"n": state["n"] + 1, "log": [f"step after {state['log'][-1]}"]}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    return builder.compile(checkpointer=saver)


def test_a_run_that_started_a_thread_is_held_to_the_check_at_every_step(
    two_processes: tuple[ZODBSaver, ZODBSaver],
) -> None:
    # On a thread with no checkpoint LangGraph keeps the config it was given: no mark from
    # get_tuple. Its first put was checked, its later ones were not, and the other process's
    # run stored meanwhile was dropped from the thread's latest state.
    one, two = two_processes
    inside, go_on = threading.Event(), threading.Event()
    build = partial(_pausing, inside, go_on)

    failures: list[BaseException] = []

    def first() -> None:
        try:
            build(one).invoke({"n": 0, "log": ["first"]}, cfg("new"))
        except BaseException as exc:
            failures.append(exc)

    runner = threading.Thread(target=first, daemon=True)
    runner.start()
    try:
        assert inside.wait(30)
        for _ in range(300):  # the first run's step checkpoint is stored in the background
            state = two.get_tuple(cfg("new"))
            if state is not None and state.metadata.get("step", -1) >= 0:
                break
            threading.Event().wait(0.01)
        second = build(two).invoke({"n": 0, "log": ["second"]}, cfg("new"))
    finally:
        go_on.set()
        runner.join(30)
    assert [type(f) for f in failures] == [ThreadMovedOn]
    latest = one.get_tuple(cfg("new")).checkpoint["channel_values"]
    assert latest["log"] == second["log"] and latest["log"][-1] == "step after second"


def test_a_newer_checkpoint_of_the_same_process_is_no_conflict(saver: ZODBSaver) -> None:
    # A run the LangGraph server interrupted or rolled back may store its last step after the
    # next run on the thread read it: the process orders its own runs.
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    graph = chain_graph(saver)
    graph.invoke({"n": 0, "log": []}, cfg("t"))
    read = saver.get_tuple(cfg("t"))
    graph.invoke({"n": 10, "log": []}, cfg("t"))
    saver.put(read.config, generate_checkpoint(), {"step": 9, "source": "loop"}, {})


def test_a_state_read_as_the_latest_and_reused_later_branches(
    two_processes: tuple[ZODBSaver, ZODBSaver],
) -> None:
    # StateSnapshot.config names its checkpoint: invoking with it later is a deliberate fork,
    # whoever moved the thread on since.
    one, two = two_processes
    graph = chain_graph(one)
    graph.invoke({"n": 0, "log": []}, cfg("t"))
    snapshot = graph.get_state(cfg("t"))
    chain_graph(two).invoke({"n": 10, "log": []}, cfg("t"))
    assert graph.invoke({"n": 5, "log": []}, snapshot.config)["n"] == 8
    graph.update_state(snapshot.config, {"n": 1})


def test_a_run_overtaken_mid_step_fails_and_the_other_run_is_kept(
    two_processes: tuple[ZODBSaver, ZODBSaver],
) -> None:
    # Two runs on one thread at once in two processes: the first stops inside a node, the
    # second runs to its end meanwhile.
    inside, go_on = threading.Event(), threading.Event()
    build = partial(_pausing, inside, go_on)

    one, two = two_processes
    build(one).invoke({"n": 0, "log": ["opening"]}, cfg("t"))
    failures: list[BaseException] = []

    def first() -> None:
        try:
            build(one).invoke({"n": 0, "log": ["first"]}, cfg("t"))
        except BaseException as exc:
            failures.append(exc)

    runner = threading.Thread(target=first)
    runner.start()
    assert inside.wait(30)
    for _ in range(300):  # the first run's step checkpoint is stored in the background
        state = two.get_tuple(cfg("t"))
        if state.metadata.get("step", -1) >= 2 and state.metadata["source"] == "loop":
            break
        threading.Event().wait(0.01)
    second = build(two).invoke({"n": 0, "log": ["second"]}, cfg("t"))
    go_on.set()
    runner.join(30)
    assert [type(f) for f in failures] == [ThreadMovedOn]
    assert second["log"][-1] == "step after second"
    latest = one.get_tuple(cfg("t")).checkpoint["channel_values"]
    assert latest["log"][-1] == "step after second"
    assert "step after first" not in latest["log"]


def test_a_replay_through_a_subgraph_with_checkpoints_of_its_own_runs(saver: ZODBSaver) -> None:
    # A subgraph compiled with checkpointer=True keeps one namespace across runs; replayed
    # from before it, it starts that namespace afresh over its own earlier checkpoints.
    inner = StateGraph(State)
    inner.add_node("inc", lambda s: {"n": s["n"] + 1, "log": ["inc"]})
    inner.add_edge(START, "inc")
    inner.add_edge("inc", END)
    outer = StateGraph(State)
    outer.add_node("sub", inner.compile(checkpointer=True))
    outer.add_edge(START, "sub")
    outer.add_edge("sub", END)
    graph = outer.compile(checkpointer=saver)
    graph.invoke({"n": 0, "log": []}, cfg("p"))
    graph.invoke({"n": 0, "log": []}, cfg("p"))
    before_sub = [h for h in graph.get_state_history(cfg("p")) if h.next == ("sub",)][-1]
    assert graph.invoke(None, before_sub.config)["n"] == 1


class _Meeting(ZODBSaver):
    """A saver whose first checkpoint transaction waits, before committing, until the other
    saver's has run too: both read the same state, as two processes' puts at once may."""

    meeting: threading.Barrier | None = None

    def _write_root(self, fn: Callable[[Any], Any], note: str) -> Any:
        def met(root: Any) -> Any:
            result = fn(root)
            meeting, self.meeting = self.meeting, None
            if meeting is not None and note.startswith("checkpoint"):
                meeting.wait(10)
            return result

        return super()._write_root(met, note)


def test_two_puts_continuing_one_latest_at_once_store_one(shared_image_uri: str) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    with (
        open_laid_out(shared_image_uri) as one_image,
        open_laid_out(shared_image_uri) as two_image,
        _Meeting(one_image) as one,
        _Meeting(two_image) as two,
    ):
        chain_graph(one).invoke({"n": 0, "log": []}, cfg("t"))
        reads = [one.get_tuple(cfg("t")), two.get_tuple(cfg("t"))]
        one.meeting = two.meeting = threading.Barrier(2)
        outcomes: list[Any] = []

        def put(saver: ZODBSaver, read: Any) -> None:
            try:
                outcomes.append(saver.put(read.config, generate_checkpoint(), {"step": 9}, {}))
            except ThreadMovedOn as exc:
                outcomes.append(exc)

        _race(partial(put, one, reads[0]), partial(put, two, reads[1]))
        moved = [o for o in outcomes if isinstance(o, ThreadMovedOn)]
        stored = [o for o in outcomes if not isinstance(o, ThreadMovedOn)]
        assert len(moved) == 1 and len(stored) == 1, outcomes
        latest = one.get_tuple(cfg("t")).config["configurable"]["checkpoint_id"]
        assert latest == stored[0]["configurable"]["checkpoint_id"]
        assert len(list(one.list(cfg("t")))) == len(list(two.list(cfg("t"))))


def test_writes_racing_their_put_are_stored_exactly_once(file_saver: ZODBSaver) -> None:
    # Whatever the interleaving, every write ends up stored with its checkpoint, once.
    for i in range(30):
        checkpoint, config = _checkpoint_and_config("race")
        parent = file_saver.get_tuple(cfg("race"))
        _race(
            partial(
                file_saver.put,
                parent.config if parent else cfg("race", checkpoint_ns=""),
                checkpoint,
                {"step": i},
                {"x": "1"},
            ),
            partial(file_saver.put_writes, config, [("ch", "t0")], "t0"),
            partial(file_saver.put_writes, config, [("ch", "t1")], "t1"),
        )
        assert sorted(w[2] for w in file_saver.get_tuple(config).pending_writes) == ["t0", "t1"]
    assert file_saver._parking.parked() == 0


def test_unknown_prune_strategy_and_bad_keep(saver: ZODBSaver) -> None:
    from store.checkpoint.saver import CheckpointError

    with pytest.raises(CheckpointError, match="strategy"):
        saver.prune(["x"], strategy="everything")
    with pytest.raises(CheckpointError, match="keep"):
        saver.trim(None, keep=0)


def test_reads_see_other_writers_without_a_transaction_of_their_own(file_uri: str) -> None:
    from transaction.interfaces import NoTransaction

    with open_laid_out(file_uri) as image, ZODBSaver(image) as reader:
        graph = chain_graph(reader)
        graph.invoke({"n": 0, "log": []}, cfg("t"))
        assert reader.get_tuple(cfg("t")).checkpoint["channel_values"]["n"] == 3  # now cached
        with ZODBSaver(image) as writer:  # another pool: its own connections
            chain_graph(writer).invoke({"n": 10, "log": []}, cfg("t"))
        assert reader.get_tuple(cfg("t")).checkpoint["channel_values"]["n"] == 13
        before = written(reader)
        with pytest.raises(NoTransaction), reader._reading() as tree:
            tree.threads["t"].created = 0.0  # a read that tried to change the image
        assert written(reader) == before


def _forged_value(marker: Path) -> Any:
    """A value the serializer writes as a call of ``builtins.open(file=marker, mode='w')``:
    what a checkpoint written by someone else can hold."""
    import dataclasses

    cls = dataclasses.make_dataclass("open", [("file", str), ("mode", str)])
    cls.__module__ = "builtins"
    return cls(str(marker), "w")


def test_a_checkpoint_value_that_names_code_decodes_as_data(lasting_saver, tmp_path) -> None:
    marker = tmp_path / "marker"
    checkpoint, config = _checkpoint_and_config("forged")
    checkpoint["channel_values"]["x"] = _forged_value(marker)
    lasting_saver.put(cfg("forged", checkpoint_ns=""), checkpoint, {}, {"x": "1"})
    lasting_saver.put_writes(config, [("ch", _forged_value(marker))], "task-1")
    with ZODBSaver(lasting_saver.image) as reader:  # nothing cached: decoded from the image
        stored = reader.get_tuple(config)
    assert not marker.exists()
    assert stored.checkpoint["channel_values"]["x"] == {"file": str(marker), "mode": "w"}
    assert stored.pending_writes == [("task-1", "ch", {"file": str(marker), "mode": "w"})]
