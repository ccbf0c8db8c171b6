"""ZODBSaver against SqliteSaver / AsyncSqliteSaver (file, WAL) and InMemorySaver.

Same workloads for each, every on-disk saver durable: FileStorage fsyncs the image on every
commit, SQLite runs in WAL mode with synchronous=FULL, which syncs the WAL on every commit.
Workloads, sync and async: put + put_writes + get_tuple cycles, listing every checkpoint of a
thread of N, and whole runs of a 10-node graph. In each round every workload runs in short
slices, the savers taking turns slice by slice (first saver rotating per round), so that all
of them see the same drift of the disk's sync latency. The table shows the median of the rounds and
ratios to the SQLite saver and, for graph runs, to InMemorySaver; JSON goes to bench/results/.
Where a sync costs milliseconds it dominates every durable saver; where it is cheap (tmpfs) the
savers' CPU shows. So the files go in ``--dir`` (default: the system's temporary folder), and the
median latency of a 4 KiB write + fsync there is measured before and after the run and printed
beside the figures, with the load average. The CPU each saver spent per operation (process time,
its threads included) is printed too, and beside it the floor under ZODBSaver's: the CPU of a
bare ZODB commit that changes one small object, on a FileStorage in the same folder (a cycle
commits twice: its put and its put_writes), and one commit of one small record made by
FileStorage's own two-phase commit called directly and by SQLite writing one row, to show how
much of a commit is ZODB's Python above the storage and how much the storage's own.

    python bench/checkpointer.py                     # full sizes, 5 rounds, on the temp disk
    python bench/checkpointer.py --dir /dev/shm      # where a sync costs next to nothing
    python bench/checkpointer.py --quick             # small sizes, for a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from persistent.mapping import PersistentMapping

from store.checkpoint.saver import ZODBSaver
from store.core.image import LivingImage

RESULTS = Path(__file__).resolve().parent / "results"
ROUNDS = 5


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


class Cycles:
    """put + put_writes + get_tuple cycles on one thread, one cycle per ``step``."""

    def __init__(self, saver: BaseCheckpointSaver, thread: str) -> None:
        self.saver = saver
        self.config: dict = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        self.previous: dict | None = None
        self.i = 0

    def step(self) -> None:
        cp, metadata, new = checkpoint(self.saver, self.i, self.previous)
        self.config = self.saver.put(self.config, cp, metadata, new)
        self.saver.put_writes(self.config, self.writes(), f"task-{self.i}")
        assert self.saver.get_tuple(self.config) is not None
        self.previous, self.i = cp, self.i + 1

    async def astep(self) -> None:
        cp, metadata, new = checkpoint(self.saver, self.i, self.previous)
        self.config = await self.saver.aput(self.config, cp, metadata, new)
        await self.saver.aput_writes(self.config, self.writes(), f"task-{self.i}")
        assert await self.saver.aget_tuple(self.config) is not None
        self.previous, self.i = cp, self.i + 1

    def writes(self) -> list[tuple[str, Any]]:
        return [("messages", f"write {self.i}"), ("counter", self.i)]


def sqlite_conn(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


#: Operations per slice. Each round a workload runs in slices of this many operations, the
#: savers taking turns slice by slice: a disk's sync latency can drift within seconds (on a
#: shared virtual disk, between 0.1 and 4 ms), and every saver should see the same drift.
SLICE = {"cycle": 10, "list": 1, "graph": 4}
SYNC_WORKLOADS = ("cycle ops/s", "list ops/s", "graph runs/s")
ASYNC_WORKLOADS = ("async cycle ops/s", "async list ops/s", "async graph runs/s")


class Bench:
    """The savers under test, each holding a thread of ``sizes['list']`` checkpoints to list."""

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
            listed = Cycles(saver, "listed")
            for _ in range(self.sizes["list"]):
                listed.step()
        alisted = Cycles(asqlite, "listed")
        for _ in range(self.sizes["list"]):
            await alisted.astep()

    async def close(self) -> None:
        await self.astack.aclose()
        self.stack.close()

    def workload(
        self, name: str, saver: BaseCheckpointSaver, round_: int
    ) -> tuple[int, Callable[[], Any]]:
        """(operations in the round, one operation) of workload ``name`` on ``saver``."""
        n, listed = self.sizes, {"configurable": {"thread_id": "listed"}}
        if "cycle" in name:
            cycles = Cycles(saver, f"cycles-{round_}")
            return n["cycles"], cycles.astep if "async" in name else cycles.step
        if "list" in name:

            async def alisting() -> None:
                assert len([c async for c in saver.alist(listed)]) == n["list"]

            def listing() -> None:
                assert len(list(saver.list(listed))) == n["list"]

            return n["listings"], alisting if "async" in name else listing
        graph, runs = ten_node_graph(saver), iter(range(n["graph"]))

        def config() -> dict:
            return {"configurable": {"thread_id": f"{name}-{round_}-{next(runs)}"}}

        async def arun() -> None:
            await graph.ainvoke({"n": 0, "log": []}, config())

        def run() -> None:
            graph.invoke({"n": 0, "log": []}, config())

        return n["graph"], arun if "async" in name else run


def sync_latency_ms(folder: Path, samples: int = 50) -> float:
    """Median milliseconds of a 4 KiB write followed by fsync of the file, in ``folder``."""
    path = folder / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        block = os.urandom(4096)
        for _ in range(samples):
            start = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1e3


def bare_commit(folder: Path, commits: int = 500) -> tuple[float, float]:
    """(CPU ms, wall ms) of one ZODB commit changing one small object, on a file image in
    ``folder``, as the saver's connections commit (explicit transactions): the least a put
    can cost."""
    import transaction

    manager = transaction.TransactionManager(explicit=True)
    with LivingImage.open(f"file://{folder / 'floor.fs'}") as image:
        conn = image.db.open(transaction_manager=manager)
        try:
            manager.begin()
            conn.root()["floor"] = counter = PersistentMapping(n=0)
            manager.commit()
            cpu, wall = time.process_time(), time.perf_counter()
            for n in range(commits):
                manager.begin()
                counter["n"] = n
                manager.commit()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        finally:
            conn.close()
    return cpu / commits * 1e3, wall / commits * 1e3


def one_commit(folder: Path, commits: int = 500) -> dict[str, float]:
    """CPU ms of one commit of one small record, three ways, in ``folder``: through a ZODB
    connection (as ``bare_commit``), FileStorage's own two-phase commit called directly with a
    record already pickled (no connection, no transaction manager: what is left of a commit
    when ZODB's Python above the storage is gone), and SQLite writing one row (WAL,
    synchronous=FULL, as the SQLite savers here)."""
    import ZODB
    from ZODB.Connection import TransactionMetaData
    from ZODB.FileStorage import FileStorage

    storage = FileStorage(str(folder / "direct.fs"))
    db = ZODB.DB(storage)
    try:
        with db.transaction() as conn:
            conn.root()["record"] = record = PersistentMapping(text="x" * 300)
        oid = record._p_oid
        data, serial = storage.load(oid)
        cpu = time.process_time()
        for _ in range(commits):
            meta = TransactionMetaData()
            storage.tpc_begin(meta)
            storage.store(oid, serial, data, "", meta)
            storage.tpc_vote(meta)
            serial = storage.tpc_finish(meta)
        direct = (time.process_time() - cpu) / commits * 1e3
    finally:
        db.close()
    conn = sqlite_conn(folder / "row.db")
    try:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")
        conn.commit()
        cpu = time.process_time()
        for _ in range(commits):
            conn.execute("INSERT OR REPLACE INTO t VALUES (1, ?)", (data,))
            conn.commit()
        row = (time.process_time() - cpu) / commits * 1e3
    finally:
        conn.close()
    return {"FileStorage called directly": direct, "SQLite one row": row}


def load() -> str:
    return "load average " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def measure(
    sizes: dict[str, int], rounds: int, where: Path | None
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[float]]], dict[str, list]]:
    """({saver: {workload: [ops/s of each round]}}, the same in CPU ms per operation,
    {"sync_ms": [before, after], "bare_commit": [(cpu ms, wall ms) before, after]})."""
    samples: dict[str, dict[str, list[float]]] = {}
    cpu_samples: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        sync_ms = [sync_latency_ms(Path(tmp))]
        floor = [bare_commit(Path(tmp))]
        bench = Bench(Path(tmp), sizes)
        await bench.open()
        try:
            for round_ in range(rounds):
                for workload in SYNC_WORKLOADS + ASYNC_WORKLOADS:
                    is_async = workload.startswith("async")
                    savers = bench.asynchronous if is_async else bench.sync
                    names = list(savers)
                    names = names[round_ % len(names) :] + names[: round_ % len(names)]
                    jobs = {name: bench.workload(workload, savers[name], round_) for name in names}
                    size = next(v for k, v in SLICE.items() if k in workload)
                    ops = next(iter(jobs.values()))[0]
                    spent = dict.fromkeys(names, 0.0)
                    cpu = dict.fromkeys(names, 0.0)
                    for _ in range(ops // size):
                        for name in names:
                            op = jobs[name][1]
                            start, start_cpu = time.perf_counter(), time.process_time()
                            for _ in range(size):
                                if is_async:
                                    await op()
                                else:
                                    op()
                            spent[name] += time.perf_counter() - start
                            cpu[name] += time.process_time() - start_cpu
                    for name in names:
                        done = ops // size * size
                        samples.setdefault(name, {}).setdefault(workload, []).append(
                            done / spent[name]
                        )
                        cpu_samples.setdefault(name, {}).setdefault(workload, []).append(
                            cpu[name] / done * 1e3
                        )
                print(f"round {round_ + 1}/{rounds} done ({load()})", file=sys.stderr)
        finally:
            await bench.close()
        sync_ms.append(sync_latency_ms(Path(tmp)))
        floor.append(bare_commit(Path(tmp)))
        commits = one_commit(Path(tmp))
    return samples, cpu_samples, {"sync_ms": sync_ms, "bare_commit": floor, "commits": commits}


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


def cpu_table(
    cpu: dict[str, dict[str, float]], floor: list[list[float]], commits: dict[str, float]
) -> str:
    """CPU per operation of each saver, ZODBSaver's over the SQLite saver's, and the floor."""
    metrics = [m for m in SYNC_WORKLOADS + ASYNC_WORKLOADS if any(m in r for r in cpu.values())]
    names = [m.replace("ops/s", "").replace("runs/s", "run").strip() for m in metrics]
    lines = [f"{'CPU ms per op':<18}" + "".join(f"{n:>20}" for n in names)]
    for name, row in cpu.items():
        cells = (f"{row[m]:>20.3f}" if m in row else f"{'-':>20}" for m in metrics)
        lines.append(f"{name:<18}" + "".join(cells))
    lines.append("")
    zodb = cpu["ZODBSaver"]
    for metric, baseline in (
        *((m, "SqliteSaver") for m in SYNC_WORKLOADS),
        *((m, "AsyncSqliteSaver") for m in ASYNC_WORKLOADS),
    ):
        ratio = zodb[metric] / cpu[baseline][metric]
        lines.append(f"ZODBSaver CPU / {baseline:<17} {metric:<19} {ratio:6.2f}x")
    (cpu_before, wall_before), (cpu_after, wall_after) = floor
    commit = (cpu_before + cpu_after) / 2
    lines.append(
        f"floor: a bare ZODB commit of one small object costs {cpu_before:.3f} ms CPU "
        f"({wall_before:.3f} ms wall) before the run, {cpu_after:.3f} ({wall_after:.3f}) after; "
        f"a cycle commits twice (put, put_writes): {2 * commit:.3f} ms CPU against "
        f"SqliteSaver's whole cycle, {cpu['SqliteSaver']['cycle ops/s']:.3f} ms"
    )
    lines.append(
        f"one commit of one small record, CPU: through a ZODB connection {cpu_after:.3f} ms, "
        + ", ".join(f"{name} {ms:.3f} ms" for name, ms in commits.items())
        + f" (ZODB connection / SQLite {cpu_after / commits['SQLite one row']:.1f}x, "
        f"FileStorage direct / SQLite "
        f"{commits['FileStorage called directly'] / commits['SQLite one row']:.1f}x)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds; medians are shown")
    parser.add_argument(
        "--dir", type=Path, help="folder for the databases (default: the system's temp folder)"
    )
    args = parser.parse_args()
    sizes = (
        {"cycles": 50, "list": 200, "listings": 10, "graph": 20}
        if args.quick
        else {"cycles": 500, "list": 1000, "listings": 20, "graph": 200}
    )
    where = args.dir.resolve() if args.dir else Path(tempfile.gettempdir())
    before = load()
    samples, cpu_samples, disk = asyncio.run(measure(sizes, args.rounds, args.dir))
    results, cpu = medians(samples), medians(cpu_samples)
    sync_ms = disk["sync_ms"]
    print(f"sizes: {sizes}, rounds: {args.rounds}")
    print(
        f"databases in {where}: 4 KiB write + fsync {sync_ms[0]:.3f} ms before the run, "
        f"{sync_ms[1]:.3f} ms after (median of 50); {before} at the start, {load()} at the end"
    )
    print(table(results))
    print()
    print(cpu_table(cpu, disk["bare_commit"], disk["commits"]))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "checkpointer.json"
    out.write_text(
        json.dumps(
            {
                "sizes": sizes,
                "rounds": args.rounds,
                "dir": str(where),
                "sync_ms": sync_ms,
                "bare_commit_ms": disk["bare_commit"],
                "one_commit_cpu_ms": disk["commits"],
                "load": [before, load()],
                "medians": results,
                "cpu_ms_medians": cpu,
                "samples": samples,
                "cpu_ms_samples": cpu_samples,
            },
            indent=2,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
