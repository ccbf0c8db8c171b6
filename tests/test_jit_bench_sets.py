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
    return {
        "bench": jit.CASES,
        "heldout": jit.heldout_cases(jit.HELDOUT),
        "fresh": jit.heldout_cases(jit.FRESH),
        "unseen": jit.heldout_cases(jit.UNSEEN),
        "unseen2": jit.heldout_cases(jit.UNSEEN2),
        "unseen3": jit.heldout_cases(jit.UNSEEN3),
        "unseen4": jit.heldout_cases(jit.UNSEEN4),
        "unseen5": jit.heldout_cases(jit.UNSEEN5),
        "unseen6": jit.heldout_cases(jit.UNSEEN6),
        "unseen7": jit.heldout_cases(jit.UNSEEN7),
    }


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


@pytest.mark.parametrize(
    "path",
    [
        jit.HELDOUT,
        jit.FRESH,
        jit.UNSEEN,
        jit.UNSEEN2,
        jit.UNSEEN3,
        jit.UNSEEN4,
        jit.UNSEEN5,
        jit.UNSEEN6,
        jit.UNSEEN7,
    ],
    ids=[
        "heldout",
        "fresh",
        "unseen",
        "unseen2",
        "unseen3",
        "unseen4",
        "unseen5",
        "unseen6",
        "unseen7",
    ],
)
def test_data_checks_accept_the_expected_answer_and_reject_another(path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for item in data["intents"]:
        for call in item["calls"]:
            check = jit._data_check(call)
            obj = UvmObject(**{**(item.get("slots") or {}), **(call.get("slots_after") or {})})
            assert check(call["returns"], obj), (item["selector"], call)
            wrong = ["not", "this"] if call["returns"] != ["not", "this"] else 0
            assert not check(wrong, obj), (item["selector"], call)
