"""Counters (``batos.metrics``): what transactions, the guardian and persona models count, the
side files that keep them per process, their totals across processes, ``batos stats`` and its
Prometheus export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fakes import ScriptedChatModel
from persistent.mapping import PersistentMapping
from prometheus_client.parser import text_string_to_metric_families

from batos import metrics
from batos.errors import AuditRejected, ModelError
from batos.models.base import PersonaChatModel
from batos.shell.cli import main
from prototypes import guardian
from store.core import stats
from store.core.image import LivingImage

REPO = Path(__file__).resolve().parents[1]


def counter(name: str, snapshot: dict | None = None, **labels: str) -> float:
    rows = (snapshot or metrics.snapshot())["counters"]
    return sum(
        v for n, lb, v in rows if n == name and all(lb.get(k) == x for k, x in labels.items())
    )


def timing_count(name: str, **labels: str) -> float:
    rows = metrics.snapshot()["timings"]
    return sum(
        r[0] for n, lb, r in rows if n == name and all(lb.get(k) == x for k, x in labels.items())
    )


def test_commits_aborts_conflicts_and_retries_are_counted(memory_image: LivingImage) -> None:
    before = {n: counter(n) for n in metrics.METRICS}
    memory_image.transact(lambda root: root.__setitem__("n", 0))
    with pytest.raises(ZeroDivisionError):
        memory_image.transact(lambda root: 1 / 0)
    assert counter("transactions_committed") == before["transactions_committed"] + 1
    assert counter("transactions_aborted") == before["transactions_aborted"] + 1

    # Two writers on one object: the loser conflicts, is retried, and both get through.
    ready, first_reads = threading.Barrier(2), []

    def bump(root) -> None:
        value = root["n"]
        first_reads.append(value)
        if len(first_reads) <= 2:
            ready.wait(timeout=10)  # both read before either writes; a retry runs alone
        root["n"] = value + 1

    threads = [threading.Thread(target=memory_image.transact, args=(bump,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with memory_image.read() as root:
        assert root["n"] == 2
    assert counter("transaction_conflicts") >= before["transaction_conflicts"] + 1
    assert counter("transaction_retries") >= before["transaction_retries"] + 1
    assert counter("transactions_committed") == before["transactions_committed"] + 3


def test_guardian_verdicts_are_counted() -> None:
    approved = counter("guardian_verdicts", verdict="approved")
    rejected = counter("guardian_verdicts", verdict="rejected")
    guardian.check("twice", "def twice(self, x):\n    return 2 * x\n")
    with pytest.raises(AuditRejected):
        guardian.check("leak", "import os\ndef leak(self):\n    return os.environ\n")
    assert counter("guardian_verdicts", verdict="approved") == approved + 1
    assert counter("guardian_verdicts", verdict="rejected") == rejected + 1


class ScriptedPersona(PersonaChatModel, ScriptedChatModel):
    """The persona seam in front of the scripted model, as a backend puts it in front of its own."""

    def exception_table(self):
        return {RuntimeError: lambda exc: ModelError(f"backend down: {exc}", hint="start it")}


def test_model_calls_and_their_latency_are_counted() -> None:
    backend = "scripted"
    ok = counter("model_calls", backend=backend, outcome="ok")
    errors = counter("model_calls", backend=backend, outcome="error")
    closed = counter("model_calls", backend=backend, outcome="closed")
    seconds = timing_count("model_seconds", backend=backend)
    first = timing_count("model_first_token_seconds", backend=backend)
    model = ScriptedPersona().enqueue("one", "two", RuntimeError("gone"), "three")
    assert model.invoke("hi").content == "one"
    assert "".join(c.content for c in model.stream("hi")) == "two"
    with pytest.raises(ModelError):
        model.invoke("hi")
    stream = model.stream("hi")
    next(stream)
    stream.close()  # the caller stopped reading
    assert counter("model_calls", backend=backend, outcome="ok") == ok + 2
    assert counter("model_calls", backend=backend, outcome="error") == errors + 1
    assert counter("model_calls", backend=backend, outcome="closed") == closed + 1
    assert timing_count("model_seconds", backend=backend) == seconds + 4
    assert timing_count("model_first_token_seconds", backend=backend) == first + 2


def test_undeclared_metrics_and_labels_are_refused() -> None:
    with pytest.raises(KeyError, match="undeclared metric"):
        metrics.count("made_up")
    with pytest.raises(KeyError, match="takes labels"):
        metrics.count("guardian_verdicts")


def test_a_forked_child_counts_from_zero() -> None:
    metrics.count("transactions_committed")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it sees, then leave without running exit hooks
        os.write(write, json.dumps(metrics.snapshot()).encode())
        os._exit(0)
    os.close(write)
    seen = json.loads(os.read(read, 1 << 20))
    os.waitpid(pid, 0)
    assert seen == {"counters": [], "timings": []}
    assert counter("transactions_committed") >= 1


def _count_in_a_process(home: Path, commits: int) -> None:
    code = (
        "from batos import metrics\n"
        "from store.core import stats\n"
        f"for _ in range({commits}):\n"
        "    metrics.count('transactions_committed')\n"
        "metrics.observe('model_seconds', 0.3, backend='elsewhere')\n"
    )
    env = {**os.environ, "BATOS_HOME": str(home), "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def test_finished_processes_add_up_and_are_folded_into_the_archive(batos_home: Path) -> None:
    _count_in_a_process(batos_home, 3)
    _count_in_a_process(batos_home, 4)
    folder = stats.stats_dir()
    assert len(list(folder.glob("*-*.json"))) == 2  # one side file per finished process
    mine = counter("transactions_committed")
    total = stats.totals()
    assert counter("transactions_committed", total) == mine + 7
    assert [p.name for p in folder.glob("*.json") if p.name != stats.ARCHIVE] == [
        stats._own_file().name
    ]  # the finished processes' files were folded into the archive
    assert counter("transactions_committed", stats.totals()) == mine + 7  # not counted twice
    elsewhere = [r for n, lb, r in total["timings"] if lb.get("backend") == "elsewhere"]
    assert elsewhere and elsewhere[0][0] == 2 and abs(elsewhere[0][1] - 0.6) < 1e-9


def test_batos_stats_shows_totals_and_exports_prometheus_text(capsys, batos_home) -> None:
    _count_in_a_process(batos_home, 5)
    capsys.readouterr()
    assert main(["stats", "--json"]) == 0
    total = json.loads(capsys.readouterr().out)
    assert counter("transactions_committed", total) >= 5
    assert main(["stats", "--prometheus"]) == 0
    families = {f.name: f for f in text_string_to_metric_families(capsys.readouterr().out)}
    assert families["batos_transactions_committed"].samples[0].value >= 5
    assert families["batos_transaction_conflicts"].type == "counter"  # present at zero too
    histogram = families["batos_model_seconds"]
    buckets = {
        s.labels["le"]: s.value
        for s in histogram.samples
        if s.name.endswith("_bucket") and s.labels["backend"] == "elsewhere"
    }
    assert buckets["0.25"] == 0 and buckets["0.5"] == 1 and buckets["+Inf"] == 1
    assert main(["stats"]) == 0
    assert "transactions_committed" in capsys.readouterr().out


def test_an_unwritable_stats_folder_never_breaks_the_work(batos_home: Path) -> None:
    batos_home.mkdir(parents=True, exist_ok=True)
    (batos_home / "stats").write_text("a file where the folder should be")
    stats.write(metrics.snapshot())  # logged, not raised
    image = LivingImage.open("memory://")
    try:
        image.transact(lambda root: root.__setitem__("x", PersistentMapping()))
        metrics.flush()
    finally:
        image.close()
