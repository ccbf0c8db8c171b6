"""One retry policy for every ZODB transaction in BAT OS.

A ``TransientError`` (a write or read conflict, a ZEO client briefly disconnected) means "do
it again on fresh state". ``retry`` runs an attempt until it stops raising one, sleeping a
jittered, exponentially growing pause between attempts, for as long as the ``tx_retry_seconds``
setting allows — a time budget, not a count, so that a handful of writers on one hot object
all get through however unlucky their interleaving. ``run_in_transaction`` is the usual form:
one transaction per attempt, committed on success, aborted on any failure or when the function
finds nothing to change (``Unchanged``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import transaction
from transaction.interfaces import TransientError

from batos import metrics, settings
from batos.errors import TransactionFailed

log = logging.getLogger("batos.transactions")

T = TypeVar("T")

#: The longest pause before the first retry; it doubles with each retry after that.
FIRST_PAUSE_S = 0.005
#: The longest pause before any retry.
MAX_PAUSE_S = 0.5
#: The most characters of a transaction's note: a line of history, not data; a file image
#: refuses a description over 64 KiB, and a note naming a client's id could be longer.
MAX_NOTE_CHARS = 2_000


class Unchanged(Exception):
    """Raised by a transaction's function that found nothing to change: ``run_in_transaction``
    aborts the transaction instead of committing an empty one, and returns ``result``."""

    def __init__(self, result: Any = None) -> None:
        super().__init__(result)
        self.result = result


def pause(attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based): full jitter.

    Uniform in [0, min(MAX_PAUSE_S, FIRST_PAUSE_S * 2**(attempt-1))], so writers that collided
    spread out instead of colliding again in step.
    """
    ceiling = min(MAX_PAUSE_S, FIRST_PAUSE_S * 2 ** min(attempt - 1, 30))
    return random.uniform(0, ceiling)


def _disconnected(exc: BaseException) -> bool:
    """Whether ``exc`` says a ZEO client lost its server (a ``TransientError`` as a conflict
    is, though retrying soon rarely helps)."""
    from ZEO.Exceptions import ClientDisconnected

    return isinstance(exc, ClientDisconnected)


def retry(
    attempt: Callable[[], T],
    *,
    what: str,
    hint: str,
    seconds: float | None = None,
) -> T:
    """``attempt()`` again after each ``TransientError``, within ``seconds`` (setting default).

    ``attempt`` must leave nothing behind when it raises (abort its transaction, close what
    it opened). When the budget is spent, ``TransactionFailed`` says how often ``what``
    conflicted, with ``hint``; any other exception propagates at once.
    """
    started = time.monotonic()
    tries = 0
    while True:
        tries += 1
        try:
            return attempt()
        except TransientError as exc:
            metrics.count("transaction_conflicts")
            # Read only now: most transactions never conflict, and a settings lookup on
            # every one cost a checkpoint put a tenth of its CPU.
            budget = settings.get_float("tx_retry_seconds") if seconds is None else seconds
            elapsed = time.monotonic() - started
            wait = pause(tries)
            if elapsed + wait > budget:
                metrics.count("transactions_failed")
                said = str(exc).strip() or type(exc).__name__
                if _disconnected(exc):  # transient too, but no other writer is the cause
                    raise TransactionFailed(
                        f"{what} was not committed: the image's ZEO server cannot be reached "
                        f"({said}; {tries} tries in {elapsed:.1f} s)",
                        hint="start the server ('batos zeo start') or check the image's "
                        "address, then run it again: nothing of it was committed",
                    ) from exc
                raise TransactionFailed(
                    f"{what} conflicted {tries} times in {elapsed:.1f} s: {said}",
                    hint=hint,
                ) from exc
            log.info("%s: %s on attempt %d; retrying", what, type(exc).__name__, tries)
            metrics.count("transaction_retries")
            time.sleep(wait)


def note_text(note: str) -> str:
    """``note`` as a transaction records it: cut to ``MAX_NOTE_CHARS`` (ending in "…"), and a
    lone surrogate (an undecodable byte of a file name, an id a client sent) written as its
    escape, since storages keep notes as UTF-8 and would fail the commit on one."""
    if len(note) > MAX_NOTE_CHARS:
        note = note[: MAX_NOTE_CHARS - 1] + "…"
    return note.encode("utf-8", "backslashreplace").decode("utf-8")


def run_in_transaction(
    tm: transaction.TransactionManager,
    fn: Callable[[], T],
    *,
    note: str,
    user: str,
    hint: str = "another process keeps changing the same objects; retry later",
    seconds: float | None = None,
) -> T:
    """``fn()`` in one transaction of ``tm``, committed; retried on ``TransientError``.

    Each attempt begins a new transaction (recording ``user`` and ``note_text(note)``) and
    runs ``fn`` on fresh state, so ``fn`` must be safe to repeat. Any failure aborts: nothing
    of a failed attempt is ever committed, and neither is one whose ``fn`` raised
    ``Unchanged``.
    """

    def attempt() -> T:
        txn = tm.begin()
        txn.user = user
        if note:
            txn.note(note_text(note))
        try:
            result = fn()
            tm.commit()
        except Unchanged as unchanged:
            tm.abort()
            return unchanged.result
        except BaseException:
            tm.abort()
            metrics.count("transactions_aborted")
            raise
        metrics.count("transactions_committed")
        return result

    return retry(attempt, what=note or "transaction", hint=hint, seconds=seconds)
