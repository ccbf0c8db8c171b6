"""``batos personas``: train the persona LoRA adapters and build fused persona models."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from batos import settings
from batos.shell.cli.app import console, err_console
from batos.shell.cli.progress import ProgressReport
from batos.shell.cli.terminal import shown
from prototypes.codex import PERSONAS

personas_app = typer.Typer(
    help="Train the persona LoRA adapters and build fused persona models.",
    no_args_is_help=True,
)

VERIFY_PROMPT = "What should I pack for a beach holiday?"


def _personas(chosen: list[str] | None) -> list[str]:
    from batos.training.lora import persona_name

    return [persona_name(p) for p in chosen] if chosen else list(PERSONAS)


@personas_app.command("train")
def train(
    model: str = typer.Option(
        None, "--model", help="'test', 'default' or a GGUF path (default: BATOS_MODEL)."
    ),
    persona: list[str] = typer.Option(
        None, "--persona", "-p", help="Persona to train (repeatable; default: all four)."
    ),
    steps: int = typer.Option(None, "--steps", help="Optimiser steps per persona."),
    rank: int = typer.Option(None, "--rank", help="LoRA rank (alpha is twice the rank)."),
    batch_size: int = typer.Option(None, "--batch-size", help="Examples per step."),
    learning_rate: float = typer.Option(None, "--lr", help="Peak learning rate."),
    layers: int = typer.Option(
        None, "--layers", help="Adapt only the last N transformer layers (default: all)."
    ),
    device: str = typer.Option(None, "--device", help="cpu or cuda (default: cuda if present)."),
    out: Path = typer.Option(
        None, "--out", help="Adapter folder (default: modelfiles/adapters/<model>)."
    ),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Load each adapter in llama.cpp and compare replies."
    ),
) -> None:
    """Train persona adapters on modelfiles/data and install them as GGUF LoRA files.

    Examples:

      batos personas train --model test

      batos personas train --model default --persona brick --steps 200 --device cuda
    """
    from batos.training import gguf as lora_gguf
    from batos.training import lora as training
    from store.core.model_files import model_path

    model = model or settings.get_str("model")
    names = _personas(persona)
    defaults = training.TrainingPlan(model=model, persona=names[0])
    plans = [
        training.TrainingPlan(
            model=model,
            persona=name,
            steps=steps or defaults.steps,
            rank=rank or defaults.rank,
            alpha=2 * (rank or defaults.rank),
            batch_size=batch_size or defaults.batch_size,
            learning_rate=learning_rate or defaults.learning_rate,
            device=device,
            top_layers=layers,
        )
        for name in names
    ]
    out_dir = out or training.adapters_dir(model)
    examples = {name: training.load_examples(training.data_file(name)) for name in names}
    resolved = training.resolve_device(device)
    lora_gguf.tools_dir()  # fetch the converters before an hour of training, not after
    console.print(f"loading base model {model!r} (dequantizing its GGUF) on {resolved}…")
    base = training.load_base(model, resolved)
    results = []
    for plan in plans:
        title = f"train {plan.persona}"
        with ProgressReport(err_console, title, total=plan.steps, unit="steps") as progress:

            def on_step(step: int, total: int, loss: float, bar: ProgressReport = progress) -> None:
                bar.update(step, f"loss {loss:.3f}")

            results.append(
                training.train_persona(
                    plan,
                    base=base,
                    examples=examples[plan.persona],
                    out_dir=out_dir,
                    on_step=on_step,
                )
            )
    table = Table(title=f"Persona adapters for {model!r} in {out_dir}")
    for column in ("persona", "examples", "steps", "final loss", "adapter", "seconds"):
        table.add_column(column)
    for plan, result in zip(plans, results, strict=True):
        table.add_row(
            plan.persona,
            str(len(examples[plan.persona])),
            str(plan.steps),
            f"{result.final_loss:.3f}",
            f"{result.adapter.stat().st_size / 1e6:.1f} MB",
            f"{result.seconds:.0f}",
        )
    console.print(table)
    if verify:
        gguf = model_path(model)
        for result in results:
            system = training.system_prompt(result.persona)
            plain, adapted = lora_gguf.verify_adapter(gguf, result.adapter, system, VERIFY_PROMPT)
            console.print(f"[bold]{result.persona}[/] {shown(repr(VERIFY_PROMPT))}")
            console.print(f"  base:    {plain!r}", markup=False)
            console.print(f"  adapter: {adapted!r}", markup=False)


@personas_app.command("fuse")
def fuse(
    model: str = typer.Option(
        None, "--model", help="'test', 'default' or a GGUF path (default: BATOS_MODEL)."
    ),
    persona: list[str] = typer.Option(
        None, "--persona", "-p", help="Persona to fuse (repeatable; default: all four)."
    ),
    outtype: str = typer.Option("q8_0", "--outtype", help="q8_0, f16, bf16 or f32."),
) -> None:
    """Merge persona adapters into the base and write standalone GGUF models.

    For Ollama versions whose ADAPTER instruction does not apply: build the persona from the
    fused file instead ('FROM <file>' plus the persona's SYSTEM and PARAMETER lines).

    Example:

      batos personas fuse --model test --persona robin
    """
    from batos.training import lora as training

    model = model or settings.get_str("model")
    for name in _personas(persona):
        with console.status(f"fusing {name} into {model!r}…"):
            path = training.fuse_persona(model, name, outtype)
        console.print(f"{name}: {path} ({path.stat().st_size / 1e6:.0f} MB)")


def register(app: typer.Typer) -> None:
    app.add_typer(personas_app, name="personas")
