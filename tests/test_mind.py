"""The mind graph with a scripted model: every path through the PSM, and what reaches the image."""

from __future__ import annotations

import json
import operator
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from fakes import (
    FakeEmbedder,
    FakeModels,
    FakeRouter,
    ModelCall,
    a_dead_pid,
    call_kind,
    image_digest,
)
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from batos.errors import CheckpointError, GraphRequestError, MalformedCommit, MindError, ModelError
from batos.shell.runtime import ask, open_image
from graph import cycle, facets
from graph.answer import repetition
from graph.mind import MAX_ANSWER_CHARS, MindServices, build_graph, run_config
from graph.records import MAX_THREAD_ID_CHARS
from prototypes.codex import load_codex
from prototypes.incarnation import personas
from prototypes.uvm import Method
from store.checkpoint import effects
from store.checkpoint.saver import ZODBSaver
from store.core.image import LivingImage

REPO = Path(__file__).resolve().parents[1]

SELECTOR = re.compile(r"Write the method `(\w+)`")


def facet_source(selector: str, instruction: str | None = None) -> str:
    """A right facet method: the text and temperature its codex intent states (a selector
    the codex lacks: "Work on this: " and 0.2), or ``instruction`` as its text."""
    intents = {s: i for spec in load_codex().personas.values() for s, i in spec.intents.items()}
    text, temperature = facets.stated(intents.get(selector, ""))
    text = instruction if instruction is not None else (text or "Work on this: ")
    return (
        f"def {selector}(self, query):\n"
        f"    return {{'instruction': {text!r} + query, 'temperature': {temperature or 0.2}}}\n"
    )


def plan_of(*steps: tuple[str, str]) -> str:
    return json.dumps({"steps": [{"facet": f, "query": q} for f, q in steps]})


def responder(
    plan: str | Callable[[ModelCall], Any] = "",
    answer: str | Callable[[ModelCall], Any] = "",
    draft: Callable[[str], str] = facet_source,
    facet: Callable[[ModelCall], Any] | None = None,
) -> Callable[[ModelCall], Any]:
    """Replies by what a call is for; the answer echoes the request so the gate passes it."""

    def respond(call: ModelCall) -> Any:
        kind = call_kind(call)
        if kind == "plan":
            return plan(call) if callable(plan) else plan
        if kind == "draft":
            return "```python\n" + draft(SELECTOR.search(call.text).group(1)) + "```"
        if kind == "facet":
            if facet is not None:
                return facet(call)
            return f"{call.persona} notes on {call.text.splitlines()[0].split(': ', 1)[-1]}"
        if callable(answer):
            return answer(call)
        return answer or f"About {request_of(call)}: here is the answer."

    return respond


def request_of(call: ModelCall) -> str:
    found = re.search(r"Request: (.*)", call.text)
    return found.group(1) if found else call.text


@pytest.fixture
def image() -> Iterator[LivingImage]:
    living = open_image("memory://")
    yield living
    living.close()


def mind(models: FakeModels, router: FakeRouter | None = None, **extra: Any) -> MindServices:
    return MindServices(
        models=models, router=router or FakeRouter(), embedder=FakeEmbedder(), **extra
    )


def run(
    image: LivingImage,
    services: MindServices,
    text: Any,
    thread: str = "t1",
    **context: Any,
) -> dict[str, Any]:
    with ZODBSaver(image) as saver:
        graph = build_graph(services, checkpointer=saver)
        message = text if isinstance(text, HumanMessage) else HumanMessage(text)
        return graph.invoke({"messages": [message]}, run_config(thread), context=context)


def stable_digest(image: LivingImage) -> str:
    return image_digest(image.db, exclude=("checkpoints",))


def test_a_greeting_takes_the_fast_path_and_commits_with_its_checkpoint(image) -> None:
    models = FakeModels(responder(answer="Hello there, hello to you too!"))
    state = run(image, mind(models), "hello there")
    assert state["status"] == "COMPLETE"
    assert state["cycle"]["depth"] == {
        "mode": "fast",
        "rule": "1 persona, 2 words <= 12, no planning cue",
    }
    assert [call_kind(c) for c in models.calls] == ["answer"]
    assert state["messages"][-1].content == "Hello there, hello to you too!"
    assert state["plan"] == [] and state["partials"] == []
    assert state["commit"]["id"] == state["cycle"]["id"]
    with image.read() as root:
        record = cycle.get(root, state["cycle"]["id"])
        assert record["status"] == "COMPLETE" and record["personas"] == ["ROBIN"]
        assert record["depth"]["mode"] == "fast" and record["tokens"] == {"input": 0, "output": 0}
        request_vector, response_vector = cycle.vectors(root, state["cycle"]["id"])
        assert request_vector.shape == (384,) and response_vector.shape == (384,)
        assert personas(root)["ROBIN"].stats["cycles"] == 1
        assert personas(root)["ROBIN"].stats["invocations"] == 1
        memory = root["memory"][("mind", "exchanges")][state["cycle"]["id"]]
        assert memory.value["response"] == "Hello there, hello to you too!"
        assert effects.applied(root, state["cycle"]["id"])


def steps_plan() -> str:
    return plan_of(
        ("BRICK.facet_steps", "which steps build a shed"),
        ("BRICK.facet_design", "what design suits a small shed"),
    )


def test_a_full_cycle_folds_the_lead_s_own_steps_into_one_answer(image) -> None:
    """Facets written ahead of time serve the plan; the lead's steps become its answer's
    outline, so a one-persona plan costs the plan and the answer, no call per step."""
    install_facets(image, "BRICK", "facet_steps", "facet_design")
    models = FakeModels(responder(plan=steps_plan()))
    router = FakeRouter(("BRICK",))
    state = run(image, mind(models, router), "plan the steps to build a garden shed")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"]["rule"] == "planning cue 'plan'"
    assert [(p["persona"], p["facet"]) for p in state["plan"]] == [
        ("BRICK", "facet_steps"),
        ("BRICK", "facet_design"),
    ]
    assert [call_kind(c) for c in models.calls] == ["plan", "answer"]
    assert all(p["ok"] and p["kind"] == "instruction" for p in state["partials"])
    assert state["cycle"]["degraded"] == []
    plan_call = models.of("plan")[0]
    assert plan_call.options["format"]["properties"]["steps"]["maxItems"] == 4
    weave = models.of("answer")[0].text
    steps = "List the numbered steps that solve this, one short line each, at most six steps: "
    assert f"(not only its heading):\n1. {steps}which steps build a shed\n2. Describe" in weave
    assert state["cycle"]["plan_quality"]["final"] == {
        "steps": 2,
        "duplicates": 0,
        "off_request": 0,
    }
    with image.read() as root:
        record = cycle.get(root, state["cycle"]["id"])
        assert record["degraded"] == [] and record["truncated"] is False
        assert personas(root)["BRICK"].stats["facets"] == {"facet_steps": 1, "facet_design": 1}


def install_facets(image: LivingImage, persona: str, *selectors: str) -> None:
    from prototypes import kernel

    def install(root: Any) -> None:
        for selector in selectors:
            kernel.add_method(personas(root)[persona], selector, facet_source(selector))

    image.transact(install)


def test_a_facet_not_written_yet_hands_its_part_to_the_persona(image) -> None:
    """No user request pays for writing a facet: a missing one falls back at once, and the
    reason is recorded; nothing is drafted and nothing is installed."""
    models = FakeModels(responder(plan=steps_plan()))
    state = run(image, mind(models, FakeRouter(("BRICK",))), "plan the steps to build a shed")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert models.of("draft") == []
    weave = models.of("answer")[0].text
    assert "1. which steps build a shed\n2. what design suits a small shed" in weave
    degraded = state["cycle"]["degraded"]
    assert [(d["where"], d["what"]) for d in degraded] == [
        ("facet", "BRICK.facet_steps"),
        ("facet", "BRICK.facet_design"),
    ]
    assert all(d["reason"] == "its method is not written yet" for d in degraded)
    with image.read() as root:
        assert "facet_steps" not in personas(root)["BRICK"]._slots()
        assert cycle.get(root, state["cycle"]["id"])["degraded"] == degraded


def test_one_facet_missing_for_several_steps_is_one_degradation_with_a_count(image) -> None:
    """The record says what went wrong once, not once per plan step that used the facet."""
    plan = plan_of(
        ("BRICK.facet_steps", "painting the fence"),
        ("BRICK.facet_steps", "fixing the gate"),
        ("BRICK.facet_design", "a gate that lasts"),
    )
    models = FakeModels(responder(plan=plan))
    state = run(
        image,
        mind(models, FakeRouter(("BRICK",))),
        "list the steps to paint the fence and fix the gate",
    )
    assert state["status"] == "COMPLETE", state.get("failure")
    assert all(p["degraded"] == "its method is not written yet" for p in state["partials"])
    reason = "its method is not written yet"
    assert state["cycle"]["degraded"] == [
        {"where": "facet", "what": "BRICK.facet_steps", "reason": reason, "times": 2},
        {"where": "facet", "what": "BRICK.facet_design", "reason": reason},
    ]
    with image.read() as root:
        assert cycle.get(root, state["cycle"]["id"])["degraded"] == state["cycle"]["degraded"]


def test_inline_writing_writes_each_facet_once_on_sample_questions(image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_MIND_WRITE_FACETS", "inline")
    request = "plan the steps to build a garden shed"
    models = FakeModels(responder(plan=steps_plan()))
    state = run(image, mind(models, FakeRouter(("BRICK",))), request)
    assert state["status"] == "COMPLETE", state.get("failure")
    drafts = models.of("draft")
    assert len(drafts) == 2
    # The author never sees the user's request or sub-queries, only a neutral sample.
    assert all("shed" not in d.text and "vegetable patch" in d.text for d in drafts)
    assert all(p["wrote"] for p in state["partials"])
    with image.read() as root:
        brick = personas(root)["BRICK"]
        assert isinstance(brick._slots()["facet_steps"], Method)
        assert brick.facet_steps("x") == {
            "instruction": "List the numbered steps that solve this, one short line each, at most "
            "six steps: x",
            "temperature": 0.2,
        }
        assert sorted(cycle.get(root, state["cycle"]["id"])["methods_written"]) == [
            "BRICK.facet_design",
            "BRICK.facet_steps",
        ]
    again = FakeModels(responder(plan=steps_plan()))
    state = run(image, mind(again, FakeRouter(("BRICK",))), "plan a bigger shed", thread="t2")
    assert state["status"] == "COMPLETE"
    assert again.of("draft") == [] and not any(p["wrote"] for p in state["partials"])


def test_two_branches_wanting_one_missing_facet_write_it_once(image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_MIND_WRITE_FACETS", "inline")
    plan = plan_of(
        ("BRICK.facet_steps", "painting the fence"), ("BRICK.facet_steps", "fixing the gate")
    )
    models = FakeModels(responder(plan=plan))
    state = run(
        image,
        mind(models, FakeRouter(("BRICK",))),
        "list the steps to paint the fence and fix the gate",
    )
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(models.of("draft")) == 1
    installs = [e for e in state["commit"]["effects"] if e["kind"] == "install_method"]
    assert [e["selector"] for e in installs] == ["facet_steps"]


def test_a_facet_that_cannot_be_written_falls_back_once_for_every_branch(
    image, monkeypatch
) -> None:
    """The first branch's failure is the others' answer: no second attempt on the user's
    clock, each part answered by the persona directly, the image unchanged but for the cycle."""
    monkeypatch.setenv("BATOS_MIND_WRITE_FACETS", "inline")
    bad = "def facet_steps(self, query):\n    import os\n    return os.getcwd()\n"
    plan = plan_of(
        ("BRICK.facet_steps", "painting the fence"), ("BRICK.facet_steps", "fixing the gate")
    )
    models = FakeModels(responder(plan=plan, draft=lambda selector: bad))
    state = run(
        image,
        mind(models, FakeRouter(("BRICK",))),
        "list the steps to paint the fence and fix the gate",
    )
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(models.of("draft")) == 3  # one mission: the attempts of one branch
    assert all("could not be written" in p["degraded"] for p in state["partials"])
    assert "1. painting the fence\n2. fixing the gate" in models.of("answer")[0].text
    with image.read() as root:
        assert "facet_steps" not in personas(root)["BRICK"]._slots()


def test_a_facet_that_raises_falls_back_to_its_persona(image) -> None:
    from prototypes import kernel

    def install(root: Any) -> None:
        source = "def facet_steps(self, query):\n    return 1 / 0\n"
        kernel.add_method(personas(root)["BRICK"], "facet_steps", source)

    image.transact(install)
    models = FakeModels(responder(plan=steps_plan()))
    state = run(image, mind(models, FakeRouter(("BRICK",))), "plan the steps to build a shed")
    assert state["status"] == "COMPLETE", state.get("failure")
    [steps] = [p for p in state["partials"] if p["facet"] == "facet_steps"]
    assert "facet BRICK.facet_steps failed" in steps["degraded"]
    assert "ZeroDivisionError" in state["cycle"]["degraded"][0]["reason"] or steps["degraded"]


def test_other_personas_notes_run_in_parallel_branches(image) -> None:
    barrier = threading.Barrier(2, timeout=20)

    def facet(call: ModelCall) -> str:
        barrier.wait()  # both branches must be in their model call at once
        return f"{call.persona} was here"

    plan = plan_of(
        ("ROBIN.facet_feelings", "what hurts in losing"), ("ROBIN.facet_meaning", "why losing")
    )
    models = FakeModels(responder(plan=plan, facet=facet))
    router = FakeRouter(("BRICK", "ROBIN"))
    state = run(image, mind(models, router), "explain why losing a game hurts so much")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert [p["text"] for p in state["partials"]] == ["ROBIN was here"] * 2
    assert all(p["kind"] == "note" for p in state["partials"])
    assert models.made.count(("ROBIN", {"num_predict": 160})) == 2


def test_several_personas_are_woven_by_the_lead(image) -> None:
    plan = plan_of(
        ("BRICK.facet_steps", "how to move house"),
        ("ROBIN.facet_feelings", "the sadness of moving"),
    )
    models = FakeModels(responder(plan=plan))
    router = FakeRouter(("BRICK", "ROBIN"))
    state = run(image, mind(models, router), "I am sad about moving house, help me do it")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"]["rule"] == "2 personas routed: their answers are woven"
    assert state["route"]["chosen"] == ["BRICK", "ROBIN"]
    weave = models.of("answer")[0]
    assert weave.persona == "BRICK"
    assert "Notes from ROBIN (facet_feelings):\nROBIN notes on" in weave.text
    assert "how to move house" in weave.text  # BRICK's own step, in its outline
    assert [p["kind"] for p in sorted(state["partials"], key=lambda p: p["index"])] == [
        "instruction",
        "note",
    ]
    assert state["messages"][-1].name == "brick"
    with image.read() as root:
        record = cycle.get(root, state["cycle"]["id"])
        assert record["personas"] == ["BRICK", "ROBIN"]
        assert personas(root)["ROBIN"].stats["facets"] == {"facet_feelings": 1}


def test_an_unparseable_plan_is_retried_once(image) -> None:
    good = plan_of(
        ("ROBIN.facet_meaning", "why my garden matters"), ("ROBIN.facet_feelings", "garden joy")
    )
    replies = iter(["not json at all", good])
    models = FakeModels(responder(plan=lambda call: next(replies)))
    state = run(image, mind(models), "explain why my garden matters to me")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["plan_attempts"] == 2
    retry = models.of("plan")[1]
    assert "rejected: the reply is not JSON" in retry.text


def test_a_plan_of_one_step_is_the_fast_path(image) -> None:
    models = FakeModels(responder(plan=plan_of(("ROBIN.facet_meaning", "why my garden matters"))))
    state = run(image, mind(models), "explain why my garden matters to me")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"] == {"mode": "fast", "rule": "the plan has one step"}
    assert state["partials"] == [] and [call_kind(c) for c in models.calls] == ["plan", "answer"]
    assert models.of("answer")[0].text == "explain why my garden matters to me"


def test_generic_and_repeated_sub_queries_do_not_make_a_plan(image) -> None:
    generic = plan_of(
        ("ROBIN.facet_meaning", "What is the first step?"),
        ("ROBIN.facet_feelings", "Why do you need to know this?"),
    )
    good = plan_of(
        ("ROBIN.facet_meaning", "why gardens calm people"),
        ("ROBIN.facet_feelings", "why gardens calm people down"),  # a near-duplicate
        ("ROBIN.facet_feelings", "the worry about my garden failing"),
    )
    replies = iter([generic, good])
    models = FakeModels(responder(plan=lambda call: next(replies)))
    state = run(image, mind(models), "explain why my garden calms me and why I worry about it")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert "no step names anything from the request" in models.of("plan")[1].text
    assert [p["query"] for p in state["plan"]] == [
        "why gardens calm people",
        "the worry about my garden failing",
    ]
    quality = state["cycle"]["plan_quality"]
    assert quality["raw"] == {"steps": 3, "duplicates": 1, "off_request": 0}
    assert quality["final"] == {"steps": 2, "duplicates": 0, "off_request": 0}


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        json.dumps({"steps": []}),
        plan_of(("BRICK.facet_steps", "a facet of a persona not routed")),
        plan_of(*[("ROBIN.facet_meaning", f"q{i}") for i in range(5)]),
        plan_of(("ROBIN.facet_nonexistent", "q")),
    ],
)
def test_a_plan_rejected_twice_becomes_the_fast_path(image, bad: str) -> None:
    models = FakeModels(responder(plan=bad))
    state = run(image, mind(models), "explain why the sky is blue")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"] == {"mode": "fast", "rule": "the plan failed twice"}
    [degraded] = state["cycle"]["degraded"]
    assert degraded["where"] == "plan" and "rejected twice" in degraded["reason"]
    assert len(models.of("plan")) == 2 and len(models.of("answer")) == 1
    assert models.of("answer")[0].text == "explain why the sky is blue"


_LOOP = " ".join(
    f"A {kite} kite is easy to fly because it has a light frame and a long tail."
    for kite in ("delta", "box", "diamond", "sled", "parafoil")
)


def test_repetition_is_the_share_of_phrases_said_before() -> None:
    assert repetition(_LOOP) > 0.5
    assert repetition("I hear you. " * 20) > 0.9
    steps = (
        "Step 1: open the file in your editor. Step 2: read the file line by line. "
        "Step 3: close the file when you are done. Step 4: check the size of the file."
    )
    assert repetition(steps) == 0.0
    # Short answers repeat by chance: a refrain of a few words is not a loop.
    assert repetition("Yes. Yes. Yes. Yes.") == 0.0


def test_the_repetition_check_can_be_turned_off(image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_MIND_REPETITION", "1")
    models = FakeModels(responder(answer=lambda call: "How to fly my kite: " + _LOOP))
    state = run(image, mind(models), "how do I fly my kite", depth="fast")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["gate"]["repetition"] > 0.5


def test_the_gate_retries_synthesis_once(image) -> None:
    answers = iter(["Bananas are yellow.", "Your kite question: fly the kite upwind."])
    models = FakeModels(responder(answer=lambda call: next(answers)))
    state = run(image, mind(models), "how do I fly my kite", depth="fast")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["synthesis_attempts"] == 2
    second = models.of("answer")[1]
    assert "relevance" in second.text and second.options["temperature"] == 0.3
    assert state["response"].startswith("Your kite question")


@pytest.mark.parametrize(
    ("answers", "reason"),
    [
        (["Bananas are yellow.", "Bananas are yellow."], "relevance"),
        (["I'm sorry, but I can't help with kites."] * 2, "refusal"),
        ([_LOOP] * 2, "repeats itself"),
    ],
)
def test_an_answer_failing_the_gate_twice_is_given_and_marked(image, answers, reason) -> None:
    replies = iter(answers)
    models = FakeModels(responder(answer=lambda call: next(replies)))
    state = run(image, mind(models), "how do I fly my kite", depth="fast")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["response"] == answers[1].strip()
    assert state["cycle"]["gate"]["passed"] is False and reason in state["cycle"]["gate"]["reason"]
    [degraded] = state["cycle"]["degraded"]
    assert degraded["where"] == "gate" and reason in degraded["reason"]


def test_an_over_long_answer_failing_twice_is_cut_at_a_sentence(image) -> None:
    long = "Fly the kite upwind and let the line out slowly. " * 400
    models = FakeModels(responder(answer=lambda call: long))
    state = run(image, mind(models), "how do I fly my kite", depth="fast")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(state["response"]) <= MAX_ANSWER_CHARS
    assert state["response"].endswith("slowly.")


def test_an_empty_answer_twice_fails_the_cycle_and_changes_nothing(image) -> None:
    run(image, mind(FakeModels(responder())), "hi")
    before = stable_digest(image)
    replies = iter(["", "   "])
    models = FakeModels(responder(answer=lambda call: next(replies)))
    state = run(image, mind(models), "how do I fly my kite", thread="t2", depth="fast")
    assert state["status"] == "FAILED"
    assert state["failure"]["node"] == "gate" and "empty" in state["failure"]["reason"]
    assert stable_digest(image) == before


def test_an_answer_that_ran_out_of_tokens_ends_at_its_last_sentence(image) -> None:
    cut = AIMessage(
        "Fly the kite upwind. Let the line out slowly. 8. Stop when you have lear",
        response_metadata={"finish_reason": "length"},
    )
    models = FakeModels(responder(answer=lambda call: cut))
    state = run(image, mind(models), "how do I fly my kite", depth="fast")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["response"] == "Fly the kite upwind. Let the line out slowly."
    assert state["cycle"]["truncated"] is True
    with image.read() as root:
        assert cycle.get(root, state["cycle"]["id"])["truncated"] is True


@pytest.mark.parametrize(
    ("message", "context", "reason"),
    [
        ("", {}, "empty"),
        ("   \n\t ", {}, "empty"),
        ("x" * 4001, {}, "4,001 characters"),
        (
            HumanMessage(content=[{"type": "image_url", "image_url": {"url": "data:,"}}]),
            {},
            "non-text",
        ),
        ("hello", {"persona": "JOKER"}, "unknown persona 'JOKER'"),
    ],
)
def test_bad_input_fails_at_route_and_changes_nothing(image, message, context, reason) -> None:
    run(image, mind(FakeModels(responder())), "hi")
    before = stable_digest(image)
    models = FakeModels(responder())
    state = run(image, mind(models), message, thread="t2", **context)
    assert state["status"] == "FAILED" and state["failure"]["node"] == "route"
    assert reason in state["failure"]["reason"]
    assert models.calls == []
    assert stable_digest(image) == before
    # the thread is idle and answers its next request
    state = run(image, mind(FakeModels(responder())), "hello", thread="t2")
    assert state["status"] == "COMPLETE"


def test_a_forced_persona_and_depth_are_honoured(image) -> None:
    router = FakeRouter(("ROBIN",))
    models = FakeModels(responder())
    state = run(image, mind(models, router), "explain the plan", persona="alfred", depth="fast")
    assert state["status"] == "COMPLETE"
    assert state["route"] == {"ranked": [["ALFRED", 1.0]], "chosen": ["ALFRED"], "forced": True}
    assert router.routed == [] and models.calls[0].persona == "ALFRED"


def test_a_malformed_thread_id_is_refused(image) -> None:
    for thread in ("../etc/passwd", "kitchen\n", "kitchen\n\n"):  # not another 'kitchen'
        with pytest.raises(MindError, match="thread id"):
            run_config(thread)
    with pytest.raises(MindError, match="thread id"):
        ask("hi", thread_id="", image=image, services=mind(FakeModels(responder())))


def test_a_thread_id_its_effects_cannot_name_fails_at_route_before_the_answer(image) -> None:
    # A graph client passes its own config: an id the commit's effects refuse used to be
    # answered and then lose its commit
    before = stable_digest(image)
    for thread, reason in (
        ("y" * 300, "is 300 characters long"),
        ("a\ud800b", "is malformed"),
        ("kitchen sink", "is malformed"),
    ):
        models = FakeModels(responder())
        with ZODBSaver(image) as saver:
            graph = build_graph(mind(models), checkpointer=saver)
            config = {"configurable": {"thread_id": thread}, "recursion_limit": 40}
            state = graph.invoke({"messages": [HumanMessage("hello there")]}, config)
        assert state["status"] == "FAILED" and state["failure"]["node"] == "route"
        assert reason in state["failure"]["reason"] and models.calls == []
    assert stable_digest(image) == before
    longest = "t" * MAX_THREAD_ID_CHARS  # the longest id accepted: its lesson is committed
    assert run(image, mind(FakeModels(responder())), "hello there", thread=longest)["status"] == (
        "COMPLETE"
    )


def _boom(call: ModelCall) -> Any:
    return ModelError("the backend died mid-cycle", hint="restart it")


@pytest.mark.parametrize("where", ["router", "plan", "facet", "embed"])
def test_a_part_that_fails_degrades_the_answer_not_the_request(image, where) -> None:
    """The router, the plan, another persona's note and the gate's embedding may each fail:
    the answer is still given, and what failed is recorded."""

    def respond(call: ModelCall) -> Any:
        if call_kind(call) == where:
            return _boom(call)
        return responder(
            plan=plan_of(
                ("ROBIN.facet_meaning", "why the tide turns"), ("BRICK.facet_steps", "tide tables")
            )
        )(call)

    class Failing(FakeEmbedder):  # the request's vector is the router's: this embeds answers
        def encode(self, texts):
            if where == "embed":
                raise ModelError("the embedding model died")
            return super().encode(texts)

    class BrokenRouter(FakeRouter):
        def route(self, text):
            raise ModelError("the router died")

    router = BrokenRouter() if where == "router" else FakeRouter(("ROBIN", "BRICK"))
    services = MindServices(models=FakeModels(respond), router=router, embedder=Failing())
    state = run(image, services, "explain why the tide turns", thread="t2")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["response"].startswith("About explain why the tide turns")
    assert any("died" in d["reason"] for d in state["cycle"]["degraded"]), state["cycle"]


@pytest.mark.parametrize(("where", "node"), [("answer", "synthesize")])
def test_without_a_model_to_answer_the_cycle_fails_and_changes_nothing(image, where, node) -> None:
    run(image, mind(FakeModels(responder())), "hi")
    before = stable_digest(image)

    def respond(call: ModelCall) -> Any:
        if call_kind(call) == where:
            return _boom(call)
        return responder(plan=plan_of(("ROBIN.facet_meaning", "why the tide turns")))(call)

    state = run(image, mind(FakeModels(respond)), "explain why the tide turns", thread="t2")
    assert state["status"] == "FAILED"
    assert state["failure"]["node"] == node, state["failure"]
    assert "died" in state["failure"]["reason"]
    assert state["messages"][-1].additional_kwargs["batos_failed"] is True
    assert stable_digest(image) == before


def test_a_commit_the_image_refuses_leaves_nothing(image) -> None:
    run(image, mind(FakeModels(responder())), "hi")
    before = stable_digest(image)
    plan = plan_of(("ROBIN.facet_meaning", "why"))
    models = FakeModels(responder(plan=plan))
    with ZODBSaver(image) as saver:
        graph = build_graph(mind(models), checkpointer=saver)
        config = run_config("t2")

        def tamper(state):  # a method the guardian refuses, smuggled into the effects
            bad = "def facet_meaning(self, query):\n    return self.__class__\n"
            return {
                "effects": [
                    {
                        "kind": "install_method",
                        "persona": "ROBIN",
                        "selector": "facet_meaning",
                        "source": bad,
                    }
                ]
            }

        graph.invoke({"messages": [HumanMessage("hello")]}, config, interrupt_before=["gate"])
        graph.update_state(config, tamper(None), as_node="synthesize")
        with pytest.raises(Exception, match="__class__"):
            graph.invoke(None, config)
    assert stable_digest(image) == before


def test_without_a_zodb_saver_the_cycle_commits_its_own_transaction(file_uri) -> None:
    models = FakeModels(responder())
    with open_image(file_uri, create=True) as image:
        graph = build_graph(mind(models, image=image), checkpointer=InMemorySaver())
        state = graph.invoke({"messages": [HumanMessage("hello")]}, run_config("mem"))
        assert state["status"] == "COMPLETE"
        with image.read() as root:
            assert cycle.get(root, state["cycle"]["id"])["status"] == "COMPLETE"
        assert image.history(1)[0].description.startswith(f"mind cycle {state['cycle']['id']}")


def test_state_a_client_writes_into_list_and_commit_channels_is_refused_with_its_reason(
    image,
) -> None:
    # update_state from a server's client: a number in a list channel failed with a bare
    # TypeError, a string was added as its characters, and a malformed commit raised a
    # CheckpointError the server hid behind "Internal Server Error" (it shows ValueErrors).
    from store.checkpoint.saver import ZODBSaver

    with ZODBSaver(image) as saver:
        graph = build_graph(mind(FakeModels(responder())), checkpointer=saver)
        config = run_config("edited")
        graph.invoke({"messages": [HumanMessage("hello")]}, config)
        before = graph.get_state(config).values
        for values in ({"partials": 5}, {"effects": "x"}, {"metrics": {"replace": 7}}):
            with pytest.raises(GraphRequestError, match="not a list of objects") as refused:
                graph.update_state(config, values, as_node="gate")
            assert isinstance(refused.value, ValueError) and refused.value.hint
        for commit in (5, {"id": "c1", "effects": [{"kind": "nope"}]}):
            with pytest.raises(MalformedCommit) as refused:
                graph.update_state(config, {"commit": commit}, as_node="gate")
            assert isinstance(refused.value, ValueError)
        assert graph.get_state(config).values["partials"] == before["partials"]


def test_a_clients_command_update_is_checked_before_it_is_stored(image) -> None:
    # Command(update=...) is stored as a write of no task before any node runs; a value a
    # reducer refuses was applied again by every later read and run: the thread was broken
    # for good.
    from langgraph.types import Command

    from store.checkpoint.saver import ZODBSaver

    with ZODBSaver(image) as saver:
        graph = build_graph(mind(FakeModels(responder())), checkpointer=saver)
        config = run_config("commanded")
        graph.invoke({"messages": [HumanMessage("hello")]}, config)
        hostile = (
            {"messages": [{"role": "nobody", "content": "x"}]},
            {"partials": 5},
            {"effects": [{"kind": "x", "blob": "y" * 70_000}]},
        )
        for update in hostile:
            with pytest.raises(GraphRequestError):
                graph.invoke(Command(update=update), config)
            state = graph.get_state(config)  # it reads, and the next run goes on
            assert [m.content for m in state.values["messages"]][0] == "hello"
        done = graph.invoke({"messages": [HumanMessage("again")]}, config)
        assert done["status"] == "COMPLETE" and len(done["messages"]) == 4


def test_a_replayed_cycle_is_not_named_in_the_history_as_a_second_commit(file_uri) -> None:
    # Replayed from a checkpoint after routing, a cycle commits nothing again (its commit id
    # was applied), but its checkpoint's transaction carried the commit's note: the history
    # read as if the cycle had committed twice.
    from store.checkpoint.saver import ZODBSaver

    image = open_image(file_uri, create=True)
    try:
        with ZODBSaver(image) as saver:
            graph = build_graph(mind(FakeModels(responder())), checkpointer=saver)
            config = run_config("replayed")
            done = graph.invoke({"messages": [HumanMessage("hello")]}, config)
            cycle_id = done["cycle"]["id"]
            at_gate = next(s for s in graph.get_state_history(config) if s.next == ("gate",))
            graph.invoke(None, at_gate.config)
        named = [t.description for t in image.history(20) if cycle_id in t.description]
        assert len([d for d in named if d.startswith(f"mind cycle {cycle_id}")]) == 1
        assert any("applied before: nothing of it now" in d for d in named)
        with image.read() as root:
            assert len(cycle.recent(root, 10)) == 1
    finally:
        image.close()


def test_a_commit_is_applied_once_and_checked(image) -> None:
    state = run(image, mind(FakeModels(responder())), "hello")
    commit = effects.check(state["commit"], cycle.EFFECT_KINDS)
    assert (
        image.transact(
            lambda root: effects.apply_commit(root, commit, ("t", "", "x"), cycle.EFFECT_KINDS)
        )
        is False
    )
    with image.read() as root:
        assert personas(root)["ROBIN"].stats["cycles"] == 1
    with pytest.raises(CheckpointError, match="nothing applies"):
        effects.check({"id": "x", "effects": [{"kind": "format_disk"}]}, cycle.EFFECT_KINDS)
    with pytest.raises(CheckpointError, match="not a facet selector"):
        image.transact(
            lambda root: effects.apply_commit(
                root,
                effects.check(
                    {
                        "id": "y",
                        "effects": [
                            {"kind": "persona_stats", "persona": "ROBIN", "facets": {"shout": 1}}
                        ],
                    },
                    cycle.EFFECT_KINDS,
                ),
                ("t", "", "y"),
                cycle.EFFECT_KINDS,
            )
        )


def test_a_conversation_keeps_its_history(image) -> None:
    models = FakeModels(responder())
    run(image, mind(models), "my name is Ada", thread="chat")
    state = run(image, mind(models), "hello again", thread="chat")
    assert [m.type for m in state["messages"]] == ["human", "ai", "human", "ai"]
    last = models.calls[-1]
    assert [m.content for m in last.messages[:2]] == [
        "my name is Ada",
        state["messages"][1].content,
    ]


def test_transitions_are_logged_as_json(image, caplog) -> None:
    caplog.set_level("INFO", logger="batos.mind")
    state = run(image, mind(FakeModels(responder())), "hello")
    lines = [json.loads(r.message) for r in caplog.records if r.name == "batos.mind"]
    events = [(line["event"], line.get("node")) for line in lines]
    assert events == [
        ("transition", "route"),
        ("transition", "synthesize"),
        ("transition", "gate"),
        ("transition", "complete"),
        ("commit", None),
    ]
    assert lines[-1]["cycle"] == state["cycle"]["id"]
    assert {"seconds", "input_tokens", "output_tokens"} <= set(lines[1])


def test_the_last_message_must_be_the_users(image) -> None:
    with ZODBSaver(image) as saver:
        graph = build_graph(mind(FakeModels(responder())), checkpointer=saver)
        state = graph.invoke({"messages": [AIMessage("I speak first")]}, run_config("ai"))
    assert state["status"] == "FAILED" and "not the user's" in state["failure"]["reason"]


def test_an_over_long_plan_query_is_cut_at_a_word_not_rejected() -> None:
    from graph.plan import MAX_QUERY_CHARS, parse_plan

    long = " ".join(["word"] * 300)  # 1,499 characters
    reply = json.dumps({"steps": [{"facet": "BRICK.facet_steps", "query": long}]})
    [step] = parse_plan(reply, {"BRICK.facet_steps": "steps"}, 3)
    assert len(step["query"]) <= MAX_QUERY_CHARS and step["query"].endswith("word")
    assert long.startswith(step["query"])


def test_a_plan_json_cannot_parse_is_rejected_with_the_parser_reason() -> None:
    from graph.plan import PlanRejected, parse_plan

    facets = {"BRICK.facet_steps": "steps"}
    with pytest.raises(PlanRejected, match=r"not JSON \(Expecting value, character 10\)"):
        parse_plan('{"steps": ]}', facets, 3)
    # ValueErrors that are not JSONDecodeErrors: an integer past the bound, NaN, 1e400
    with pytest.raises(PlanRejected, match="not JSON.*an integer of over 100 digits"):
        parse_plan('{"steps": ' + "1" * 5000 + "}", facets, 3)
    with pytest.raises(PlanRejected, match="not JSON.*NaN is not a JSON value"):
        parse_plan('{"steps": NaN}', facets, 3)
    with pytest.raises(PlanRejected, match="not JSON.*1e400 is beyond"):
        parse_plan('{"steps": [1e400]}', facets, 3)
    # a server with no grammar can nest deeper than the parser recurses
    with pytest.raises(PlanRejected, match=r"not JSON \(nested too deeply\)"):
        parse_plan("[" * 100_000, facets, 3)


# -- computations and memory ---------------------------------------------------------------

MUFFINS = "A bakery sells 36 muffins a day at $2.75 each. How much does it take in over 2 weeks?"


def program(body: str) -> Callable[[ModelCall], str]:
    return lambda call: f"```python\ndef solve(self):\n{body}```"


def test_a_computation_is_written_as_a_program_run_and_quoted(image) -> None:
    source = "    muffins = 36\n    price = 2.75\n    return muffins * price * 14\n"
    said = "It takes in $1,386 over two weeks: 36 muffins a day at $2.75, for 14 days."
    models = FakeModels(
        lambda call: (
            program(source)(call) if call_kind(call) == "program" else responder(answer=said)(call)
        )
    )
    state = run(image, mind(models, FakeRouter(("BRICK",))), MUFFINS)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["compute"] is True
    assert [call_kind(c) for c in models.calls] == ["program", "answer"]  # no plan for it
    [partial] = state["partials"]
    assert partial["kind"] == "computed" and partial["ok"] and partial["text"] == "1386"
    assert "A program computed this for the request: 1386" in models.of("answer")[0].text
    program_call = models.of("program")[0]
    assert program_call.persona == "BRICK" and program_call.options["temperature"] == 0.0
    assert MUFFINS in program_call.text


def test_a_program_that_fails_twice_leaves_the_answer_without_a_result(image) -> None:
    models = FakeModels(
        lambda call: (
            program("    return 1 / 0\n")(call)
            if call_kind(call) == "program"
            else responder()(call)
        )
    )
    state = run(image, mind(models, FakeRouter(("BRICK",))), MUFFINS)
    assert state["status"] == "COMPLETE", state.get("failure")
    programs = models.of("program")
    assert len(programs) == 2 and "ZeroDivisionError" in programs[1].text  # the repair
    [degraded] = state["cycle"]["degraded"]
    assert degraded["where"] == "compute" and "could not be run" in degraded["reason"]
    assert "A program computed" not in models.of("answer")[0].text


def test_an_answer_that_contradicts_its_computed_result_is_not_given(image) -> None:
    # The model redoes the arithmetic in words and gets it wrong, twice: the checked result and
    # the program that computed it are the answer.
    source = "    seats = 37 * 28\n    return seats - 119\n"
    models = FakeModels(
        lambda call: (
            program(source)(call)
            if call_kind(call) == "program"
            else responder(answer="37 rows of 28 is 1,056 seats, so 937 are free.")(call)
        )
    )
    question = "A hall has 37 rows of 28 seats, and 119 are reserved. How many seats are free?"
    state = run(image, mind(models, FakeRouter(("BRICK",))), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    answers = models.of("answer")
    assert len(answers) == 2 and "does not state what the program computed, 917" in answers[1].text
    assert state["response"].startswith("917\n") and "seats = 37 * 28" in state["response"]
    assert state["response"].endswith("Result: 917")
    [degraded] = state["cycle"]["degraded"]
    assert degraded["where"] == "gate" and "917" in degraded["reason"]


def test_a_retried_answer_that_states_the_result_is_given_as_written(image) -> None:
    replies = iter(["That is 1,056 less the reserved ones.", "917 seats are still free."])
    models = FakeModels(
        lambda call: (
            program("    return 37 * 28 - 119\n")(call)
            if call_kind(call) == "program"
            else responder(answer=lambda call: next(replies))(call)
        )
    )
    state = run(
        image,
        mind(models, FakeRouter(("BRICK",))),
        "How many of 37 rows of 28 seats are left if 119 are sold?",
    )
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["response"] == "917 seats are still free."
    assert state["cycle"]["degraded"] == []


@pytest.mark.parametrize(
    ("text", "value", "given"),
    [
        ("There are 917 seats.", "917", True),
        ("There are 108 seats.", "917", False),
        ("Each pays $71.82.", "71.8175", True),  # rounded to the answer's own precision
        ("It grew by 8.0%.", "8.006441", True),
        ("It grew by 8.1%.", "8.006441", False),
        ("1,036 seats", "1036", True),
        ("It is 20 March 2025.", "2025-03-20", True),
        ("March 20th, 2025", "2025-03-20", True),
        ("21 March 2025", "2025-03-20", False),
        ("It was a Sunday.", "Sunday", True),
        ("It was a Monday.", "Sunday", False),
        ("Day 200 is 18 August 2025, a Monday.", "18 August 2025, Monday", True),
        ("", "42", False),
    ],
)
def test_an_answer_gives_a_computed_value_as_written_or_rounded(text, value, given) -> None:
    from graph.compute import gives

    assert gives(text, value) is given


@pytest.fixture(scope="module")
def encoder() -> Any:
    from store.knowledge.embeddings import Embedder

    return Embedder()


@pytest.fixture
def remembered(image, encoder, tmp_path) -> Any:
    """The image's catalog holding two small documents."""
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    (tmp_path / "ferry.md").write_text(
        "# Ferry timetable\n\nThe Ondine ferry leaves Harbour Pier at 7:40 every morning. "
        "An adult single ticket costs 4.80 dollars."
    )
    (tmp_path / "bread.md").write_text("# Rye bread\n\nKnead the rye dough for ten minutes.")
    catalog = KnowledgeCatalog.open(image, encoder)
    ingest_paths(catalog, [tmp_path / "ferry.md", tmp_path / "bread.md"])
    return catalog


def test_a_request_about_memory_is_answered_from_its_passages_with_citations(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    answer = "The ferry leaves at 7:40 [1]; see also [7] and [n]."
    models = FakeModels(responder(answer=lambda call: answer))
    services = mind(models, FakeRouter(("BABS",)), catalog=remembered)
    state = run(image, services, "when does the Ondine ferry leave Harbour Pier")
    assert state["status"] == "COMPLETE", state.get("failure")
    grounding = state["cycle"]["grounding"]
    assert grounding["about_catalog"] and grounding["best"] >= 0.3
    prompt = models.of("answer")[0].text
    assert "[1] " in prompt and "ferry leaves Harbour Pier at 7:40" in prompt
    assert "cite the passage it comes from by its number" in prompt
    source = state["cycle"]["passages"][0]["source"]
    assert source.endswith("ferry.md")
    # [7] has no passage and [n] was copied from the instructions: neither is kept as a source
    assert state["response"].startswith("The ferry leaves at 7:40 [1]; see also [7] and.")
    assert state["response"].endswith(
        f"Sources: [1] {source} (0–{state['cycle']['passages'][0]['end']})"
    )
    with image.read() as root:
        assert cycle.get(root, state["cycle"]["id"])["cited"] == [
            state["cycle"]["passages"][0]["citation"]
        ]


def test_an_answer_from_passages_is_asked_its_question_before_them_when_set(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    models = FakeModels(responder(answer=lambda call: "It leaves at 7:40 [1]."))
    services = mind(models, FakeRouter(("BABS",)), catalog=remembered)
    question = "when does the Ondine ferry leave Harbour Pier"
    for value, thread in (("off", "t-after"), ("on", "t-both")):
        monkeypatch.setenv("BATOS_MIND_QUESTION_FIRST", value)
        state = run(image, services, question, thread=thread)
        assert state["status"] == "COMPLETE", state.get("failure")
        prompt = models.of("answer")[-1].text
        assert prompt.endswith(f"Question: {question}")
        assert prompt.startswith(f"Question: {question}") is (value == "on")
        assert prompt.count(question) == (2 if value == "on" else 1)
        assert "ferry leaves Harbour Pier at 7:40" in prompt
        assert state["response"].startswith("It leaves at 7:40 [1].")


def test_a_quote_first_answer_gives_the_answer_and_records_the_quote_it_stands_on(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_QUOTE_FIRST", "on")
    replies = iter(
        [
            'Quote: "The Ondine ferry leaves Harbour Pier at 7:40 every morning." [1]\n'
            "Answer: It leaves at 7:40 [1].",
            "Quote: The ferry leaves at 9:15 sharp [1]\nAnswer: At 9:15 [1].",
        ]
    )
    models = FakeModels(responder(answer=lambda call: next(replies)))
    services = mind(models, FakeRouter(("BABS",)), catalog=remembered)
    question = "when does the Ondine ferry leave Harbour Pier"
    state = run(image, services, question)
    assert state["status"] == "COMPLETE", state.get("failure")
    prompt = models.of("answer")[0].text
    assert prompt.startswith(f"Question: {question}") and prompt.endswith(f"Question: {question}")
    assert "Quote: the sentence of the passages that answers it" in prompt
    assert state["response"].startswith("It leaves at 7:40 [1].")
    assert "Quote" not in state["response"]
    evidence = state["cycle"]["evidence"]
    assert evidence == {
        "quote": "The Ondine ferry leaves Harbour Pier at 7:40 every morning.",
        "passage": 1,
        "found": True,
    }
    with image.read() as root:
        assert cycle.get(root, state["cycle"]["id"])["evidence"] == evidence
    # a quote that is in no passage is recorded as not found
    state = run(image, services, question, thread="t-quote-2")
    assert state["cycle"]["evidence"]["found"] is False
    assert state["response"].startswith("At 9:15 [1].")


def test_an_answer_from_passages_stating_a_figure_none_gives_is_sent_back_once(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_FIGURES", "on")
    replies = iter(["A single costs 5.20 dollars [1].", "A single costs 4.80 dollars [1]."])
    models = FakeModels(responder(answer=lambda call: next(replies)))
    services = mind(models, FakeRouter(("BABS",)), catalog=remembered)
    state = run(image, services, "what does an adult single ticket on the Ondine ferry cost")
    assert state["status"] == "COMPLETE", state.get("failure")
    first, second = models.of("answer")
    assert "the answer states 5.20, which no passage gives" in second.text
    assert state["response"].startswith("A single costs 4.80 dollars [1].")
    assert state["cycle"]["synthesis_attempts"] == 2 and state["cycle"]["degraded"] == []
    # with the check off, the first answer is given as it is
    monkeypatch.setenv("BATOS_MIND_FIGURES", "off")
    replies = iter(["A single costs 5.20 dollars [1]."])
    state = run(image, services, "what does an adult single ferry ticket cost", thread="t-off")
    assert state["response"].startswith("A single costs 5.20 dollars [1].")
    assert state["cycle"]["synthesis_attempts"] == 1


TICKET_QUESTION = "how much is an adult single ticket on the Ondine ferry"


def _ticket(image, remembered, answer: str, thread: str = "t1") -> tuple[Any, Any, int]:
    """The ticket question answered by BABS with ``answer``: the services, the final state
    and the number of the passage stating the fare."""
    services = mind(
        FakeModels(responder(answer=lambda call: answer)),
        FakeRouter(("BABS",)),
        catalog=remembered,
    )
    state = run(image, services, TICKET_QUESTION, thread=thread)
    assert state["status"] == "COMPLETE", state.get("failure")
    passages = state["cycle"]["passages"]
    return services, state, next(n for n, p in enumerate(passages, 1) if "4.80" in p["text"])


def test_a_figure_cited_to_the_wrong_passage_is_cited_to_the_one_holding_it(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    _, state, holding = _ticket(image, remembered, "It costs 4.80 dollars [2].")
    passages = state["cycle"]["passages"]
    assert holding != 2  # the bread recipe is passage 2: the model cited the wrong one
    assert state["response"].startswith(f"It costs 4.80 dollars [{holding}].")
    assert state["cycle"]["recited"] == {"cited": 2, "holding": holding}
    assert f"[{holding}] {passages[holding - 1]['source']}" in state["response"]


def test_an_answer_citing_no_passage_cites_the_one_stating_it(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    services, state, holding = _ticket(image, remembered, "A single costs 4.80 dollars [ticket].")
    passages = state["cycle"]["passages"]
    assert state["response"].startswith(f"A single costs 4.80 dollars [{holding}].")
    assert state["cycle"]["attributed"] == holding
    assert state["cycle"]["cited"] == [passages[holding - 1]["citation"]]
    # off, the answer is left citing nothing (its word label is no source)
    monkeypatch.setenv("BATOS_MIND_ATTRIBUTE", "off")
    state = run(image, services, TICKET_QUESTION, thread="t-attribute-off")
    assert state["response"].startswith("A single costs 4.80 dollars [ticket].")
    assert "attributed" not in state["cycle"] and state["cycle"]["cited"] == []


def test_a_citation_line_copied_into_an_answer_is_given_as_its_number(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")

    def echo(call: ModelCall) -> str:  # the model copies the first passage's header line
        header = re.search(r"\[1\] (\S+)", call.text)
        return f"{header.group(1) if header else ''}. The ferry leaves at 7:40."

    services = mind(FakeModels(responder(answer=echo)), FakeRouter(("BABS",)), catalog=remembered)
    state = run(image, services, "when does the Ondine ferry leave Harbour Pier")
    assert state["status"] == "COMPLETE", state.get("failure")
    first = state["cycle"]["passages"][0]
    assert state["response"].startswith("[1]. The ferry leaves at 7:40.")
    assert first["source"] not in state["response"].split("Sources:")[0]


HARBOUR_DOCS = {
    "ferry_guide.md": "# The Kelvick ferry\n\nThe Kelvick ferry crosses the sound between Kelvick "
    "and Orra Point. The Kelvick ferry is the oldest crossing on the coast, and the Kelvick "
    "ferry company has run it since 1921.\n\nTickets are sold on board. A return runs until "
    "the last sailing. Every adult must show a ticket on request. How much luggage you bring "
    "is up to you.",
    "harbour_notes.md": "# Harbour notes\n\nThe harbour office opens at eight and closes at "
    "six. Parking by the slipway is free on Sundays and costs two pounds on other days. The "
    "chandlery sells charts, rope, paint and fuel. Moorings are let by the season; the waiting "
    "list is kept by the harbour master. The fish market runs on Tuesday and Friday mornings. "
    "An adult return ticket on the ferry costs 7.50 pounds. The lifeboat station holds an "
    "open day each August. Crab lines and buckets may not be left on the quay overnight.",
    "bakery.md": "# Rye bread\n\nKnead the rye dough for ten minutes and prove it overnight.",
}
FARE_QUESTION = "How much is an adult return ticket on the Kelvick ferry?"
FARE_ANSWER = "An adult return ticket on the Kelvick ferry costs 7.50 pounds [1]."


@pytest.fixture
def harbour(image, encoder, tmp_path) -> Any:
    """A catalog whose own order puts the guide that names the ferry throughout before the
    notes whose one sentence gives the fare."""
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    for name, text in HARBOUR_DOCS.items():
        (tmp_path / name).write_text(text)
    catalog = KnowledgeCatalog.open(image, encoder)
    ingest_paths(catalog, [tmp_path / name for name in HARBOUR_DOCS])
    return catalog


def _fare_services(catalog: Any) -> MindServices:
    """BABS answering the fare question from ``catalog``, the same answer each time."""
    return mind(
        FakeModels(responder(answer=lambda c: FARE_ANSWER)), FakeRouter(("BABS",)), catalog=catalog
    )


def _read_first(state: dict[str, Any]) -> str:
    return Path(state["cycle"]["passages"][0]["source"]).name


def test_reranked_a_request_about_memory_reads_first_the_passage_whose_sentence_answers_it(
    image, harbour, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.2")
    monkeypatch.setenv("BATOS_MIND_RERANK", "on")
    services = _fare_services(harbour)
    assert Path(harbour.search(FARE_QUESTION, 3, record=False)[0].source).name == "ferry_guide.md"
    state = run(image, services, FARE_QUESTION)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert _read_first(state) == "harbour_notes.md"
    assert state["cycle"]["degraded"] == []
    # off (the default), the catalog's own order
    monkeypatch.delenv("BATOS_MIND_RERANK")
    state = run(image, services, FARE_QUESTION, thread="t-rerank-off")
    assert _read_first(state) == "ferry_guide.md"


def test_a_reranking_that_fails_keeps_the_catalogs_order_and_says_so(
    image, harbour, monkeypatch
) -> None:
    import graph.retrieval

    def broken(*args: Any) -> Any:
        raise RuntimeError("encoder gone")

    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.2")
    monkeypatch.setenv("BATOS_MIND_RERANK", "on")
    monkeypatch.setattr(graph.retrieval, "rerank", broken)
    services = _fare_services(harbour)
    state = run(image, services, FARE_QUESTION)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert _read_first(state) == "ferry_guide.md" and len(state["cycle"]["passages"]) == 3
    assert state["cycle"]["degraded"] == [
        {
            "where": "retrieval",
            "what": "the passages' order",
            "reason": "RuntimeError: encoder gone",
        }
    ]


def test_a_request_far_from_memory_gets_no_passages(image, remembered, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    models = FakeModels(responder())
    state = run(image, mind(models, catalog=remembered), "hello there")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["grounding"]["about_catalog"] is False
    assert models.of("answer")[0].text == "hello there"
    assert "Sources:" not in state["response"]


def test_history_keeps_what_the_user_said_and_alternates() -> None:
    from graph.answer import HISTORY_TURNS, OLD_ANSWER_CHARS
    from graph.answer import history as _history

    failed = {"batos_failed": True}
    said = [HumanMessage("My locker code is 4471.")]
    for n in range(HISTORY_TURNS - 1):
        said += [AIMessage("noted " + "x" * 2000), HumanMessage(f"filler question {n}")]
    said += [AIMessage("oops", additional_kwargs=failed), HumanMessage("and one more")]
    said += [AIMessage("fine"), HumanMessage("lost one"), AIMessage("no", additional_kwargs=failed)]
    said += [HumanMessage("What is my locker code?")]
    kept = _history(said)
    assert kept[0].content == "My locker code is 4471."  # 12 turns back: still there
    assert [type(m).__name__ for m in kept[:4]] == ["HumanMessage", "AIMessage"] * 2
    assert all(type(a) is not type(b) for a, b in zip(kept, kept[1:], strict=False))
    assert kept[-2].content == "filler question 10\nand one more" and kept[-1].content == "fine"
    assert len(kept[1].content) == OLD_ANSWER_CHARS + 1  # an old answer, cut
    assert "lost one" not in " ".join(str(m.content) for m in kept)


def test_a_computation_about_memory_takes_its_figures_from_the_passages(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    source = "    single = 4.80\n    return single * 3\n"
    models = FakeModels(
        lambda call: (
            program(source)(call)
            if call_kind(call) == "program"
            else responder(answer="They cost 14.40 dollars [1].")(call)
        )
    )
    question = "How much more do three adult single tickets on the Ondine ferry cost than one?"
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["grounding"]["about_catalog"] and state["cycle"]["compute"]
    program_call = models.of("program")[0].text
    assert program_call.startswith("Facts (quoted from documents")
    assert "adult single ticket costs 4.80 dollars" in program_call
    assert "A program computed this for the request: 14.4" in models.of("answer")[0].text


def test_a_computation_that_names_its_figures_by_year_takes_them_from_the_passages(
    image, encoder, tmp_path, monkeypatch
) -> None:
    # Two years are figures of the request, but not its operands: the counts are in memory.
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    (tmp_path / "ferry.md").write_text(
        "# Ondine ferry passengers\n\nThe Ondine ferry carried 1,200 passengers in 2023 "
        "and 1,450 passengers in 2024."
    )
    catalog = KnowledgeCatalog.open(image, encoder)
    ingest_paths(catalog, [tmp_path / "ferry.md"])
    source = "    before = 1200\n    after = 1450\n    return after - before\n"
    models = FakeModels(
        lambda call: (
            program(source)(call)
            if call_kind(call) == "program"
            else responder(answer="It carried 250 more passengers [1].")(call)
        )
    )
    question = "How many more passengers did the Ondine ferry carry in 2024 than in 2023?"
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=catalog), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["grounding"]["about_catalog"] and state["cycle"]["compute"]
    assert "1,200 passengers in 2023" in models.of("program")[0].text
    assert "A program computed this for the request: 250" in models.of("answer")[0].text


def _ferry_counts(image, encoder, tmp_path):
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    (tmp_path / "ferry.md").write_text(
        "# Ondine ferry passengers\n\nThe Ondine ferry carried 1,450 passengers in 2024, "
        "against 1,200 passengers in 2023."
    )
    catalog = KnowledgeCatalog.open(image, encoder)
    ingest_paths(catalog, [tmp_path / "ferry.md"])
    return catalog


FERRY_QUESTION = "How many more passengers did the Ondine ferry carry in 2024 than in 2023?"


def test_a_difference_from_memory_is_worked_out_from_two_figures_babs_copies(
    image, encoder, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    catalog = _ferry_counts(image, encoder, tmp_path)
    pair = (
        '{"first": {"words": "carried 1,450 passengers in 2024", "value": 1450}, '
        '"second": {"words": "1,200 passengers in 2023", "value": 1200}}'
    )
    models = FakeModels(
        lambda call: (
            pair
            if call_kind(call) == "figures"
            else responder(answer="It carried 250 more passengers [1].")(call)
        )
    )
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=catalog), FERRY_QUESTION)
    assert state["status"] == "COMPLETE", state.get("failure")
    [call] = models.of("figures")
    assert call.persona == "BABS" and call.options["temperature"] == 0.0
    assert "1,450 passengers in 2024" in call.text and FERRY_QUESTION in call.text
    assert models.of("program") == []  # no program was needed
    assert "A program computed this for the request: 250" in models.of("answer")[0].text
    [computed] = [p for p in state["partials"] if p.get("kind") == "computed"]
    assert "difference = abs(first - second)" in computed["program"]


def test_a_computed_difference_cites_the_passages_its_figures_came_from(
    image, encoder, tmp_path, monkeypatch
) -> None:
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    (tmp_path / "ferry.md").write_text(
        "# Ondine ferry passengers\n\nThe Ondine ferry carried 1,450 passengers in 2024."
    )
    (tmp_path / "ferry-2023.md").write_text(
        "# Ondine ferry, 2023\n\nIn 2023 the Ondine ferry carried 1,200 passengers."
    )
    (tmp_path / "copyright.txt").write_text(
        "Ondine ferry app\nCopyright: 2019 Harbour Pier Software\nLicense: GPL-2+"
    )
    catalog = KnowledgeCatalog.open(image, encoder)
    ingest_paths(catalog, [tmp_path / n for n in ("ferry.md", "ferry-2023.md", "copyright.txt")])
    pair = (
        '{"first": {"words": "carried 1,450 passengers in 2024", "value": 1450}, '
        '"second": {"words": "carried 1,200 passengers", "value": 1200}}'
    )

    def weave(call: ModelCall) -> str:  # the model cites the licence file, not the counts
        licence = re.search(r"\[(\d)\] \S*copyright\.txt", call.text)
        return f"It carried 250 more passengers [{licence.group(1) if licence else 9}]."

    models = FakeModels(
        lambda call: pair if call_kind(call) == "figures" else responder(answer=weave)(call)
    )
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=catalog), FERRY_QUESTION)
    assert state["status"] == "COMPLETE", state.get("failure")
    passages = state["cycle"]["passages"]
    number = {Path(p["source"]).name: n for n, p in enumerate(passages, start=1)}
    assert "copyright.txt" in number, "the licence file was among the passages the model saw"
    counts = sorted((number["ferry.md"], number["ferry-2023.md"]))
    assert state["response"].startswith(
        f"It carried 250 more passengers [{counts[0]}][{counts[1]}]."
    )
    assert state["cycle"]["sourced"] == {"dropped": [number["copyright.txt"]], "added": counts}
    assert sorted(Path(c.split(":")[0]).name for c in state["cycle"]["cited"]) == [
        "ferry-2023.md",
        "ferry.md",
    ]


def test_two_figures_the_passages_do_not_give_go_to_a_program(
    image, encoder, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    catalog = _ferry_counts(image, encoder, tmp_path)
    made_up = '{"first": {"words": "x", "value": 1500}, "second": {"words": "y", "value": 1200}}'
    source = "    before = 1200\n    after = 1450\n    return after - before\n"
    models = FakeModels(
        lambda call: (
            made_up
            if call_kind(call) == "figures"
            else program(source)(call)
            if call_kind(call) == "program"
            else responder(answer="It carried 250 more passengers [1].")(call)
        )
    )
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=catalog), FERRY_QUESTION)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(models.of("figures")) == 1 and len(models.of("program")) == 1
    [computed] = [p for p in state["partials"] if p.get("kind") == "computed"]
    assert computed["figures"] == "1500 is not a figure the passages give"
    assert "A program computed this for the request: 250" in models.of("answer")[0].text


def test_copying_two_figures_can_be_switched_off(image, encoder, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_PAIRS", "off")
    catalog = _ferry_counts(image, encoder, tmp_path)
    source = "    before = 1200\n    after = 1450\n    return after - before\n"
    models = FakeModels(
        lambda call: (
            program(source)(call)
            if call_kind(call) == "program"
            else responder(answer="It carried 250 more passengers [1].")(call)
        )
    )
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=catalog), FERRY_QUESTION)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert models.of("figures") == [] and len(models.of("program")) == 1


def _pitch_prices(image, encoder, tmp_path):
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    (tmp_path / "campsite.md").write_text(
        "# Gorrel Hills campsite prices\n\nA tent pitch with an electric hook-up costs £29 a "
        "night in August and £23 a night at other times."
    )
    catalog = KnowledgeCatalog.open(image, encoder)
    ingest_paths(catalog, [tmp_path / "campsite.md"])
    return catalog


def _pitch_models(terms: str) -> FakeModels:
    """BABS lists ``terms``; a program, if one is asked for, multiplies the nightly price."""
    source = "    per_night = 29\n    nights = 3\n    return per_night * nights\n"
    return FakeModels(
        lambda call: (
            terms
            if call_kind(call) == "figures"
            else program(source)(call)
            if call_kind(call) == "program"
            else responder(answer="Three nights cost £87 [1].")(call)
        )
    )


PITCH_QUESTION = "How much will a pitch with hook-up at Gorrel Hills cost for 3 nights in August?"


@pytest.mark.parametrize("totals", ["on", "off"])
def test_a_total_from_memory_is_worked_out_from_the_figures_babs_lists(
    image, encoder, tmp_path, monkeypatch, totals
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_TOTALS", totals)
    catalog = _pitch_prices(image, encoder, tmp_path)
    terms = '{"terms": [{"words": "costs £29 a night in August", "value": 29, "times": 3}]}'
    models = _pitch_models(terms)
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=catalog), PITCH_QUESTION)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["grounding"]["about_catalog"] and state["cycle"]["compute"]
    assert "A program computed this for the request: 87" in models.of("answer")[0].text
    [computed] = [p for p in state["partials"] if p.get("kind") == "computed"]
    if totals == "off":  # straight to a program, as before
        assert models.of("figures") == [] and len(models.of("program")) == 1
        return
    [call] = models.of("figures")
    assert call.persona == "BABS" and call.options["temperature"] == 0.0
    assert "£29 a night in August" in call.text and PITCH_QUESTION in call.text
    assert models.of("program") == []
    assert "term1 = 29 * 3" in computed["program"] and computed["operands"] == ["29"]


def test_a_total_counted_more_times_than_the_question_says_goes_to_a_program(
    image, encoder, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    catalog = _pitch_prices(image, encoder, tmp_path)
    terms = '{"terms": [{"words": "costs £29 a night in August", "value": 29, "times": 7}]}'
    models = _pitch_models(terms)
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=catalog), PITCH_QUESTION)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(models.of("figures")) == 1 and len(models.of("program")) == 1
    [computed] = [p for p in state["partials"] if p.get("kind") == "computed"]
    assert computed["figures"] == "term 1's count 7 is not one the question states"
    assert "A program computed this for the request: 87" in models.of("answer")[0].text


def test_a_computation_whose_figures_are_nowhere_is_not_a_program_of_its_years(image) -> None:
    # No catalog holds the counts: subtracting 2023 from 2024 would be an exact wrong answer.
    models = FakeModels(responder(answer="I do not know how many newts were counted."))
    question = "How many more newts were counted at the Mill Pond in 2024 than in 2023?"
    state = run(image, mind(models, FakeRouter(("BABS",))), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert not state["cycle"]["compute"] and models.of("program") == []


def test_an_answer_that_restates_its_question_is_asked_again_on_the_same_passages(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    replies = iter(["The Ondine ferry leaves Harbour Pier [1].", "At 7:40 every morning [1]."])
    models = FakeModels(responder(answer=lambda call: next(replies)))
    question = "When does the Ondine ferry leave Harbour Pier?"
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["gate"]["passed"]
    first, second = models.of("answer")
    assert "only restates the question" in second.text
    shown = [" ".join(str(m.content) for m in call.messages) for call in (first, second)]
    assert all("leaves Harbour Pier at 7:40" in text for text in shown)
    assert state["response"].startswith("At 7:40 every morning")
    assert state["cycle"]["degraded"] == []


def test_a_restated_answer_to_a_when_question_is_asked_afresh_for_the_time_when_asked_is_on(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_ASKED", "on")
    replies = iter(["The Ondine ferry leaves Harbour Pier [1].", "At 7:40 every morning [1]."])
    models = FakeModels(responder(answer=lambda call: next(replies)))
    question = "When does the Ondine ferry leave Harbour Pier?"
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    first, second = models.of("answer")
    assert "The question asks for a date, day or time" in second.text
    assert "only restates" not in second.text
    assert state["response"].startswith("At 7:40") and state["cycle"]["gate"]["passed"]


def test_a_restated_question_is_let_through_when_that_check_is_off(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_RESTATES", "off")
    models = FakeModels(responder(answer="The Ondine ferry leaves Harbour Pier [1]."))
    question = "When does the Ondine ferry leave Harbour Pier?"
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(models.of("answer")) == 1 and state["cycle"]["gate"]["passed"]


@pytest.mark.parametrize("asked", ["on", "off"])
def test_an_answer_that_gives_no_time_for_a_when_question_is_asked_again_when_that_check_is_on(
    image, remembered, monkeypatch, asked: str
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_ASKED", asked)
    monkeypatch.setenv("BATOS_MIND_GROUNDED_SAMPLING", "persona")  # the ask itself is greedy
    # Words of its own, so the restating check lets it through; no time, which the passage has.
    replies = iter(["It sails from Harbour Pier every morning [1].", "At 7:40 [1]."])
    models = FakeModels(responder(answer=lambda call: next(replies)))
    question = "When does the Ondine ferry leave?"
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["gate"]["passed"] and state["cycle"]["degraded"] == []
    calls = models.of("answer")
    if asked == "off":
        assert len(calls) == 1 and state["response"].startswith("It sails from Harbour Pier")
        return
    first, second = calls
    # Asked afresh for the time, greedily, not as a reply to the answer it sent back.
    assert "The question asks for a date, day or time" in second.text
    assert second.options["temperature"] == 0.0
    shown = [" ".join(str(m.content) for m in c.messages) for c in (first, second)]
    assert all("7:40" in text for text in shown) and "It sails from" not in shown[1]
    assert state["response"].startswith("At 7:40")
    assert state["cycle"]["gate_asked"] == "date"


def test_an_answer_asked_again_that_does_no_better_gives_way_to_the_first(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_ASKED", "on")
    replies = iter(["It sails from Harbour Pier every morning [1].", ""])
    models = FakeModels(responder(answer=lambda call: next(replies)))
    state = run(
        image, mind(models, FakeRouter(("BABS",)), catalog=remembered), "When does the ferry go?"
    )
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(models.of("answer")) == 2
    assert state["response"].startswith("It sails from Harbour Pier every morning")
    assert state["cycle"]["gate"]["kept_first"] and not state["cycle"]["gate"]["passed"]
    [degraded] = state["cycle"]["degraded"]
    assert degraded["what"] == "the answer asked again" and "empty" in degraded["reason"]
    assert state["cycle"]["cited"]  # the first answer's citation stands with it


def test_an_answer_saying_its_passages_do_not_hold_it_is_not_asked_again(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_ASKED", "on")
    models = FakeModels(responder(answer="The passages do not say when it leaves [1]."))
    run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), "When does the ferry go?")
    assert all("The question asks for" not in c.text for c in models.of("answer"))


def test_an_answer_that_gives_the_time_asked_for_is_let_through_at_once(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_ASKED", "on")
    models = FakeModels(responder(answer="It leaves Harbour Pier at 7:40 [1]."))
    question = "When does the Ondine ferry leave?"
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(models.of("answer")) == 1 and state["cycle"]["gate"]["passed"]


@pytest.mark.parametrize(("sampling", "temperature"), [("greedy", 0.0), ("persona", None)])
def test_an_answer_from_passages_is_decoded_as_the_setting_says(
    image, remembered, monkeypatch, sampling: str, temperature: float | None
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_GROUNDED_SAMPLING", sampling)
    models = FakeModels(responder(answer="At 7:40 [1]."))
    question = "When does the Ondine ferry leave Harbour Pier?"
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    [call] = models.of("answer")
    assert call.options.get("temperature") == temperature


def test_an_answer_without_passages_keeps_the_persona_s_sampling(image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDED_SAMPLING", "greedy")
    models = FakeModels(responder(answer="Hello to you too."))
    state = run(image, mind(models, FakeRouter(("ROBIN",))), "hello there")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert "temperature" not in models.of("answer")[0].options


def test_a_question_about_what_was_just_said_is_answered_greedily_from_the_thread(image) -> None:
    def answer(call: ModelCall) -> str:
        return "What did I just say? You said hello." if "just" in call.text else "Hello!"

    models = FakeModels(responder(answer=answer))
    services = mind(models, FakeRouter(("ROBIN",)))
    run(image, services, "hello")
    state = run(image, services, "what did I just say?")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["thread"]["about_thread"]
    assert state["cycle"]["thread"]["why"] == "conversation"
    first, second = models.of("answer")
    assert "temperature" not in first.options and second.options["temperature"] == 0.0
    said = [m.content for m in second.messages if isinstance(m, HumanMessage)]
    # the user's messages listed in order before the question, since it asks about them
    assert said[0] == "hello" and said[1].endswith('\n1. "hello"\n\nwhat did I just say?')
    assert state["response"].endswith("You said hello.")


def test_a_fact_the_user_gave_is_answered_from_the_thread_not_from_memory(
    image, remembered, encoder, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    models = FakeModels(responder())
    router = FakeRouter(("BABS", "BRICK"))
    router.embedder = encoder  # one encoder weighs the thread and the catalog, as in use
    services = MindServices(models=models, router=router, embedder=encoder, catalog=remembered)
    run(image, services, "My Ondine ferry ticket from Harbour Pier cost 6.20 dollars.")
    question = "How much did my Ondine ferry ticket from Harbour Pier cost?"
    state = run(image, services, question)
    assert state["status"] == "COMPLETE", state.get("failure")
    record = state["cycle"]["thread"]
    assert record["about_thread"] and record["why"] == "nearest" and record["turn"] == 0
    assert record["best"] >= state["cycle"]["grounding"]["best"]
    assert state["cycle"]["passages"] == [] and state["cycle"]["cited"] == []
    assert not state["cycle"]["grounding"]["about_catalog"]
    # two personas routed, yet one answer from what was said: a plan's steps would not see it
    assert state["cycle"]["depth"]["mode"] == "fast"
    assert "about the thread" in state["cycle"]["depth"]["rule"]
    [answer] = models.of("answer")[1:]
    assert answer.options["temperature"] == 0.0
    assert answer.messages[-1].content == question  # no passages put before it


def asked_after(image: LivingImage, catalog: Any, said: str, question: str) -> dict[str, Any]:
    """``question`` on a thread where the user said ``said`` first; BABS answers from the
    ferry timetable when given its passages."""
    models = FakeModels(responder(answer=lambda call: "At 7:40, for 4.80 dollars [1]."))
    services = mind(models, FakeRouter(("BABS",)), catalog=catalog)
    run(image, services, said)
    state = run(image, services, question)
    assert state["status"] == "COMPLETE", state.get("failure")
    return state


def test_a_follow_up_about_a_document_keeps_its_passages(image, remembered, monkeypatch) -> None:
    """The user's earlier question resembles the follow-up most, but states nothing."""
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    state = asked_after(
        image,
        remembered,
        "When does the Ondine ferry leave Harbour Pier?",
        "And when does the Ondine ferry leave Harbour Pier on Sundays?",
    )
    assert state["cycle"]["thread"]["about_thread"] is False
    assert state["cycle"]["passages"] and state["cycle"]["cited"]


def test_with_the_thread_setting_off_the_same_question_is_answered_from_memory(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    monkeypatch.setenv("BATOS_MIND_THREAD", "off")
    state = asked_after(
        image,
        remembered,
        "My Ondine ferry ticket from Harbour Pier cost 6.20 dollars.",
        "How much did my Ondine ferry ticket from Harbour Pier cost?",
    )
    assert "thread" not in state["cycle"] and state["cycle"]["passages"]


def test_a_request_the_thread_does_not_answer_keeps_the_persona_s_sampling(image) -> None:
    models = FakeModels(responder())
    services = mind(models, FakeRouter(("ROBIN",)))
    run(image, services, "hello")
    state = run(image, services, "tell me a joke about cats")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["thread"]["about_thread"] is False
    assert all("temperature" not in call.options for call in models.of("answer"))


def test_earlier_messages_that_cannot_be_weighed_leave_the_request_s_words_to_decide(
    image,
) -> None:
    class Failing(FakeEmbedder):
        def encode(self, texts):  # the earlier messages, weighed in one batch
            if "hello" in texts:
                raise RuntimeError("the encoder is gone")
            return super().encode(texts)

    models = FakeModels(responder(answer="What did I just say? You said hello."))
    services = MindServices(models=models, router=FakeRouter(("ROBIN",)), embedder=Failing())
    run(image, services, "hello")
    state = run(image, services, "what did I just say?")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["thread"]["about_thread"] and state["cycle"]["thread"]["best"] is None
    [degraded] = state["cycle"]["degraded"]
    assert degraded["what"] == "the thread's earlier messages"
    assert "the encoder is gone" in json.dumps(degraded)


def test_a_question_about_memory_needs_no_plan(image, remembered, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    models = FakeModels(responder(answer=lambda call: "At 7:40 [1]."))
    question = "explain when the Ondine ferry leaves Harbour Pier"  # a planning cue
    state = run(image, mind(models, FakeRouter(("BABS",)), catalog=remembered), question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"]["rule"] == "about memory: one answer from its passages"
    assert [call_kind(c) for c in models.calls] == ["answer"]


def test_one_long_question_about_memory_needs_no_plan_but_a_long_request_has_one(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    models = FakeModels(responder(answer=lambda call: "At 7:40 [1]."))
    services = mind(models, FakeRouter(("BRICK",)), catalog=remembered)
    scene = "I am taking my old mother and my two children across to the island next Saturday and "
    question = scene + "we must not miss it, so when does the Ondine ferry leave Harbour Pier?"
    assert 30 < len(question.split()) <= 60
    state = run(image, services, question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"]["rule"] == "about memory: one answer from its passages"
    assert [call_kind(c) for c in models.calls] == ["answer"]
    # several requests in one, or more than a question's words: planned as before
    for request in (
        question.replace("?", ". Plan the day around it: lunch, a walk and the way back."),
        scene * 4 + "when does the Ondine ferry leave Harbour Pier?",
    ):
        before = len(models.calls)
        state = run(image, services, request, thread=f"t-{len(request)}")
        assert "plan" in [call_kind(c) for c in models.calls[before:]], state["cycle"]["depth"]


def test_a_question_about_memory_routed_to_two_personas_needs_no_plan(
    image, remembered, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_GROUNDING", "0.3")
    models = FakeModels(responder(answer=lambda call: "At 7:40 [1]."))
    question = "When does the Ondine ferry leave Harbour Pier?"
    services = mind(models, FakeRouter(("BRICK", "BABS")), catalog=remembered)
    state = run(image, services, question)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"] == {
        "mode": "fast",
        "rule": "about memory: one answer from its passages (2 personas routed)",
    }
    [call] = models.calls
    assert call_kind(call) == "answer" and call.persona == "BRICK"
    assert "ferry leaves Harbour Pier at 7:40" in call.text
    # "single": several personas routed plan and weave, as before
    monkeypatch.setenv("BATOS_MIND_MEMORY_FAST", "single")
    state = run(image, services, question, thread="t-single")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert "plan" in [call_kind(c) for c in models.calls[1:]]  # it planned (and fell back)


def test_a_plan_s_babs_step_brings_as_many_passages_as_a_grounded_answer_reads(
    image, encoder, tmp_path, monkeypatch
) -> None:
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    monkeypatch.setenv("BATOS_MIND_GROUNDING", "2")  # the request is not answered from memory
    monkeypatch.setenv("BATOS_MIND_PASSAGES", "2")
    for n in range(6):
        (tmp_path / f"ferry{n}.md").write_text(f"# Ferry {n}\n\nFerry number {n} runs daily.")
    catalog = KnowledgeCatalog.open(image, encoder)
    ingest_paths(catalog, sorted(tmp_path.glob("*.md")))
    plan = plan_of(
        ("BABS.facet_research", "which ferries run daily"),
        ("BRICK.facet_steps", "how to plan a trip by ferry"),
    )
    models = FakeModels(responder(plan=plan))
    state = run(
        image,
        mind(models, FakeRouter(("BRICK", "BABS")), catalog=catalog),
        "plan a trip on the ferries that run daily, step by step, and explain why",
    )
    assert state["status"] == "COMPLETE", state.get("failure")
    [research] = [p for p in state["partials"] if p["persona"] == "BABS"]
    assert len(research["passages"]) == 2
    assert len(state["cycle"]["passages"]) == 2


def test_an_answer_that_finds_nothing_looks_again_in_the_next_passages(
    image, encoder, tmp_path, monkeypatch
) -> None:
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    monkeypatch.setenv("BATOS_MIND_GROUNDING", "-1")
    for n in range(8):
        (tmp_path / f"ferry{n}.md").write_text(f"# Ferry {n}\n\nFerry number {n} runs daily.")
    catalog = KnowledgeCatalog.open(image, encoder)
    ingest_paths(catalog, sorted(tmp_path.glob("*.md")))
    replies = iter(["Found in [2].", "Every ferry runs daily [1]."])
    models = FakeModels(responder(answer=lambda call: next(replies)))
    state = run(
        image, mind(models, FakeRouter(("BABS",)), catalog=catalog), "which ferry runs daily"
    )
    assert state["status"] == "COMPLETE", state.get("failure")
    first, second = models.of("answer")
    assert second.text.startswith("Retrieved passages follow") and "Found in" not in second.text

    def cited(call: ModelCall) -> set[str]:  # the passages a prompt shows, by citation
        return {x.split(" ", 1)[1] for x in call.text.splitlines() if x[:1] == "["}

    assert len(cited(second)) == 3 and not cited(first) & cited(second)
    assert state["response"].startswith("Every ferry runs daily [1].")
    assert state["cycle"]["synthesis_attempts"] == 2 and state["cycle"]["degraded"] == []


def test_a_short_computation_takes_the_fast_path_after_its_program(image, remembered) -> None:
    models = FakeModels(
        lambda call: (
            program("    return 240 * 15 / 100\n")(call)
            if call_kind(call) == "program"
            else responder(answer="15% of 240 is 36.")(call)
        )
    )
    services = mind(models, FakeRouter(("BRICK",)), catalog=remembered)
    state = run(image, services, "What is 15% of 240?")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"]["mode"] == "fast" and state["cycle"]["compute"]
    # its figures are all in the request: no passages, whatever the catalog holds
    assert state["cycle"]["grounding"] == {"about_catalog": False}
    assert [call_kind(c) for c in models.calls] == ["program", "answer"]
    assert "A program computed this for the request: 36" in models.of("answer")[0].text


# -- a request on a thread another process is answering on -------------------------------


class _Steps(TypedDict):
    log: Annotated[list, operator.add]


def two_steps() -> Any:
    """A graph of two steps, ``one`` then ``two``: a run stopped before ``two`` is mid-run."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(_Steps)
    builder.add_node("one", lambda s: {"log": ["one"]})
    builder.add_node("two", lambda s: {"log": ["two"]})
    builder.add_edge(START, "one")
    builder.add_edge("one", "two")
    builder.add_edge("two", END)
    return builder


class _Asked(TypedDict):
    answer: str


def test_a_request_on_a_thread_mid_run_is_refused_before_it_starts(
    shared_image_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from images import open_laid_out

    from batos.errors import ThreadBusy
    from graph import mind as mind_module
    from graph.mind import refuse_if_busy

    builder = two_steps()
    config = run_config("busy")
    # Two processes: each its own image of the shared one, and its own checkpointer.
    with (
        open_laid_out(shared_image_uri) as here_image,
        open_laid_out(shared_image_uri) as there_image,
        ZODBSaver(here_image) as here_saver,
        ZODBSaver(there_image) as there_saver,
    ):
        here = builder.compile(checkpointer=here_saver)
        there = builder.compile(checkpointer=there_saver)
        refuse_if_busy(here, config)  # a new thread
        there.invoke({"log": []}, config)
        refuse_if_busy(here, config)  # a thread whose last run ended
        # A run stopped between its steps, as the other process's run is while it works.
        stopped = {**config, "metadata": {"run_id": "run-1"}}
        there.invoke({"log": []}, stopped, interrupt_before=["two"])
        refuse_if_busy(there, config)  # its own process orders its own runs
        with pytest.raises(ThreadBusy, match="is answering another request") as refused:
            refuse_if_busy(here, config)
        # a server retrying a run its stopped predecessor left running: its own attempt
        refuse_if_busy(here, config, run_id="run-1")
        with pytest.raises(ThreadBusy):
            refuse_if_busy(here, config, run_id="run-2")
        assert "before two" in refused.value.message and refused.value.hint
        assert isinstance(refused.value, ValueError)
        latest = here_saver.get_tuple(config)
        fork = {"configurable": {**config["configurable"], "checkpoint_id": "x"}}
        refuse_if_busy(here, fork)  # a branch from a named checkpoint is never refused
        # A run whose last step is older than a cycle's step ever takes: its process died.
        monkeypatch.setattr(mind_module, "BUSY_SECONDS", 0.0)
        refuse_if_busy(here, config)
        assert here_saver.get_tuple(config).config == latest.config  # a check stores nothing


_STOPPED_WRITER = """
import sys
from images import open_laid_out
from test_mind import two_steps
from graph.mind import run_config
from store.checkpoint.saver import ZODBSaver

with open_laid_out(sys.argv[1]) as image, ZODBSaver(image) as saver:
    two_steps().compile(checkpointer=saver).invoke(
        {"log": []}, run_config("stopped"), interrupt_before=["two"]
    )
    print("stored", flush=True)
    sys.stdin.readline()  # alive, as a process answering, until the test lets it go
"""


def test_a_thread_whose_writer_was_killed_takes_a_new_request_at_once(
    shared_image_uri: str, tmp_path: Path
) -> None:
    """A killed process's thread was refused for five minutes."""
    from images import open_laid_out

    from batos.errors import ThreadBusy
    from graph.mind import refuse_if_busy

    script = tmp_path / "writer.py"
    script.write_text(_STOPPED_WRITER)
    paths = os.pathsep.join([str(REPO / "tests"), str(REPO)])
    writer = subprocess.Popen(
        [sys.executable, str(script), shared_image_uri],
        env={**os.environ, "PYTHONPATH": paths},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "stored\n"
        builder = two_steps()
        with open_laid_out(shared_image_uri) as image, ZODBSaver(image) as saver:
            graph = builder.compile(checkpointer=saver)
            config = run_config("stopped")
            with pytest.raises(ThreadBusy):  # its writer is alive: it may be answering
                refuse_if_busy(graph, config)
            assert "__batos_writer__" not in graph.get_state(config).metadata  # kept apart
            writer.kill()
            writer.wait(30)
            refuse_if_busy(graph, config)  # its writer is gone: nothing runs there
    finally:
        writer.kill()
        writer.wait(30)


def test_a_checkpoints_writer_is_gone_only_when_this_host_can_tell() -> None:
    import psutil

    from store.checkpoint import writers

    mine = writers.this_process()
    assert mine is not None and not writers.gone(mine)
    boot, namespace, pid, started = mine.split("|")
    dead_pid = a_dead_pid()
    assert not psutil.pid_exists(dead_pid)
    assert writers.gone(f"{boot}|{namespace}|{dead_pid}|{started}")
    assert writers.gone(f"{boot}|{namespace}|{pid}|{float(started) - 60:.2f}")  # pid reused
    other_boot = "0" * 8 + boot[8:]
    for unknown in (  # another host or container, or not a writer's name at all: unknown
        f"{other_boot}|{namespace}|{dead_pid}|{started}",
        f"{boot}|pid:[1]|{dead_pid}|{started}",
        f"{boot}|{namespace}|{dead_pid}|{started}" + "0" * 300,
        None,
        12,
        ["x"],
        "x" * 10_000,
    ):
        assert not writers.gone(unknown), unknown


def test_a_thread_waiting_on_an_interrupt_takes_a_new_request(memory_image: LivingImage) -> None:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    from graph.mind import refuse_if_busy

    builder = StateGraph(_Asked)
    builder.add_node("ask", lambda s: {"answer": interrupt("an example, please")})
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    with ZODBSaver(memory_image) as saver:
        asking = builder.compile(checkpointer=saver)
        asking.invoke({"answer": ""}, run_config("asking"))
        assert asking.get_state(run_config("asking")).next == ("ask",)
        refuse_if_busy(asking, run_config("asking"))  # the user may answer, or ask anew
