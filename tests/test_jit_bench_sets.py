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
from graph import jit as graph_jit
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


def test_only_takes_known_selectors_of_the_chosen_set(monkeypatch, capsys) -> None:
    assert jit._selectors(" max_run_sum, babs_cite ,") == {"max_run_sum", "babs_cite"}
    with pytest.raises(Exception, match="at least one selector"):
        jit._selectors(" , ")
    # A name that is in another set, not the chosen one, stops before any model loads.
    monkeypatch.setattr(
        "sys.argv", ["jit.py", "--no-calls", "--set", "unseen7", "--only", "max_run_sum,record_lap"]
    )
    with pytest.raises(SystemExit) as stop:
        jit.main()
    assert stop.value.code == 2
    assert "no intent named record_lap in --set unseen7" in capsys.readouterr().err


def test_authors_are_named_as_the_setting_names_them(monkeypatch, capsys) -> None:
    assert jit._author_label("test") == "embedded:test"
    assert jit._author_label("ollama:qwen2.5-coder:7b") == "ollama:qwen2.5-coder:7b"
    assert jit._author_label("persona") == "persona" and jit._author_label(None) is None
    # A malformed author stops before any model loads.
    monkeypatch.setattr("sys.argv", ["jit.py", "--no-calls", "--author", "persona,vllm:coder"])
    with pytest.raises(SystemExit) as stop:
        jit.main()
    assert stop.value.code == 2
    assert "--author vllm:coder: BATOS_AUTHOR_MODEL='vllm:coder'" in capsys.readouterr().err


#: push_bounded (unseen11) written right, and right only on its first call.
PUSH_RIGHT = (
    "def push_bounded(self, item):\n    h = list(self.history) + [item]\n"
    "    dropped = h[: max(0, len(h) - self.limit)]\n    self.history = h[len(dropped):]\n"
    "    return dropped\n"
)
PUSH_FIRST_ONLY = (
    "def push_bounded(self, item):\n    self.history = self.history + [item]\n    return []\n"
)


def test_the_pool_diagnosis_counts_distinct_drafts_that_pass_both_calls() -> None:
    """A miss is read by how many of its gated drafts were right: each distinct source runs on
    a fresh receiver through the sandbox, on both of the case's calls."""
    from types import SimpleNamespace

    case = {c.selector: c for c in jit.heldout_cases(jit.UNSEEN11)}["push_bounded"]
    raises = "def push_bounded(self, item):\n    return self.missing\n"
    drafts = [PUSH_RIGHT, PUSH_FIRST_ONLY, raises, PUSH_RIGHT]  # the repeated source counts once
    mission = SimpleNamespace(candidates=[SimpleNamespace(source=s) for s in drafts])
    assert jit._pool(case, mission) == (3, 1)
    assert jit._pool(case, None) == (0, 0)


def test_the_ceiling_estimates_pass_at_k_from_checked_independent_drafts() -> None:
    """pass@k (the bound on any choice among k drafts) counts a draft right only when it
    passes both calls after the guardian and the sandbox; each draft is its own model call
    at the kernel's draft temperature with its own seed, on the kernel's first-round prompt."""
    from fakes import ScriptedChatModel

    from bench import jit_ceiling

    case = {c.selector: c for c in jit.heldout_cases(jit.UNSEEN11)}["push_bounded"]
    right, first_only = (f"```python\n{source}```" for source in (PUSH_RIGHT, PUSH_FIRST_ONLY))
    rejected = "```python\ndef push_bounded(self, item):\n    return self.__dict__\n```"
    model = ScriptedChatModel().enqueue(first_only, right, rejected, right)
    options: list[dict] = []

    def factory(persona: str, **kw: object) -> ScriptedChatModel:
        options.append({"persona": persona, **kw})
        return model

    row = jit_ceiling.sample_case(case, 4, factory)
    assert (row["n"], row["right"], row["distinct"]) == (4, 2, 3)
    assert [d["right"] for d in row["drafts"]] == [False, True, False, True]
    assert [o["seed"] for o in options] == [1000, 1001, 1002, 1003]
    assert {o["temperature"] for o in options} == {graph_jit.SAMPLE_TEMPERATURE}
    assert "push_bounded" in model.history[0][-1].content
    assert all(h == model.history[0] for h in model.history)
    # 2 of 4 right: one draft is right half the time, two drafts five times in six.
    assert jit_ceiling.pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert jit_ceiling.pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert jit_ceiling.pass_at_k(4, 0, 4) == 0.0
    with pytest.raises(ValueError):
        jit_ceiling.pass_at_k(4, 5, 1)
