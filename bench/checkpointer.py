"""ZODBSaver against SqliteSaver / AsyncSqliteSaver (file, WAL) and InMemorySaver.

Same workloads for each, every on-disk saver durable: FileStorage fsyncs the image on every
commit, SQLite runs in WAL mode with synchronous=FULL, which syncs the WAL on every commit.
Workloads, sync and async: put + put_writes + get_tuple cycles, listing every checkpoint of a
thread of N, and whole runs of a 10-node graph. Each round runs every workload on every saver
(in a rotating order, so no saver always goes first); the table shows the median of the rounds,
the ratio to the SQLite saver and, for graph runs, to InMemorySaver. JSON goes to bench/results/.

    python bench/checkpointer.py            # full sizes, 3 rounds
    python bench/checkpointer.py --quick    # small sizes, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from store.checkpointer import ZODBSaver  # noqa: E402
from store.image import LivingImage  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ROUNDS = 3


class State(TypedDict):
    n: int
    log: Annotated[list, operator.add]


def ten_node_graph(saver: BaseCheckpointSaver) -> Any:
    builder = StateGraph(State)
    previous = START
    for i in range(10):
        builder.add_node(f"n{i}", lambda s, i=i: {"n": s["n"] + 1, "log": [f"step {i}"]})
        builder.add_edge(previous, f"n{i}")
        previous = f"n{i}"
    builder.add_edge(previous, END)
    return builder.compile(checkpointer=saver)


def checkpoint(saver: BaseCheckpointSaver, i: int, previous: dict | None) -> tuple:
    cp = empty_checkpoint()
    versions = dict(previous["channel_versions"]) if previous else {}
    versions["messages"] = saver.get_next_version(versions.get("messages"), None)
    versions["counter"] = saver.get_next_version(versions.get("counter"), None)
    cp["channel_versions"] = versions
    cp["channel_values"] = {"messages": [f"message {j}" * 5 for j in range(i % 20)], "counter": i}
    cp["versions_seen"] = {"node": dict(versions)}
    new = {"messages": versions["messages"], "counter": versions["counter"]}
    return cp, {"source": "loop", "step": i, "parents": {}}, new


def cycles(saver: BaseCheckpointSaver, n: int, thread: str) -> None:
    config: dict = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    previous = None
    for i in range(n):
        cp, metadata, new = checkpoint(saver, i, previous)
        config = saver.put(config, cp, metadata, new)
        saver.put_writes(config, [("messages", f"write {i}"), ("counter", i)], f"task-{i}")
        assert saver.get_tuple(config) is not None
        previous = cp


async def acycles(saver: BaseCheckpointSaver, n: int, thread: str) -> None:
    config: dict = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    previous = None
    for i in range(n):
        cp, metadata, new = checkpoint(saver, i, previous)
        config = await saver.aput(config, cp, metadata, new)
        await saver.aput_writes(config, [("messages", f"write {i}"), ("counter", i)], f"t{i}")
        assert await saver.aget_tuple(config) is not None
        previous = cp


def sqlite_conn(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def rate(ops: int, fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return ops / (time.perf_counter() - start)


async def arate(ops: int, fn: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await fn()
    return ops / (time.perf_counter() - start)


class Bench:
    """The savers under test, each holding a 1,000-checkpoint thread to list."""

    def __init__(self, folder: Path, sizes: dict[str, int]) -> None:
        self.folder = folder
        self.sizes = sizes
        self.stack = ExitStack()
        self.astack = AsyncExitStack()
        self.sync: dict[str, BaseCheckpointSaver] = {}
        self.asynchronous: dict[str, BaseCheckpointSaver] = {}

    async def open(self) -> None:
        image = self.stack.enter_context(LivingImage.open(f"file://{self.folder / 'image.fs'}"))
        zodb = self.stack.enter_context(ZODBSaver(image))
        memory = InMemorySaver()
        self.sync = {
            "ZODBSaver": zodb,
            "SqliteSaver": SqliteSaver(sqlite_conn(self.folder / "sync.db")),
            "InMemorySaver": memory,
        }
        asqlite = await self.astack.enter_async_context(
            AsyncSqliteSaver.from_conn_string(str(self.folder / "async.db"))
        )
        await asqlite.conn.execute("PRAGMA journal_mode=WAL")
        await asqlite.conn.execute("PRAGMA synchronous=FULL")
        self.asynchronous = {
            "ZODBSaver": zodb,
            "AsyncSqliteSaver": asqlite,
            "InMemorySaver": memory,
        }
        for saver in self.sync.values():
            cycles(saver, self.sizes["list"], "listed")
        await acycles(asqlite, self.sizes["list"], "listed")

    async def close(self) -> None:
        await self.astack.aclose()
        self.stack.close()

    def run_sync(self, name: str, workload: str, round_: int) -> float:
        saver, n = self.sync[name], self.sizes
        if workload == "cycle ops/s":
            return rate(n["cycles"], lambda: cycles(saver, n["cycles"], f"cycles-{round_}"))
        if workload == "list ops/s":
            config = {"configurable": {"thread_id": "listed"}}
            return rate(3, lambda: [len(list(saver.list(config))) for _ in range(3)])
        graph = ten_node_graph(saver)
        return rate(
            n["graph"],
            lambda: [
                graph.invoke({"n": 0, "log": []}, {"configurable": {"thread_id": f"g{round_}-{k}"}})
                for k in range(n["graph"])
            ],
        )

    async def run_async(self, name: str, workload: str, round_: int) -> float:
        saver, n = self.asynchronous[name], self.sizes
        if workload == "async cycle ops/s":
            return await arate(
                n["cycles"], lambda: acycles(saver, n["cycles"], f"acycles-{round_}")
            )
        if workload == "async list ops/s":
            config = {"configurable": {"thread_id": "listed"}}

            async def listing() -> None:
                for _ in range(3):
                    assert len([c async for c in saver.alist(config)]) == n["list"]

            return await arate(3, listing)
        graph = ten_node_graph(saver)

        async def runs() -> None:
            for k in range(n["graph"]):
                config = {"configurable": {"thread_id": f"ag{round_}-{k}"}}
                await graph.ainvoke({"n": 0, "log": []}, config)

        return await arate(n["graph"], runs)


SYNC_WORKLOADS = ("cycle ops/s", "list ops/s", "graph runs/s")
ASYNC_WORKLOADS = ("async cycle ops/s", "async list ops/s", "async graph runs/s")


async def measure(sizes: dict[str, int], rounds: int) -> dict[str, dict[str, list[float]]]:
    samples: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(Path(tmp), sizes)
        await bench.open()
        try:
            for round_ in range(rounds):
                for workload in SYNC_WORKLOADS + ASYNC_WORKLOADS:
                    names = list(bench.asynchronous if workload.startswith("async") else bench.sync)
                    shift = round_ % len(names)
                    for name in names[shift:] + names[:shift]:
                        if workload.startswith("async"):
                            value = await bench.run_async(name, workload, round_)
                        else:
                            value = bench.run_sync(name, workload, round_)
                        samples.setdefault(name, {}).setdefault(workload, []).append(value)
                print(f"round {round_ + 1}/{rounds} done", file=sys.stderr)
        finally:
            await bench.close()
    return samples


def medians(samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    return {
        name: {metric: statistics.median(values) for metric, values in row.items()}
        for name, row in samples.items()
    }


def table(results: dict[str, dict[str, float]]) -> str:
    metrics = [m for m in SYNC_WORKLOADS + ASYNC_WORKLOADS if any(m in r for r in results.values())]
    lines = [f"{'saver (median)':<18}" + "".join(f"{m:>20}" for m in metrics)]
    for name, row in results.items():
        cells = (f"{row[m]:>20.1f}" if m in row else f"{'-':>20}" for m in metrics)
        lines.append(f"{name:<18}" + "".join(cells))
    zodb = results["ZODBSaver"]
    lines.append("")
    for metric, baseline in (
        *((m, "SqliteSaver") for m in SYNC_WORKLOADS),
        *((m, "AsyncSqliteSaver") for m in ASYNC_WORKLOADS),
        ("graph runs/s", "InMemorySaver"),
        ("async graph runs/s", "InMemorySaver"),
    ):
        ratio = zodb[metric] / results[baseline][metric]
        lines.append(f"ZODBSaver / {baseline:<17} {metric:<19} {ratio:6.2f}x")
    lines.append(
        "ZODBSaver graph run time / InMemorySaver's: "
        f"{results['InMemorySaver']['graph runs/s'] / zodb['graph runs/s']:.2f}x "
        "(target ≤ 1.2x)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds; medians are shown")
    args = parser.parse_args()
    sizes = (
        {"cycles": 50, "list": 200, "graph": 20}
        if args.quick
        else {"cycles": 500, "list": 1000, "graph": 200}
    )
    samples = asyncio.run(measure(sizes, args.rounds))
    results = medians(samples)
    print(f"sizes: {sizes}, rounds: {args.rounds}")
    print(table(results))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "checkpointer.json"
    out.write_text(
        json.dumps(
            {"sizes": sizes, "rounds": args.rounds, "medians": results, "samples": samples},
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
