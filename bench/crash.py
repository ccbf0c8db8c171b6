"""Crash harness: SIGKILL a process at random points while it thinks, then check the image.

A worker process (forked from this one, so it starts in milliseconds) opens a FileStorage
image and loops: mind cycles on a scripted fast model (``tests/fakes.py``), document
ingests, and JIT installs of methods the scripted model writes. It first resumes every mind
thread a previous worker left mid-cycle. After each operation returns — committed — it
appends an acknowledgement to a journal and fsyncs it. This process kills it with SIGKILL
after a random delay, and then:

* reopens the image (a commit cut short is dropped, as FileStorage does) and runs ZODB's own
  checks: ``fstest`` (the file's structure) and ``fsrefs`` (no reference to a missing object);
* **lost**: an acknowledged cycle, document or method that is not in the image;
* **partial**: a cycle whose record, memory entry and persona counter disagree (a cycle
  applied twice, or half), a document whose chunks are not all there, a method without its
  source — anything a transaction boundary should have made impossible.

Every worker resumes the threads the last one left, so a resumed graph must apply its
changes exactly once for the counters to agree. The last line reads
``points=N lost=L partial=P``. Usage: python bench/crash.py [--points 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from store.core import layout

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from fakes import FakeEmbedder, FakeModels, FakeRouter, ScriptedChatModel, call_kind  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PLAN = json.dumps({"steps": [{"facet": "BRICK.facet_steps", "query": "which steps"}]})
FACET = (
    "```python\ndef facet_steps(self, query):\n    return {'instruction': 'Steps: ' + query}\n```"
)
#: The object the worker's JIT installs land on.
CALC = "crash_calc"
WORDS = "shed timber roof nail saw level plank door window hinge paint brush ladder".split()


class WordEmbedder(FakeEmbedder):
    """``FakeEmbedder``'s hashed bag of words, with the per-span sums ingestion asks for.

    The harness tests transactions, not retrieval: a model would only slow each worker's start.
    """

    encoder = "crash-bag-of-words"
    max_tokens = 256

    def token_starts(self, text: str) -> np.ndarray:
        return np.array([w.start() for w in re.finditer(r"\S+", text)], dtype=np.int64)

    def count_tokens_batch(self, texts: Any) -> list[int]:
        return [self.count_tokens(t) for t in texts]

    def encode_units(self, texts: Any, units: Any) -> tuple[Any, list[Any], list[Any]]:
        from store.knowledge.embeddings import unit_sums

        sums, counts = [], []
        for text, spans in zip(texts, units, strict=True):
            words = list(re.finditer(r"\S+", text))
            hidden = self.encode([w.group() for w in words]) if words else self.encode([""])[:0]
            starts = np.array([w.start() for w in words], dtype=np.int64)
            total, count = unit_sums(hidden, starts, spans)
            sums.append(total)
            counts.append(count)
        return self.encode(texts), sums, counts


def _respond(call: Any) -> str:
    kind = call_kind(call)
    if kind == "plan":
        return PLAN
    if kind == "draft":
        return FACET
    if kind == "facet":
        return "1. measure 2. cut 3. build"
    return "To build the shed: measure, cut, build."


# -- the worker ---------------------------------------------------------------------------


class Journal:
    """Acknowledgements, one JSON line each, on disk before the next operation starts."""

    def __init__(self, path: Path) -> None:
        self.handle = open(path, "a", encoding="utf-8")

    def ack(self, **entry: Any) -> None:
        self.handle.write(json.dumps(entry) + "\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())


def unfinished_threads(saver: Any) -> list[str]:
    """Threads whose newest checkpoint still has nodes to run: cycles cut short."""
    found = []
    for summary in saver.threads():
        latest = saver.get_tuple({"configurable": {"thread_id": summary.thread_id}})
        status = latest.checkpoint["channel_values"].get("status") if latest else None
        if latest is not None and status not in ("COMPLETE", "FAILED"):
            found.append(summary.thread_id)
    return found


def work(uri: str, journal_path: Path, seed: int, operations: int | None = None) -> None:
    """The worker's loop: resume what was cut short, then think, ingest and grow methods."""
    from langchain_core.messages import HumanMessage

    from batos.shell.runtime import open_image
    from graph import jit
    from graph.mind import MindServices, build_graph, run_config
    from store.checkpoint.saver import ZODBSaver
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_text

    rng = random.Random(seed)
    journal = Journal(journal_path)
    services = MindServices(
        models=FakeModels(_respond), router=FakeRouter(("BRICK",)), embedder=FakeEmbedder()
    )
    # Each install asks the scripted model for its examples, then for one draft.
    os.environ["BATOS_JIT_DRAFTS"] = "1"
    drafts = ScriptedChatModel()
    jit.enable(drafts)
    with open_image(uri, create=True) as image, ZODBSaver(image) as saver:
        graph = build_graph(services, checkpointer=saver)
        catalog = KnowledgeCatalog.open(image, WordEmbedder())
        for thread in unfinished_threads(saver):
            state = graph.invoke(None, run_config(thread))
            journal.ack(op="resume", thread=thread, status=state["status"], cycle=_cycle(state))
        done = 0
        while operations is None or done < operations:
            done += 1
            tag = f"{os.getpid()}-{done}-{rng.randrange(10**6)}"
            op = rng.choice(("cycle", "cycle", "ingest", "jit"))
            if op == "cycle":
                message = {"messages": [HumanMessage("plan the steps to build a shed")]}
                state = graph.invoke(message, run_config(f"t{tag}"))
                journal.ack(
                    op="cycle", thread=f"t{tag}", status=state["status"], cycle=_cycle(state)
                )
            elif op == "ingest":
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(20, 200))) + "."
                ingest_text(catalog, f"doc-{tag}", text)
                journal.ack(op="ingest", source=f"doc-{tag}", hash=_hash(text))
            else:
                name = f"grown_{tag.replace('-', '_')}"
                bias = rng.randrange(100)
                example = {"args": [5], "slots": {}, "returns": 10 + bias, "slots_after": {}}
                drafts.enqueue(json.dumps({"examples": [example]}))
                drafts.enqueue(f"```python\ndef {name}(self, x):\n    return x * 2 + {bias}\n```")
                got = image.transact(lambda root, n=name: getattr(root[CALC], n)(3))
                assert got == 6 + bias, got
                journal.ack(op="jit", name=name, result=got)


def _cycle(state: dict[str, Any]) -> str | None:
    return (state.get("cycle") or {}).get("id")


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# -- the checks ---------------------------------------------------------------------------


@dataclass
class Findings:
    points: int = 0
    acknowledged: int = 0
    resumed: int = 0
    cut_commits: int = 0  # kills that left a commit cut short in the file (dropped on open)
    # Each problem once, however many later checks see it again.
    lost: set[str] = field(default_factory=set)
    partial: set[str] = field(default_factory=set)
    damaged: set[str] = field(default_factory=set)  # fstest / fsrefs findings


def read_journal(path: Path) -> list[dict[str, Any]]:
    entries = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line cut by the kill: that operation was never acknowledged
    return entries


def check_files(path: Path) -> list[str]:
    """ZODB's own checks of a FileStorage: fstest (structure) and fsrefs (references)."""
    from ZODB.scripts import fsrefs, fstest

    problems = []
    try:
        fstest.check(str(path))
    except fstest.FormatError as exc:
        problems.append(f"fstest: {exc}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fsrefs.main(str(path))
    if out.getvalue().strip():
        problems.append(f"fsrefs: {out.getvalue().strip()[:2000]}")
    return problems


def check_image(uri: str, journal: list[dict[str, Any]], findings: Findings) -> None:
    """Lost and partial operations, from the acknowledgements and the image's invariants."""
    from graph.mind import MindServices  # noqa: F401 (the image's classes, registered)
    from prototypes.incarnation import personas
    from prototypes.uvm import Method
    from store.core.image import LivingImage
    from store.knowledge.catalog import catalog_root

    with LivingImage.open(uri) as image, image.read() as root:
        cycles = root.get(layout.CYCLES) or {}
        records = set(cycles.keys())
        memory = root.get(layout.MEMORY)
        exchanges = memory.get(("mind", "exchanges")) if memory is not None else None
        remembered = set(exchanges.keys()) if exchanges is not None else set()
        counted = int(personas(root)["BRICK"].stats.get("cycles", 0))
        if remembered != records or counted != len(records):
            findings.partial.add(
                f"{len(records)} cycle records, {len(remembered)} remembered exchanges, "
                f"BRICK counted {counted} cycles"
            )
        cat = catalog_root(root) if layout.CATALOG in root else None
        calc = root.get(CALC)
        slots = calc._slots() if calc is not None else {}
        if cat is not None:
            for source, document in cat["documents"].items():
                missing = [c for c in document.chunk_ids if c not in cat["chunks"]]
                if missing or not document.chunk_ids:
                    findings.partial.add(f"document {source} lacks chunks {missing[:3]}")
        for name, slot in slots.items():
            if isinstance(slot, Method) and not slot.source:
                findings.partial.add(f"method {name} has no source")
        for entry in journal:
            op = entry["op"]
            if op in ("cycle", "resume") and entry["status"] == "COMPLETE":
                if entry["cycle"] not in records:
                    findings.lost.add(f"{op} {entry['thread']} cycle {entry['cycle']}")
            elif op == "ingest":
                document = cat["documents"].get(entry["source"]) if cat is not None else None
                if document is None or document.content_hash != entry["hash"]:
                    findings.lost.add(f"document {entry['source']}")
            elif op == "jit" and not isinstance(slots.get(entry["name"]), Method):
                findings.lost.add(f"method {entry['name']}")


def prepare(uri: str) -> None:
    from batos.shell.runtime import open_image
    from prototypes.uvm import UvmObject
    from store.checkpoint.saver import ZODBSaver
    from store.knowledge.catalog import KnowledgeCatalog

    with open_image(uri, create=True) as image, ZODBSaver(image):
        image.transact(lambda root: root.__setitem__(CALC, UvmObject(name="calc")))
        KnowledgeCatalog.open(image, WordEmbedder())


def _spawn(uri: str, journal: Path, seed: int, log: Path, operations: int | None) -> int:
    pid = os.fork()
    if pid:
        return pid
    # The worker: its own output file, and never back into the caller's code.
    status = 0
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        work(uri, journal, seed, operations)
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)


def run(
    points: int, *, seed: int = 1, max_delay: float = 3.0, workdir: Path | None = None
) -> Findings:
    """Kill ``points`` workers at random moments, checking the image after each kill."""
    from store.core.image import LivingImage

    rng = random.Random(seed)
    workdir = Path(workdir or tempfile.mkdtemp(prefix="batos-crash-"))
    path = workdir / "live_image.fs"
    uri = f"file://{path}"
    journal = workdir / "journal.jsonl"
    log = workdir / "workers.log"
    prepare(uri)
    findings = Findings()
    for point in range(points):
        pid = _spawn(uri, journal, seed * 100_003 + point, log, None)
        time.sleep(rng.uniform(0.0, max_delay))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            raise RuntimeError(f"worker {pid} ended by itself ({status}); see {log}")
        findings.points += 1
        findings.cut_commits += _cut_short(path)
        LivingImage.open(uri).close()  # drops a commit cut short, as any reopening does
        findings.damaged.update(check_files(path))
        entries = read_journal(journal)
        check_image(uri, entries, findings)
    # One last worker without a kill: it resumes what the last kill cut short, and stops.
    pid = _spawn(uri, journal, seed, log, 0)
    _, status = os.waitpid(pid, 0)
    if status:
        raise RuntimeError(f"the final worker failed ({status}); see {log}")
    entries = read_journal(journal)
    check_image(uri, entries, findings)
    findings.damaged.update(check_files(path))
    findings.acknowledged = sum(1 for e in entries if e["op"] != "resume")
    findings.resumed = sum(1 for e in entries if e["op"] == "resume")
    with LivingImage.open(uri) as image:
        from store.checkpoint.saver import ZODBSaver

        with ZODBSaver(image) as saver:
            left = unfinished_threads(saver)
    if left:
        findings.partial.add(f"threads never resumed to an end: {left[:5]}")
    return findings


def _cut_short(path: Path) -> int:
    from store.core.image_file import check

    return int(check(path).uncommitted_tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=200, help="kills (default 200)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-delay", type=float, default=3.0, help="longest life, seconds")
    parser.add_argument("--keep", action="store_true", help="keep the image and the journal")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="batos-crash-"))
    os.environ.setdefault("BATOS_HOME", str(workdir / "home"))
    # Each reopening after a kill mid-commit warns that it drops the cut commit: counted instead.
    logging.getLogger("batos.image").setLevel(logging.ERROR)
    logging.getLogger("ZODB.FileStorage").setLevel(logging.ERROR)
    started = time.monotonic()
    findings = run(args.points, seed=args.seed, max_delay=args.max_delay, workdir=workdir)
    seconds = time.monotonic() - started
    problems = findings.damaged | findings.lost | findings.partial
    if args.keep or problems:
        print(f"the image, the journal and the workers' log are in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "crash.json").write_text(
        json.dumps({**asdict(findings), "seconds": round(seconds, 1)}, indent=2, default=sorted)
    )
    print(
        f"{findings.acknowledged} operations acknowledged, {findings.resumed} cut-short cycles "
        f"resumed, {findings.cut_commits} kills landed mid-commit, in {seconds:.0f} s"
    )
    for problem in sorted(problems):
        print(f"  {problem}")
    print(
        f"points={findings.points} lost={len(findings.lost)} partial={len(findings.partial)} "
        f"damaged={len(findings.damaged)}"
    )


if __name__ == "__main__":
    main()
