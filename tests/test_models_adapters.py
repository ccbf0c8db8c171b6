"""Persona adapters on the real test model: switching in place, and agreement with peft.

The adapters are made here: a random-init peft LoRA on the test base dequantized from its
GGUF, written as a GGUF LoRA with gguf-py. llama.cpp's greedy output with the adapter must
equal peft's greedy output for the same prompt tokens, and differ from the base's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from batos.errors import ModelError
from batos.models.engine import Engine, Sampling, Usage, engine
from store.core.model_files import model_path

pytestmark = [pytest.mark.model, pytest.mark.slow]

# Only projections llama.cpp stores unpermuted (q/k are row-permuted for RoPE in GGUF).
TARGETS = ("v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GGUF_NAMES = {
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
RANK, ALPHA = 8, 16
STEPS = 6
MESSAGES = [{"role": "user", "content": "Count from one to ten."}]
#: Logit difference llama.cpp's Q8 activations may flip a near-tie by (observed: < 0.1).
TOLERANCE = 0.25
GREEDY = Sampling(temperature=0.0, repeat_penalty=1.0, num_predict=STEPS)


def _write_lora_gguf(state: dict, path: Path, *, alpha: float = ALPHA) -> None:
    """peft LoRA tensors → a llama.cpp GGUF adapter (F32), named after the base tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for name, tensor in state.items():
        # base_model.model.model.layers.3.mlp.up_proj.lora_A.weight
        rest = name.split("model.layers.", 1)[1]
        layer, _, module = rest.partition(".")
        module, part = module.rsplit(".lora_", 1)
        kind = "lora_a" if part.startswith("A") else "lora_b"
        gguf_name = f"blk.{layer}.{GGUF_NAMES[module]}.weight.{kind}"
        writer.add_tensor(gguf_name, tensor.detach().float().contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two random adapters, a mismatched one; for each adapter (and none): llama.cpp's greedy
    tokens, peft's greedy tokens, and peft's logits along llama.cpp's tokens."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    gguf_path = model_path("test")
    folder = tmp_path_factory.mktemp("adapters")
    eng = engine(gguf_path)
    base = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    base.eval()
    prompt = eng.prompt_tokens(MESSAGES)

    def compare(model: torch.nn.Module, adapters: list[Path]) -> dict:
        ids = torch.tensor([prompt])
        greedy: list[int] = []
        with torch.no_grad():
            for _ in range(STEPS):
                token = int(model(ids).logits[0, -1].argmax())
                greedy.append(token)
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            ours = _ids(eng, adapters)
            logits = model(torch.tensor([prompt + ours])).logits[0, len(prompt) - 1 : -1]
        top2 = logits.topk(2).values
        return {
            "peft": greedy,
            "llama": ours,
            "eos": eng.llama.token_eos(),
            "gap": [float(logits[i].max() - logits[i][t]) for i, t in enumerate(ours)],
            "margin": [float(v[0] - v[1]) for v in top2],
        }

    result = {"folder": folder, "prompt": prompt, "base": compare(base, [])}
    for label, seed in (("a", 1), ("b", 2)):
        torch.manual_seed(seed)
        config = LoraConfig(
            r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), init_lora_weights=False
        )
        model = get_peft_model(base, config)
        model.eval()
        state = {k: v for k, v in model.state_dict().items() if "lora_" in k}
        _write_lora_gguf(state, folder / f"{label}.gguf")
        result[label] = compare(model, [folder / f"{label}.gguf"])
        base = model.unload()  # the base without this adapter, for the next one
    wrong = {k: v[:, :100] if "lora_A" in k else v for k, v in state.items()}
    _write_lora_gguf(wrong, folder / "wrong.gguf")
    return result


def _ids(eng: Engine, adapters: list[Path]) -> list[int]:
    pieces = list(eng.generate(MESSAGES, adapters=adapters, sampling=GREEDY))
    usage = pieces[-1]
    assert isinstance(usage, Usage)
    return usage.token_ids


def _agrees(run: dict) -> None:
    """llama.cpp's greedy tokens are peft's: equal up to the first step where peft's own top
    two are closer than llama.cpp's activation quantization can resolve, and never more than
    TOLERANCE logits below peft's best at any step."""
    ours_all = run["llama"] + ([run["eos"]] if len(run["llama"]) < STEPS else [])
    assert len(ours_all) == STEPS or ours_all[-1] == run["eos"]
    assert max(run["gap"]) <= TOLERANCE, run
    for ours, theirs, margin in zip(ours_all, run["peft"], run["margin"], strict=False):
        if margin <= TOLERANCE:
            break
        assert ours == theirs, run


def test_base_matches_peft_reference(lab: dict) -> None:
    _agrees(lab["base"])
    assert len(lab["prompt"]) > 5


def test_adapter_output_matches_peft_and_differs_by_adapter(lab: dict) -> None:
    _agrees(lab["a"])
    _agrees(lab["b"])
    assert lab["a"]["llama"] != lab["base"]["llama"]
    assert lab["b"]["llama"] != lab["a"]["llama"]


def test_switching_back_and_forth_never_reloads_the_model(lab: dict) -> None:
    eng = engine(model_path("test"))
    llama = eng.llama
    a, b = lab["folder"] / "a.gguf", lab["folder"] / "b.gguf"
    first = _ids(eng, [a])
    _ids(eng, [b])
    _ids(eng, [])
    pieces = list(eng.generate(MESSAGES, adapters=[a], sampling=GREEDY))
    assert pieces[-1].token_ids == first
    assert pieces[-1].swap_s > 0 and eng.active_adapters == (a,)
    assert engine(model_path("test")) is eng and eng.llama is llama


def test_adapter_that_does_not_fit_the_base_is_refused_and_the_model_stays_usable(
    lab: dict,
) -> None:
    eng = engine(model_path("test"))
    with pytest.raises(ModelError, match="does not fit the base model"):
        list(eng.generate(MESSAGES, adapters=[lab["folder"] / "wrong.gguf"], sampling=GREEDY))
    assert _ids(eng, []) == lab["base"]["llama"]


def test_adapters_beyond_capacity_are_evicted_least_recently_used(lab: dict) -> None:
    eng = Engine(model_path("test"), n_ctx=512, capacity=1)
    a, b = lab["folder"] / "a.gguf", lab["folder"] / "b.gguf"
    ids_a = _ids(eng, [a])
    assert eng.loaded_adapters() == [a]
    _ids(eng, [b])
    assert eng.loaded_adapters() == [b]
    eng.prefetch([a]).join(timeout=60)
    assert set(eng.loaded_adapters()) == {a, b}  # b stays while active, a waits in RAM
    assert _ids(eng, [a]) == ids_a == lab["a"]["llama"]
    assert eng.loaded_adapters() == [a]


def test_chat_model_applies_an_adapter_as_soon_as_its_file_appears(
    lab: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batos.models import chat_model

    shipped = Path(__file__).resolve().parent.parent / "modelfiles"
    folder = tmp_path / "modelfiles"
    folder.mkdir()
    for path in shipped.glob("*.Modelfile"):
        shutil.copy(path, folder / path.name)
    monkeypatch.setenv("BATOS_MODELFILES", str(folder))
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.delenv("BATOS_OPENAI_BASE_URL", raising=False)
    robin = chat_model("ROBIN", temperature=0, repeat_penalty=1.0, num_predict=STEPS)
    before = robin.invoke("Name a colour.")
    assert before.response_metadata["adapters"] == []
    (folder / "adapters" / "test").mkdir(parents=True)
    shutil.copy(lab["folder"] / "a.gguf", folder / "adapters" / "test" / "robin.gguf")
    after = robin.invoke("Name a colour.")
    assert after.response_metadata["adapters"] == ["robin.gguf"]
    assert after.content != before.content
    assert after.usage_metadata["output_tokens"] > 0
    monkeypatch.setenv("BATOS_ADAPTERS", "off")  # system prompt only, as bench/voice.py compares
    off = robin.invoke("Name a colour.")
    assert off.response_metadata["adapters"] == [] and off.content == before.content


def test_a_persona_s_kv_cache_comes_back_after_another_spoke(
    lab: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set aside on a swap and put back: the same tokens, the prompt not evaluated again."""
    eng = Engine(model_path("test"), n_ctx=512)
    a, b = lab["folder"] / "a.gguf", lab["folder"] / "b.gguf"
    other = [{"role": "user", "content": "Name three rivers of Europe, briefly."}]
    first = list(eng.generate(MESSAGES, adapters=[a], sampling=GREEDY))[-1]
    assert first.cached_tokens == 0
    list(eng.generate(other, adapters=[b], sampling=GREEDY))
    list(eng.generate(other, adapters=[], sampling=GREEDY))
    again = list(eng.generate(MESSAGES, adapters=[a], sampling=GREEDY))[-1]
    assert again.token_ids == first.token_ids == lab["a"]["llama"]
    assert again.cached_tokens == len(lab["prompt"])
    # Under one adapter set, two prompts that share no prefix each keep their own cache.
    list(eng.generate(other, adapters=[a], sampling=GREEDY))
    back = list(eng.generate(MESSAGES, adapters=[a], sampling=GREEDY))[-1]
    assert back.token_ids == first.token_ids and back.cached_tokens == len(lab["prompt"])
    assert len(eng.prefixes) >= 1

    monkeypatch.setenv("BATOS_LLM_PREFIX_CACHE_MB", "0")
    off = Engine(model_path("test"), n_ctx=512)
    list(off.generate(MESSAGES, adapters=[a], sampling=GREEDY))
    list(off.generate(other, adapters=[b], sampling=GREEDY))
    cold = list(off.generate(MESSAGES, adapters=[a], sampling=GREEDY))[-1]
    assert cold.token_ids == first.token_ids and cold.cached_tokens == 0
    assert len(off.prefixes) == 0
