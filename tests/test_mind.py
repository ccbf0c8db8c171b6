"""The mind graph with a scripted model: every path through the PSM, and what reaches the image."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fakes import FakeEmbedder, FakeModels, FakeRouter, ModelCall, call_kind, image_digest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from batos.errors import CheckpointError, MindError, ModelError
from graph import cycle
from graph.boot import open_image
from graph.mind import MindServices, ask, build_graph, run_config
from graph.mind_nodes import repetition
from prototypes.incarnation import personas
from prototypes.uvm import Method
from store import effects
from store.checkpointer import ZODBSaver
from store.image import LivingImage

SELECTOR = re.compile(r"Write the method `(\w+)`")


def facet_source(selector: str, instruction: str = "Work on this: ") -> str:
    return (
        f"def {selector}(self, query):\n"
        f"    return {{'instruction': {instruction!r} + query, 'temperature': 0.2}}\n"
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


def test_a_full_cycle_writes_its_facets_once_and_installs_them_at_complete(image) -> None:
    plan = plan_of(
        ("BRICK.facet_steps", "which steps build a shed"),
        ("BRICK.facet_design", "what design suits a small shed"),
    )
    models = FakeModels(responder(plan=plan))
    router = FakeRouter(("BRICK",))
    state = run(image, mind(models, router), "plan the steps to build a garden shed")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"]["rule"] == "planning cue 'plan'"
    assert [(p["persona"], p["facet"]) for p in state["plan"]] == [
        ("BRICK", "facet_steps"),
        ("BRICK", "facet_design"),
    ]
    assert sorted(p["facet"] for p in state["partials"]) == ["facet_design", "facet_steps"]
    assert all(p["ok"] and p["wrote"] for p in state["partials"])
    plan_call = models.of("plan")[0]
    assert plan_call.options["format"]["properties"]["steps"]["maxItems"] == 4
    assert (
        "BRICK.facet_steps"
        in plan_call.options["format"]["properties"]["steps"]["items"]["properties"]["facet"][
            "enum"
        ]
    )
    # the facet's instruction (from the generated method) is what the persona model reads
    facet_texts = sorted(c.text for c in models.of("facet"))
    assert facet_texts[0].startswith("Work on this: what design suits a small shed")
    assert models.made.count(("BRICK", {"num_predict": 256, "temperature": 0.2})) == 2
    weave = models.of("answer")[0].text
    assert "BRICK notes on" in weave and "[BRICK · facet_steps]" in weave
    with image.read() as root:
        brick = personas(root)["BRICK"]
        assert isinstance(brick._slots()["facet_steps"], Method)
        assert brick.facet_steps("x") == {"instruction": "Work on this: x", "temperature": 0.2}
        assert brick.stats["facets"] == {"facet_steps": 1, "facet_design": 1}
        assert cycle.get(root, state["cycle"]["id"])["methods_written"] == [
            "BRICK.facet_steps",
            "BRICK.facet_design",
        ] or sorted(cycle.get(root, state["cycle"]["id"])["methods_written"]) == [
            "BRICK.facet_design",
            "BRICK.facet_steps",
        ]

    # The next cycle finds the methods in the image: no drafts.
    again = FakeModels(responder(plan=plan))
    state = run(image, mind(again, router), "plan the steps to build a bigger shed", thread="t2")
    assert state["status"] == "COMPLETE"
    assert again.of("draft") == [] and not any(p["wrote"] for p in state["partials"])


def test_facets_run_in_parallel_branches(image) -> None:
    barrier = threading.Barrier(2, timeout=20)

    def facet(call: ModelCall) -> str:
        barrier.wait()  # both branches must be in their model call at once
        return f"{call.persona} was here"

    plan = plan_of(("ROBIN.facet_feelings", "what hurts"), ("ROBIN.facet_meaning", "why"))
    models = FakeModels(responder(plan=plan, facet=facet))
    state = run(image, mind(models), "explain why losing a game hurts so much")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert [p["text"] for p in state["partials"]] == ["ROBIN was here"] * 2


def test_the_same_missing_facet_twice_in_a_plan_is_written_once(image) -> None:
    plan = plan_of(("BRICK.facet_steps", "first part"), ("BRICK.facet_steps", "second part"))
    models = FakeModels(responder(plan=plan))
    state = run(image, mind(models, FakeRouter(("BRICK",))), "list the steps to do two parts")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert len(models.of("draft")) == 1
    installs = [e for e in state["commit"]["effects"] if e["kind"] == "install_method"]
    assert [e["selector"] for e in installs] == ["facet_steps"]


def test_several_personas_are_woven_by_the_lead(image) -> None:
    plan = plan_of(("BRICK.facet_steps", "how to move"), ("ROBIN.facet_feelings", "the sadness"))
    models = FakeModels(responder(plan=plan))
    router = FakeRouter(("BRICK", "ROBIN"))
    state = run(image, mind(models, router), "I am sad about moving house, help me do it")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["depth"]["rule"] == "2 personas routed: their answers are woven"
    assert state["route"]["chosen"] == ["BRICK", "ROBIN"]
    weave = models.of("answer")[0]
    assert weave.persona == "BRICK" and "BRICK and ROBIN" in weave.text
    assert {p["persona"] for p in state["partials"]} == {"BRICK", "ROBIN"}
    assert state["messages"][-1].name == "brick"
    with image.read() as root:
        record = cycle.get(root, state["cycle"]["id"])
        assert record["personas"] == ["BRICK", "ROBIN"]
        assert personas(root)["ROBIN"].stats["facets"] == {"facet_feelings": 1}


def test_an_unparseable_plan_is_retried_once(image) -> None:
    replies = iter(["not json at all", plan_of(("ROBIN.facet_meaning", "why it matters"))])
    models = FakeModels(responder(plan=lambda call: next(replies)))
    state = run(image, mind(models), "explain why my garden matters to me")
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["cycle"]["plan_attempts"] == 2
    retry = models.of("plan")[1]
    assert "rejected: the reply is not JSON" in retry.text


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
def test_a_plan_rejected_twice_fails_and_changes_nothing(image, bad: str) -> None:
    run(image, mind(FakeModels(responder())), "hi")  # layouts and first records in place
    before = stable_digest(image)
    models = FakeModels(responder(plan=bad))
    state = run(image, mind(models), "explain why the sky is blue", thread="t2")
    assert state["status"] == "FAILED"
    assert state["failure"]["node"] == "decompose"
    assert "plan was rejected twice" in state["failure"]["reason"]
    assert len(models.of("plan")) == 2
    assert state["messages"][-1].additional_kwargs["batos_failed"] is True
    assert stable_digest(image) == before


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
        (["", "   "], "empty"),
        (["I'm sorry, but I can't help with kites."] * 2, "refusal"),
        (["kite " * 2000] * 2, "characters"),
        ([_LOOP] * 2, "repeats itself"),
    ],
)
def test_an_answer_failing_the_gate_twice_fails_the_cycle(image, answers, reason) -> None:
    run(image, mind(FakeModels(responder())), "hi")
    before = stable_digest(image)
    replies = iter(answers)
    models = FakeModels(responder(answer=lambda call: next(replies)))
    state = run(image, mind(models), "how do I fly my kite", thread="t2", depth="fast")
    assert state["status"] == "FAILED"
    assert state["failure"]["node"] == "gate" and reason in state["failure"]["reason"]
    assert stable_digest(image) == before


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
    with pytest.raises(MindError, match="thread id"):
        run_config("../etc/passwd")
    with pytest.raises(MindError, match="thread id"):
        ask("hi", thread_id="", image=image, services=mind(FakeModels(responder())))


def test_a_facet_whose_method_cannot_be_written_fails_the_cycle(image) -> None:
    run(image, mind(FakeModels(responder())), "hi")
    before = stable_digest(image)
    plan = plan_of(("ROBIN.facet_meaning", "why"))
    bad = "def facet_meaning(self, query):\n    import os\n    return os.getcwd()\n"
    models = FakeModels(responder(plan=plan, draft=lambda selector: bad))
    state = run(image, mind(models), "explain why the moon matters", thread="t2")
    assert state["status"] == "FAILED"
    assert "could not be written" in state["failure"]["reason"]
    assert len(models.of("draft")) == 3
    assert stable_digest(image) == before


def _boom(call: ModelCall) -> Any:
    return ModelError("the backend died mid-cycle", hint="restart it")


@pytest.mark.parametrize(
    ("where", "node"),
    [
        ("router", "route"),
        ("plan", "decompose"),
        ("draft", "synthesize"),  # a facet's failure is reported when the partials are joined
        ("facet", "synthesize"),
        ("answer", "synthesize"),
        ("embed", "gate"),
    ],
)
def test_a_failure_at_every_node_leaves_the_image_unchanged(image, where, node) -> None:
    run(image, mind(FakeModels(responder())), "hi")
    before = stable_digest(image)

    def respond(call: ModelCall) -> Any:
        if call_kind(call) == where:
            return _boom(call)
        return responder(plan=plan_of(("ROBIN.facet_meaning", "why")))(call)

    class Failing(FakeEmbedder):  # the request's vector is the router's: this embeds answers
        def encode(self, texts):
            if where == "embed":
                raise ModelError("the embedding model died")
            return super().encode(texts)

    class BrokenRouter(FakeRouter):
        def route(self, text):
            raise ModelError("the router died")

    router = BrokenRouter() if where == "router" else FakeRouter()
    services = MindServices(models=FakeModels(respond), router=router, embedder=Failing())
    state = run(image, services, "explain why the tide turns", thread="t2")
    assert state["status"] == "FAILED"
    assert state["failure"]["node"] == node, state["failure"]
    assert "died" in state["failure"]["reason"]
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
    with open_image(file_uri) as image:
        graph = build_graph(mind(models, image=image), checkpointer=InMemorySaver())
        state = graph.invoke({"messages": [HumanMessage("hello")]}, run_config("mem"))
        assert state["status"] == "COMPLETE"
        with image.read() as root:
            assert cycle.get(root, state["cycle"]["id"])["status"] == "COMPLETE"
        assert image.history(1)[0].description.startswith(f"mind cycle {state['cycle']['id']}")


def test_a_commit_is_applied_once_and_checked(image) -> None:
    state = run(image, mind(FakeModels(responder())), "hello")
    commit = effects.check(state["commit"])
    assert image.transact(lambda root: effects.apply_commit(root, commit, ("t", "", "x"))) is False
    with image.read() as root:
        assert personas(root)["ROBIN"].stats["cycles"] == 1
    with pytest.raises(CheckpointError, match="nothing applies"):
        effects.check({"id": "x", "effects": [{"kind": "format_disk"}]})
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
                    }
                ),
                ("t", "", "y"),
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
