"""Load through the LangGraph server: concurrent mind runs, image on ZEO and on PostgreSQL.

For each backend one ``batos serve --jobs 16`` serves the mind graph on a scripted fast model
(``bench/load/scripted_mind.py``: the model comes through the backend registry, the router
and embedder are the tests' fakes), over an image on a real ZEO server or on PostgreSQL
through RelStorage (a throw-away cluster). ``langgraph_sdk`` clients, each on its own thread,
send one request after another for ``--seconds``, with 1, 4 and 16 clients in turn. Reported
side by side: cycles per second, p50/p95 latency of a run, transaction retries (write
conflicts, counted in the server), and lost updates: every cycle a client saw COMPLETE must
be in the image, and the persona's cycle counter, the memory entries and the cycle records
must agree (each cycle applied exactly once).

Usage: python bench/load.py [--seconds 60] [--clients 1,4,16] [--backends zeo,postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from store.core import layout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

RESULTS = Path(__file__).resolve().parent / "results"
CONFIG = Path(__file__).resolve().parent / "load" / "langgraph.json"
REQUEST = "plan the steps to build a shed"
#: Runs one server executes at once: as many as the most clients measured.
JOBS = 16
SERVER_START_TIMEOUT = 240.0


@dataclass
class Step:
    """One measurement: ``clients`` clients for ``seconds`` on one backend."""

    backend: str
    clients: int
    seconds: float
    cycles: int = 0
    failed: int = 0
    retries: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.cycles / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        if len(self.latencies) == 1:
            return self.latencies[0]
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[int(q) - 1]


@dataclass
class BackendRun:
    backend: str
    steps: list[Step] = field(default_factory=list)
    acknowledged: int = 0  # cycles clients saw COMPLETE, warm-up included
    lost: int = 0  # acknowledged but not in the image
    disagreements: list[str] = field(default_factory=list)  # counters vs records vs memory


# -- the image's backends -------------------------------------------------------------------


@contextmanager
def zeo_image(workdir: Path) -> Iterator[str]:
    from store.core.zeo import ZeoServer

    with ZeoServer(workdir / "zeo" / "live_image.fs") as server:
        yield server.uri


@contextmanager
def postgres_image(workdir: Path) -> Iterator[str]:
    from pgcluster import PostgresCluster

    with PostgresCluster() as cluster:
        yield cluster.uri()


BACKENDS = {"zeo": zeo_image, "postgres": postgres_image}
LABELS = {"zeo": "ZEO", "postgres": "PostgreSQL"}


# -- the server -----------------------------------------------------------------------------


@contextmanager
def serve(uri: str, workdir: Path, jobs: int = JOBS) -> Iterator[tuple[str, Path]]:
    """``batos serve`` over ``uri``; yields its base URL and the file its retries go to."""

    from store.core.zeo import free_port

    port = free_port()
    retries = workdir / f"retries-{port}.log"
    retries.touch()
    log_path = workdir / f"server-{port}.log"
    env = {
        **os.environ,
        "BATOS_LOAD_RETRIES": str(retries),
        "LANGSMITH_TRACING": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    }
    command = [
        sys.executable,
        "-m",
        "batos.shell.cli",
        "--image",
        uri,
        "serve",
        "--config",
        str(CONFIG),
        "--port",
        str(port),
        "--jobs",
        str(jobs),
    ]
    from servers import serving

    with serving(
        command,
        port=port,
        cwd=ROOT,
        env=env,
        log_path=log_path,
        timeout=SERVER_START_TIMEOUT,
    ) as base:
        yield base, retries


# -- the clients ----------------------------------------------------------------------------


async def _client(base: str, deadline: float, step: Step, seen: list[str]) -> None:
    from langgraph_sdk import get_client

    client = get_client(url=base, timeout=120)
    thread = (await client.threads.create())["thread_id"]
    while True:  # at least one run each, so a warm-up of zero seconds runs once
        started = time.perf_counter()
        out = await client.runs.wait(
            thread, "mind", input={"messages": [{"role": "user", "content": REQUEST}]}
        )
        elapsed = time.perf_counter() - started
        if isinstance(out, dict) and out.get("status") == "COMPLETE":
            step.cycles += 1
            step.latencies.append(elapsed)
            seen.append(out["cycle"]["id"])
        else:
            step.failed += 1
        if time.monotonic() >= deadline:
            return


async def _drive(base: str, clients: int, seconds: float, step: Step, seen: list[str]) -> None:
    deadline = time.monotonic() + seconds
    await asyncio.gather(*(_client(base, deadline, step, seen) for _ in range(clients)))


def measure(
    base: str, retries: Path, backend: str, clients: int, seconds: float, seen: list[str]
) -> Step:
    before = len(retries.read_text().splitlines())
    step = Step(backend, clients, seconds)
    started = time.monotonic()
    asyncio.run(_drive(base, clients, seconds, step, seen))
    step.seconds = time.monotonic() - started  # the last runs end after the deadline
    step.retries = len(retries.read_text().splitlines()) - before
    return step


def check(uri: str, seen: list[str], run: BackendRun) -> None:
    """Every acknowledged cycle in the image, and each applied exactly once."""
    from prototypes.incarnation import personas
    from store.core.image import LivingImage

    with LivingImage.open(uri) as image, image.read() as root:
        records = set((root.get(layout.CYCLES) or {}).keys())
        memory = root.get(layout.MEMORY)
        exchanges = memory.get(("mind", "exchanges")) if memory is not None else None
        remembered = set(exchanges.keys()) if exchanges is not None else set()
        counted = int(personas(root)["BRICK"].stats.get("cycles", 0))
    run.acknowledged = len(seen)
    run.lost = len(set(seen) - records)
    if not (counted == len(records) and remembered == records):
        run.disagreements.append(
            f"{len(records)} cycle records, {len(remembered)} remembered, BRICK counted {counted}"
        )


def run_backend(
    backend: str, clients: list[int], seconds: float, workdir: Path, uri: str | None = None
) -> BackendRun:
    """Measure ``backend`` with each client count; on ``uri`` if given, else on a new image."""
    from batos.shell.runtime import open_image
    from store.checkpoint.saver import ZODBSaver

    run = BackendRun(backend)
    given = contextlib.nullcontext(uri) if uri is not None else None
    with given or BACKENDS[backend](workdir) as uri:
        with open_image(uri, create=True) as image, ZODBSaver(image):
            pass  # incarnated and laid out once, before the server's first run
        seen: list[str] = []
        with serve(uri, workdir) as (base, retries):
            warm = Step(backend, 1, 0)
            asyncio.run(_drive(base, 1, 0.0, warm, seen))  # one run: imports, first layouts
            for count in clients:
                run.steps.append(measure(base, retries, backend, count, seconds, seen))
        check(uri, seen, run)
    return run


# -- the report -----------------------------------------------------------------------------


def table(runs: list[BackendRun]) -> str:
    header = f"{'clients':>7} |" + "|".join(
        f" {LABELS[r.backend]:<10} {'cycles/s':>8} {'p50 s':>6} {'p95 s':>6} {'retries':>7} "
        for r in runs
    )
    lines = [header, "-" * len(header)]
    counts = sorted({s.clients for r in runs for s in r.steps})
    for count in counts:
        cells = []
        for r in runs:
            step = next((s for s in r.steps if s.clients == count), None)
            if step is None:
                cells.append(" " * 44)
                continue
            cells.append(
                f" {'':<10} {step.rate:>8.2f} {step.percentile(50):>6.2f} "
                f"{step.percentile(95):>6.2f} {step.retries:>7} "
            )
        lines.append(f"{count:>7} |" + "|".join(cells))
    if len(runs) == 2:
        for count in counts:
            a, b = (next((s for s in r.steps if s.clients == count), None) for r in runs)
            if a and b and a.rate:
                lines.append(
                    f"{count} clients: {LABELS[runs[1].backend]} / {LABELS[runs[0].backend]} "
                    f"throughput = {b.rate / a.rate:.2f}x"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per client count")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--backends", default="zeo,postgres")
    parser.add_argument("--keep", action="store_true", help="keep the servers' logs")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    backends = args.backends.split(",")
    runs = []
    tmp = tempfile.mkdtemp(prefix="batos-load-")
    try:
        os.environ.setdefault("BATOS_HOME", str(Path(tmp) / "home"))
        for backend in backends:
            workdir = Path(tmp) / backend
            workdir.mkdir()
            runs.append(run_backend(backend, clients, args.seconds, workdir))
    finally:
        if args.keep:
            print(f"logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(table(runs))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "load.json").write_text(
        json.dumps(
            [
                {
                    **asdict(r),
                    "steps": [
                        {
                            **asdict(s),
                            "latencies": None,
                            "cycles_per_s": s.rate,
                            "p50": s.percentile(50),
                            "p95": s.percentile(95),
                        }
                        for s in r.steps
                    ],
                }
                for r in runs
            ],
            indent=2,
        )
    )
    for r in runs:
        for problem in r.disagreements:
            print(f"  {LABELS[r.backend]}: {problem}")
    print(
        "; ".join(
            f"{LABELS[r.backend]}: acknowledged={r.acknowledged} lost={r.lost} "
            f"retries={sum(s.retries for s in r.steps)} failed={sum(s.failed for s in r.steps)}"
            for r in runs
        )
    )


if __name__ == "__main__":
    main()
