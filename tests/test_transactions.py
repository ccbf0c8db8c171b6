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
