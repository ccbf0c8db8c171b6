"""The counters of ``batos.metrics``, kept in side files and added up across processes.

Each process that opens an image writes its counters to ``<home>/stats/<host>-<pid>-<start>.json``
(write-then-rename, at most every ``metrics.FLUSH_EVERY_S`` after a change, and at exit), so the
CLI, the LangGraph server and the heartbeat each leave their own file and none writes to the
image for it. ``totals()`` adds up every file; files of processes of this host that are gone
are folded into ``archive.json`` under a lock, so the folder stays small. A process killed by
SIGKILL loses what it counted since its last write (at most ``FLUSH_EVERY_S``).
``prometheus_text()`` writes the totals in Prometheus' text exposition format.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from batos import metrics, settings
from store.core.files import write_text

log = logging.getLogger("batos.stats")

ARCHIVE = "archive.json"
_STARTED = time.time_ns()
_HOST = socket.gethostname()


def stats_dir() -> Path:
    return Path(settings.get_str("home")) / "stats"


def _own_file() -> Path:
    return stats_dir() / f"{_HOST}-{os.getpid()}-{_STARTED}.json"


def write(snapshot: dict[str, Any]) -> None:
    """This process's counters to its side file; a failure is logged, never raised (counting
    must not break the work it counts)."""
    record = {"host": _HOST, "pid": os.getpid(), "updated": time.time(), "snapshot": snapshot}
    try:
        folder = stats_dir()
        folder.mkdir(parents=True, exist_ok=True)
        write_text(_own_file(), json.dumps(record))
    except Exception as exc:
        log.debug("cannot write the stats side file: %s", exc)


def _add(total: dict[str, Any], snapshot: dict[str, Any]) -> None:
    counters, timings = total["counters"], total["timings"]
    for name, labels, value in snapshot.get("counters", []):
        key = (name, tuple(sorted(labels.items())))
        counters[key] = counters.get(key, 0) + value
    for name, labels, row in snapshot.get("timings", []):
        key = (name, tuple(sorted(labels.items())))
        known = timings.get(key)
        timings[key] = (
            list(row) if known is None else [a + b for a, b in zip(known, row, strict=True)]
        )


def _as_snapshot(total: dict[str, Any]) -> dict[str, Any]:
    return {
        "counters": [[n, dict(lb), v] for (n, lb), v in sorted(total["counters"].items())],
        "timings": [[n, dict(lb), row] for (n, lb), row in sorted(total["timings"].items())],
    }


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("skipping unreadable stats file %s: %s", path, exc)
        return None


def _alive(record: dict[str, Any]) -> bool:
    if record.get("host") != _HOST:
        return True  # another host's process: never folded from here
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, ValueError, TypeError):
        return True
    return True


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    with (folder / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fold_finished(folder: Path, files: Iterable[Path]) -> None:
    """Files of this host's finished processes, added into the archive and removed."""
    archive_path = folder / ARCHIVE
    with _locked(folder):
        archive = _read(archive_path) if archive_path.exists() else None
        total: dict[str, Any] = {"counters": {}, "timings": {}}
        _add(total, (archive or {}).get("snapshot", {}))
        folded = []
        for path in files:
            record = _read(path) if path.exists() else None
            if record is None or _alive(record):
                continue
            _add(total, record.get("snapshot", {}))
            folded.append(path)
        if not folded:
            return
        write_text(archive_path, json.dumps({"snapshot": _as_snapshot(total)}), durable=True)
        for path in folded:
            path.unlink(missing_ok=True)


def totals() -> dict[str, Any]:
    """Every process's counters added up (this one's written first), as a snapshot."""
    metrics.flush()
    folder = stats_dir()
    if not folder.is_dir():
        return _as_snapshot({"counters": {}, "timings": {}})
    own = _own_file()
    _fold_finished(folder, [p for p in folder.glob("*.json") if p.name != ARCHIVE and p != own])
    total: dict[str, Any] = {"counters": {}, "timings": {}}
    for path in sorted(folder.glob("*.json")):
        record = _read(path)
        if record is not None:
            _add(total, record.get("snapshot", {}))
    return _as_snapshot(total)


def prometheus_text(snapshot: dict[str, Any]) -> str:
    """``snapshot`` in Prometheus' text exposition format (``batos_`` names, every declared
    metric present, zero when nothing happened yet)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    counters: dict[str, list[tuple[dict[str, str], float]]] = {}
    timings: dict[str, list[tuple[dict[str, str], list[float]]]] = {}
    for name, labels, value in snapshot["counters"]:
        counters.setdefault(name, []).append((labels, value))
    for name, labels, row in snapshot["timings"]:
        timings.setdefault(name, []).append((labels, row))

    class Totals:
        def collect(self) -> Iterator[Any]:
            for name, (kind, help_text, label_names) in metrics.METRICS.items():
                full = f"batos_{name}"
                if kind == metrics.COUNTER:
                    counter = CounterMetricFamily(full, help_text, labels=label_names)
                    rows = counters.get(name) or ([] if label_names else [({}, 0.0)])
                    for labels, value in rows:
                        counter.add_metric([labels[k] for k in label_names], value)
                    yield counter
                else:
                    family = HistogramMetricFamily(full, help_text, labels=label_names)
                    for labels, row in timings.get(name, []):
                        cumulative, buckets = 0.0, []
                        for bound, hits in zip(
                            (*map(str, metrics.BUCKETS_S), "+Inf"), row[2:], strict=True
                        ):
                            cumulative += hits
                            buckets.append((bound, cumulative))
                        family.add_metric([labels[k] for k in label_names], buckets, row[1])
                    yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Totals())
    return generate_latest(registry).decode("utf-8")


metrics.on_flush(write)
atexit.register(metrics.flush)
