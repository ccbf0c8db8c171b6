"""Methods the image wants written ahead of use, and how each try to write one went.

Writing a method takes a model minutes on a CPU, so it happens off the user's clock (``batos
init --prepare``, the heartbeat). A try that fails is not retried at once: the entry waits
``BACKOFF_BASE_S``, doubled with each failure up to ``BACKOFF_MAX_S``, and says what went
wrong, which ``batos doctor`` shows. A method taken out as wrong is *pending* again: due at
once, with why it was taken out. Keys are opaque strings (``"BRICK.facet_steps"``) of the
caller's choosing; values are plain dicts, assigned again on each change.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from store.core import layout

#: First wait after a failed try, and the longest wait, in seconds.
BACKOFF_BASE_S = 600.0
BACKOFF_MAX_S = 86_400.0
#: Characters of a failure's reason kept.
MAX_REASON_CHARS = 2000


def entries(root: Any) -> dict[str, dict[str, Any]]:
    """Every recorded key and its state (``written``, ``failed`` or ``pending``), attempts,
    last reason, when it was last tried and when it may next be tried."""
    queue = layout.find(root, layout.METHOD_QUEUE)
    return {} if queue is None else {str(k): dict(v) for k, v in queue.items()}


def backoff(failures: int) -> float:
    return min(BACKOFF_BASE_S * 2 ** max(failures - 1, 0), BACKOFF_MAX_S)


def due(root: Any, key: str, now: float | None = None) -> bool:
    """Whether ``key`` may be tried now: never tried, or its wait after a failure is over."""
    queue = layout.find(root, layout.METHOD_QUEUE)
    entry: Mapping[str, Any] | None = None if queue is None else queue.get(key)
    if entry is None or entry.get("state") != "failed":
        return True
    return float(entry.get("next_try") or 0) <= (time.time() if now is None else now)


def record_failure(root: Any, key: str, reason: str, now: float | None = None) -> float:
    """Count a failed try of ``key``; when it may be tried again (epoch seconds)."""
    now = time.time() if now is None else now
    queue = layout.method_queue(root)
    previous = queue.get(key) or {}
    failures = int(previous.get("failures") or 0) + 1
    next_try = now + backoff(failures)
    queue[key] = {
        "state": "failed",
        "failures": failures,
        "attempts": int(previous.get("attempts") or 0) + 1,
        "reason": str(reason)[:MAX_REASON_CHARS],
        "tried": now,
        "next_try": next_try,
    }
    return next_try


def record_success(root: Any, key: str, now: float | None = None) -> None:
    now = time.time() if now is None else now
    queue = layout.method_queue(root)
    previous = queue.get(key) or {}
    queue[key] = {
        "state": "written",
        "failures": 0,
        "attempts": int(previous.get("attempts") or 0) + 1,
        "reason": "",
        "tried": now,
        "next_try": None,
    }


def record_pending(root: Any, key: str, reason: str) -> None:
    """``key``'s method was taken out as wrong: it is wanted again, and may be tried now."""
    queue = layout.method_queue(root)
    previous = queue.get(key) or {}
    queue[key] = {
        "state": "pending",
        "failures": 0,
        "attempts": int(previous.get("attempts") or 0),
        "reason": str(reason)[:MAX_REASON_CHARS],
        "tried": previous.get("tried"),
        "next_try": None,
    }
