"""Persona adapters end to end on the test model: train, convert to GGUF, apply in llama.cpp."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from batos.training import gguf as lora_gguf
from batos.training import lora as training
from prototypes.codex import PERSONAS
from store.core.model_files import catalog, model_path

REPO_MODELFILES = Path(__file__).resolve().parent.parent / "modelfiles"
SHIPPED = REPO_MODELFILES / "adapters" / "test"
PROMPT = "What should I pack for a beach holiday?"


def _gguf_fields(path: Path) -> tuple[dict[str, object], list[str]]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    fields = {}
    for name in ("general.type", "adapter.type", "adapter.lora.alpha"):
        field = reader.fields[name]
        value = field.parts[field.data[0]]
        fields[name] = bytes(value).decode() if field.types[0].name == "STRING" else value[0]
    return fields, [t.name for t in reader.tensors]


@pytest.mark.slow
@pytest.mark.model
def test_a_tiny_training_run_yields_an_adapter_llama_cpp_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    lines = (REPO_MODELFILES / "data" / "brick.jsonl").read_text().splitlines()[:8]
    (tmp_path / "data" / "brick.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("BATOS_MODELFILES", str(tmp_path))
    monkeypatch.setenv("BATOS_MODEL_CACHE", str(_shared_cache(tmp_path)))
    plan = training.TrainingPlan(
        model="test",
        persona="brick",
        steps=3,
        rank=2,
        alpha=4,
        batch_size=4,
        learning_rate=5e-3,
        max_tokens=128,
        top_layers=2,
    )
    seen: list[int] = []
    result = training.train_persona(
        plan, out_dir=tmp_path / "out", on_step=lambda step, total, loss: seen.append(step)
    )
    assert seen == [1, 2, 3]
    assert result.adapter == tmp_path / "out" / "brick.gguf"
    fields, tensors = _gguf_fields(result.adapter)
    assert fields["general.type"] == "adapter" and fields["adapter.type"] == "lora"
    assert fields["adapter.lora.alpha"] == pytest.approx(4.0)
    # SmolLM2-135M has 30 layers: only the last two are adapted.
    assert len(tensors) == 2 * len(plan.target_modules) * 2
    assert {name.split(".")[1] for name in tensors} == {"28", "29"}
    assert all(name.endswith((".lora_a", ".lora_b")) for name in tensors)

    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["base_sha256"] == catalog()["test"].sha256
    entry = manifest["personas"]["brick"]
    assert (entry["rank"], entry["alpha"], entry["steps"], entry["examples"]) == (2, 4, 3, 8)
    assert entry["target_modules"] == list(training.TARGET_MODULES)
    assert entry["top_layers"] == 2
    assert entry["data_sha256"] == training.file_sha256(tmp_path / "data" / "brick.jsonl")
    assert entry["final_loss"] == pytest.approx(result.final_loss, abs=1e-3)
    assert (result.peft_dir / "adapter_model.safetensors").is_file()

    # llama.cpp accepts it against the base it was trained on (it raises otherwise).
    plain, adapted = lora_gguf.verify_adapter(
        model_path("test"), result.adapter, training.system_prompt("brick"), PROMPT, 8
    )
    assert plain and adapted


def _shared_cache(tmp_path: Path) -> Path:
    """A cache with the real assembled test model and converters, but private peft output."""
    from batos import settings

    real = Path(settings.get_str("model_cache"))
    cache = tmp_path / "cache"
    cache.mkdir()
    spec = catalog()["test"]
    for name in (spec.filename, spec.filename + ".verified"):
        if (real / name).exists():
            (cache / name).symlink_to(real / name)
    for tools in real.glob("llama.cpp-tools-*"):
        (cache / tools.name).symlink_to(tools)
    if not (cache / spec.filename).exists():
        shutil.rmtree(cache)
        return real
    return cache


@pytest.mark.model
def test_shipped_test_adapters_load_and_change_greedy_output() -> None:
    manifest = json.loads((SHIPPED / "manifest.json").read_text())
    assert manifest["base_sha256"] == catalog()["test"].sha256
    replies = {}
    for persona in PERSONAS:
        adapter = SHIPPED / f"{persona.lower()}.gguf"
        entry = manifest["personas"][persona.lower()]
        assert training.file_sha256(adapter) == entry["adapter_sha256"]
        assert entry["data_sha256"] == training.file_sha256(
            REPO_MODELFILES / "data" / f"{persona.lower()}.jsonl"
        ), f"{persona}'s data changed since its adapter was trained: train it again"
        assert adapter.stat().st_size < 4_000_000
        plain, adapted = lora_gguf.verify_adapter(
            model_path("test"), adapter, training.system_prompt(persona), PROMPT
        )
        assert adapted != plain, persona
        replies[persona] = adapted
    assert len(set(replies.values())) == len(PERSONAS)


@pytest.mark.slow
@pytest.mark.model
def test_an_adapter_for_another_base_is_refused() -> None:
    default = catalog()["default"]
    try:
        base = model_path("default")
    except Exception:
        pytest.skip(f"the default model ({default.description}) is not installed")
    with pytest.raises(lora_gguf.ConversionError, match="refused"):
        lora_gguf.verify_adapter(base, SHIPPED / "robin.gguf", "You are ROBIN.", PROMPT, 4)


@pytest.mark.slow
@pytest.mark.model
def test_shipped_default_adapters_match_their_data_and_change_greedy_output() -> None:
    """The default model's four adapters, applied in place by the embedded engine."""
    from batos.models.engine import Sampling, Usage, engine

    shipped = REPO_MODELFILES / "adapters" / "default"
    manifest = json.loads((shipped / "manifest.json").read_text())
    assert manifest["base_sha256"] == catalog()["default"].sha256
    eng = engine(model_path("default"))
    greedy = Sampling(temperature=0.0, repeat_penalty=1.0, num_predict=24)

    def reply(persona: str, adapters: list[Path]) -> str:
        messages = [
            {"role": "system", "content": training.system_prompt(persona)},
            {"role": "user", "content": PROMPT},
        ]
        return "".join(
            p
            for p in eng.generate(messages, adapters=adapters, sampling=greedy)
            if not isinstance(p, Usage)
        )

    replies = {}
    for persona in PERSONAS:
        adapter = shipped / f"{persona.lower()}.gguf"
        entry = manifest["personas"][persona.lower()]
        assert training.file_sha256(adapter) == entry["adapter_sha256"]
        assert entry["data_sha256"] == training.file_sha256(
            REPO_MODELFILES / "data" / f"{persona.lower()}.jsonl"
        ), f"{persona}'s data changed since its adapter was trained: train it again"
        replies[persona] = reply(persona, [adapter])
        assert replies[persona] != reply(persona, []), persona
    assert len(set(replies.values())) == len(PERSONAS)


def test_scratch_folders_a_killed_process_left_are_removed_by_the_next_work(tmp_path) -> None:
    """A retraining killed outright left its scratch folder (weights, megabytes to gigabytes)
    in the temporary folder for good: each kill added one."""
    import fcntl
    import os
    import socket

    from fakes import a_dead_pid

    from batos.training.scratch import LOCK, scratch

    dead = a_dead_pid()

    def left_by(name: str, host: str | None = None) -> Path:
        folder = tmp_path / name
        (folder / "warm-start").mkdir(parents=True)
        (folder / "warm-start" / "adapter_model.safetensors").write_bytes(b"w" * 1000)
        if host is not None:
            (folder / LOCK).write_text(host)
        return folder

    here = socket.gethostname()
    abandoned = left_by(f"batos-retrain-{dead}-abc123", here)
    elsewhere = left_by(f"batos-fuse-{dead}-def456", "another-host")  # a shared folder
    unlocked = left_by(f"batos-eval-{dead}-ghi789")  # no lock file: not known to be ours
    held = left_by(f"batos-lora-{dead}-jkl012", here)  # its owner, in another pid namespace
    holder = os.open(held / LOCK, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    live = left_by(f"batos-eval-{os.getppid()}-mno345", here)  # a process that runs
    other = tmp_path / "batos-notes"
    other.mkdir()
    link = tmp_path / f"batos-sdist-{dead}-pqr678"
    link.symlink_to(other)  # a link is never followed
    try:
        with scratch("retrain", tmp_path) as mine:
            assert Path(mine).name.startswith(f"batos-retrain-{os.getpid()}-")
            assert not abandoned.exists()
            for kept in (elsewhere, unlocked, held, live, other):
                assert kept.is_dir()
            assert link.is_symlink()
    finally:
        os.close(holder)
    assert not Path(mine).exists()
