"""Retraining a persona's adapter on what it learnt in use, judged before it is served.

``retrain`` trains a candidate adapter on the persona's original data plus the examples it
learnt from accepted cycles (good ones twice), with the current adapter's plan and a time
bound, then has an ``Evaluator`` score the current adapter and the candidate on the same
prompts, and ``decide`` whether the candidate is better by the margin fixed in advance. The
candidate starts *warm*: from the served adapter's own weights (``batos.training.warm``), at
``WARM_LEARNING_RATE_SCALE`` of its learning rate, the original data still in every epoch so
the voice it has does not drift. A bounded retraining from scratch would rarely catch up with
an adapter trained for longer. It starts *cold* (a fresh LoRA, the plan's rate) only when
there is no served adapter or its weights cannot be read back, and says why.

The rule:

    swap  iff  voice(candidate) >= voice(current) + ``learning_voice_margin``
          and  relevance(candidate) >= relevance(current) - ``RELEVANCE_TOLERANCE``

*Voice* is the share of replies the validated style classifier (``batos.training.voice``)
attributes to the persona; *relevance* is the mean cosine between a prompt's and its reply's
embeddings. The prompts are the persona's held-out prompts (``heldout.jsonl``) and the voice
prompts far from every training topic (``voice_prompts.jsonl``): none is ever a training
example (``held_out_prompts`` keeps learnt examples off them).

Adapter files are versioned: every adapter that was ever served or trained as a candidate is
kept as ``adapters/<model>/history/<persona>-<sha12>.gguf``, and ``install_version`` puts one
of them in place (``adapters/<model>/<persona>.gguf``, which the backends read), moving the
manifest entry it replaces into that persona's ``history`` list. Which version is served is
decided in the image (``graph.learning``); this module only moves the files.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from batos import settings
from batos.models.modelfile import adapter_path, modelfiles_dir
from batos.training.lora import (
    MANIFEST,
    Example,
    StepCallback,
    TrainingError,
    TrainingPlan,
    adapters_dir,
    data_file,
    file_sha256,
    load_examples,
    persona_name,
    read_manifest,
    train_persona,
)
from batos.training.scratch import scratch as scratch_folder
from batos.training.voice import heldout_rows, train_classifier, usable, validate, voice_prompts
from batos.training.warm import WarmStart, plan_for, served_weights
from store.core.files import copy_file, write_text

log = logging.getLogger("batos.training.retrain")

#: How far the candidate's mean relevance may fall below the current adapter's and still win.
RELEVANCE_TOLERANCE = 0.02
#: Folder, beside the served adapters, of every version kept.
HISTORY = "history"
#: Tokens of each evaluation reply (as in ``bench/voice.py``).
REPLY_TOKENS = 64
#: Entries of a persona's manifest history kept (the files stay).
MAX_HISTORY = 20
#: A warm start's learning rate, as a share of the served adapter's: it refines, so it moves
#: the weights less than the training that found them.
WARM_LEARNING_RATE_SCALE = 0.25


@dataclass(frozen=True)
class Evaluation:
    """One adapter on the evaluation prompts: ``hits`` of ``n`` replies in the persona's voice,
    and the mean prompt–reply cosine."""

    hits: int
    n: int
    relevance: float | None
    seconds: float = 0.0

    @property
    def voice(self) -> float:
        return self.hits / self.n if self.n else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["voice"] = round(self.voice, 4)
        out["relevance"] = None if self.relevance is None else round(self.relevance, 4)
        out["seconds"] = round(self.seconds, 2)
        return out


class Evaluator(Protocol):
    """Scores ``persona``'s ``adapter`` file (None: no adapter) on fixed prompts."""

    def __call__(self, persona: str, adapter: Path | None) -> Evaluation: ...


@dataclass(frozen=True)
class Decision:
    swap: bool
    why: str
    margin: float


def decide(current: Evaluation, candidate: Evaluation, margin: float) -> Decision:
    """The rule of the module docstring."""
    if candidate.n == 0:
        return Decision(False, "the candidate was not evaluated", margin)
    gain = candidate.voice - current.voice
    if gain < margin:
        return Decision(
            False,
            f"voice {current.voice:.3f} → {candidate.voice:.3f} ({gain:+.3f}), under the "
            f"margin {margin:+.3f}",
            margin,
        )
    if (
        current.relevance is not None
        and candidate.relevance is not None
        and candidate.relevance < current.relevance - RELEVANCE_TOLERANCE
    ):
        return Decision(
            False,
            f"voice rose {gain:+.3f} but relevance fell {current.relevance:.3f} → "
            f"{candidate.relevance:.3f}, more than {RELEVANCE_TOLERANCE}",
            margin,
        )
    return Decision(
        True, f"voice {current.voice:.3f} → {candidate.voice:.3f} ({gain:+.3f})", margin
    )


# --- evaluation prompts --------------------------------------------------------------------


def held_out_prompts() -> set[str]:
    """Every prompt evaluation uses, lower-cased: never a training example."""
    rows = [*heldout_rows(), *voice_prompts()]
    return {r["prompt"].strip().lower() for r in rows}


def evaluation_prompts(persona: str, limit: int) -> list[str]:
    """The persona's held-out prompts, then the far voice prompts, then the near ones in its
    territory, ``limit`` in all, in a fixed order."""
    persona = persona_name(persona)
    held = [r["prompt"] for r in heldout_rows() if r["persona"] == persona]
    voice = voice_prompts()
    far = [r["prompt"] for r in voice if r["set"] == "far"]
    near = [r["prompt"] for r in voice if r["set"] == "near" and r["territory"] == persona]
    return list(dict.fromkeys([*held, *far, *near]))[:limit]


class VoiceEvaluator:
    """Generates replies under an adapter with the embedded backend and scores them with the
    validated style classifier and the embedder; the same seed for every adapter."""

    def __init__(
        self,
        model: str,
        *,
        prompts: int | None = None,
        tokens: int = REPLY_TOKENS,
        seed: int = 0,
        embedder: Any = None,
    ) -> None:
        self.model = model
        self.limit = prompts or settings.get_int("learning_eval_prompts")
        self.tokens = tokens
        self.seed = seed
        self.classifier = train_classifier()
        validation = validate(self.classifier)
        if not usable(validation):
            raise TrainingError(
                f"the style classifier tells only {validation} of the reference replies apart",
                hint="the persona data files changed: check them against heldout.jsonl",
            )
        self.embedder = embedder

    def _embedder(self) -> Any:
        if self.embedder is None:
            from store.knowledge.embeddings import Embedder

            self.embedder = Embedder()
        return self.embedder

    def __call__(self, persona: str, adapter: Path | None) -> Evaluation:
        import numpy as np
        from langchain_core.messages import HumanMessage

        from batos.models.embedded import EmbeddedChatModel

        persona = persona_name(persona)
        prompts = evaluation_prompts(persona, self.limit)
        started = time.monotonic()
        with scratch_folder("eval") as scratch:
            folder = _modelfiles_with(Path(scratch), self.model, persona, adapter)
            chat = EmbeddedChatModel(
                persona=persona,
                base_model=self.model,
                modelfiles=str(folder),
                num_predict=self.tokens,
                seed=self.seed,
                timeout=900,
            )
            replies = [str(chat.invoke([HumanMessage(p)]).content).strip() for p in prompts]
        predicted = list(self.classifier.predict(replies)) if replies else []
        hits = sum(1 for guess in predicted if guess == persona)
        embedder = self._embedder()
        relevance = None
        if replies:
            asked, said = embedder.encode(prompts), embedder.encode(replies)
            relevance = float(np.mean(np.sum(asked * said, axis=1)))
        return Evaluation(hits, len(replies), relevance, time.monotonic() - started)


def _modelfiles_with(folder: Path, model: str, persona: str, adapter: Path | None) -> Path:
    """A Modelfiles folder like the configured one whose only adapter is ``adapter``."""
    for modelfile in modelfiles_dir().glob("*.Modelfile"):
        shutil.copyfile(modelfile, folder / modelfile.name)
    if adapter is not None:
        target = adapter_path(model, persona, folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(adapter, target)
    return folder


# --- training ------------------------------------------------------------------------------


def training_set(
    persona: str, learnt: Sequence[Example], preferred: Sequence[Example] = ()
) -> list[Example]:
    """The persona's original data, then the learnt examples; ``preferred`` (marked good by a
    user) count twice. A learnt example on an evaluation prompt is left out."""
    held = held_out_prompts()
    extra = [e for e in [*preferred, *learnt, *preferred] if e.prompt.strip().lower() not in held]
    return [*load_examples(data_file(persona)), *extra]


def current_plan(model: str, persona: str) -> TrainingPlan:
    """The plan the served adapter was trained with (its manifest entry), so that a candidate
    differs from it in its data only; the shipped defaults when there is none."""
    entry = (read_manifest(adapters_dir(model)).get("personas") or {}).get(persona.lower(), {})
    known = {k: entry[k] for k in TrainingPlan.__dataclass_fields__ if k in entry}
    known.pop("device", None)
    # A warm retraining records the reduced rate it ran at: the next one scales the plan's.
    if "planned_learning_rate" in entry:
        known["learning_rate"] = entry["planned_learning_rate"]
    if "target_modules" in known:
        known["target_modules"] = tuple(known["target_modules"])
    return TrainingPlan(model=model, persona=persona_name(persona), **known)


@dataclass
class Retrained:
    """What one retraining produced and how it was judged."""

    persona: str
    candidate: Path
    candidate_sha256: str
    current_sha256: str | None
    current: Evaluation
    new: Evaluation
    decision: Decision
    examples: int
    learnt: int
    train_seconds: float
    steps_run: int
    entry: dict[str, Any] = field(default_factory=dict)
    #: 'warm' (continued the served adapter) or 'cold' (a fresh LoRA), and why.
    start: str = "cold"
    start_why: str = ""
    learning_rate: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "persona": self.persona,
            "candidate": self.candidate.name,
            "candidate_sha256": self.candidate_sha256,
            "current_sha256": self.current_sha256,
            "current": self.current.as_dict(),
            "new": self.new.as_dict(),
            "swap": self.decision.swap,
            "why": self.decision.why,
            "margin": self.decision.margin,
            "examples": self.examples,
            "learnt": self.learnt,
            "train_seconds": round(self.train_seconds, 1),
            "steps_run": self.steps_run,
            "start": self.start,
            "start_why": self.start_why,
            "learning_rate": self.learning_rate,
        }


class Trainer(Protocol):
    """Trains ``plan`` on ``examples`` until ``deadline`` (``time.monotonic()``), from the peft
    adapter folder ``start`` when given; writes the GGUF adapter and a ``manifest.json`` entry
    in ``out_dir`` and returns the adapter file."""

    def __call__(
        self,
        plan: TrainingPlan,
        examples: list[Example],
        out_dir: Path,
        deadline: float,
        *,
        start: Path | None = None,
        on_step: StepCallback | None = None,
    ) -> Path: ...


def _train(
    plan: TrainingPlan,
    examples: list[Example],
    out_dir: Path,
    deadline: float,
    *,
    start: Path | None = None,
    on_step: StepCallback | None = None,
) -> Path:
    return train_persona(
        plan,
        examples=examples,
        out_dir=out_dir,
        deadline=deadline,
        keep_peft=False,
        start=start,
        on_step=on_step,
    ).adapter


def start_for(
    model: str, persona: str, plan: TrainingPlan, scratch: Path
) -> tuple[WarmStart, TrainingPlan]:
    """Where a retraining of ``plan`` starts, and the plan it then trains: the served adapter's
    shape at ``WARM_LEARNING_RATE_SCALE`` of the rate when warm, ``plan`` itself when cold."""
    start = served_weights(model, persona, scratch)
    if start.weights is None:
        return start, plan
    shaped = plan_for(plan, start.weights)
    if shaped is None:
        why = f"{start.why}, but its layers are not the top ones a plan can continue"
        return WarmStart(None, why), plan
    return start, replace(shaped, learning_rate=plan.learning_rate * WARM_LEARNING_RATE_SCALE)


def retrain(
    model: str,
    persona: str,
    learnt: Sequence[Example],
    evaluator: Evaluator,
    *,
    preferred: Sequence[Example] = (),
    plan: TrainingPlan | None = None,
    seconds: float | None = None,
    trainer: Trainer = _train,
    warm: bool = True,
    on_step: StepCallback | None = None,
    tell: Callable[[str], None] | None = None,
) -> Retrained:
    """Train a candidate, keep it as a version, evaluate it and the served adapter, decide.

    Nothing that is served changes here: the candidate is only kept in ``history``. ``warm``
    False starts from a fresh LoRA even when the served adapter's weights are to be had (for
    comparisons); ``on_step`` follows training, ``tell`` hears each phase as it begins.
    """
    say = tell or (lambda text: None)
    persona = persona_name(persona)
    plan = plan or current_plan(model, persona)
    steps = settings.get_int("learning_steps")
    if steps:
        plan = replace(plan, steps=steps)
    seconds = seconds if seconds is not None else settings.get_float("learning_train_seconds")
    examples = training_set(persona, learnt, preferred)
    served = adapter_path(model, persona)
    current_sha = keep_version(model, persona, served)[0] if served.is_file() else None
    planned_rate = plan.learning_rate
    with scratch_folder("retrain") as scratch:
        if warm:
            start, plan = start_for(model, persona, plan, Path(scratch))
        else:
            start = WarmStart(None, "a cold start was asked for")
        say(f"training {persona} ({'warm' if start.warm else 'cold'}: {start.why})")
        started = time.monotonic()
        out = Path(scratch) / "candidate"
        out.mkdir()
        trained = trainer(
            plan, examples, out, started + seconds, start=start.weights, on_step=on_step
        )
        train_seconds = time.monotonic() - started
        entry = (read_manifest(out).get("personas") or {}).get(persona.lower(), {})
        sha, kept = keep_version(model, persona, trained)
    say("evaluating the served adapter")
    current = evaluator(persona, served if current_sha else None)
    say("evaluating the candidate")
    new = evaluator(persona, kept)
    decision = decide(current, new, settings.get_float("learning_voice_margin"))
    log.info("%s retrained on %d examples: %s", persona, len(examples), decision.why)
    learnt_count = len(learnt) + len(preferred)
    how = "warm" if start.warm else "cold"
    return Retrained(
        persona,
        kept,
        sha,
        current_sha,
        current,
        new,
        decision,
        len(examples),
        learnt_count,
        train_seconds,
        int(entry.get("steps_run") or plan.steps),
        {
            **entry,
            "learnt_examples": learnt_count,
            "start": how,
            "planned_learning_rate": planned_rate,
        },
        how,
        start.why,
        plan.learning_rate,
    )


# --- versions ------------------------------------------------------------------------------


def history_dir(model: str) -> Path:
    return adapters_dir(model) / HISTORY


def version_path(model: str, persona: str, sha: str) -> Path:
    return history_dir(model) / f"{persona.lower()}-{sha[:12]}.gguf"


def keep_version(model: str, persona: str, adapter: Path) -> tuple[str, Path]:
    """Keep a copy of ``adapter`` among the persona's versions; its sha256 and the copy."""
    sha = file_sha256(adapter)
    kept = version_path(model, persona, sha)
    if not kept.is_file():
        kept.parent.mkdir(parents=True, exist_ok=True)
        copy_file(adapter, kept, durable=True)
    return sha, kept


def served_sha(model: str, persona: str) -> str | None:
    path = adapter_path(model, persona)
    return file_sha256(path) if path.is_file() else None


def install_version(
    model: str, persona: str, sha: str, entry: dict[str, Any] | None = None
) -> Path:
    """Serve the kept version ``sha`` of ``persona``'s adapter; the served file.

    The manifest entry of the adapter it replaces moves to the persona's ``history`` (bounded);
    the new entry is ``entry``, else the one ``history`` kept for ``sha``.
    """
    persona = persona_name(persona)
    source = version_path(model, persona, sha)
    if not source.is_file():
        raise TrainingError(
            f"{persona}'s adapter version {sha[:12]} is not kept in {source.parent}",
            hint="it was deleted by hand; retrain the persona with 'batos personas train'",
        )
    folder = adapters_dir(model)
    served = copy_file(source, adapter_path(model, persona), durable=True)
    manifest = read_manifest(folder)
    personas = manifest.setdefault("personas", {})
    old = dict(personas.get(persona.lower()) or {})
    history = list(old.pop("history", []))
    if entry is None:
        entry = next((h for h in history if h.get("adapter_sha256") == sha), None)
        entry = dict(entry) if entry else {"adapter_sha256": sha}
    history = [h for h in history if h.get("adapter_sha256") != sha]
    if old:
        kept = version_path(model, persona, str(old.get("adapter_sha256") or ""))
        old["kept_as"] = f"{HISTORY}/{kept.name}"
        history.append(old)
    personas[persona.lower()] = {
        **entry,
        "adapter_file": served.name,
        "adapter_sha256": sha,
        "adapter_bytes": served.stat().st_size,
        "history": history[-MAX_HISTORY:],
    }
    write_text(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    log.info("%s now serves adapter version %s", persona, sha[:12])
    return served
