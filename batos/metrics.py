"""Counters BAT OS keeps about itself, in this process: transactions, guardian verdicts, model
calls. ``store.core.stats`` writes them to a side file per process and adds them up for the CLI.

Every metric is declared in ``METRICS`` (name, kind, help), so the set is known before
anything happened. A counter only grows; a timing keeps a count, a sum and counts per bucket
(``BUCKETS_S``), which is what a Prometheus histogram holds. A forked child starts from zero:
what it counts is its own, and the parent's counts are never reported twice.

    metrics.count("transactions_committed")
    metrics.observe("model_seconds", 0.42, backend="llama-cpp")
    metrics.snapshot()   # {"counters": {...}, "timings": {...}}
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

#: Upper bounds (seconds) of the timing buckets; the last, implicit one is +Inf.
BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

COUNTER, TIMING = "counter", "timing"
#: name → (kind, help, label names).
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "transactions_committed": (COUNTER, "Image transactions committed.", ()),
    "transactions_aborted": (COUNTER, "Image transactions aborted (any failure).", ()),
    "transaction_conflicts": (
        COUNTER,
        "Transient errors (write or read conflicts, disconnects) an attempt met.",
        (),
    ),
    "transaction_retries": (COUNTER, "Attempts run again after a transient error.", ()),
    "transactions_failed": (
        COUNTER,
        "Transactions given up after the retry budget (TransactionFailed).",
        (),
    ),
    "guardian_verdicts": (
        COUNTER,
        "PersistenceGuardian audits of method source, by verdict.",
        ("verdict",),
    ),
    "model_calls": (
        COUNTER,
        "Persona model calls, by backend and outcome (ok, error, or closed: a stream "
        "left before its end).",
        ("backend", "outcome"),
    ),
    "model_seconds": (TIMING, "Seconds a persona model call took, by backend.", ("backend",)),
    "model_first_token_seconds": (
        TIMING,
        "Seconds to a streamed call's first chunk, by backend.",
        ("backend",),
    ),
}

#: How often (seconds) a change is handed to the flush hook at most; the rest waits for exit.
FLUSH_EVERY_S = 2.0

Labels = tuple[tuple[str, str], ...]

_lock = threading.Lock()
_counters: dict[tuple[str, Labels], float] = {}
_timings: dict[tuple[str, Labels], list[float]] = {}  # [count, sum, bucket counts...]
_flush: dict[str, Any] = {"hook": None, "last": 0.0}


def _key(name: str, labels: dict[str, str]) -> tuple[str, Labels]:
    try:
        _, _, names = METRICS[name]
    except KeyError:
        raise KeyError(f"undeclared metric {name!r}; declare it in batos.metrics.METRICS") from None
    if not labels and not names:  # most counters, once per transaction: skip the general case
        return name, ()
    if set(labels) != set(names):
        raise KeyError(f"metric {name!r} takes labels {names}, got {tuple(labels)}")
    return name, tuple((k, str(labels[k])) for k in names)


def count(name: str, amount: float = 1, **labels: str) -> None:
    """Add ``amount`` to counter ``name`` with ``labels``."""
    key = _key(name, labels)
    with _lock:
        _counters[key] = _counters.get(key, 0) + amount
    _maybe_flush()


def observe(name: str, seconds: float, **labels: str) -> None:
    """Record one timing of ``seconds`` for ``name`` with ``labels``."""
    key = _key(name, labels)
    with _lock:
        row = _timings.get(key)
        if row is None:
            row = _timings[key] = [0.0, 0.0] + [0.0] * (len(BUCKETS_S) + 1)
        row[0] += 1
        row[1] += seconds
        slot = next((i for i, bound in enumerate(BUCKETS_S) if seconds <= bound), len(BUCKETS_S))
        row[2 + slot] += 1
    _maybe_flush()


def snapshot() -> dict[str, Any]:
    """Everything counted in this process, as JSON-ready data."""
    with _lock:
        return {
            "counters": [[n, dict(labels), v] for (n, labels), v in sorted(_counters.items())],
            "timings": [[n, dict(labels), list(v)] for (n, labels), v in sorted(_timings.items())],
        }


def on_flush(hook: Callable[[dict[str, Any]], None] | None) -> None:
    """Call ``hook(snapshot())`` at most every ``FLUSH_EVERY_S`` after a change, and by
    ``flush()``; one hook per process (``store.core.stats`` installs the side file's)."""
    _flush["hook"] = hook


def flush() -> None:
    """Hand the current snapshot to the hook now (at exit, or before reading it back)."""
    hook = _flush["hook"]
    if hook is not None:
        _flush["last"] = time.monotonic()
        hook(snapshot())


def _maybe_flush() -> None:
    if _flush["hook"] is not None and time.monotonic() - _flush["last"] >= FLUSH_EVERY_S:
        flush()


def _forget_after_fork() -> None:
    # A forked child (a sandboxed method call) counts from zero: its parent reports its own.
    global _lock
    _lock = threading.Lock()
    _counters.clear()
    _timings.clear()
    _flush["hook"] = None


os.register_at_fork(after_in_child=_forget_after_fork)


def address_space() -> int:
    """Bytes this process maps now (its virtual size): what a forked child starts from, to
    which the sandbox and the PDF reader add their memory limits."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
