"""bench/jit.py's intent sets: well-formed, distinct, and checks that tell right from wrong.

The benchmark runs a model for an hour; what its pass rate stands on is checked here: each
set has at least twenty intents, no selector or intent repeats across the sets (a set that
shares intents with another is not held out), every case's check accepts the expected
answer of its data and rejects a different one.
"""

from __future__ import annotations

import json

import pytest

from bench import jit
from prototypes.uvm import UvmObject


def _sets() -> dict[str, list[jit.Case]]:
    sets = {"bench": jit.CASES}
    sets.update({name: jit.heldout_cases(path) for name, path in jit.HELDOUT_SETS.items()})
    return sets


def test_every_set_has_twenty_intents_and_none_repeats_across_sets() -> None:
    seen_selectors: set[str] = set()
    seen_intents: set[str] = set()
    for name, cases in _sets().items():
        assert len(cases) >= 20, name
        for case in cases:
            assert case.selector not in seen_selectors, (name, case.selector)
            assert case.intent not in seen_intents, (name, case.intent)
            seen_selectors.add(case.selector)
            seen_intents.add(case.intent)


@pytest.mark.parametrize("path", jit.HELDOUT_SETS.values(), ids=jit.HELDOUT_SETS.keys())
def test_data_checks_accept_the_expected_answer_and_reject_another(path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for item in data["intents"]:
        for call in item["calls"]:
            check = jit._data_check(call)
            obj = UvmObject(**{**(item.get("slots") or {}), **(call.get("slots_after") or {})})
            assert check(call["returns"], obj), (item["selector"], call)
            wrong = ["not", "this"] if call["returns"] != ["not", "this"] else 0
            assert not check(wrong, obj), (item["selector"], call)
