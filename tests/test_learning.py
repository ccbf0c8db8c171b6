"""Personas that learn from accepted cycles: lessons from the mind's commits, marks from a user,
and the retraining mission that swaps an adapter in only when it is better, undoably."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeModels
from test_mind import mind, responder, run

from batos.errors import BatosError
from batos.shell.cli.mind import Session, chat_loop
from batos.shell.runtime import Runtime, open_image
from batos.training import retrain
from batos.training.lora import Example, TrainingPlan, read_manifest
from graph import learning
from graph.missions import history
from store.core.image import LivingImage

REPO_MODELFILES = Path(__file__).resolve().parent.parent / "modelfiles"


@pytest.fixture
def modelfiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the Modelfiles, data and the test model's adapters: swaps write into it."""
    folder = tmp_path / "modelfiles"
    folder.mkdir()
    for modelfile in REPO_MODELFILES.glob("*.Modelfile"):
        shutil.copy(modelfile, folder)
    shutil.copytree(REPO_MODELFILES / "data", folder / "data")
    shutil.copytree(REPO_MODELFILES / "adapters" / "test", folder / "adapters" / "test")
    monkeypatch.setenv("BATOS_MODELFILES", str(folder))
    monkeypatch.setenv("BATOS_MODEL_CACHE", str(tmp_path / "cache"))
    return folder


@pytest.fixture
def image(file_uri: str) -> Iterator[LivingImage]:
    living = open_image(file_uri, create=True)  # a file image: missions need its undo history
    yield living
    living.close()


def ask(image: LivingImage, text: str, thread: str = "t1", **models: Any) -> dict[str, Any]:
    fake = FakeModels(responder(**models))
    return run(image, mind(fake), text, thread=thread, persona="ALFRED")


# -- lessons ------------------------------------------------------------------------------------


def test_a_completed_cycle_becomes_a_lesson_with_its_provenance(image) -> None:
    state = ask(image, "how should I fold a napkin")
    assert state["status"] == "COMPLETE"
    with image.read() as root:
        [lesson] = learning.lessons(root, "ALFRED")
    assert lesson["cycle"] == state["cycle"]["id"] and lesson["thread_id"] == "t1"
    assert lesson["request"] == "how should I fold a napkin"
    assert lesson["answer"] == "About how should I fold a napkin: here is the answer."
    assert lesson["persona"] == "ALFRED" and lesson["model"] == "test"
    assert lesson["source"] == "cycle" and lesson["verdict"] is None and lesson["time"] > 0


def test_a_model_path_longer_than_a_lesson_holds_is_named_by_a_stable_key(
    image, monkeypatch, tmp_path
) -> None:
    # BATOS_MODEL may be a GGUF path of any length: the lesson's model field is bounded, and a
    # lesson naming the path whole had every COMPLETE cycle's commit refused
    path = str(tmp_path / ("models-" * 40) / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    other = path.replace("qwen2.5", "qwen3")
    monkeypatch.setenv("BATOS_MODEL", path)
    assert ask(image, "how should I fold a napkin")["status"] == "COMPLETE"
    with image.read() as root:
        [lesson] = learning.lessons(root, "ALFRED")
        assert len(lesson["model"]) <= learning.MAX_MODEL_CHARS
        assert "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" in lesson["model"]
        assert [x["cycle"] for x in learning.accepted(root, "ALFRED", path)] == [lesson["cycle"]]
        assert learning.accepted(root, "ALFRED", other) == []
    assert learning.lesson_model(other) != lesson["model"]
    assert learning.lesson_model("test") == "test"  # a name that fits is kept as it is


def test_a_flagged_cycle_leaves_no_lesson() -> None:
    state = {"route": {"chosen": ["ALFRED"]}, "response": "An answer."}
    clean = {"thread_id": "t", "request": "a request", "degraded": [], "truncated": False}
    assert [e["kind"] for e in learning.effects_for(state, clean)] == ["lesson"]
    degraded = {**clean, "degraded": [{"where": "gate", "what": "the answer", "reason": "x"}]}
    assert learning.flags(degraded) == ["gate: the answer"]
    assert learning.effects_for(state, degraded) == []
    assert learning.effects_for(state, {**clean, "truncated": True}) == []


def test_lessons_are_bounded_and_good_ones_go_last(image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MAX_LESSONS", "2")
    first = ask(image, "first question about silver")
    learning.mark(image, "t1", first["cycle"]["id"], "good")
    ask(image, "second question about silver")
    third = ask(image, "third question about silver")
    with image.read() as root:
        kept = learning.lessons(root, "ALFRED")
    assert [x["cycle"] for x in kept] == [first["cycle"]["id"], third["cycle"]["id"]]


def test_good_and_bad_marks_through_the_python_api(image) -> None:
    good = ask(image, "what wine goes with fish")
    bad = ask(image, "what wine goes with beef")
    learning.mark(image, "t1", good["cycle"]["id"], "good")
    learning.mark(image, "t1", bad["cycle"]["id"], "bad")
    with image.read() as root:
        taken = learning.accepted(root, "ALFRED")
    assert [(x["cycle"], x["verdict"]) for x in taken] == [(good["cycle"]["id"], "good")]
    with pytest.raises(learning.LearningError, match="has no committed cycle"):
        learning.mark(image, "another-thread", good["cycle"]["id"], "good")
    with pytest.raises(learning.LearningError, match="unknown verdict"):
        learning.mark(image, "t1", good["cycle"]["id"], "meh")


def test_marking_a_cycle_that_left_no_lesson_makes_one_from_the_user(image) -> None:
    state = ask(image, "how do I polish brass")
    image.transact(lambda root: root["lessons"]["ALFRED"].clear(), note="forget")
    lesson = learning.mark(image, "t1", state["cycle"]["id"], "good")
    assert lesson["source"] == "user" and lesson["persona"] == "ALFRED"
    assert lesson["answer"] == "About how do I polish brass: here is the answer."


def test_feedback_set_in_the_thread_state_is_recorded_by_the_next_cycle(image) -> None:
    from graph.mind import build_graph, run_config
    from store.checkpoint.saver import ZODBSaver

    first = ask(image, "how do I iron a shirt")
    with ZODBSaver(image) as saver:
        graph = build_graph(mind(FakeModels(responder())), checkpointer=saver)
        config = run_config("t1")
        graph.update_state(config, {"feedback": {"cycle": first["cycle"]["id"], "verdict": "bad"}})
        graph.update_state(config, {"feedback": {"cycle": "no-such", "verdict": "bad"}})
        with image.read() as root:  # nothing is recorded before a cycle commits
            assert learning.find(root, first["cycle"]["id"])["verdict"] is None
    # the last one set wins; one naming no cycle of the thread is ignored, the cycle commits
    after = ask(image, "and a jacket")
    assert after["status"] == "COMPLETE" and after["feedback"] is None
    with ZODBSaver(image) as saver:
        graph = build_graph(mind(FakeModels(responder())), checkpointer=saver)
        graph.update_state(
            run_config("t1"), {"feedback": {"cycle": first["cycle"]["id"], "verdict": "bad"}}
        )
    ask(image, "and a tie")
    with image.read() as root:
        assert learning.find(root, first["cycle"]["id"])["verdict"] == "bad"
        assert [x["request"] for x in learning.accepted(root, "ALFRED")] == [
            "and a jacket",
            "and a tie",
        ]


class Lines:
    """A ``LineReader`` that reads from a list."""

    def __init__(self, *lines: str) -> None:
        self.lines = list(lines)

    def read(self, prompt: str = "") -> str | None:
        return self.lines.pop(0) if self.lines else None


def test_good_and_bad_in_batos_chat_mark_the_last_answer(image, capsys) -> None:
    session = Session(Runtime.of(image, models=FakeModels(responder())))
    try:
        chat_loop(session, "chat-1", "ALFRED", "auto", Lines("/good"))
        chat_loop(
            session, "chat-1", "ALFRED", "auto", Lines("how do I lay a table", "/good", "/quit")
        )
        chat_loop(session, "chat-1", "ALFRED", "auto", Lines("and set a fork", "/bad"))
    finally:
        session.close()
    out = capsys.readouterr().out
    assert "no answer to mark yet" in out
    assert "marked good: ALFRED learns from cycle" in out and "marked bad: cycle" in out
    with image.read() as root:
        marked = [(x["request"], x["verdict"]) for x in learning.lessons(root, "ALFRED")]
    assert marked == [("how do I lay a table", "good"), ("and set a fork", "bad")]


# -- the mission -------------------------------------------------------------------------------


def test_the_mission_declines_without_enough_new_accepted_lessons(image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", "3")
    for n in range(2):
        ask(image, f"question {n} about the cellar")
    bad = ask(image, "question 2 about the cellar")
    learning.mark(image, "t1", bad["cycle"]["id"], "bad")
    assert learning.due(image) == []
    with pytest.raises(learning.LearningError, match="2 new accepted lessons"):
        learning.retrain_mission(image, "ALFRED", evaluator=FakeEvaluator({}))
    assert history(image) == []


def test_the_swap_decision_needs_the_margin_and_keeps_relevance() -> None:
    current = retrain.Evaluation(10, 20, 0.50)
    assert retrain.decide(current, retrain.Evaluation(11, 20, 0.50), 0.05).swap
    assert not retrain.decide(current, retrain.Evaluation(10, 20, 0.90), 0.05).swap
    lost = retrain.decide(current, retrain.Evaluation(20, 20, 0.40), 0.05)
    assert not lost.swap and "relevance fell" in lost.why
    assert not retrain.decide(current, retrain.Evaluation(0, 0, None), 0.0).swap


def test_learnt_examples_never_include_an_evaluation_prompt(modelfiles) -> None:
    held = retrain.evaluation_prompts("ALFRED", 5)
    assert len(held) == 5
    learnt = [Example(held[0], "a reply"), Example("a new prompt", "a reply")]
    examples = retrain.training_set("ALFRED", learnt, [Example("a good prompt", "yes")])
    extra = examples[-3:]
    assert [e.prompt for e in extra] == ["a good prompt", "a new prompt", "a good prompt"]


class FakeEvaluator:
    """Scores an adapter by its file's bytes: ``voice[bytes]`` of 20 hits."""

    def __init__(self, voice: dict[bytes, int]) -> None:
        self.voice = voice
        self.seen: list[bytes | None] = []

    def __call__(self, persona: str, adapter: Path | None) -> retrain.Evaluation:
        data = adapter.read_bytes() if adapter else None
        self.seen.append(data)
        return retrain.Evaluation(self.voice.get(data, 10), 20, 0.5)


class FakeTrainer:
    """Writes ``content`` as the adapter; remembers what each training got."""

    def __init__(self, content: bytes) -> None:
        self.content = content
        self.sizes: list[int] = []
        self.starts: list[Path | None] = []
        self.plans: list[TrainingPlan] = []

    def __call__(
        self,
        plan: TrainingPlan,
        examples: list[Example],
        out_dir: Path,
        deadline: float,
        *,
        start: Path | None = None,
        on_step: Any = None,
    ) -> Path:
        self.sizes.append(len(examples))
        self.starts.append(start)
        self.plans.append(plan)
        if start is not None:  # what it continues from is there to be read while it trains
            assert (start / "adapter_model.safetensors").is_file()
        if on_step:
            on_step(1, plan.steps, 2.5)
        (out_dir / "alfred.gguf").write_bytes(self.content)
        (out_dir / "manifest.json").write_text(
            json.dumps({"personas": {"alfred": {"steps": plan.steps, "steps_run": 1}}})
        )
        return out_dir / "alfred.gguf"


def fake_trainer(content: bytes, seen: list[int]) -> FakeTrainer:
    trainer = FakeTrainer(content)
    trainer.sizes = seen
    return trainer


def lessons_for(image: LivingImage, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        ask(image, f"question {n} about the pantry")


def alfred_with_lessons(
    image: LivingImage, modelfiles: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> tuple[Path, bytes]:
    """ALFRED with ``count`` new lessons, the minimum for a retraining: his served adapter
    file and its bytes before the mission."""
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", str(count))
    served = modelfiles / "adapters" / "test" / "alfred.gguf"
    old = served.read_bytes()
    lessons_for(image, count)
    return served, old


def test_a_better_adapter_is_swapped_in_and_undo_serves_the_old_file(
    image, modelfiles, monkeypatch
) -> None:
    served, old = alfred_with_lessons(image, modelfiles, monkeypatch, 2)
    good = ask(image, "a question the user liked")
    learning.mark(image, "t1", good["cycle"]["id"], "good")
    assert learning.due(image) == [("ALFRED", 3)]
    sizes: list[int] = []
    evaluator = FakeEvaluator({b"better": 12})
    mission = learning.retrain_mission(
        image, "ALFRED", evaluator=evaluator, trainer=fake_trainer(b"better", sizes)
    )
    original = len(retrain.load_examples(modelfiles / "data" / "alfred.jsonl"))
    assert sizes == [original + 2 + 2]  # the good lesson counts twice
    assert evaluator.seen == [old, b"better"]
    assert mission["status"] == "kept" and mission["kind"] == "retrain_adapter"
    assert mission["evaluation"]["current"]["voice"] == 0.5
    assert mission["evaluation"]["new"]["voice"] == 0.6 and len(mission["tids"]) == 1
    assert served.read_bytes() == b"better"
    entry = read_manifest(served.parent)["personas"]["alfred"]
    assert entry["learnt_examples"] == 3 and entry["adapter_sha256"] == retrain.served_sha(
        "test", "ALFRED"
    )
    [previous] = entry["history"]
    assert (served.parent / previous["kept_as"]).read_bytes() == old
    assert learning.due(image) == []  # its lessons are used: it waits for new ones

    learning.undo(image, mission["id"])
    assert served.read_bytes() == old
    assert read_manifest(served.parent)["personas"]["alfred"]["adapter_file"] == "alfred.gguf"
    assert [m["status"] for m in history(image)] == ["undone"]
    assert retrain.version_path("test", "ALFRED", mission["evaluation"]["candidate_sha256"])


def test_batos_undo_of_the_swap_transaction_serves_the_old_file(
    image, modelfiles, monkeypatch, capsys, file_uri
) -> None:
    from batos.shell.cli import main

    served, old = alfred_with_lessons(image, modelfiles, monkeypatch, 2)
    mission = learning.retrain_mission(
        image,
        "ALFRED",
        evaluator=FakeEvaluator({b"better": 15}),
        trainer=fake_trainer(b"better", []),
    )
    assert served.read_bytes() == b"better"
    image.close()
    assert main(["--image", file_uri, "undo", mission["tids"][0]]) == 0
    assert "adapter test/ALFRED" in capsys.readouterr().out
    assert served.read_bytes() == old


def test_a_candidate_that_is_not_better_is_kept_aside_not_served(
    image, modelfiles, monkeypatch
) -> None:
    served, old = alfred_with_lessons(image, modelfiles, monkeypatch, 2)
    # one hit more of twenty is 0.05, the margin: a tie with it is enough; none more is not
    mission = learning.retrain_mission(
        image, "ALFRED", evaluator=FakeEvaluator({b"same": 10}), trainer=fake_trainer(b"same", [])
    )
    assert mission["status"] == "declined" and "under the margin" in mission["evaluation"]["why"]
    assert served.read_bytes() == old and mission["tids"] == []
    assert retrain.version_path("test", "ALFRED", mission["evaluation"]["candidate_sha256"])
    with pytest.raises(BatosError, match="no kept retrain_adapter mission"):
        learning.undo(image, mission["id"])
    lessons_for(image, 1, start=2)
    assert learning.due(image) == []  # one new lesson is not enough for another try


def test_a_failed_retraining_changes_nothing_served(image, modelfiles, monkeypatch) -> None:
    served, old = alfred_with_lessons(image, modelfiles, monkeypatch, 1)

    def broken(*args: Any, **options: Any) -> Path:
        raise RuntimeError("out of memory")

    mission = learning.retrain_mission(image, "ALFRED", evaluator=FakeEvaluator({}), trainer=broken)
    assert mission["status"] == "failed" and "out of memory" in mission["error"]
    assert served.read_bytes() == old


def test_a_stopped_retraining_is_recorded_and_its_lessons_stay_new(
    image, modelfiles, monkeypatch
) -> None:
    served, old = alfred_with_lessons(image, modelfiles, monkeypatch, 2)

    def stopped(*args: Any, **options: Any) -> Path:
        raise KeyboardInterrupt  # Ctrl-C while it trains

    with pytest.raises(KeyboardInterrupt):
        learning.retrain_mission(image, "ALFRED", evaluator=FakeEvaluator({}), trainer=stopped)
    [mission] = history(image)
    assert mission["status"] == "interrupted" and "KeyboardInterrupt" in mission["error"]
    assert "lessons_through" not in mission and served.read_bytes() == old
    assert learning.due(image) == [("ALFRED", 2)]  # nothing was learnt from them

    def broken(*args: Any, **options: Any) -> Path:
        raise RuntimeError("out of memory")

    failed = learning.retrain_mission(image, "ALFRED", evaluator=FakeEvaluator({}), trainer=broken)
    assert failed["status"] == "failed" and "lessons_through" not in failed
    assert learning.due(image) == [("ALFRED", 2)]

    # A record from before the mark was set at the end carries it from its start: only a
    # retraining that learnt its lessons moves the mark.
    def running_with_a_mark(root: Any) -> None:
        from store.core import layout

        found = layout.missions(root)
        last = max(x["cycle"] for x in learning.lessons(root, "ALFRED"))
        # (long gone: a running one within its bound would hold retraining off)
        found[1] = {**found[1], "status": "running", "lessons_through": last, "started": 0.0}

    image.transact(running_with_a_mark, note="test: a record of the old kind")
    assert learning.due(image) == [("ALFRED", 2)]
    # Stopped once its swap is committed, the candidate is served: the mission is kept.
    monkeypatch.setattr(learning, "reconcile", stopped)
    with pytest.raises(KeyboardInterrupt):
        learning.retrain_mission(
            image,
            "ALFRED",
            evaluator=FakeEvaluator({b"better": 12}),
            trainer=fake_trainer(b"better", []),
        )
    kept = history(image)[-1]
    assert kept["status"] == "kept" and len(kept["tids"]) == 1 and kept["evaluation"]
    assert "stopped after its swap" in kept["error"] and learning.due(image) == []


@pytest.mark.parametrize("when", ["training", "swapped"])
def test_no_audit_judges_a_retraining_which_judges_itself(
    image, modelfiles, monkeypatch, capsys, file_uri, when
) -> None:
    from fakes import ScriptedChatModel

    from batos.shell.cli import main
    from graph import audit

    served, _ = alfred_with_lessons(image, modelfiles, monkeypatch, 2)
    alfred = ScriptedChatModel().enqueue("Nothing to report.")
    reports: list[dict[str, Any]] = []

    def audited(at: str) -> None:
        if at == when:
            reports.append(audit.run(image, lambda persona, **o: alfred))

    trainer = fake_trainer(b"better", [])

    def training(*args: Any, **options: Any) -> Path:
        audited("training")  # an audit while the mission trains, or
        return trainer(*args, **options)

    reconcile = learning.reconcile

    def swapped(img: LivingImage) -> list[str]:
        audited("swapped")  # one between its swap and its record
        return reconcile(img)

    monkeypatch.setattr(learning, "reconcile", swapped)
    mission = learning.retrain_mission(
        image, "ALFRED", evaluator=FakeEvaluator({b"better": 12}), trainer=training
    )
    assert [r["judged"] for r in reports] == [{}]
    assert mission["status"] == "kept" and "judged" not in mission
    assert served.read_bytes() == b"better"  # the swap stands
    with image.read() as root:
        from store.core import layout

        assert layout.find(root, layout.ADAPTERS)["test/ALFRED"]["mission"] == mission["id"]
    monkeypatch.setattr(learning, "reconcile", reconcile)  # every opening of the image calls it
    image.close()
    # The report shows what it trained on and its own verdict, not a CEM hypothesis.
    assert main(["--image", file_uri, "audit", "report"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"mission {mission['id']}: retrain_adapter ALFRED on test" in out
    assert "trained on 2 new accepted lessons" in out and "warm start" in out
    assert "kept: voice 0.500 → 0.600 (+0.100)" in out and "expects voice" not in out


# -- the warm start -----------------------------------------------------------------------------


def test_the_served_adapter_is_read_back_from_its_gguf_for_a_warm_start(
    modelfiles, tmp_path
) -> None:
    from gguf import GGUFReader
    from safetensors.torch import load_file

    from batos.training import warm

    served = modelfiles / "adapters" / "test" / "alfred.gguf"
    start = warm.served_weights("test", "ALFRED", tmp_path / "scratch")
    assert start.warm and "read back from its GGUF" in start.why
    config = json.loads((start.weights / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["layers_to_transform"]) == (8, 16, None)
    assert sorted(config["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    weights = load_file(str(start.weights / "adapter_model.safetensors"))
    gguf = {t.name: t.data for t in GGUFReader(str(served)).tensors}
    assert len(weights) == len(gguf) == 30 * 4 * 2
    key = "base_model.model.model.layers.{}.self_attn.{}.lora_{}.weight"
    # v's matrices come back as they are; q's lora_B rows were permuted for llama.cpp's rope
    v_b = weights[key.format(3, "v_proj", "B")].numpy()
    assert (v_b == gguf["blk.3.attn_v.weight.lora_b"].astype("float32")).all()
    q_b = weights[key.format(3, "q_proj", "B")].numpy()
    raw = gguf["blk.3.attn_q.weight.lora_b"].astype("float32")
    assert sorted(q_b.ravel()) == sorted(raw.ravel()) and not (q_b == raw).all()

    plan = warm.plan_for(TrainingPlan(model="test", persona="ALFRED", rank=2), start.weights)
    assert plan is not None and (plan.rank, plan.alpha, plan.top_layers) == (8, 16, None)
    assert plan.target_modules == ("q_proj", "k_proj", "v_proj", "o_proj")


def test_the_peft_cache_is_used_only_when_it_holds_the_served_version(modelfiles, tmp_path) -> None:
    from batos.training import lora, warm

    cached = lora.peft_dir("test", "ALFRED")
    first = warm.served_weights("test", "ALFRED", tmp_path / "a")
    shutil.copytree(first.weights, cached)
    assert warm.served_weights("test", "ALFRED", tmp_path / "b").weights == cached
    lora.mark_peft(cached, "0" * 64)  # the cache holds another version: read the GGUF back
    again = warm.served_weights("test", "ALFRED", tmp_path / "c")
    assert again.weights == tmp_path / "c" / "warm-start"


def test_a_retraining_starts_cold_and_says_why_when_nothing_can_be_read_back(
    modelfiles, tmp_path
) -> None:
    from batos.training import warm

    served = modelfiles / "adapters" / "test" / "alfred.gguf"
    served.write_bytes(b"not a gguf file at all, but long enough to be read as one" * 10)
    start = warm.served_weights("test", "ALFRED", tmp_path / "a")
    assert not start.warm and "cannot be read back" in start.why
    served.unlink()
    start = warm.served_weights("test", "ALFRED", tmp_path / "b")
    assert not start.warm and "serves no adapter" in start.why


def test_the_mission_continues_the_served_adapter_at_a_lower_rate_and_records_it(
    image, modelfiles, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", "2")
    lessons_for(image, 2)
    shipped = retrain.current_plan("test", "ALFRED").learning_rate
    trainer = FakeTrainer(b"better")
    mission = learning.retrain_mission(
        image, "ALFRED", evaluator=FakeEvaluator({b"better": 12}), trainer=trainer
    )
    [start] = trainer.starts
    assert start is not None and start.name == "warm-start"
    [plan] = trainer.plans
    assert plan.learning_rate == pytest.approx(shipped * retrain.WARM_LEARNING_RATE_SCALE)
    assert mission["start"] == "warm" and mission["evaluation"]["start"] == "warm"
    assert "read back from its GGUF" in mission["evaluation"]["start_why"]
    entry = read_manifest(modelfiles / "adapters" / "test")["personas"]["alfred"]
    assert entry["start"] == "warm" and entry["planned_learning_rate"] == shipped
    # the next retraining scales the plan's rate again, not the reduced one it ran at
    assert retrain.current_plan("test", "ALFRED").learning_rate == shipped


def test_the_mission_starts_cold_without_a_served_adapter(image, modelfiles, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", "2")
    (modelfiles / "adapters" / "test" / "alfred.gguf").unlink()
    lessons_for(image, 2)
    trainer = FakeTrainer(b"first")
    mission = learning.retrain_mission(
        image, "ALFRED", evaluator=FakeEvaluator({b"first": 12}), trainer=trainer
    )
    assert trainer.starts == [None] and mission["start"] == "cold"
    assert "serves no adapter" in mission["evaluation"]["start_why"]
    assert trainer.plans[0].learning_rate == retrain.current_plan("test", "ALFRED").learning_rate


def test_a_forced_mission_runs_with_few_lessons(image, modelfiles, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", "5")
    lessons_for(image, 1)
    mission = learning.retrain_mission(
        image,
        "ALFRED",
        evaluator=FakeEvaluator({}),
        trainer=FakeTrainer(b"same"),
        force=True,
    )
    assert mission["status"] == "declined" and mission["reason"].endswith("(forced)")
    # nothing new since: forced again, the mark of the lessons used stays where it was
    again = learning.retrain_mission(
        image, "ALFRED", evaluator=FakeEvaluator({}), trainer=FakeTrainer(b"same"), force=True
    )
    assert again["lessons_through"] == mission["lessons_through"] != ""


# -- batos learn ------------------------------------------------------------------------------


def cli(capsys, file_uri: str, *argv: str, retraining: Any = None) -> tuple[int, str, str]:
    from batos.shell.cli import main

    code = main(["--image", file_uri, *argv], retraining=retraining)
    out, err = capsys.readouterr()
    return code, out, err


def test_batos_learn_shows_lessons_the_served_adapter_and_no_mission_yet(
    image, modelfiles, monkeypatch, capsys, file_uri
) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", "2")
    lessons_for(image, 2)
    good = ask(image, "a question the user liked")
    bad = ask(image, "a question the user did not like")
    learning.mark(image, "t1", good["cycle"]["id"], "good")
    learning.mark(image, "t1", bad["cycle"]["id"], "bad")
    image.close()
    code, out, _ = cli(capsys, file_uri, "learn")
    assert code == 0
    [alfred] = [line.split() for line in out.splitlines() if line.startswith("ALFRED")]
    served = retrain.served_sha("test", "ALFRED")[:12]
    # lessons, accepted, good, bad, new (due at 2), adapter, since (the manifest's date), by
    assert alfred[:8] == ["ALFRED", "4", "3", "1", "1", "3", "due", served]
    assert alfred[8:] == ["2026-11-22", "trained"]
    assert "no retraining mission yet" in out
    code, out, _ = cli(capsys, file_uri, "learn", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["persona"] for r in rows] == ["ROBIN", "BRICK", "BABS", "ALFRED"]
    assert (rows[3]["new"], rows[0]["lessons"], rows[3]["missions"]) == (3, 0, [])


def test_batos_learn_run_refuses_with_too_few_lessons_unless_forced(
    image, modelfiles, monkeypatch, capsys, file_uri
) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", "5")
    lessons_for(image, 1)
    image.close()
    doubles = learning.Retraining(FakeTrainer(b"same"), FakeEvaluator({}))
    code, _, err = cli(capsys, file_uri, "learn", "run", "alfred", retraining=doubles)
    assert code == 1 and "1 new accepted lessons on test, fewer than 5" in err
    assert "--force" in err and doubles.trainer.sizes == []
    assert "0 steps" not in err  # no progress line for work that never started
    code, out, err = cli(capsys, file_uri, "learn", "run", "alfred", "--force", retraining=doubles)
    assert code == 0 and "mission 1: ALFRED declined" in out
    assert "warm start: the served adapter" in out and "kept aside: voice 0.500" in out
    assert "undo with" not in out
    assert "retrain ALFRED: 1 steps" in err  # the progress of training, on stderr
    code, _, err = cli(capsys, file_uri, "learn", "run", "nobody", retraining=doubles)
    assert code == 2 and "unknown persona" in err


@pytest.mark.parametrize("seconds", ["inf", "nan", "1e9", "0.5"])
def test_batos_learn_run_refuses_seconds_beyond_what_its_setting_takes(
    image, modelfiles, monkeypatch, capsys, file_uri, seconds
) -> None:
    alfred_with_lessons(image, modelfiles, monkeypatch, 1)
    image.close()
    doubles = learning.Retraining(FakeTrainer(b"better"), FakeEvaluator({b"better": 14}))
    argv = ("learn", "run", "alfred", "--seconds", seconds)
    code, out, err = cli(capsys, file_uri, *argv, retraining=doubles)
    assert code == 2 and "--seconds" in err and "from 1 to 604800" in err and out == ""
    assert doubles.trainer.sizes == []


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BATOS_LEARNING_VOICE_MARGIN", "-0.5"),  # a worse adapter would be swapped in
        ("BATOS_LEARNING_VOICE_MARGIN", "1.5"),
        ("BATOS_MISSION_MIN_GAIN", "5"),  # a component lies in [0, 1]: never reached
        ("BATOS_MISSION_MIN_GAIN", "-0.1"),
        ("BATOS_MISSION_MIN_GAIN", "nan"),
    ],
)
def test_shares_are_held_to_0_to_1(monkeypatch, variable, value) -> None:
    from batos import settings
    from batos.errors import ConfigurationError

    name = next(s.name for s in settings.SETTINGS.values() if s.env == variable)
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match="must be a number from 0 to 1"):
        settings.get(name)
    monkeypatch.setenv(variable, "0")
    assert settings.get_float(name) == 0.0


def test_batos_learn_run_then_undo_serves_the_old_adapter_again(
    image, modelfiles, monkeypatch, capsys, file_uri
) -> None:
    served, old = alfred_with_lessons(image, modelfiles, monkeypatch, 2)
    image.close()
    trainer = FakeTrainer(b"better")
    doubles = learning.Retraining(trainer, FakeEvaluator({b"better": 14}))
    code, out, _ = cli(
        capsys, file_uri, "learn", "run", "ALFRED", "--seconds", "30", retraining=doubles
    )
    assert code == 0 and "mission 1: ALFRED kept" in out
    assert "candidate  voice 0.70 (14/20)" in out and "undo with: batos learn undo 1" in out
    assert served.read_bytes() == b"better" and trainer.starts[0] is not None

    code, out, _ = cli(capsys, file_uri, "learn")
    [alfred] = [line for line in out.splitlines() if line.startswith("ALFRED ")]
    assert retrain.served_sha("test", "ALFRED")[:12] in alfred
    assert alfred.rstrip().endswith("mission 1")
    assert "ALFRED: mission 1 kept (warm start)" in out
    assert "voice 0.50 → 0.70, relevance 0.500 → 0.500" in out

    code, out, _ = cli(capsys, file_uri, "learn", "undo", "1")
    assert code == 0 and "mission 1 undone: ALFRED serves adapter" in out
    assert served.read_bytes() == old
    code, _, err = cli(capsys, file_uri, "learn", "undo", "1")
    assert code == 1 and "no kept retrain_adapter mission" in err
    code, out, _ = cli(capsys, file_uri, "learn")
    assert "ALFRED: mission 1 undone" in out


def test_batos_learn_model_is_the_base_model_of_run_and_undo_too(
    image, modelfiles, monkeypatch, capsys, file_uri
) -> None:
    served, old = alfred_with_lessons(image, modelfiles, monkeypatch, 2)  # lessons on test
    image.close()
    monkeypatch.setenv("BATOS_MODEL", "default")  # what --model stands in for
    doubles = learning.Retraining(FakeTrainer(b"better"), FakeEvaluator({b"better": 14}))
    code, out, err = cli(capsys, file_uri, "learn", "--model", "test", "run", "alfred",
                         retraining=doubles)  # fmt: skip
    assert code == 0 and "mission 1: ALFRED kept" in out, err
    assert served.read_bytes() == b"better"
    code, out, _ = cli(capsys, file_uri, "learn", "--model", "test")
    assert out.startswith("Learning on test") and "ALFRED: mission 1 kept" in out

    # undoing a mission of another base model than the one named is refused
    code, _, err = cli(capsys, file_uri, "learn", "--model", "default", "undo", "1")
    assert code == 1 and "mission 1 retrained ALFRED's adapter on test, not on default" in err
    assert served.read_bytes() == b"better"
    code, out, _ = cli(capsys, file_uri, "learn", "--model", "test", "undo", "1")
    assert code == 0 and "ALFRED serves adapter" in out and "on test again" in out
    assert served.read_bytes() == old

    for argv in (["learn", "--model", "bogus"], ["learn", "--model", "bogus", "run", "alfred"]):
        code, out, err = cli(capsys, file_uri, *argv, retraining=doubles)
        assert code == 2 and "'bogus' is no named base model" in err and out == ""
    assert len(doubles.trainer.sizes) == 1  # nothing trained on it


def test_batos_learn_run_reports_a_failed_mission_with_an_error_exit(
    image, modelfiles, monkeypatch, capsys, file_uri
) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", "1")
    lessons_for(image, 1)
    image.close()

    def broken(*args: Any, **options: Any) -> Path:
        raise RuntimeError("out of memory")

    doubles = learning.Retraining(broken, FakeEvaluator({}))
    code, out, err = cli(capsys, file_uri, "learn", "run", "alfred", retraining=doubles)
    assert code == 1 and "mission 1: ALFRED failed" in out
    assert "mission 1 failed: RuntimeError: out of memory" in err


@pytest.mark.slow
@pytest.mark.model
def test_a_real_retraining_on_the_test_model_goes_through_evaluate_and_decide(
    image, modelfiles, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_LEARNING_MIN_EXAMPLES", "2")
    monkeypatch.setenv("BATOS_LEARNING_STEPS", "2")
    lessons_for(image, 2)
    # The warm start continues the served adapter: its shape (rank 8, every layer) wins over
    # the plan's, so the steps are few and short.
    plan = TrainingPlan(
        model="test",
        persona="ALFRED",
        steps=2,
        rank=2,
        alpha=4,
        batch_size=2,
        max_tokens=200,  # past the system prompt: the reply tokens carry the loss
        top_layers=1,
    )
    evaluator = retrain.VoiceEvaluator("test", prompts=2, tokens=12)
    done = retrain.retrain(
        "test",
        "ALFRED",
        [Example(f"question {n} about the pantry", "Very good, sir.") for n in range(2)],
        evaluator,
        plan=plan,
    )
    assert done.start == "warm" and done.steps_run == 2 and done.candidate.is_file()
    assert (done.entry["rank"], done.entry["top_layers"]) == (8, None)
    # it moved from the served adapter, and not far: a fresh LoRA's lora_B would be all zeros
    from gguf import GGUFReader

    served = {
        t.name: t.data for t in GGUFReader(str(modelfiles / "adapters/test/alfred.gguf")).tensors
    }
    trained = {t.name: t.data for t in GGUFReader(str(done.candidate)).tensors}
    name = "blk.29.attn_v.weight.lora_b"
    assert not (served[name] == trained[name]).all()
    assert abs(served[name].astype("float32")).sum() > 0
    assert abs(trained[name].astype("float32") - served[name].astype("float32")).max() < 0.05
    assert done.current.n == done.new.n == 2
    assert done.new.relevance is not None and -1.0 <= done.new.relevance <= 1.0
    assert done.decision.swap == (
        done.new.voice >= done.current.voice + 0.05
        and done.new.relevance >= done.current.relevance - retrain.RELEVANCE_TOLERANCE
    )
    # the served adapter is untouched until a mission swaps it
    assert retrain.served_sha("test", "ALFRED") == done.current_sha256


def test_fusing_reads_the_served_adapter_not_a_stale_cache_and_refuses_without_one(
    modelfiles, tmp_path
) -> None:
    from batos.training import lora, warm

    # The peft cache holds another version than the one served (a swap or an undo happened
    # since it was trained): fusing must not merge it.
    cached = lora.peft_dir("test", "ALFRED")
    shutil.copytree(warm.served_weights("test", "ALFRED", tmp_path / "a").weights, cached)
    lora.mark_peft(cached, "0" * 64)
    assert warm.served_weights("test", "ALFRED", tmp_path / "b").weights != cached

    (modelfiles / "adapters" / "test" / "alfred.gguf").unlink()
    with pytest.raises(BatosError) as refused:
        lora.fuse_persona("test", "ALFRED")
    assert "serves no adapter" in refused.value.message
    assert "batos personas train" in (refused.value.hint or "")


def test_a_swap_whose_file_copy_never_happened_is_served_at_the_next_opening(
    file_uri, modelfiles, monkeypatch
) -> None:
    """The process dies right after the swap's commit, before the file is copied (a kill -9
    there leaves the same state: the commit is durable, the copy never began)."""
    from batos.shell.runtime import open_runtime

    class Killed(BaseException):
        pass

    def killed(image: Any) -> list[str]:
        raise Killed

    living = open_image(file_uri, create=True)
    try:
        served, old = alfred_with_lessons(living, modelfiles, monkeypatch, 2)
        monkeypatch.setattr(learning, "reconcile", killed)
        with pytest.raises(Killed):
            learning.retrain_mission(
                living,
                "ALFRED",
                evaluator=FakeEvaluator({b"better": 12}),
                trainer=fake_trainer(b"better", []),
            )
    finally:
        living.close()
    assert served.read_bytes() == old  # the image says "better", the folder serves the old one
    monkeypatch.undo()
    monkeypatch.setenv("BATOS_MODELFILES", str(modelfiles))
    monkeypatch.setenv("BATOS_MODEL_CACHE", str(modelfiles.parent / "cache"))
    with open_runtime(file_uri) as runtime:
        assert runtime.image is not None
        assert served.read_bytes() == b"better"
        assert retrain.served_sha("test", "ALFRED") == retrain.file_sha256(served)


def test_a_second_retraining_of_a_persona_waits_for_the_one_running(
    image, modelfiles, monkeypatch
) -> None:
    """A retraining records its lessons as learnt only when it ends: meanwhile the heartbeat's
    learn job and 'batos learn run' would both have started a second one on the same lessons,
    and both could swap. A running one older than its bound is taken as gone."""
    alfred_with_lessons(image, modelfiles, monkeypatch, 2)
    trainer = fake_trainer(b"better", [])
    seen: dict[str, Any] = {}

    def training(*args: Any, **options: Any) -> Path:
        seen["due"] = learning.due(image)
        with pytest.raises(learning.LearningError, match="being retrained already") as refused:
            learning.retrain_mission(image, "ALFRED", evaluator=FakeEvaluator({}), trainer=trainer)
        seen["refused"] = refused.value.message
        return trainer(*args, **options)

    mission = learning.retrain_mission(
        image, "ALFRED", evaluator=FakeEvaluator({b"better": 12}), trainer=training
    )
    assert mission["status"] == "kept" and seen["due"] == []
    assert f"(mission {mission['id']})" in seen["refused"]
    # A record left running by a process killed outright stops counting after its bound.
    from store.core import layout

    def left_running(root: Any) -> None:
        found = layout.missions(root)
        found[mission["id"]] = {**found[mission["id"]], "status": "running", "started": 0.0}

    image.transact(left_running)
    with image.read() as root:
        assert learning.running_mission(root, "ALFRED", "test") is None


def test_a_retraining_whose_process_was_killed_is_not_running_and_is_closed_by_the_next(
    image, modelfiles, monkeypatch, capsys
) -> None:
    """A retraining killed outright (SIGKILL, the OOM killer) kept its record 'running': no
    other retraining of the persona could start for half an hour past the training time,
    and every listing showed it running for ever. Its process is recorded; on its host, an
    ended process is seen at once, and the next retraining records it as interrupted."""
    from store.core import layout

    alfred_with_lessons(image, modelfiles, monkeypatch, 2)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import psutil

        runner = {
            **learning._this_process(),
            "pid": child.pid,
            "since": psutil.Process(child.pid).create_time(),
        }

        def running_in_child(root: Any) -> int:
            found = layout.missions(root)
            number = found.maxKey() + 1 if len(found) else 1
            found[number] = {
                "id": number,
                "started": __import__("time").time(),
                "report": 0,
                "kind": learning.MISSION_KIND,
                "target": "voice",
                "persona": "ALFRED",
                "status": "running",
                "hypothesis": {
                    "component": "voice",
                    "baseline": None,
                    "gain": 0.05,
                    "cycles": 0,
                    "text": "",
                },
                "baseline": {},
                "model": "test",
                "process": runner,
            }
            return number

        number = image.transact(running_in_child)
        with image.read() as root:  # alive: it is running, and a second one must wait
            assert learning.running_mission(root, "ALFRED", "test")["id"] == number
        with pytest.raises(learning.LearningError, match="being retrained already"):
            learning.retrain_mission(image, "ALFRED", evaluator=FakeEvaluator({}))
    finally:
        child.kill()
        child.wait()
    from batos.shell.cli.learn import _mission_line

    with image.read() as root:
        assert learning.running_mission(root, "ALFRED", "test") is None
        line = _mission_line(dict(layout.missions(root)[number]))
    assert f"mission {number} ended without a word (its process is gone)" in line
    from batos.shell.cli.heartbeat import _print_retraining

    capsys.readouterr()
    with image.read() as root:  # 'batos audit report' says the same
        _print_retraining(dict(layout.missions(root)[number]))
    assert "ended without a word (its process is gone)" in " ".join(capsys.readouterr().out.split())
    mission = learning.retrain_mission(
        image,
        "ALFRED",
        evaluator=FakeEvaluator({b"better": 12}),
        trainer=fake_trainer(b"better", []),
    )
    assert mission["status"] == "kept" and mission["process"]["pid"] != child.pid
    with image.read() as root:
        ended = dict(layout.missions(root)[number])
    assert ended["status"] == "interrupted" and f"pid {child.pid}" in ended["error"]
    assert "ended without a word" in ended["error"]


def test_no_retraining_is_due_for_a_model_given_as_a_file(image, modelfiles, monkeypatch) -> None:
    """Lessons are kept for a GGUF path too, but no adapter of one can be trained: every
    learn job recorded another failed mission, for ever, with a hint of another command."""
    path = "/models/some-model.Q4_K_M.gguf"
    monkeypatch.setenv("BATOS_MODEL", path)  # the lessons of its answers name the file
    alfred_with_lessons(image, modelfiles, monkeypatch, 2)
    with image.read() as root:
        assert len(learning.new_accepted(root, "ALFRED", path)) == 2
    assert learning.due(image) == []
    assert learning.due(image, "test") == []  # and none of another model's


def test_a_mission_of_another_host_or_of_no_process_is_never_taken_as_ended() -> None:
    assert not learning.process_ended({"status": "running"})
    assert not learning.process_ended({"process": {"host": "elsewhere", "pid": 1, "since": 0}})
    me = learning._this_process()
    assert not learning.process_ended({"process": me})
    assert learning.process_ended({"process": {**me, "since": me["since"] - 3600}})  # pid reused
    assert not learning.process_ended({"process": {**me, "pid": "x"}})
    # same host name, another container: its pids are not ours to look up
    gone = {**me, "since": me["since"] - 3600}
    assert not learning.process_ended({"process": {**gone, "pids": "another-boot pid:[1]"}})
    assert not learning.process_ended({"process": {k: v for k, v in gone.items() if k != "pids"}})
