"""Selective installation: the trust verdict, the reviewer's log-likelihoods, the refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import ScriptedChatModel, image_digest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import BaseMessage, HumanMessage
from persistent.mapping import PersistentMapping
from test_jit import NO_EXAMPLES, _examples, _method

from batos import settings
from batos.errors import ConfigurationError, GraphRequestError, MissionFailed, ModelError
from bench import jit as bench_jit
from graph import jit
from graph.review import Reviewer, signature_of
from prototypes import trust
from prototypes.trust import Evidence, MethodUntrusted, Review
from prototypes.uvm import UvmObject
from store.core.image import LivingImage


@pytest.fixture
def image(memory_image: LivingImage) -> LivingImage:
    intents = PersistentMapping({"double": "Return twice x plus the bias slot."})
    memory_image.transact(
        lambda root: root.__setitem__("o", UvmObject(name="calc", bias=1, intents=intents))
    )
    return memory_image


class ReviewingModel(ScriptedChatModel):
    """A scripted author that also scores texts: the intent reads back well from code that
    doubles, badly from anything else, and moderately from the bare signature."""

    scored: list[tuple[str, str]] = []

    def loglikelihood(self, messages: list[BaseMessage], text: str) -> tuple[float, int]:
        shown = str(messages[-1].content)
        self.scored.append((shown, text))
        if text.startswith("```python"):  # p(code | intent)
            return -0.2 * 10, 10
        if "..." in shown:  # the signature alone
            return -2.0 * 5, 5
        return (-1.0 if "x * 2" in shown else -3.0) * 5, 5


# --- the verdict --------------------------------------------------------------------------


def test_unanimous_drafts_passing_their_examples_are_trusted_and_a_lone_one_is_not() -> None:
    strong = Evidence(support=3, drafts=3, examples=4, failed=0, groups=1)
    weak = Evidence(support=1, drafts=3, examples=4, failed=2, groups=3)
    assert trust.assess(strong, 0.5).trusted
    verdict = trust.assess(weak, 0.5)
    assert not verdict.trusted
    assert any("no two of the 3 drafts agree" in r for r in verdict.reasons)
    assert any("fails 2 of its 4 examples" in r for r in verdict.reasons)
    # With no threshold (jit_trust off) every chosen group is installed, as before.
    assert trust.assess(weak, None).trusted


def test_a_review_that_reads_back_another_intent_lowers_the_score() -> None:
    base = dict(support=3, drafts=3, examples=4, failed=0, groups=1)
    agrees = Evidence(**base, review=Review(-1.0, -2.0, -0.2))
    strays = Evidence(**base, review=Review(-2.5, -2.0, -0.2))
    assert trust.score(agrees) > trust.score(strays)
    verdict = trust.assess(strays, 0.5)
    assert not verdict.trusted
    assert any("does not make the intent any likelier" in r for r in verdict.reasons)
    record = verdict.as_dict()
    assert record["review"]["gain"] == -0.5 and record["trusted"] is False


@given(
    drafts=st.integers(1, 8),
    support=st.integers(1, 8),
    examples=st.integers(0, 6),
    failed=st.integers(0, 6),
    gain=st.none() | st.floats(-5, 5),
)
def test_the_score_is_a_share_and_grows_with_agreement_and_examples_passed(
    drafts: int, support: int, examples: int, failed: int, gain: float | None
) -> None:
    support, failed = min(support, drafts), min(failed, examples)
    review = None if gain is None else Review(-1.0 + gain, -1.0, -0.3)

    def value(support: int, failed: int) -> float:
        return trust.score(Evidence(support, drafts, examples, failed, 1, review))

    now = value(support, failed)
    assert 0.0 <= now <= 1.0
    if support < drafts:
        assert value(support + 1, failed) >= now
    if failed:
        assert value(support, failed - 1) >= now


def test_the_threshold_setting_reads_off_or_a_share(monkeypatch) -> None:
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    assert trust.threshold() is None
    monkeypatch.setenv("BATOS_JIT_TRUST", "0.35")
    assert trust.threshold() == 0.35
    for bad in ("1.5", "-0.1", "high"):
        monkeypatch.setenv("BATOS_JIT_TRUST", bad)
        with pytest.raises(ConfigurationError, match="BATOS_JIT_TRUST"):
            settings.get_str("jit_trust")


# --- the mission ----------------------------------------------------------------------------


def test_an_untrusted_method_is_refused_with_why_and_the_image_is_unchanged(image) -> None:
    before = image_digest(image.db)
    model = ScriptedChatModel().enqueue(
        _examples(([2], 5), ([0], 1), ([-3], -5)),
        _method("x + 3"),  # passes 2 → 5 only
        _method("1"),
        _method("x - 2"),
        _method("x + 4"),  # the second batch: still nobody agrees
        _method("x * 7"),
        _method("x + 8"),
        _method("x + 3"),  # the repair of the best draft changes nothing
    )
    runner = jit.JitRunner(model, drafts=3, trust=0.5)
    with pytest.raises(MethodUntrusted) as caught:
        image.transact(lambda root: runner.send(root["o"], "double", (2,)))
    assert isinstance(caught.value, MissionFailed)  # callers that catch a failure still do
    text = str(caught.value)
    assert "not trusted enough to install" in text and "image is unchanged" in text
    assert "agree" in text and "examples" in text and "hint:" in text
    assert image_digest(image.db) == before


def test_a_trusted_method_is_installed_with_its_verdict_and_review(image) -> None:
    model = ReviewingModel().enqueue(
        _examples(([2], 5), ([0], 1)),
        _method("x * 2 + self.bias"),
        _method("self.bias + x * 2"),
    )
    runner = jit.JitRunner(model, drafts=2, trust=0.3)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    with image.read() as root:
        verdict = root["o"]._methods["double"].audit["trust"]
    assert verdict["trusted"] and verdict["support"] == 2 and verdict["failed"] == 0
    assert verdict["review"]["gain"] == pytest.approx(1.0)
    assert verdict["review"]["code_given_intent"] == pytest.approx(-0.2)


def test_the_reviewer_keeps_a_method_that_reads_back_as_another_intent_out(image) -> None:
    model = ReviewingModel().enqueue(
        NO_EXAMPLES, _method("x + x + self.bias"), _method("self.bias + x + x")
    )
    # The drafts agree, but the reviewer reads "x + x" as less likely than the signature.
    runner = jit.JitRunner(model, drafts=2, trust=0.5)
    with pytest.raises(MethodUntrusted, match="no examples could be written"):
        image.transact(lambda root: runner.send(root["o"], "double", (2,)))


def test_with_the_gate_off_the_chosen_method_is_installed_as_before(image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    model = ScriptedChatModel().enqueue(NO_EXAMPLES, _method("x * 2 + self.bias"))
    runner = jit.JitRunner(model, drafts=1)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    with image.read() as root:
        assert root["o"]._methods["double"].audit["trust"]["review"] is None


def test_a_reviewer_that_cannot_score_costs_the_signal_not_the_mission() -> None:
    class Broken(ScriptedChatModel):
        def loglikelihood(self, messages: Any, text: str) -> tuple[float, int]:
            raise ModelError("the engine is gone", hint="restart it")

    reviewer = Reviewer(Broken(), "double", "Double x.", [HumanMessage("write it")])
    assert reviewer.review("def double(self, x):\n    return 2 * x\n") is None
    assert Reviewer(ScriptedChatModel(), "double", "Double x.", []).review("x") is None


def test_the_signature_leaves_the_body_out() -> None:
    source = "import math\ndef area(self, r: float) -> float:\n    return math.pi * r * r\n"
    assert signature_of(source, "area") == "def area(self, r: float) -> float:\n    ..."
    assert signature_of("garbage", "area") == "def area(self, *args):\n    ..."


# --- the engine's log-likelihood, on the test model ----------------------------------------


@pytest.fixture(scope="module")
def brick() -> Any:
    from batos.models import chat_model

    return chat_model("BRICK", temperature=0.0, num_predict=12, seed=1)


def test_the_greedy_reply_is_the_likeliest_and_scoring_changes_no_generation(brick) -> None:
    messages = [HumanMessage("What is the capital of France? Answer in one word.")]
    first = brick.invoke(messages).content
    total, count = brick.loglikelihood(messages, first)
    assert count > 0 and total < 0
    changed, _ = brick.loglikelihood(messages, first + " Banana banana.")
    assert changed < total
    assert brick.loglikelihood(messages, first) == (total, count)  # deterministic
    assert brick.invoke(messages).content == first  # the KV cache it left is consistent


def test_scoring_in_small_batches_gives_the_same_log_likelihood(brick, monkeypatch) -> None:
    from batos.models import engine

    messages = [HumanMessage("Write a sentence about rivers.")]
    text = "Rivers carry water from the mountains to the sea, shaping valleys on the way. " * 3
    whole = brick.loglikelihood(messages, text)
    monkeypatch.setattr(engine, "N_BATCH", 7)
    pieces = brick.loglikelihood(messages, text)
    assert pieces[1] == whole[1] and pieces[0] == pytest.approx(whole[0], abs=0.05)


def test_a_text_longer_than_the_context_is_refused_and_the_model_stays_usable(brick) -> None:
    messages = [HumanMessage("Say hi.")]
    with pytest.raises(ModelError, match="the context holds"):
        brick.loglikelihood(messages, "word " * 5000)
    assert brick.invoke(messages).content


# --- the bench's reading of recorded verdicts ------------------------------------------------


def _case(score: float | None, installed: bool, right: bool, drafts: list[bool]) -> dict:
    return {
        "verdicts": [] if score is None else [{"score": score}],
        "installed": installed,
        "solved_at": 1 if right else None,
        "first_drafts_right": drafts,
        "seconds": 10.0,
    }


def test_the_bench_applies_the_gate_to_recorded_verdicts() -> None:
    cases = [
        _case(0.9, True, True, [True, True, False]),
        _case(0.2, True, False, [False, False, False]),
        _case(0.6, True, True, [True, False, False]),
        _case(None, False, False, [False, False, False]),
    ]
    assert [bench_jit.gated(c, 0.5) for c in cases] == ["right", "refused", "right", "failed"]
    assert [bench_jit.gated(c, None) for c in cases] == ["right", "wrong", "right", "failed"]
    at = bench_jit.selective(cases, 0.5)
    assert (at["installed"], at["right"], at["refused"], at["precision"]) == (2, 2, 1, 1.0)
    assert at["drafts_pass@3"] == 0.5 and at["coverage_vs_pass@3"] == 1.0
    low, high = bench_jit.wilson(19, 20)
    assert 0.75 < low < 0.95 < high <= 1.0


# --- asking the user for one example ----------------------------------------------------------

ANSWER = {"args": [2], "returns": 5}


def _disagreeing() -> ScriptedChatModel:
    # Two drafts that disagree, no examples: nothing backs either one.
    return ScriptedChatModel().enqueue(NO_EXAMPLES, _method("x * 3"), _method("x * 2 + self.bias"))


def test_a_users_example_settles_the_choice_and_the_method_is_installed(image) -> None:
    asked: list[dict] = []

    def answer(question: dict) -> dict:
        asked.append(question)
        return ANSWER

    model = _disagreeing()
    runner = jit.JitRunner(model, drafts=2, trust=0.6, ask=answer)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    question = asked[0]
    assert question["kind"] == "example_needed" and question["call"] == "self.double(2)"
    assert question["intent"] == "Return twice x plus the bias slot."
    assert any("agree" in why for why in question["why"])
    with image.read() as root:
        method = root["o"]._methods["double"]
    assert "x * 2" in method.source  # the draft the example refuted is gone
    assert method.audit["trust"]["refuted"] == 1 and method.audit["trust"]["asked"] == 1
    assert model.calls == 3  # no more drafts were needed


def test_when_the_example_refutes_every_draft_new_ones_are_written_with_it(image) -> None:
    model = ScriptedChatModel().enqueue(
        NO_EXAMPLES, _method("x * 3"), _method("x * 4"), _method("2 * x + self.bias")
    )
    runner = jit.JitRunner(model, drafts=2, attempts=1, trust=0.6, ask=lambda q: ANSWER)
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    assert "The user says: self.double(2) must return 5." in model.history[-1][-1].content


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (None, "no example was given"),
        ("{not json", "the answer is not JSON"),
        ({"args": [1, 2], "returns": 3}, "2 argument(s) where the call has 1"),
        ("x" * 30_000, "over 20000 characters"),
        ("[" * 15_000, "the answer is not JSON: nested too deeply"),
        ('{"args": [NaN], "returns": 1}', "NaN is not a JSON value"),
        # JSON, but past an example's integers (128 bits), whatever its length: it said
        # "not JSON" from 101 digits on
        ('{"args": [1], "returns": ' + "9" * 40 + "}", "cannot be used: an integer over 128"),
        ('{"args": [1], "returns": ' + "9" * 101 + "}", "cannot be used: an integer of 101"),
    ],
)
def test_no_usable_answer_refuses_and_says_why(image, answer, why) -> None:
    before = image_digest(image.db)
    asked: list[dict] = []
    runner = jit.JitRunner(
        _disagreeing(), drafts=2, trust=0.6, ask=lambda q: asked.append(q) or answer
    )
    with pytest.raises(MethodUntrusted) as caught:
        image.transact(lambda root: runner.send(root["o"], "double", (2,)))
    assert why in str(caught.value)
    assert image_digest(image.db) == before
    # null refuses at once; an answer that cannot be used is asked for again, saying why
    assert len(asked) == (1 if answer is None else jit.ASKS)
    assert all(why in q["again"] for q in asked[1:])


def test_an_answer_with_a_typo_is_asked_for_again_and_the_next_one_used(image) -> None:
    answers = iter(['{"args": [2], "returns": 5', json.dumps(ANSWER)])
    asked: list[dict] = []
    runner = jit.JitRunner(
        _disagreeing(), drafts=2, trust=0.6, ask=lambda q: asked.append(q) or next(answers)
    )
    assert image.transact(lambda root: runner.send(root["o"], "double", (2,))) == 5
    assert len(asked) == 2 and "the answer is not JSON" in asked[1]["again"]


def _asking(conn: Any) -> jit.JitContext:
    """A live run context on ``conn`` whose drafts disagree, so the run asks the user."""
    return jit.JitContext(
        receiver=conn.root()["o"],
        args=(2,),
        model=_disagreeing(),
        drafts=2,
        trust=0.6,
        ask="interrupt",
    )


def test_the_graph_interrupts_and_resumes_with_the_users_example(image) -> None:
    """The Python API with a checkpointer: the run returns the interrupt, and resuming it
    with an example installs the method."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    graph = jit.build_graph(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t1"}}
    with image.connection() as conn:
        conn.transaction_manager.begin()
        live = _asking(conn)
        context = {jit.LIVE: live}
        paused = graph.invoke({"selector": "double"}, config, context=context)
        (pending,) = paused["__interrupt__"]
        assert pending.value["selector"] == "double" and "double" not in conn.root()["o"]._methods
        again = graph.invoke(Command(resume="{not json"), config, context=context)
        (pending,) = again["__interrupt__"]  # asked once more, not refused
        assert "the answer is not JSON" in pending.value["again"]
        done = graph.invoke(Command(resume=json.dumps(ANSWER)), config, context=context)
        assert done["status"] == "installed" and done["answer"] == {
            "args": [2],
            "returns": 5,
            "slots": {},
            "slots_after": {},
        }
        assert conn.root()["o"].double(4) == 9
        conn.transaction_manager.commit()


def test_the_bench_reads_a_run_that_asked() -> None:
    asked_right = {**_case(0.2, True, True, [False] * 3), "asked": True}
    asked_right["verdicts"].append({"score": 0.9, "trusted": True})
    refused = _case(0.1, False, False, [False] * 3)
    refused["verdicts"][0]["trusted"] = False
    cases = [asked_right, refused, _case(0.9, True, True, [True] * 3)]
    assert [bench_jit.asked_fate(c) for c in cases] == ["right", "refused", "right"]
    summary = bench_jit.with_asking(cases)
    assert (summary["asked"], summary["installed"], summary["precision"]) == (1, 2, 1.0)
    # Without asking, the first verdict under the threshold is where it would have stopped.
    assert bench_jit.selective(cases, 0.5)["installed"] == 1


@pytest.fixture
def served(file_uri, monkeypatch) -> Any:
    """(the JIT graph, its scripted model) as 'langgraph dev' runs it on the image at
    ``file_uri``: two disagreeing drafts of 'twice', so a run asks; the image each served run
    held is given back at the end."""
    from langgraph.checkpoint.memory import InMemorySaver

    from batos.shell.runtime import open_image
    from store.core.image import _SHARED as shared_images
    from store.core.image import release_shared

    open_image(file_uri, create=True).close()
    monkeypatch.setenv("BATOS_IMAGE", file_uri)
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "2")
    monkeypatch.setenv("BATOS_JIT_TRUST", "0.6")
    model = ScriptedChatModel().enqueue(
        NO_EXAMPLES,
        _method("x * 3").replace("double", "twice"),
        _method("x * 2").replace("double", "twice"),
    )
    monkeypatch.setattr(jit, "default_model_factory", lambda persona, **options: model)
    yield jit.build_graph(checkpointer=InMemorySaver()), model
    while file_uri in shared_images._open:
        release_shared(file_uri)


def test_a_served_run_interrupts_and_a_later_run_resumes_it_from_the_thread(
    file_uri, served
) -> None:
    """As under 'langgraph dev': the request names the receiver, the run stops at the
    question with nothing written, and the resuming run (a new request, no receiver in its
    context) rebuilds the mission from the thread's state, without calling the model."""
    from langgraph.types import Command

    from store.core.image import _SHARED as shared_images
    from store.core.image import acquire_shared

    graph, model = served
    config = {"configurable": {"thread_id": "served"}}
    paused = graph.invoke({"selector": "twice"}, config, context={"receiver": "brick", "args": [4]})
    assert paused["__interrupt__"][0].value["call"] == "self.twice(4)"
    assert file_uri not in shared_images._open  # a paused run holds no image
    with acquire_shared(file_uri).read() as root:
        assert "twice" not in root["objects"]["brick"]._methods
    calls = model.calls
    done = graph.invoke(Command(resume={"args": [3], "returns": 6}), config, context={})
    assert done["status"] == "installed" and model.calls == calls
    with acquire_shared(file_uri).read() as root:
        assert root["objects"]["brick"].twice(5) == 10
    # named in the history, to be found and undone (it was an empty description)
    [installed] = acquire_shared(file_uri).history(1)
    assert installed.description == "jit: BRICK.twice installed" and installed.user


def test_resumed_runs_left_behind_give_their_image_connections_back(
    file_uri, served, monkeypatch
) -> None:
    """A resumed served run whose run context is not a dict is kept by thread until it ends;
    one a client cancelled kept its image connection until its own thread resumed again."""
    from store.core.image import _SHARED as shared_images

    monkeypatch.setattr(jit, "MAX_ASKED", 2)
    monkeypatch.setattr(jit, "_RESUMED", {})
    state = {"selector": "twice", "drafted": [], "examples": []}
    left = []
    for n in range(4):
        live = jit._served({"receiver": "brick", "args": [4]}, state)
        left.append(jit._rebuilt(live, None, state, f"cancelled-{n}"))
    assert list(jit._RESUMED) == ["cancelled-2", "cancelled-3"]
    assert [live.connection is None for live in left] == [True, True, False, False]
    assert shared_images._open[shared_images._key(file_uri)][1] == 2  # one hold per live run
    for live in left[2:]:
        jit._finish_served(live, commit=False)


def test_a_served_runs_state_written_by_a_client_installs_nothing(file_uri, served) -> None:
    """A server's client can write any state of a JIT run (update_state) and resume it: the
    run rebuilt its mission from the state's drafts, so the client's own code, with an
    example it passes, was installed as the model's, trusted."""
    from langgraph.types import Command

    from store.core.image import _SHARED as shared_images
    from store.core.image import acquire_shared

    graph, model = served
    forged = _method("x * 100").replace("double", "twice")
    # 1. a thread that never asked anything, its state written to stand at a question
    config = {"configurable": {"thread_id": "forged"}}
    graph.update_state(
        config,
        {
            "selector": "twice",
            "attempt": 1,
            "decision": "ask",
            "status": "drafting",
            "examples": [],
            "request": {"receiver": "brick", "args": [3], "kwargs": {}},
            "drafted": [forged],
        },
        as_node="choose",
    )
    done = graph.invoke(None, config, context={})
    assert done["status"] == "failed" and "not asked by this server" in done["error"]
    assert "send the request again" in done["error"]
    # 2. a run that did ask: its drafts replaced by the client's before the answer
    config = {"configurable": {"thread_id": "asked"}}
    paused = graph.invoke({"selector": "twice"}, config, context={"receiver": "brick", "args": [4]})
    assert paused["__interrupt__"]
    graph.update_state(config, {"drafted": [forged]}, as_node="choose")
    done = graph.invoke(Command(resume={"args": [3], "returns": 300}), config, context={})
    assert done["status"] == "failed" and "not asked by this server" in done["error"]
    assert file_uri not in shared_images._open  # each run gave its image back
    with acquire_shared(file_uri).read() as root:
        assert "twice" not in root["objects"]["brick"]._methods


def test_a_state_that_names_a_refused_draft_for_install_installs_nothing(image) -> None:
    """The install step took the draft the run's state named: a client that could write the
    state (and reach a run's live mission) could send a refused draft to install."""
    from langgraph.checkpoint.memory import InMemorySaver

    graph = jit.build_graph(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "forged-install"}}
    with image.connection() as conn:
        conn.transaction_manager.begin()
        live = _asking(conn)
        context = {jit.LIVE: live}
        paused = graph.invoke({"selector": "double"}, config, context=context)
        assert paused["__interrupt__"]  # not trusted: the user is asked
        chosen = live.mission.choice.candidate.number
        graph.update_state(config, {"decision": "install", "chosen": chosen}, as_node="choose")
        with pytest.raises(GraphRequestError, match="did not choose and trust"):
            graph.invoke(None, config, context=context)
        assert "double" not in conn.root()["o"]._methods
        conn.transaction_manager.abort()
