"""Persona LoRA adapters: train a peft LoRA on the base model dequantized from its GGUF.

A persona's adapter is trained on ``modelfiles/data/<persona>.jsonl`` (prompt/reply pairs in
the persona's voice), each example formatted with the base model's chat template under the
persona's system prompt, with the loss on the reply tokens only. The result is converted to a
GGUF LoRA (``batos.training.gguf``) at ``modelfiles/adapters/<model>/<persona>.gguf`` and recorded
in that folder's ``manifest.json``. The peft weights are kept in the model cache for ``fuse``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import random
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from batos import settings
from batos.errors import ConfigurationError, ModelError
from batos.models.modelfile import adapter_path, modelfiles_dir
from batos.training.scratch import scratch as scratch_folder
from prototypes.codex import PERSONAS, load_codex
from store.core.files import copy_file, replacing, write_text
from store.core.model_files import catalog, model_path

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("batos.training.lora")

#: Attention projections only: enough to carry a voice, and small enough to commit.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
DEFAULT_STEPS = 240
DEFAULT_RANK = 8
DEFAULT_BATCH = 8
DEFAULT_LR = 2e-3
MAX_TOKENS = 320
WARMUP_STEPS = 10
MIN_EXAMPLES = 150
MANIFEST = "manifest.json"
#: The file in a peft adapter folder naming the GGUF adapter it was converted to.
PEFT_MARKER = "batos-adapter.json"


class TrainingError(ModelError):
    """Persona adapter training, conversion or fusing cannot go on."""


@dataclass(frozen=True)
class Example:
    prompt: str
    reply: str


@dataclass(frozen=True)
class TrainingPlan:
    """Everything one training run depends on; recorded in the manifest."""

    model: str
    persona: str
    steps: int = DEFAULT_STEPS
    rank: int = DEFAULT_RANK
    alpha: int = 2 * DEFAULT_RANK
    batch_size: int = DEFAULT_BATCH
    learning_rate: float = DEFAULT_LR
    target_modules: tuple[str, ...] = TARGET_MODULES
    max_tokens: int = MAX_TOKENS
    seed: int = 0
    device: str | None = None  # None: cuda when present, else cpu
    #: Adapt only the last N transformer layers (None: all). Backpropagation then stops at
    #: the lowest adapted layer, which makes CPU training of a larger base affordable.
    top_layers: int | None = None


@dataclass
class TrainingResult:
    persona: str
    adapter: Path
    peft_dir: Path
    final_loss: float
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


# --- where things live ---------------------------------------------------------------------


def data_file(persona: str) -> Path:
    return modelfiles_dir() / "data" / f"{persona_name(persona).lower()}.jsonl"


def adapters_dir(model: str) -> Path:
    """``modelfiles/adapters/<model>`` for a named model; a GGUF path has no shipped folder."""
    if model not in catalog():
        raise ConfigurationError(
            f"adapters are shipped per named model, and {model!r} is not one",
            hint=f"pass --out FOLDER, or choose --model {' or '.join(catalog())}",
        )
    return adapter_path(model)


def cache_dir() -> Path:
    return Path(settings.get_str("model_cache"))


def peft_dir(model: str, persona: str) -> Path:
    """Where the peft form of an adapter is kept for ``fuse`` (the GGUF form is shipped)."""
    return cache_dir() / "peft" / _model_key(model) / persona_name(persona).lower()


def _model_key(model: str) -> str:
    return model if model in catalog() else Path(model).stem


def persona_name(persona: str) -> str:
    name = persona.upper()
    if name not in PERSONAS:
        raise ConfigurationError(
            f"unknown persona {persona!r}", hint=f"choose one of {', '.join(PERSONAS)}"
        )
    return name


def system_prompt(persona: str) -> str:
    """The persona's SYSTEM text; the Modelfiles are rendered from the same codex entry."""
    return load_codex().persona(persona_name(persona)).identity


# --- data ----------------------------------------------------------------------------------


def load_examples(path: Path) -> list[Example]:
    """Read a JSONL file of ``{"prompt", "reply"}`` objects; every bad line is reported."""
    if not path.is_file():
        raise TrainingError(
            f"no training data at {path}", hint="write modelfiles/data/<persona>.jsonl first"
        )
    examples: list[Example] = []
    problems: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, reply = row["prompt"], row["reply"]
            if not (isinstance(prompt, str) and isinstance(reply, str)):
                raise TypeError("prompt and reply must be strings")
            if not prompt.strip() or not reply.strip():
                raise ValueError("prompt and reply must not be empty")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            problems.append(f"line {number}: {type(exc).__name__}: {exc}")
            continue
        examples.append(Example(prompt.strip(), reply.strip()))
    if problems:
        raise TrainingError(
            f"{path} has {len(problems)} malformed line(s): " + "; ".join(problems[:5]),
            hint='each line must be a JSON object {"prompt": "…", "reply": "…"}',
        )
    return examples


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# --- the base model ------------------------------------------------------------------------


def load_base(model: str, device: str = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model dequantized from its shipped GGUF to float32, with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = model_path(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        base = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise TrainingError(
            f"transformers cannot dequantize {gguf.name}: {exc}",
            hint="train on a GGUF whose architecture transformers supports (llama, qwen2, …)",
        ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    base.config.architectures = [type(base).__name__]
    # transformers' decorator on to() hides that it takes a device name
    return base.to(device), tokenizer  # type: ignore[arg-type]


def resolve_device(device: str | None) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ConfigurationError(f"unknown device {device!r}", hint="use --device cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError(
            "--device cuda was asked for, but torch sees no CUDA GPU",
            hint="drop --device to train on the CPU",
        )
    return device


def encode(
    tokenizer: PreTrainedTokenizerBase, system: str, example: Example, max_tokens: int
) -> tuple[list[int], list[int]]:
    """Token ids of one chat turn and its labels: -100 everywhere but the reply."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": example.prompt}]
    prefix = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(
        [*messages, {"role": "assistant", "content": example.reply}], tokenize=False
    )
    # tokenize=False: both are the rendered text
    if not cast(str, full).startswith(cast(str, prefix)):
        raise TrainingError(
            "the model's chat template does not extend the prompt with the reply",
            hint="train on a model with a ChatML-like template",
        )
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    reply_ids = tokenizer(full[len(prefix) :], add_special_tokens=False)["input_ids"]
    ids = (prefix_ids + reply_ids)[:max_tokens]
    labels = ([-100] * len(prefix_ids) + reply_ids)[:max_tokens]
    return ids, labels


def _batches(
    rows: list[tuple[list[int], list[int]]], batch_size: int, seed: int
) -> Iterator[list[tuple[list[int], list[int]]]]:
    rng = random.Random(seed)
    while True:
        order = list(range(len(rows)))
        rng.shuffle(order)
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield [rows[i] for i in order[start : start + batch_size]]


def _collate(
    batch: list[tuple[list[int], list[int]]], pad_id: int, device: str
) -> dict[str, torch.Tensor]:
    import torch

    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (tokens, targets) in enumerate(batch):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, : len(targets)] = torch.tensor(targets)
        mask[row, : len(tokens)] = 1
    return {
        "input_ids": ids.to(device),
        "labels": labels.to(device),
        "attention_mask": mask.to(device),
    }


def _learning_rate(step: int, plan: TrainingPlan) -> float:
    """Linear warm-up (a fifth of a short run at most), then cosine decay to a tenth."""
    warmup = max(1, min(WARMUP_STEPS, plan.steps // 5))
    if step < warmup:
        return plan.learning_rate * (step + 1) / warmup
    progress = (step - warmup) / max(1, plan.steps - warmup)
    return plan.learning_rate * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


# --- training ------------------------------------------------------------------------------

#: ``on_step(step, total, loss)`` after every optimiser step.
StepCallback = Callable[[int, int, float], None]


def train_persona(
    plan: TrainingPlan,
    *,
    base: tuple[PreTrainedModel, PreTrainedTokenizerBase] | None = None,
    examples: list[Example] | None = None,
    out_dir: Path | None = None,
    on_step: StepCallback | None = None,
    deadline: float | None = None,
    keep_peft: bool = True,
    start: Path | None = None,
) -> TrainingResult:
    """Train one persona's adapter and install it, GGUF and manifest entry, in ``out_dir``.

    ``base`` lets several personas share one loaded base model (its weights are never
    changed: the LoRA is unloaded again afterwards). Nothing is written before training ends.
    ``deadline`` (a ``time.monotonic()`` value) ends training after the step that passes it,
    with what was learnt so far; ``keep_peft`` False leaves the peft weights ``fuse`` reads as
    they were (a candidate adapter that may never be used). ``start``, a peft adapter folder,
    makes training continue from its weights instead of a fresh LoRA; its shape (rank, alpha,
    modules, layers) must be the plan's (``batos.training.warm`` reads one back from a GGUF).
    """
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    from batos.training import gguf as lora_gguf

    persona = persona_name(plan.persona)
    if plan.steps <= 0 or plan.rank <= 0 or plan.batch_size <= 0:
        raise ConfigurationError("steps, rank and batch size must be positive integers")
    if plan.top_layers is not None and plan.top_layers <= 0:
        raise ConfigurationError("--layers must be a positive number of layers")
    out_dir = out_dir or adapters_dir(plan.model)
    data_path = data_file(persona)
    if examples is None:
        examples = load_examples(data_path)
    if len(examples) < plan.batch_size:
        raise TrainingError(
            f"{persona} has {len(examples)} examples, fewer than one batch ({plan.batch_size})",
            hint="add examples to its data file or lower --batch-size",
        )
    device = resolve_device(plan.device)
    torch.manual_seed(plan.seed)
    model, tokenizer = base or load_base(plan.model, device)
    model.to(device)  # type: ignore[arg-type]  # as in load_base
    system = system_prompt(persona)
    rows = [encode(tokenizer, system, ex, plan.max_tokens) for ex in examples]
    layers = int(model.config.num_hidden_layers)
    top = min(plan.top_layers or layers, layers)
    config = LoraConfig(
        r=plan.rank,
        lora_alpha=plan.alpha,
        target_modules=list(plan.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        layers_to_transform=list(range(layers - top, layers)) if top < layers else None,
    )
    if start is not None:
        _check_start(start, config)
    peft_model = get_peft_model(model, config)
    if start is not None:
        _load_start(peft_model, start)
    started = time.monotonic()
    losses: list[float] = []
    try:
        params = [p for p in peft_model.parameters() if p.requires_grad]
        optimiser = torch.optim.AdamW(params, lr=plan.learning_rate, weight_decay=0.0)
        peft_model.train()
        batches = _batches(rows, plan.batch_size, plan.seed)
        for step in range(plan.steps):
            for group in optimiser.param_groups:
                group["lr"] = _learning_rate(step, plan)
            batch = _collate(next(batches), tokenizer.pad_token_id, device)
            loss = peft_model(**batch).loss
            if not torch.isfinite(loss):
                raise TrainingError(
                    f"{persona}: the loss became {loss.item()} at step {step + 1}",
                    hint="lower the learning rate or the rank and train again",
                )
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
            losses.append(float(loss.item()))
            if (step + 1) % max(1, plan.steps // 10) == 0:
                log.info(
                    "%s: step %d/%d, loss %.3f, %.1f s/step",
                    persona,
                    step + 1,
                    plan.steps,
                    losses[-1],
                    (time.monotonic() - started) / (step + 1),
                )
            if on_step:
                on_step(step + 1, plan.steps, losses[-1])
            if deadline is not None and time.monotonic() >= deadline:
                log.info("%s: time is up after step %d of %d", persona, step + 1, plan.steps)
                break
        peft_model.eval()
        with warnings.catch_warnings():
            # peft looks for a config.json beside the GGUF to see whether the vocabulary
            # grew; it cannot have, since only LoRA matrices were trained.
            warnings.filterwarnings("ignore", message="Could not find a config file")
            state = get_peft_model_state_dict(peft_model)
        weights = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()}
        adapter_config = peft_model.peft_config["default"]
        with scratch_folder("lora") as scratch:
            staging = Path(scratch)
            lora_dir = save_peft(weights, adapter_config, staging / "peft")
            base_dir = lora_gguf.write_base_config(model, tokenizer, staging / "base")
            gguf_tmp = staging / f"{persona.lower()}.gguf"
            lora_gguf.convert_lora(lora_dir, base_dir, gguf_tmp)
            adapter = copy_file(gguf_tmp, out_dir / adapter_path(plan.model, persona).name)
            keep = peft_dir(plan.model, persona)
            if keep_peft:
                # Marked with the GGUF it became, so a warm start knows it is the served one.
                mark_peft(lora_dir, file_sha256(adapter))
                _replace_dir(lora_dir, keep)
    finally:
        # Give the shared base model its plain modules back for the next persona.
        peft_model.unload()
    final = sum(losses[-10:]) / len(losses[-10:])
    _record(
        out_dir, plan, data_path, examples, adapter, final, time.monotonic() - started, len(losses)
    )
    return TrainingResult(persona, adapter, keep, final, losses, time.monotonic() - started)


def mark_peft(folder: Path, adapter_sha256: str) -> None:
    """Record in a peft adapter folder which GGUF adapter file it is the peft form of."""
    (folder / PEFT_MARKER).write_text(json.dumps({"adapter_sha256": adapter_sha256}) + "\n")


def _check_start(start: Path, config: Any) -> None:
    """A warm start's adapter must have the shape the plan trains: it is continued, not mixed."""
    try:
        known = json.loads((start / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrainingError(f"no peft adapter to start from in {start}: {exc}") from exc
    ours = {
        "r": config.r,
        "lora_alpha": config.lora_alpha,
        "target_modules": sorted(config.target_modules),
        "layers_to_transform": config.layers_to_transform,
    }
    theirs = {
        **{k: known.get(k) for k in ours},
        "target_modules": sorted(known.get("target_modules") or []),
    }
    if theirs != ours:
        raise TrainingError(
            f"the adapter to start from has the shape {theirs}, the plan {ours}",
            hint="train the plan of the adapter it starts from (batos.training.warm.plan_for)",
        )


def _load_start(peft_model: Any, start: Path) -> None:
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(start / "adapter_model.safetensors"))
    expected = set(get_peft_model_state_dict(peft_model))
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise TrainingError(
            f"the adapter to start from in {start} does not fit the model: "
            f"{len(missing)} tensors missing ({missing[:2]}), {len(extra)} unknown ({extra[:2]})"
        )
    set_peft_model_state_dict(peft_model, weights)


def save_peft(weights: dict[str, Any], config: Any, folder: Path) -> Path:
    """A peft adapter folder (adapter_config.json + adapter_model.safetensors).

    ``save_pretrained`` of the peft model would also try to describe the GGUF-loaded base, so
    the two files are written directly from the adapter's own state dict and config.
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(folder))
    save_file(weights, str(folder / "adapter_model.safetensors"))
    return folder


def _replace_dir(source: Path, target: Path) -> None:
    with replacing(target) as draft:
        shutil.copytree(source, draft)


def read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TrainingError(
            f"{path} is not valid JSON: {exc}", hint="restore it from git or delete it"
        ) from exc


def _record(
    folder: Path,
    plan: TrainingPlan,
    data_path: Path,
    examples: list[Example],
    adapter: Path,
    final_loss: float,
    seconds: float,
    steps_run: int,
) -> None:
    specs = catalog()
    base = model_path(plan.model)
    manifest = read_manifest(folder)
    manifest.update(
        base_model=plan.model if plan.model in specs else base.name,
        base_file=base.name,
        base_sha256=specs[plan.model].sha256 if plan.model in specs else file_sha256(base),
        format="GGUF LoRA adapter (llama.cpp convert_lora_to_gguf.py, f16)",
    )
    plan_fields = {k: v for k, v in asdict(plan).items() if k not in ("model", "persona")}
    plan_fields["target_modules"] = list(plan.target_modules)
    manifest.setdefault("personas", {})[plan.persona.lower()] = {
        **plan_fields,
        "device": resolve_device(plan.device),
        "data_file": f"data/{data_path.name}",
        "data_sha256": file_sha256(data_path),
        "examples": len(examples),
        "system_sha256": hashlib.sha256(system_prompt(plan.persona).encode()).hexdigest(),
        "steps_run": steps_run,
        "final_loss": round(final_loss, 4),
        "seconds": round(seconds, 1),
        "adapter_file": adapter.name,
        "adapter_sha256": file_sha256(adapter),
        "adapter_bytes": adapter.stat().st_size,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    manifest["personas"] = dict(sorted(manifest["personas"].items()))
    write_text(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")


# --- fused variant -------------------------------------------------------------------------


def fused_dir(model: str) -> Path:
    return cache_dir() / "fused" / _model_key(model)


def fuse_persona(model: str, persona: str, outtype: str = "q8_0") -> Path:
    """Merge ``persona``'s adapter into the base and write the result as one GGUF model.

    For Ollama versions whose ``ADAPTER`` does not apply to the base: the fused file is
    served as a plain model (``FROM <file>``). The merge needs the peft weights of the adapter
    that is served now: the peft cache when it is marked with that adapter's sha256, otherwise
    read back from the served GGUF LoRA (a retraining swapped in by the heartbeat, an undo, or
    a Modelfiles folder copied from elsewhere leave the cache holding another version).
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from batos.training import gguf as lora_gguf
    from batos.training.warm import served_weights  # warm builds on this module

    persona = persona_name(persona)
    if outtype not in ("f16", "bf16", "q8_0", "f32"):
        raise ConfigurationError(f"unknown outtype {outtype!r}", hint="use q8_0, f16, bf16 or f32")
    target = fused_dir(model) / f"{persona.lower()}.gguf"
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        scratch_folder("fuse", target.parent) as scratch,
        replacing(target) as draft,
    ):
        served = served_weights(model, persona, Path(scratch))
        if served.weights is None:
            raise TrainingError(
                f"cannot fuse {persona}'s adapter for model {model!r}: {served.why}",
                hint=f"train it first: batos personas train --model {model} "
                f"--persona {persona.lower()}",
            )
        log.info("fusing %s from %s", persona, served.why)
        base, tokenizer = load_base(model)
        merged = PeftModel.from_pretrained(base, str(served.weights)).merge_and_unload()
        hf_dir = Path(scratch) / "hf"
        # A GGUF-loaded model refuses save_pretrained; a plain one built from its config and
        # given the merged weights does not. Half precision halves the peak memory.
        plain = AutoModelForCausalLM.from_config(merged.config, dtype=torch.float16)
        plain.load_state_dict(merged.state_dict())
        del merged, base
        plain.save_pretrained(str(hf_dir))
        tokenizer.save_pretrained(str(hf_dir))
        lora_gguf.forget_gguf_origin(hf_dir)
        del plain
        lora_gguf.convert_model(hf_dir, draft, outtype)
    return target
