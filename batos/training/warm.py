"""The served adapter's peft weights, so that a retraining continues from them (a warm start).

``served_weights`` finds them in the peft cache when the cache holds the version that is served
(``train_persona`` marks the cache with its adapter's sha256), and otherwise reads them back
from the served GGUF LoRA with ``peft_from_gguf``. The GGUF form loses nothing a warm start
needs: its tensors are the peft ``lora_A``/``lora_B`` matrices in f16, under llama.cpp's names,
and for the llama architecture the converter permuted the rows of the q and k projections'
``lora_B`` for llama.cpp's rotary layout, which is undone here. When neither is to be had the
result says why, and the retraining starts cold.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from batos.models.modelfile import adapter_path
from batos.training.lora import (
    PEFT_MARKER,
    TrainingError,
    TrainingPlan,
    file_sha256,
    mark_peft,
    peft_dir,
    persona_name,
    save_peft,
)
from store.core.model_files import model_path

log = logging.getLogger("batos.training.warm")

#: llama.cpp's tensor names → the module paths of a llama-like transformers model.
MODULES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
#: Architectures whose GGUF LoRA can be read back; llama's q/k rows were permuted on the way.
ARCHITECTURES = ("llama", "qwen2")
PERMUTED = {"llama": {"attn_q": "head_count", "attn_k": "head_count_kv"}}
_TENSOR = re.compile(r"^blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")


@dataclass(frozen=True)
class WarmStart:
    """Where a retraining starts: ``weights``, a peft adapter folder, or None (cold), and why."""

    weights: Path | None
    why: str

    @property
    def warm(self) -> bool:
        return self.weights is not None


def _marked(folder: Path) -> str | None:
    try:
        return json.loads((folder / PEFT_MARKER).read_text(encoding="utf-8"))["adapter_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def served_weights(model: str, persona: str, scratch: Path) -> WarmStart:
    """The peft weights of ``persona``'s served adapter on ``model``; read back from its GGUF
    into ``scratch`` when the peft cache does not hold that version."""
    persona = persona_name(persona)
    served = adapter_path(model, persona)
    if not served.is_file():
        return WarmStart(None, f"{persona} serves no adapter on {model}: nothing to start from")
    sha = file_sha256(served)
    cached = peft_dir(model, persona)
    if _marked(cached) == sha and (cached / "adapter_model.safetensors").is_file():
        return WarmStart(cached, f"the served adapter {sha[:12]}'s peft weights (peft cache)")
    try:
        folder = peft_from_gguf(served, model_path(model), scratch / "warm-start")
    except TrainingError as exc:
        log.warning("%s starts cold: %s", persona, exc.message)
        return WarmStart(None, f"the served adapter {sha[:12]} cannot be read back: {exc.message}")
    return WarmStart(folder, f"the served adapter {sha[:12]}, read back from its GGUF LoRA")


def _reader(path: Path) -> Any:
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except (OSError, ValueError, IndexError, KeyError) as exc:  # gguf's errors for a bad file
        raise TrainingError(f"{path.name} is not a readable GGUF file: {exc}") from exc


def _field(reader: Any, name: str) -> Any:
    found = reader.fields.get(name)
    return None if found is None else found.contents()


def _unpermute(rows: Any, heads: int) -> Any:
    """The inverse of llama.cpp's ``LlamaModel.permute`` on a ``lora_B`` (rows: head, half,
    pair → head, pair, half)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def peft_from_gguf(adapter: Path, base: Path, folder: Path) -> Path:
    """Write the peft adapter folder (config and safetensors) a GGUF LoRA was converted from.

    ``base`` is the GGUF base model the adapter belongs to (its head counts and layer count).
    Raises ``TrainingError`` for a file that is no LoRA, an architecture not in
    ``ARCHITECTURES``, or a tensor this module cannot name.
    """
    import numpy as np
    import torch
    from peft import LoraConfig

    reader = _reader(adapter)
    if _field(reader, "general.type") != "adapter" or _field(reader, "adapter.type") != "lora":
        raise TrainingError(f"{adapter.name} is not a GGUF LoRA adapter")
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise TrainingError(
            f"{adapter.name} is a {arch} adapter; {', '.join(ARCHITECTURES)} ones are read back"
        )
    alpha = float(_field(reader, "adapter.lora.alpha") or 0)
    base_reader = _reader(base)
    if _field(base_reader, "general.architecture") != arch:
        raise TrainingError(f"{adapter.name} does not belong to the base {base.name}")
    heads = {
        key: int(_field(base_reader, f"{arch}.attention.{key}") or 0)
        for key in ("head_count", "head_count_kv")
    }
    layers_in_base = int(_field(base_reader, f"{arch}.block_count") or 0)
    weights: dict[str, Any] = {}
    layers: set[int] = set()
    modules: set[str] = set()
    ranks: set[int] = set()
    for tensor in reader.tensors:
        match = _TENSOR.match(tensor.name)
        if match is None or match.group(2) not in MODULES:
            raise TrainingError(f"{adapter.name} holds a tensor {tensor.name!r} of no known module")
        layer, name, side = int(match.group(1)), match.group(2), match.group(3)
        data = torch.from_numpy(np.array(tensor.data, dtype=np.float32))
        heads_key = PERMUTED.get(arch, {}).get(name)
        if side == "b" and heads_key:
            data = _unpermute(data, heads[heads_key])
        ranks.add(int(data.shape[0] if side == "a" else data.shape[1]))
        module = MODULES[name]
        key = f"base_model.model.model.layers.{layer}.{module}.lora_{side.upper()}.weight"
        weights[key] = data.contiguous()
        layers.add(layer)
        modules.add(module.rsplit(".", 1)[1])
    if not weights or len(ranks) != 1 or not alpha or not alpha.is_integer():
        raise TrainingError(f"{adapter.name} holds no LoRA of one rank and a whole alpha")
    config = LoraConfig(
        r=ranks.pop(),
        lora_alpha=int(alpha),
        target_modules=sorted(modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        layers_to_transform=None if len(layers) == layers_in_base else sorted(layers),
    )
    save_peft(weights, config, folder)
    mark_peft(folder, file_sha256(adapter))
    return folder


def plan_for(plan: TrainingPlan, weights: Path) -> TrainingPlan | None:
    """``plan`` with the shape of the adapter in ``weights`` (rank, alpha, modules, layers), so
    that training continues that adapter; None when its layers are not the top ones a plan can
    name (the retraining then starts cold)."""
    try:
        config = json.loads((weights / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    layers = config.get("layers_to_transform")
    if isinstance(layers, int):
        layers = [layers]
    if layers and sorted(layers) != list(range(min(layers), min(layers) + len(layers))):
        return None
    modules = set(config.get("target_modules") or ())
    ordered = [m for m in plan.target_modules if m in modules] + sorted(
        modules - set(plan.target_modules)
    )
    return replace(
        plan,
        rank=int(config["r"]),
        alpha=config["lora_alpha"],
        target_modules=tuple(ordered),
        top_layers=len(layers) if layers else None,
    )
