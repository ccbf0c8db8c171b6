"""ZODBSaver against SqliteSaver / AsyncSqliteSaver (file, WAL) and InMemorySaver.

Same workloads for each, every on-disk saver durable (FileStorage fsyncs each commit; SQLite
runs with synchronous=FULL): put + put_writes + get_tuple cycles (sync and async), list of
N checkpoints of one thread, and whole runs of a 10-node graph. Prints ops/s and the ratio to
the SQLite saver (and, for graph runs, to InMemorySaver); writes JSON to bench/results/.

    python bench/checkpointer.py            # full sizes
    python bench/checkpointer.py --quick    # small sizes, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from store.checkpointer import ZODBSaver  # noqa: E402
from store.image import LivingImage  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


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
    from langgraph.checkpoint.base import empty_checkpoint

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


def timed(fn: Callable[[], Any], ops: int) -> float:
    start = time.perf_counter()
    fn()
    return ops / (time.perf_counter() - start)


def sqlite_conn(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def run(sizes: dict[str, int]) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        folder = Path(tmp)
        image = stack.enter_context(LivingImage.open(f"file://{folder / 'image.fs'}"))
        savers: dict[str, BaseCheckpointSaver] = {
            "ZODBSaver": stack.enter_context(ZODBSaver(image)),
            "SqliteSaver": SqliteSaver(sqlite_conn(folder / "sync.db")),
            "InMemorySaver": InMemorySaver(),
        }
        for name, saver in savers.items():
            row = results.setdefault(name, {})
            n = sizes["cycles"]
            row["cycle ops/s"] = timed(lambda s=saver, n=n: cycles(s, n, "cycles"), n)
            m = sizes["list"]
            cycles(saver, m, "listed")
            row["list ops/s"] = timed(
                lambda s=saver: [
                    len(list(s.list({"configurable": {"thread_id": "listed"}})))
                    for _ in range(3)
                ],
                3,
            )
            graph = ten_node_graph(saver)
            g = sizes["graph"]
            row["graph runs/s"] = timed(
                lambda gr=graph, g=g: [
                    gr.invoke({"n": 0, "log": []}, {"configurable": {"thread_id": f"g{k}"}})
                    for k in range(g)
                ],
                g,
            )
        results["AsyncSqliteSaver"] = {}
        results["InMemorySaver"]["async cycle ops/s"] = asyncio.run(
            _async_cycles(InMemorySaver(), sizes["cycles"])
        )
        results["ZODBSaver"]["async cycle ops/s"] = asyncio.run(
            _async_cycles(savers["ZODBSaver"], sizes["cycles"])
        )
        results["AsyncSqliteSaver"] = asyncio.run(_async_sqlite(folder / "async.db", sizes))
    return results


async def _async_cycles(saver: BaseCheckpointSaver, n: int) -> float:
    start = time.perf_counter()
    await acycles(saver, n, "async-cycles")
    return n / (time.perf_counter() - start)


async def _async_sqlite(path: Path, sizes: dict[str, int]) -> dict[str, float]:
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.conn.execute("PRAGMA journal_mode=WAL")
        await saver.conn.execute("PRAGMA synchronous=FULL")
        row = {"async cycle ops/s": await _async_cycles(saver, sizes["cycles"])}
        graph = ten_node_graph(saver)
        start = time.perf_counter()
        for k in range(sizes["graph"]):
            await graph.ainvoke({"n": 0, "log": []}, {"configurable": {"thread_id": f"g{k}"}})
        row["async graph runs/s"] = sizes["graph"] / (time.perf_counter() - start)
    return row


def table(results: dict[str, dict[str, float]]) -> str:
    metrics = sorted({m for row in results.values() for m in row})
    lines = [f"{'saver':<18}" + "".join(f"{m:>22}" for m in metrics)]
    for name, row in results.items():
        cells = (f"{row[m]:>22.1f}" if m in row else f"{'-':>22}" for m in metrics)
        lines.append(f"{name:<18}" + "".join(cells))
    zodb = results["ZODBSaver"]
    lines.append("")
    for metric, baseline in (
        ("cycle ops/s", "SqliteSaver"),
        ("list ops/s", "SqliteSaver"),
        ("graph runs/s", "SqliteSaver"),
        ("async cycle ops/s", "AsyncSqliteSaver"),
        ("graph runs/s", "InMemorySaver"),
    ):
        ratio = zodb[metric] / results[baseline][metric]
        lines.append(f"ZODBSaver / {baseline:<17} {metric:<18} {ratio:6.2f}x")
    lines.append(
        f"InMemorySaver graph run time / ZODBSaver's: "
        f"{results['InMemorySaver']['graph runs/s'] / zodb['graph runs/s']:.2f}x slower "
        "(target ≤ 1.2x)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    args = parser.parse_args()
    sizes = (
        {"cycles": 50, "list": 200, "graph": 20}
        if args.quick
        else {"cycles": 500, "list": 1000, "graph": 200}
    )
    results = run(sizes)
    print(f"sizes: {sizes}")
    print(table(results))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "checkpointer.json"
    out.write_text(json.dumps({"sizes": sizes, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
