"""Retraining a persona on what it learnt: voice before and after, and what it costs.

    python bench/retrain.py --model test                         # a small run on the test model
    python bench/retrain.py --model test --steps 3 --layers 2 --eval-prompts 8
    python bench/retrain.py --model default --persona ALFRED     # hours on 2 CPU cores

What the learning loop (``graph.learning``) does, without an image: the persona answers
``--lessons`` prompts taken from the *other* personas' training data (requests it would get in
use; never an evaluation prompt), with its served adapter and system prompt — the cycles it
would learn from. The answers the validated style classifier attributes to the persona stand
in for the ones a user marks good (they count twice); the rest are plain accepted lessons.
``batos.training.retrain.retrain`` then trains a candidate on the original data plus those
lessons, continuing the served adapter's weights (a warm start; ``--cold`` starts from a fresh
LoRA, as retraining did before), evaluates the served adapter and the candidate on the same
held-out prompts (the persona's heldout.jsonl prompts, then the far voice prompts) and decides
with the margin in force (``learning_voice_margin``). Everything happens in a copy of the
Modelfiles folder: the served adapter is never touched.

Prints the two adapters side by side (voice with its 95% Wilson interval, relevance, seconds)
and writes bench/results/retrain-<model>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batos.models.modelfile import modelfiles_dir
from batos.training import retrain
from batos.training.lora import Example, load_examples, persona_name
from batos.training.voice import PERSONAS, wilson

RESULTS = Path(__file__).resolve().parent / "results"


def lesson_prompts(persona: str, count: int) -> list[str]:
    """``count`` prompts from the other personas' training data, in turn, none held out."""
    held = retrain.held_out_prompts()
    pools = [
        [e.prompt for e in load_examples(modelfiles_dir() / "data" / f"{p.lower()}.jsonl")]
        for p in PERSONAS
        if p != persona
    ]
    mixed = [p for group in zip(*pools, strict=False) for p in group]
    return [p for p in mixed if p.strip().lower() not in held][:count]


def answer(model: str, persona: str, prompts: list[str], tokens: int) -> list[str]:
    from langchain_core.messages import HumanMessage

    from batos.models.embedded import EmbeddedChatModel

    chat = EmbeddedChatModel(persona=persona, base_model=model, num_predict=tokens, seed=0)
    return [str(chat.invoke([HumanMessage(p)]).content).strip() for p in prompts]


def voice_cell(evaluation: retrain.Evaluation) -> str:
    if not evaluation.n:
        return "—"
    low, high = wilson(evaluation.hits, evaluation.n)
    return f"{evaluation.voice:.2f} [{low:.2f}–{high:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="test", help="test or default (the base model)")
    parser.add_argument("--persona", default="ALFRED", type=persona_name)
    parser.add_argument("--lessons", type=int, default=24, help="accepted cycles to learn from")
    parser.add_argument("--steps", type=int, default=0, help="0: the served adapter's steps")
    parser.add_argument("--layers", type=int, default=0, help="adapt the top N layers (0: plan)")
    parser.add_argument("--eval-prompts", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64, help="tokens of each reply")
    parser.add_argument("--seconds", type=float, default=None, help="training time bound")
    parser.add_argument("--cold", action="store_true", help="train a fresh LoRA, not warm")
    parser.add_argument(
        "--keep", type=Path, default=None, help="copy the candidate adapter into this folder"
    )
    args = parser.parse_args()

    source = modelfiles_dir()
    with tempfile.TemporaryDirectory(prefix="batos-bench-retrain-") as scratch:
        folder = Path(scratch) / "modelfiles"
        shutil.copytree(source, folder, ignore=shutil.ignore_patterns("history"))
        os.environ["BATOS_MODELFILES"] = str(folder)
        os.environ["BATOS_MODEL"] = args.model

        started = time.monotonic()
        evaluator = retrain.VoiceEvaluator(
            args.model, prompts=args.eval_prompts, tokens=args.tokens
        )
        prompts = lesson_prompts(args.persona, args.lessons)
        replies = answer(args.model, args.persona, prompts, args.tokens)
        lesson_seconds = time.monotonic() - started
        voiced = list(evaluator.classifier.predict(replies)) if replies else []
        good = [
            Example(p, r)
            for p, r, v in zip(prompts, replies, voiced, strict=True)
            if v == args.persona
        ]
        plain = [
            Example(p, r)
            for p, r, v in zip(prompts, replies, voiced, strict=True)
            if v != args.persona
        ]
        plan = retrain.current_plan(args.model, args.persona)
        if args.steps:
            plan = replace(plan, steps=args.steps)
        if args.layers:
            plan = replace(plan, top_layers=args.layers)
        print(
            f"{args.persona} on {args.model}: {len(prompts)} lessons in {lesson_seconds:.0f} s "
            f"({len(good)} in its voice, counted twice); training {plan.steps} steps, "
            f"top layers {plan.top_layers or 'all'}",
            flush=True,
        )
        done = retrain.retrain(
            args.model,
            args.persona,
            plain,
            evaluator,
            preferred=good,
            plan=plan,
            seconds=args.seconds,
            warm=not args.cold,
        )
        if args.keep is not None:
            # The scratch folder goes at the end of the run; a candidate worth a longer look
            # (more draws, the mind's answers) is copied out first.
            args.keep.mkdir(parents=True, exist_ok=True)
            shutil.copy2(done.candidate, args.keep / f"{args.persona.lower()}.gguf")

    rows = [("served adapter", done.current), ("retrained", done.new)]
    print(f"\n{'adapter':<16}{'voice [95% CI]':>22}{'relevance':>11}{'eval s':>9}")
    for name, ev in rows:
        rel = "—" if ev.relevance is None else f"{ev.relevance:.3f}"
        print(f"{name:<16}{voice_cell(ev):>22}{rel:>11}{ev.seconds:>9.0f}")
    print(
        f"\nretraining: {done.start} start ({done.start_why}), learning rate "
        f"{done.learning_rate:g}, {done.train_seconds:.0f} s for {done.steps_run} steps on "
        f"{done.examples} examples ({done.learnt} learnt); "
        f"decision: {'swap' if done.decision.swap else 'keep the served adapter'} — "
        f"{done.decision.why} (margin {done.decision.margin:g})"
    )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"retrain-{args.model}.json"
    result = {
        "model": args.model,
        "persona": args.persona,
        "lessons": len(prompts),
        "lessons_in_voice": len(good),
        "lesson_seconds": round(lesson_seconds, 1),
        "plan": {"steps": plan.steps, "top_layers": plan.top_layers, "rank": plan.rank},
        "cold_asked": args.cold,
        "eval_prompts": args.eval_prompts,
        "tokens": args.tokens,
        **done.as_dict(),
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
