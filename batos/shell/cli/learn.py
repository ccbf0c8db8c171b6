"""``batos learn``: what each persona has learnt from use, its retraining missions, and undo.

``learn`` shows, per persona, its lessons and how many are new since its last retraining, the
adapter it serves and when that was swapped in, and its last missions with their scores;
``learn run PERSONA`` runs the retraining mission now (the heartbeat's ``learn`` job does it on
its own); ``learn undo N`` serves the adapter mission N replaced again.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import typer
from rich import box
from rich.table import Table

from batos import settings
from batos.shell.cli.app import console, err_console, image_uri, retraining
from batos.shell.cli.progress import ProgressReport
from batos.shell.cli.terminal import json_text, plain, shown
from batos.shell.runtime import open_image

learn_app = typer.Typer(
    help="Personas that learn from use: lessons, retraining missions, undo.",
)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")


def _sha(value: str | None) -> str:
    return value[:12] if value else "none"


def _since(row: dict[str, Any]) -> tuple[str, str]:
    """When the served adapter began to be served and how: a mission's swap, else training."""
    recorded = row["recorded"] or {}
    if recorded.get("mission") and recorded.get("sha256") == row["served"]:
        swapped = recorded.get("swapped")
        when = dt.datetime.fromtimestamp(swapped).strftime("%Y-%m-%d") if swapped else "-"
        return when, f"mission {recorded['mission']}"
    trained = row["trained"]
    return (trained[:10], "trained") if trained else ("-", "-")


def _scores(mission: dict[str, Any]) -> str:
    evaluation = mission.get("evaluation") or {}
    current, new = evaluation.get("current") or {}, evaluation.get("new") or {}
    if not new:
        return ""

    def relevance(ev: dict[str, Any]) -> str:
        value = ev.get("relevance")
        return "-" if value is None else f"{value:.3f}"

    return (
        f"voice {current.get('voice', 0):.2f} → {new.get('voice', 0):.2f}, "
        f"relevance {relevance(current)} → {relevance(new)}"
    )


def _mission_line(mission: dict[str, Any]) -> str:
    from graph.learning import process_ended

    start = mission.get("start") or (mission.get("evaluation") or {}).get("start")
    status = mission["status"]
    if status == "running" and process_ended(mission):  # recorded so by the next retraining
        status = "ended without a word (its process is gone)"
    head = f"mission {mission['id']} {status}"
    head += f" ({start} start)" if start else ""
    head += f", {_when(mission.get('finished') or mission.get('started'))}"
    scores = _scores(mission)
    why = (mission.get("evaluation") or {}).get("why") or mission.get("error") or ""
    return "; ".join(part for part in (head, scores, why) if part)


def _check_model(model: str) -> None:
    """Refuse a base model that has no adapters to learn on: only the named models ship them
    (a GGUF path has none), and a typo would otherwise show an empty overview as if true."""
    from store.core.model_files import catalog

    if model not in catalog():
        raise typer.BadParameter(
            f"{model!r} is no named base model: choose {' or '.join(catalog())}",
            param_hint="--model",
        )


def _model(ctx: typer.Context) -> str | None:
    """The base model 'batos learn --model' named, or None for BATOS_MODEL."""
    return (ctx.obj or {}).get("learn_model")


@learn_app.callback(invoke_without_command=True)
def status(
    ctx: typer.Context,
    model: str = typer.Option(
        None,
        "--model",
        help="Base model, 'default' or 'test' (default: BATOS_MODEL); before 'run' or 'undo', "
        "theirs too.",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per persona."),
) -> None:
    """What each persona has learnt, the adapter it serves, and its last retraining missions.

    Examples:

      batos learn

      batos learn run alfred --seconds 600

      batos learn --model test run robin

      batos learn undo 7
    """
    if model is not None:
        _check_model(model)
    # 'learn run' and 'learn undo' read it from here: the option belongs to the group.
    ctx.obj = {**(ctx.obj or {}), "learn_model": model}
    if ctx.invoked_subcommand is not None:
        return
    from graph import learning

    model = model or settings.get_str("model")
    with open_image(image_uri(ctx)) as image:
        rows = learning.overview(image, model)
    if as_json:
        for row in rows:
            console.print(
                json_text(row, "a persona"), markup=False, highlight=False, soft_wrap=True
            )
        return
    least = settings.get_int("learning_min_examples")
    console.print(f"Learning on {model} (retrained at {least} new accepted lessons)")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))
    columns = ("persona", "lessons", "accepted", "good", "bad", "new", "adapter", "since", "by")
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(
            row["persona"],
            str(row["lessons"]),
            str(row["accepted"]),
            str(row["good"]),
            str(row["bad"]),
            f"{row['new']}" + (" due" if row["new"] >= least else ""),
            _sha(row["served"]),
            *_since(row),
        )
    console.print(table)
    for row in rows:
        for mission in row["missions"]:
            console.print(plain(f"{row['persona']}: {_mission_line(mission)}"), soft_wrap=True)
    if not any(row["missions"] for row in rows):
        console.paragraph("no retraining mission yet: 'batos learn run PERSONA' runs one now")


def _check_seconds(value: float | None) -> float | None:
    """The --seconds given, held to what BATOS_LEARNING_TRAIN_SECONDS takes: 'inf' is no bound
    (and overflows the clock it reaches), and NaN passes any range click checks."""
    if value is not None and not 1 <= value <= settings.MAX_WAIT_SECONDS:
        raise typer.BadParameter(
            f"a number of seconds from 1 to {settings.MAX_WAIT_SECONDS:.0f}", param_hint="--seconds"
        )
    return value


@learn_app.command("run")
def run_mission(
    ctx: typer.Context,
    persona: str = typer.Argument(..., help="ROBIN, BRICK, BABS or ALFRED."),
    seconds: float = typer.Option(
        None,
        "--seconds",
        callback=_check_seconds,
        help="Training time bound, 1 to 604800 (default: BATOS_LEARNING_TRAIN_SECONDS).",
    ),
    force: bool = typer.Option(
        False, "--force", help="Retrain even with fewer new accepted lessons than needed."
    ),
) -> None:
    """Retrain a persona's adapter on its lessons now; served only if it is better.

    The candidate continues the served adapter (a warm start) on the original data and the
    accepted lessons, then both answer the held-out prompts and the candidate is served only
    if its voice beats the served one's by BATOS_LEARNING_VOICE_MARGIN.

    Examples:

      batos learn run alfred

      batos learn run robin --seconds 300 --force
    """
    from batos.training.lora import persona_name
    from graph import learning

    name = persona_name(persona)
    doubles = retraining(ctx) or learning.Retraining()
    with (
        open_image(image_uri(ctx)) as image,
        ProgressReport(err_console, f"retrain {name}", total=None, unit="steps") as bar,
    ):

        def on_step(step: int, total: int, loss: float) -> None:
            bar.update(step, f"step {step}/{total}, loss {loss:.3f}")

        mission = learning.retrain_mission(
            image,
            name,
            model=_model(ctx),
            evaluator=doubles.evaluator,
            trainer=doubles.trainer,
            seconds=seconds,
            force=force,
            on_step=on_step,
            tell=lambda text: bar.update(note=text),
        )
    _report(mission)
    if mission["status"] == "failed":
        raise learning.LearningError(
            f"mission {mission['id']} failed: {mission.get('error')}",
            hint="nothing served changed; 'batos learn' lists the mission",
        )


def _report(mission: dict[str, Any]) -> None:
    number, status_ = mission["id"], mission["status"]
    evaluation = mission.get("evaluation") or {}
    console.print(f"mission {number}: {shown(mission['persona'])} {status_}")
    if not evaluation:
        return
    console.print(
        plain(f"  {evaluation.get('start', 'cold')} start: {evaluation.get('start_why')}")
    )
    for label, key in (("served", "current"), ("candidate", "new")):
        ev = evaluation.get(key) or {}
        relevance = "-" if ev.get("relevance") is None else f"{ev['relevance']:.3f}"
        console.print(
            f"  {label:<10} voice {ev.get('voice', 0):.2f} ({ev.get('hits')}/{ev.get('n')}), "
            f"relevance {relevance}"
        )
    console.print(
        plain(
            f"  trained {evaluation.get('train_seconds')} s, {evaluation.get('steps_run')} steps "
            f"on {evaluation.get('examples')} examples ({evaluation.get('learnt')} learnt), "
            f"learning rate {evaluation.get('learning_rate', 0):g}"
        )
    )
    console.print(
        plain(f"  {'swapped in' if status_ == 'kept' else 'kept aside'}: {evaluation.get('why')}")
    )
    if status_ == "kept":
        console.print(f"  undo with: batos learn undo {number}")


@learn_app.command("undo")
def undo(
    ctx: typer.Context,
    number: int = typer.Argument(..., help="The kept retraining mission to take back."),
) -> None:
    """Serve again the adapter a kept retraining mission replaced.

    Example:

      batos learn undo 7
    """
    from batos.training import retrain
    from graph import learning

    with open_image(image_uri(ctx)) as image:
        done = learning.undo(image, number, model=_model(ctx))
    persona, model = done["persona"], done.get("model") or settings.get_str("model")
    console.print(
        f"mission {number} undone: {persona} serves adapter "
        f"{_sha(retrain.served_sha(model, persona))} on {model} again"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(learn_app, name="learn")
