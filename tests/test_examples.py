"""Examples as hostile data, outputs in normal form, and the choice among drafts by agreement."""

from __future__ import annotations

import json
import logging

from prototypes import examples
from prototypes.examples import Candidate, Example, Observation


def _reply(*items: object) -> str:
    return json.dumps({"examples": list(items)})


def _ex(args: list, returns: object, **extra: object) -> dict:
    return {"args": args, "slots": {}, "returns": returns, "slots_after": {}, **extra}


def test_a_well_formed_reply_gives_its_examples() -> None:
    found, dropped = examples.parse_examples(
        "```json\n" + _reply(_ex([1], 2), _ex([0], 1, slots={"n": 3})) + "\n```", arity=1
    )
    assert dropped == []
    assert found == [Example((1,), 2), Example((0,), 1, {"n": 3})]


def test_hostile_examples_are_dropped_with_a_log_line_and_never_raise(caplog) -> None:
    deep: list = []
    for _ in range(20):
        deep = [deep]
    items = [
        _ex([1], 1),
        "not an object",
        _ex([1, 2], 3),  # wrong arity
        _ex(["x" * 5_000], 1),  # string too long
        _ex([list(range(1_000))], 0),  # too many values
        _ex([deep], 0),  # too deep
        _ex([1], 1, slots={"_p_oid": 1}),  # private slot
        {"args": [2]},  # no expected output
        _ex([1], 5),  # the same input again
        *[_ex([n], n) for n in range(2, 12)],  # more than MAX_EXAMPLES
    ]
    with caplog.at_level(logging.WARNING, logger="batos.examples"):
        found, dropped = examples.parse_examples(_reply(*items), arity=1)
    assert len(found) == examples.MAX_EXAMPLES and found[0] == Example((1,), 1)
    assert len(dropped) == len(items) - examples.MAX_EXAMPLES
    assert any("argument(s)" in d for d in dropped) and any("nested" in d for d in dropped)
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) == len(dropped)


def test_the_declared_intents_are_left_out_of_an_example_that_copies_them() -> None:
    reply = _reply(
        {"args": [], "slots_before": {"intents": {"f": "x"}, "n": 1}, "returns": 1},
        {"args": [2], "slots_before": {"intents": "x"}, "returns": 2, "slots_after": {}},
    )
    found, dropped = examples.parse_examples(reply)
    assert dropped == []
    assert found == [Example((), 1, {"n": 1}), Example((2,), 2)]


def test_unusable_replies_give_no_examples() -> None:
    for reply in (
        "I cannot do that",
        '{"examples": 3}',
        "[" * 100_000,
        '{"examples": [{"args": [' + "9" * 5_000 + '], "returns": 1}]}',
        '{"examples": [{"args": [NaN], "returns": 1}]}',
        '{"examples": [{"args": [1e400], "returns": 1}]}',
        "x" * (examples.MAX_REPLY_CHARS * 3),
    ):
        found, dropped = examples.parse_examples(reply, arity=1)
        assert found == [] or all(isinstance(e, Example) for e in found)
        assert found == [] and dropped


def test_outputs_compare_in_normal_form() -> None:
    n = examples.normal
    assert n((1, 2)) == [1, 2] and n({3, 1}) == [1, 3] and n(5.0) == 5
    assert n({1: "a"}) == {"1": "a"}
    assert examples.matches(0.33, n(1 / 3))  # an expected float read as rounded
    assert not examples.matches(0.34, n(1 / 3))
    assert not examples.matches(1, n(True)) and not examples.matches(True, n(1))
    assert examples.matches({"1": ["a"]}, n({1: ["a"]}))
    # Values no float can stand for fail their example; comparing them never raises.
    assert not examples.matches(1.5, n(2**1024 - 1)) and not examples.matches(0.5, n(-(2**5000)))
    assert not examples.matches(2**100, n(float("nan"))) and not examples.matches(1e308, n(2**1030))
    big: list = [0]
    for _ in range(30):
        big = [big, big]  # 2**30 leaves: compared by a digest, never expanded
    assert set(n(big)) == {"large"}


def _candidate(number: int, outputs: list[object]) -> Candidate:
    return Candidate(
        number,
        f"draft {number}",
        Observation(True, outputs[0]),
        [Observation(True, o) for o in outputs],
    )


def test_agreement_outweighs_a_wrong_example() -> None:
    shown = [Example((5,), 10), Example((0,), 0), Example((2,), 5)]  # the last one is wrong
    good_a, good_b = _candidate(1, [10, 0, 4]), _candidate(3, [10, 0, 4])
    lone = _candidate(2, [10, 0, 5])  # agrees with the wrong example, and with no draft
    choice = examples.choose([lone, good_a, good_b], shown)
    assert choice is not None and choice.candidate is good_a
    assert (choice.support, choice.passed, choice.failed) == (2, 2, (2,))


def test_a_lone_draft_that_passes_more_examples_wins() -> None:
    shown = [Example((1,), 1), Example((2,), 4)]
    choice = examples.choose([_candidate(1, [1, 3]), _candidate(2, [1, 4])], shown)
    assert choice is not None and choice.candidate.number == 2 and choice.failed == ()
    assert examples.choose([], shown) is None


def test_each_result_and_each_expected_slot_count_apart_in_the_choice() -> None:
    """Examples that get a counter's result wrong but say which slot the call changes still
    tell a draft that saves the slot from agreeing drafts that forget to."""
    shown = [  # a counter starting at n: returns the new count (the examples say the old one)
        Example((), n, {"visits": n}, {"visits": n + 1}) for n in (1, 2, 3)
    ]

    def counter(number: int, saves: bool) -> Candidate:
        seen = [Observation(True, n + 1, {"visits": n + 1 if saves else n}) for n in (1, 2, 3)]
        return Candidate(number, f"draft {number}", seen[0], seen)

    forgetful = [counter(1, False), counter(2, False)]
    right = counter(3, True)
    assert all(c.checks_passed(shown) == 0 for c in forgetful)
    assert right.checks_passed(shown) == 3
    choice = examples.choose([*forgetful, right], shown)
    assert choice is not None and choice.candidate is right
    # no example passes whole: the choice is still reported by examples passed
    assert (choice.support, choice.passed, choice.failed, choice.score) == (1, 0, (0, 1, 2), 3)
    # a draft that errors passes no check
    assert examples.checks_passed(shown[0], Observation(False, error="ValueError: x")) == 0


def test_a_reply_names_the_state_before_the_call_and_stored_examples_still_read() -> None:
    reply = _reply({"args": [], "slots_before": {"n": 1}, "returns": 2, "slots_after": {"n": 2}})
    found, dropped = examples.parse_examples(reply, 0)
    assert dropped == [] and found == [Example((), 2, {"n": 1}, {"n": 2})]
    stored = found[0].as_dict()
    assert examples.example_from(stored) == found[0]
    properties = examples.schema()["properties"]["examples"]["items"]["properties"]
    assert set(properties) == {"args", "slots_before", "returns", "slots_after"}


def test_the_schema_holds_args_to_the_call_s_arity_and_lets_returns_be_any_value() -> None:
    """Checked on llama.cpp's own grammar converter, which reads ``{}`` as "an object"."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    rules = dict(
        line.split(" ::= ", 1)
        for line in json_schema_to_gbnf(json.dumps(examples.schema(arity=2))).splitlines()
    )
    item = rules["examples-item-args"]
    assert item.count("examples-item-args-item") == 2 and "?" not in item
    returns = rules["examples-item-returns"]
    assert all(t in returns for t in ("string", "number", "boolean", "array", "null"))
    rules = dict(
        line.split(" ::= ", 1)
        for line in json_schema_to_gbnf(json.dumps(examples.schema())).splitlines()
    )
    assert "*" in rules["examples-item-args"]  # any number of arguments


def test_returns_wrapped_in_the_method_s_name_are_unwrapped_only_when_all_are() -> None:
    wrapped = _reply(_ex([3725], {"hms": "1:02:05"}), _ex([0], {"hms": "0:00:00"}))
    found, _ = examples.parse_examples(wrapped, arity=1, selector="hms")
    assert [e.returns for e in found] == ["1:02:05", "0:00:00"]
    # One example that is not wrapped: the method may really return {name: value}.
    mixed = _reply(_ex([1], {"hms": "x"}), _ex([2], "y"))
    found, _ = examples.parse_examples(mixed, arity=1, selector="hms")
    assert [e.returns for e in found] == [{"hms": "x"}, "y"]
    # Another key, or no selector given: as written.
    found, _ = examples.parse_examples(_reply(_ex([1], {"result": 2})), arity=1, selector="hms")
    assert found[0].returns == {"result": 2}
    found, _ = examples.parse_examples(wrapped, arity=1)
    assert found[0].returns == {"hms": "1:02:05"}


def test_the_examples_task_shows_the_call_and_slots_in_json_spelling() -> None:
    """A Python repr's quotes were copied into the JSON examples (``["a', 'b'], "]``)."""
    from persistent.list import PersistentList

    from graph.jit import examples_messages
    from prototypes.kernel import build_brief
    from prototypes.uvm import UvmObject

    obj = UvmObject(name="shelf", books=PersistentList(["Dune"]), tags={"x"}, on=True)
    brief = build_brief(obj, "add_all", (["a", "b"], None), {"sep": ", "})
    task = examples_messages(brief)[-1].content
    assert 'called as self.add_all(["a", "b"], null, sep=", ")' in task
    assert '"books": ["Dune"]' in task and '"on": true' in task and '"name": "shelf"' in task
    assert "\"tags\": {'x'}" in task  # not JSON: its bounded repr, not a guess
    assert "Its slots: (none)" in examples_messages(build_brief(UvmObject(), "f", (1,)))[-1].content


def test_json_text_is_bounded_and_spells_only_plain_data() -> None:
    from prototypes.kernel import BRIEF_VALUE_CHARS, json_text

    assert json_text((1, "x", {"k": [None, False, 2.5]})) == '[1, "x", {"k": [null, false, 2.5]}]'
    assert json_text({1: 2}) == "{1: 2}"  # a key JSON cannot hold
    assert json_text(float("nan")) == "nan"
    big = json_text(list(range(10_000)))
    assert len(big) <= BRIEF_VALUE_CHARS + 1 and not big.endswith("]")
    nested: list = []
    for _ in range(100):
        nested = [nested]
    assert json_text(nested).startswith("[[[")  # too deep: the bounded repr
    # Huge values are refused before they are copied or walked.
    assert json_text("x" * 10_000_000).startswith("'xxx") and len(json_text("y" * 10**6)) < 200
    assert len(json_text(10**100_000)) <= BRIEF_VALUE_CHARS + 1
    shared = [1] * 50
    assert not json_text([shared] * 10).endswith("]]")  # shared members count every visit
    assert json_text(dict.fromkeys(map(str, range(1_000_000)), 1)).startswith("{'0': 1")


def test_every_examples_shot_parses_and_holds_to_its_call() -> None:
    """The few-shot answers teach the format; each must be what the parser and schema accept."""
    import re

    from graph.jit import prompts

    for shot in prompts()["examples_shots"]:
        count = int(re.search(r"has (\d+) item", shot["task"]).group(1))
        found, dropped = examples.parse_examples(shot["answer"], count)
        assert len(found) == 4 and not dropped, shot["task"]
        keys = examples.schema()["properties"]["examples"]["items"]["required"]
        assert all(list(item) == keys for item in json.loads(shot["answer"])["examples"])
        assert all(len(e.args) == count for e in found)
