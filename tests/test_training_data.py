"""The persona training data: enough examples, no duplicates, held-out replies kept apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batos.errors import ConfigurationError
from batos.shell.cli import main
from batos.training import lora as training
from prototypes.codex import PERSONAS

DATA = Path(__file__).resolve().parent.parent / "modelfiles" / "data"


def _rows(name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("persona", PERSONAS)
def test_each_persona_has_enough_distinct_examples(persona: str) -> None:
    examples = training.load_examples(DATA / f"{persona.lower()}.jsonl")
    assert len(examples) >= training.MIN_EXAMPLES
    assert len({e.prompt.lower() for e in examples}) == len(examples)
    assert len({e.reply for e in examples}) == len(examples)
    for example in examples:
        assert example.reply == example.reply.strip() and "\n\n" not in example.reply
        assert 3 <= len(example.reply.split()) <= 80, example


def test_personas_do_not_share_replies() -> None:
    replies = [row["reply"] for p in PERSONAS for row in _rows(f"{p.lower()}.jsonl")]
    assert len(set(replies)) == len(replies)


def test_heldout_has_ten_per_persona_disjoint_from_training() -> None:
    heldout = _rows("heldout.jsonl")
    assert sorted(row["persona"] for row in heldout) == sorted(PERSONAS * 10)
    trained = [row for p in PERSONAS for row in _rows(f"{p.lower()}.jsonl")]
    trained_prompts = {row["prompt"].lower() for row in trained}
    trained_replies = {row["reply"] for row in trained}
    for row in heldout:
        assert row["prompt"].lower() not in trained_prompts
        assert row["reply"] not in trained_replies
    assert len({row["reply"] for row in heldout}) == len(heldout)


def test_malformed_data_is_reported_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "robin.jsonl"
    path.write_text('{"prompt": "hi", "reply": "hello"}\nnot json\n{"prompt": "x"}\n')
    with pytest.raises(training.TrainingError) as caught:
        training.load_examples(path)
    assert "line 2" in caught.value.message and "line 3" in caught.value.message
    assert caught.value.hint


def test_missing_data_file_says_what_to_write(tmp_path: Path) -> None:
    with pytest.raises(training.TrainingError, match="no training data"):
        training.load_examples(tmp_path / "nobody.jsonl")


def test_too_few_examples_fail_before_any_model_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "robin.jsonl").write_text('{"prompt": "hi", "reply": "hello there"}\n')
    monkeypatch.setenv("BATOS_MODELFILES", str(tmp_path))
    plan = training.TrainingPlan(model="test", persona="robin", batch_size=4)
    with pytest.raises(training.TrainingError, match="fewer than one batch"):
        training.train_persona(plan, out_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unknown_persona_and_unnamed_model_are_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown persona"):
        training.persona_name("batman")
    with pytest.raises(ConfigurationError, match="--out"):
        training.adapters_dir(str(tmp_path / "some.gguf"))


def test_cli_rejects_an_unknown_persona_with_the_configuration_exit_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["personas", "train", "--model", "test", "--persona", "batman"]) == 2
    assert "unknown persona" in capsys.readouterr().err
