"""The JIT graph with a scripted chat model, and end to end on the real test model."""

from __future__ import annotations

import itertools
import json
from typing import TypedDict

import pytest
from fakes import ScriptedChatModel, image_digest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from persistent.mapping import PersistentMapping

from batos.errors import MissionFailed
from graph import jit
from prototypes.uvm import UvmObject
from store.core.image import LivingImage

GOOD = "Here it is:\n```python\ndef double(self, x):\n    return x * 2 + self.bias\n```\n"
#: An examples reply with none: the drafts are then judged by agreement alone.
NO_EXAMPLES = '{"examples": []}'


@pytest.fixture(autouse=True)
def one_draft(monkeypatch):
    """One draft per first round unless a test asks for more (replies are scripted); the
    trust gate off: these tests are about choosing, tests/test_trust.py about trusting."""
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "1")
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")


@pytest.fixture
def image(memory_image: LivingImage) -> LivingImage:
    memory_image.transact(lambda root: root.__setitem__("o", UvmObject(name="calc", bias=1)))
    return memory_image


@pytest.fixture
def enabled():
    yield
    jit.disable()


def test_graph_is_exported_for_langgraph_json() -> None:
    assert set(jit.graph.get_graph().nodes) >= {
        "brief",
        "examples",
        "draft",
        "check",
        "choose",
        "install",
        "invoke",
        "fail",
    }


def test_a_reply_gives_only_its_imports_and_the_method() -> None:
    reply = (
        "Sure!\n```python\nimport math\n\ndef area(self, r):\n    return math.pi * r * r\n"
        "\nshape = Shape()\nprint(shape.area(2))\nif __name__ == '__main__':\n    run()\n```"
    )
    assert jit.extract_code(reply, "area") == (
        "import math\ndef area(self, r):\n    return math.pi * r * r\n"
    )
    # Without the method, or unparsable, the reply is left for the audit to judge.
    assert jit.extract_code("```python\nprint(1)\n```", "area") == "print(1)\n"
    assert jit.extract_code("```python\ndef area(self:\n```", "area") == "def area(self:\n"


def test_a_draft_gets_the_allowed_imports_it_forgot_and_nothing_else() -> None:
    source = "def f(self, text):\n    return collections.Counter(text.split())\n"
    assert jit.extract_code(source, "f") == "import collections\n" + source
    uses = "def f(self, xs):\n    d = defaultdict(int)\n    return math.fsum(xs), reduce, d\n"
    assert set(jit.with_imports(uses).splitlines()[:3]) == {
        "from collections import defaultdict",
        "import math",
        "from functools import reduce",
    }
    # Bound names are left alone: an import there, an argument, a local, an exception name.
    for bound in (
        "import math\ndef f(self):\n    return math.pi\n",
        "def f(self, math):\n    return math.pi\n",
        "def f(self):\n    string = 'a'\n    return string\n",
        "def f(self):\n    return [deque for deque in 'ab']\n",
        "def f(self):\n    return os.getcwd()\n",  # not an allowed module: the audit rejects it
        "def f(self:\n",  # not Python: the audit says where
    ):
        assert jit.with_imports(bound) == bound


def test_a_draft_that_changes_a_slot_in_place_gets_the_slot_assigned_back() -> None:
    source = (
        "def f(self, k, v):\n"
        "    items = self.items\n"
        "    items[k] = v  # aliased\n"
        "    self.log.append(k); self.n += 1\n"
        "    if k: self.other.append(1)\n"
        "    return self.stack.pop()\n"
    )
    assert jit.with_slots_assigned(source) == (
        "def f(self, k, v):\n"
        "    items = self.items\n"
        "    items[k] = v  # aliased\n"
        "    self.items = items\n"
        "    self.log.append(k); self.n += 1\n"
        "    self.log = self.log\n"
        "    if k: self.other.append(1)\n"
        "    return self.stack.pop()\n"
    )
    # A copy is not the slot; code without in-place changes, or not Python, is left alone.
    for alone in (
        "def f(self, x):\n    q = list(self.q)\n    q.append(x)\n    self.q = q\n",
        "def f(self, x):\n    return x\n",
        "def f(self:\n",
    ):
        assert jit.with_slots_assigned(alone) == alone


def test_an_in_place_slot_change_is_installed_and_survives_a_reload(tmp_path) -> None:
    """What a small model writes after being told the covenant, end to end in the sandbox."""
    in_place = (
        "```python\ndef enqueue(self, item):\n    if len(self.queue) >= 3:\n"
        "        return False\n    self.queue.append(item)\n    return True\n```"
    )
    uri = f"file://{tmp_path / 'q.fs'}"
    image = LivingImage.open(uri)
    try:
        image.transact(lambda root: root.__setitem__("q", UvmObject(queue=["a", "b"])))
        runner = jit.JitRunner(ScriptedChatModel().enqueue(NO_EXAMPLES, in_place))
        assert image.transact(lambda root: runner.send(root["q"], "enqueue", ("c",))) is True
        assert image.transact(lambda root: root["q"].enqueue("d")) is False
    finally:
        image.close()
    image = LivingImage.open(uri)
    try:
        with image.read() as root:
            assert list(root["q"].queue) == ["a", "b", "c"]
            assert "self.queue = self.queue" in root["q"]._methods["enqueue"].source
    finally:
        image.close()


def test_drafts_and_agreement_are_recorded_without_examples(image) -> None:
    model = ScriptedChatModel().enqueue(
        NO_EXAMPLES, _method("x * 2 + self.bias"), _method("x + x + self.bias")
    )
    runner = jit.JitRunner(model, drafts=2)
    assert image.transact(lambda root: runner.send(root["o"], "double", (5,))) == 11
    with image.read() as root:
        audit = root["o"]._methods["double"].audit
        assert audit["drafts"] == 2 and audit["agreement"] == 2


def test_unknown_message_is_written_installed_and_answered(image, enabled) -> None:
    model = ScriptedChatModel().enqueue(NO_EXAMPLES, GOOD)
    jit.enable(model)
    assert image.transact(lambda root: root["o"].double(5)) == 11
    assert model.calls == 2
    assert "Write 4 examples" in model.history[0][-1].content
    prompt = model.history[1][-1].content
    assert "self.double(5)" in prompt and "'bias': '1'" in prompt
    with image.read() as root:
        assert root["o"].double(2) == 5  # installed: no model call now


def test_retries_feed_findings_back_to_the_model(image, enabled) -> None:
    model = ScriptedChatModel().enqueue(
        NO_EXAMPLES, "```python\ndef double(self, x):\n    return self.__dict__\n```", GOOD
    )
    jit.enable(model, attempts=2)
    assert image.transact(lambda root: root["o"].double(1)) == 3
    retry_prompt = model.history[2][-1].content
    assert "rejected" in retry_prompt and "'__dict__'" in retry_prompt


def test_failure_raises_with_every_finding_and_changes_nothing(image, enabled) -> None:
    before = image_digest(image.db)
    model = ScriptedChatModel().enqueue(
        NO_EXAMPLES,
        "```python\nimport os\ndef double(self, x):\n    return os.getcwd()\n```",
        "```python\ndef double(self, x):\n    while True:\n        pass\n```",
    )
    jit.enable(model, attempts=2)
    with pytest.raises(MissionFailed) as caught:
        image.transact(lambda root: root["o"].double(1))
    text = caught.value.message
    assert "attempt 1 (audit)" in text and "'os'" in text
    assert "attempt 2 (trial)" in text and "time limit" in text
    assert image_digest(image.db) == before


async def test_async_entry_point(image) -> None:
    model = ScriptedChatModel().enqueue(NO_EXAMPLES, GOOD)
    with image.connection() as conn:
        conn.transaction_manager.begin()
        obj = conn.root()["o"]
        assert await jit.JitRunner(model).asend(obj, "double", (4,)) == 9
        conn.transaction_manager.commit()
    with image.read() as root:
        assert "double" in root["o"]._methods


def test_stateful_intent_from_the_slot(image, enabled) -> None:
    def setup(root):
        root["o"].intents = PersistentMapping(remember="Store x in the memo slot; return it.")
        root["o"].memo = []

    image.transact(setup)
    model = ScriptedChatModel().enqueue(
        NO_EXAMPLES,
        "```python\ndef remember(self, x):\n    memo = list(self.memo)\n    memo.append(x)\n"
        "    self.memo = memo\n    return memo\n```",
    )
    jit.enable(model)
    assert image.transact(lambda root: root["o"].remember("a")) == ["a"]
    assert "Store x in the memo slot" in model.history[1][-1].content
    with image.read() as root:
        assert root["o"].memo == ["a"]


@pytest.mark.model
@pytest.mark.slow
def test_end_to_end_on_the_real_model(image, monkeypatch) -> None:
    """The default model (Qwen2.5-Coder-1.5B, embedded) writes a facet method that runs.

    This runs on the default model rather than the 135M test model: SmolLM2-135M did not
    write one working method in 6 sampled drafts in our runs (wrong signatures, syntax
    errors, private attributes). Sampling with a new seed per draft makes retries differ, and
    an acceptance check turns a wrong result into fed-back findings. The second call checks
    the installed method anew.
    """
    monkeypatch.setenv("BATOS_MODEL", "default")
    pytest.importorskip("llama_cpp")
    from batos.models import chat_model

    seeds = itertools.count(1)

    def sampled(persona: str, **options):
        if "format" in options:  # the examples
            return chat_model(persona, **options)
        return chat_model(persona, temperature=0.8, seed=next(seeds), num_predict=200)

    def setup(root):
        root["o"].intents = PersistentMapping(add_one="Given a number x, return x + 1.")

    image.transact(setup)
    runner = jit.JitRunner(model_factory=sampled, attempts=6, acceptance=lambda r: r == 3)
    assert image.transact(lambda root: runner.send(root["o"], "add_one", (2,))) == 3
    with image.read() as root:
        assert root["o"].add_one(41) == 42
        assert root["o"]._methods["add_one"].audit["verdict"] == "approved"


# -- examples and agreement -------------------------------------------------------------------


def _examples(*pairs: tuple[list, object]) -> str:
    return json.dumps(
        {
            "examples": [
                {"args": args, "slots": {}, "returns": returns, "slots_after": {}}
                for args, returns in pairs
            ]
        }
    )


def _method(body: str) -> str:
    return f"```python\ndef double(self, x):\n    return {body}\n```"


def test_agreement_picks_the_majority_correct_draft_when_an_example_is_wrong(image) -> None:
    wrong_example = _examples(([5], 11), ([0], 1), ([2], 6))  # 2 → 6 is wrong: it is 5
    model = ScriptedChatModel().enqueue(
        wrong_example,
        _method("x * 3 + self.bias"),  # passes only the wrong example, and no draft agrees
        _method("x * 2 + self.bias"),
        _method("x + x + self.bias"),  # the same outputs as the draft before: they agree
    )
    runner = jit.JitRunner(model, drafts=3)
    assert image.transact(lambda root: runner.send(root["o"], "double", (5,))) == 11
    assert model.calls == 4  # no repair: two independent drafts outweigh one example
    assert all("Write 4 examples" not in m[-1].content for m in model.history[1:])
    with image.read() as root:
        method = root["o"]._methods["double"]
        assert "x * 2" in method.source
        assert [e["status"] for e in method.examples] == ["agreed", "agreed", "disputed"]
        assert method.audit["drafts"] == 3 and method.audit["agreement"] == 2
        assert method.audit["examples_check"]["passed"] == 2
        assert method.audit["mission_seconds"] > 0


def test_a_draft_failing_its_own_examples_is_repaired(image) -> None:
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5), ([0], 1), ([-3], -5)),
        _method("x + 3"),  # right for 2, wrong for 0 and -3
        _method("2 * x + self.bias"),
    )
    runner = jit.JitRunner(model, drafts=1)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    repair = model.history[2][-1].content
    assert "example self.double(0) should return 1, but it returned 3" in repair
    assert "example self.double(-3) should return -5, but it returned 0" in repair
    assert "return x + 3" in repair  # the draft it repairs
    with image.read() as root:
        method = root["o"]._methods["double"]
        assert method.audit["attempt"] == 2
        assert all(e["status"] == "agreed" for e in method.examples)


def test_a_repair_that_fixes_the_disputed_examples_beats_the_agreeing_drafts(image) -> None:
    """Three drafts agree on code two examples dispute; shown the dispute, the author fixes
    it without breaking the example they passed: the repair is installed, not the majority."""
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5), ([0], 1), ([-3], -5)),
        _method("x + 3"),
        _method("3 + x"),
        _method("x + 3"),
        _method("2 * x + self.bias"),
    )
    runner = jit.JitRunner(model, drafts=3)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    repair = model.history[4][-1].content
    assert "decide each one" in repair and "Disagreements:" in repair  # asked to judge
    with image.read() as root:
        method = root["o"]._methods["double"]
        assert "2 * x" in method.source and method.audit["attempt"] == 4
        assert all(e["status"] == "agreed" for e in method.examples)
        assert root["o"].double(-3) == -5


def test_drafts_that_all_disagree_and_fail_their_examples_bring_a_second_batch(image) -> None:
    """Three drafts, three answers, the best failing an example: nothing backs any of them, so
    three more independent drafts are drawn (no findings shown) and the choice is made again
    over all six; two of the new ones agree with the examples and win."""
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5), ([0], 1), ([-3], -5)),
        _method("x + 3"),  # passes 2 → 5 only
        _method("1"),  # passes 0 → 1 only
        _method("x - 2"),  # passes -3 → -5 only
        _method("2 * x + self.bias"),
        _method("x + 7"),
        _method("self.bias + x * 2"),
    )
    runner = jit.JitRunner(model, drafts=3)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    assert len(model.history) == 7  # examples, 3 drafts, 3 more drafts: no repair round
    for call in model.history[4:]:  # drafted afresh: nothing of the first batch is shown
        text = " ".join(str(m.content) for m in call)
        assert "x + 3" not in text and "should return" not in text
    with image.read() as root:
        method = root["o"]._methods["double"]
        assert "2 * x" in method.source or "x * 2" in method.source
        assert method.audit["drafts"] == 6 and method.audit["agreement"] == 2
        assert all(e["status"] == "agreed" for e in method.examples)


def test_the_second_batch_is_drawn_once_then_the_best_draft_is_repaired(image) -> None:
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5), ([0], 1), ([-3], -5)),
        _method("x + 3"),  # passes 2 → 5 only
        _method("1"),
        _method("x - 2"),  # second batch: still no two agree
        _method("x * 5 - 5"),
        _method("2 * x + self.bias"),  # the repair of the best draft
    )
    runner = jit.JitRunner(model, drafts=2, attempts=3)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    assert len(model.history) == 6
    assert "should return" in model.history[5][-1].content  # the repair is shown the failures
    with image.read() as root:
        assert "2 * x" in root["o"]._methods["double"].source


def test_a_lone_draft_of_a_one_draft_round_is_repaired_not_resampled(image) -> None:
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5), ([0], 1), ([-3], -5)),
        _method("x + 3"),
        _method("2 * x + self.bias"),
    )
    assert (
        image.transact(lambda root: jit.JitRunner(model, drafts=1).send(root["o"], "double", (2,)))
        == 5
    )
    assert "should return" in model.history[2][-1].content


def test_a_repair_that_breaks_a_passing_example_is_not_chosen(image) -> None:
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5), ([0], 1), ([-3], -5)),
        _method("x + 3"),  # passes 2 → 5 only
        _method("1"),  # passes 0 → 1 only: it trades one failure for another
    )
    runner = jit.JitRunner(model, drafts=1, attempts=2)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    with image.read() as root:
        method = root["o"]._methods["double"]
        assert "x + 3" in method.source
        assert [e["status"] for e in method.examples] == ["agreed", "disputed", "disputed"]


def test_a_draft_whose_value_cannot_be_compared_fails_and_the_mission_goes_on(image) -> None:
    # 2**1024 - 1 is past every float: comparing it with an expected 5.5 raised OverflowError,
    # which ended the whole mission instead of failing that one draft.
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5.5), ([0], 1.5)),
        _method("2 ** 1024 - 1"),
        _method("x * 2 + 1.5"),
    )
    runner = jit.JitRunner(model, drafts=2)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5.5
    with image.read() as root:
        method = root["o"]._methods["double"]
        assert "x * 2 + 1.5" in method.source and method.audit["examples_check"]["passed"] == 2


def test_hostile_examples_are_dropped_and_the_mission_goes_on(image, caplog) -> None:
    hostile = json.dumps(
        {
            "examples": [
                {"args": [1, 2, 3], "slots": {}, "returns": 0, "slots_after": {}},
                {"args": ["x" * 10_000], "slots": {}, "returns": 0, "slots_after": {}},
                {"args": [1], "slots": {"double": 1}, "returns": 0, "slots_after": {}},
                {"args": [[[[[[[[[[[1]]]]]]]]]]], "slots": {}, "returns": 0, "slots_after": {}},
                {"args": [3], "slots": {}, "returns": 7, "slots_after": {}},
            ]
        }
    )
    model = ScriptedChatModel().enqueue(hostile, GOOD)
    with caplog.at_level("WARNING", logger="batos.examples"):
        runner = jit.JitRunner(model, drafts=1)
        assert image.transact(lambda root: runner.send(root["o"], "double", (3,))) == 7
    assert len([r for r in caplog.records if "dropped" in r.getMessage()]) >= 3
    with image.read() as root:
        assert [e["args"] for e in root["o"]._methods["double"].examples] == [[3]]
    # Not even JSON: no examples, the draft is judged by the gate alone.
    model = ScriptedChatModel().enqueue("no examples today", GOOD.replace("double", "triple"))
    runner = jit.JitRunner(model, drafts=1)
    assert image.transact(lambda root: runner.send(root["o"], "triple", (1,))) == 3


def _install_with_examples(image: LivingImage) -> None:
    model = ScriptedChatModel().enqueue(_examples(([2], 5), ([0], 1)), GOOD)
    runner = jit.JitRunner(model, drafts=1)
    image.transact(lambda root: runner.send(root["o"], "double", (2,)))


def test_examples_run_again_when_the_source_changes(image) -> None:
    _install_with_examples(image)
    with image.read() as root:
        assert root["o"]._methods["double"].audit["examples_check"]["failed"] == []

    def edit(root):
        root["o"]._methods["double"].source = "def double(self, x):\n    return x * 3\n"
        return root["o"].double(1)  # compiled anew on this send: the examples run

    assert image.transact(edit) == 3
    with image.read() as root:
        check = root["o"]._methods["double"].audit["examples_check"]
    assert check["passed"] == 0 and len(check["failed"]) == 2
    assert "should return 5, but it returned 6" in check["failed"][0]


def test_examples_run_again_after_an_upgrade_and_on_a_hand_written_replacement(
    image, monkeypatch, tmp_path
) -> None:
    from prototypes import kernel

    _install_with_examples(image)
    with image.read() as root:
        first = root["o"]._methods["double"].audit["examples_check"]
    monkeypatch.setattr(kernel, "runtime_fingerprint", lambda: "a later release")
    image.db.cacheMinimize()  # as after a restart: the method is loaded and compiled again
    with image.connection() as conn:
        conn.transaction_manager.begin()
        assert conn.root()["o"].double(1) == 3
        check = conn.root()["o"]._methods["double"].audit["examples_check"]
        conn.transaction_manager.commit()
    assert check["runtime"] == "a later release" and check["checked"] > first["checked"]
    assert check["passed"] == 2
    # A hand-written replacement is held to the examples the method kept.
    report = image.transact(
        lambda root: kernel.add_method(
            root["o"], "double", "def double(self, x):\n    return x\n"
        ).audit["examples_check"]
    )
    assert report["passed"] == 0 and len(report["failed"]) == 2
    with image.read() as root:
        assert len(root["o"]._methods["double"].examples) == 2


@pytest.mark.model
def test_examples_and_drafts_on_the_test_model(image, monkeypatch) -> None:
    """The test model writes examples under the JSON schema (constrained decoding, so they
    parse) and sampled drafts; whatever it writes, the mission installs a method that passed
    the gate or fails leaving the image unchanged."""
    monkeypatch.setenv("BATOS_MODEL", "test")
    pytest.importorskip("llama_cpp")

    def setup(root):
        root["o"].intents = PersistentMapping(add_one="Given a number x, return x + 1.")

    image.transact(setup)
    before = image_digest(image.db)
    runner = jit.JitRunner(drafts=1, attempts=1)
    try:
        image.transact(lambda root: runner.send(root["o"], "add_one", (2,)))
    except MissionFailed:
        assert image_digest(image.db) == before
        return
    with image.read() as root:
        method = root["o"]._methods["add_one"]
        assert method.audit["verdict"] == "approved" and method.audit["drafts"] >= 1


def test_a_model_failing_to_write_examples_stops_nothing(image, caplog) -> None:
    from batos.errors import ModelError

    model = ScriptedChatModel().enqueue(ModelError("generation ran past its 600s timeout"), GOOD)
    with caplog.at_level("WARNING", logger="batos.jit"):
        runner = jit.JitRunner(model, drafts=1)
        assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    assert any("no examples for 'double'" in r.getMessage() for r in caplog.records)
    with image.read() as root:
        assert list(root["o"]._methods["double"].examples) == []


def test_the_first_draft_keeps_the_personas_sampling_and_the_others_are_sampled_apart(
    image,
) -> None:
    """The first draft of a round is the persona's own (its Modelfile's temperature); the
    others are sampled warmer with a seed each and no repetition penalty, so they differ
    without the penalty steering them off the names and values code repeats on purpose."""
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5), ([0], 1)),
        _method("x * 2 + self.bias"),
        _method("self.bias + x * 2"),
        _method("x + x + self.bias"),
    )
    options: list[dict] = []

    def factory(persona: str, **kw: object) -> ScriptedChatModel:
        options.append({"persona": persona, **kw})
        return model

    runner = jit.JitRunner(model_factory=factory, drafts=3)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    examples_call, first, *others = options
    assert examples_call["temperature"] == jit.EXAMPLES_TEMPERATURE and "format" in examples_call
    assert first == {"persona": "BRICK", "num_predict": jit.DRAFT_MAX_TOKENS}
    assert [o["seed"] for o in others] == [1001, 1002]
    for o in others:
        assert o["temperature"] == jit.SAMPLE_TEMPERATURE == 0.4
        assert o["repeat_penalty"] == jit.SAMPLE_REPEAT_PENALTY == 1.0


def test_a_mission_run_inside_another_graphs_node_writes_no_checkpoint_there(image) -> None:
    """A mind cycle writes a facet from inside a node: the mission must not borrow the cycle's
    checkpointer and leave its own steps in the cycle's thread."""

    class Outer(TypedDict, total=False):
        result: int

    def write(state: Outer) -> Outer:
        runner = jit.JitRunner(ScriptedChatModel().enqueue(NO_EXAMPLES, GOOD), drafts=1)
        with image.connection() as conn:  # never committed, as the mind's facets are
            return {"result": runner.send(conn.root()["o"], "double", (4,))}

    builder = StateGraph(Outer)
    builder.add_node("write", write)
    builder.add_edge(START, "write")
    builder.add_edge("write", END)
    saver = InMemorySaver()
    outer = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "outer"}}
    assert outer.invoke({}, config)["result"] == 9
    namespaces = {c.config["configurable"]["checkpoint_ns"] for c in saver.list(None)}
    assert namespaces == {""}
