"""The one retry policy: conflicts are retried within the tx_retry_seconds budget."""

from __future__ import annotations

import pytest
from ZODB.POSException import ConflictError

from batos.errors import TransactionFailed
from store.core.transactions import retry


def _attempts(outcomes: list) -> tuple[list, object]:
    calls: list = []

    def attempt() -> object:
        calls.append(1)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return calls, attempt


def test_conflicts_are_retried_until_the_attempt_succeeds(monkeypatch) -> None:
    monkeypatch.setenv("BATOS_TX_RETRY_SECONDS", "5")
    calls, attempt = _attempts([ConflictError(), ConflictError(), "done"])
    assert retry(attempt, what="put", hint="retry later") == "done"
    assert len(calls) == 3


def test_the_budget_setting_is_read_when_a_conflict_comes(monkeypatch) -> None:
    monkeypatch.setenv("BATOS_TX_RETRY_SECONDS", "5")
    calls, attempt = _attempts([ConflictError(), "never reached"])

    def attempt_then_spend_the_budget() -> object:
        monkeypatch.setenv("BATOS_TX_RETRY_SECONDS", "0.000001")  # changed during the attempt
        return attempt()

    with pytest.raises(TransactionFailed, match="conflicted 1 times") as info:
        retry(attempt_then_spend_the_budget, what="put", hint="retry later")
    assert info.value.hint == "retry later"
    assert len(calls) == 1


def test_other_errors_are_not_retried() -> None:
    calls, attempt = _attempts([ValueError("bad"), "never reached"])
    with pytest.raises(ValueError):
        retry(attempt, what="put", hint="h", seconds=5)
    assert len(calls) == 1


def test_a_lost_zeo_server_is_said_as_such_not_as_a_conflict() -> None:
    # ClientDisconnected is a TransientError, as a conflict is: it was reported as "conflicted
    # 1 times in 10.0 s: " (an empty reason) with "another process keeps changing the same
    # objects" as the hint.
    from ZEO.Exceptions import ClientDisconnected

    _, attempt = _attempts([ClientDisconnected(), ClientDisconnected(), "never reached"])
    with pytest.raises(TransactionFailed, match="ZEO server cannot be reached") as info:
        retry(attempt, what="ingest", hint="another process keeps changing them", seconds=0.0)
    assert "ClientDisconnected" in info.value.message
    assert "batos zeo start" in info.value.hint and "nothing of it was committed" in info.value.hint
    _, attempt = _attempts([ConflictError(""), "never reached"])
    with pytest.raises(TransactionFailed, match="conflicted 1 times in .* s: ConflictError"):
        retry(attempt, what="put", hint="h", seconds=0.0)
