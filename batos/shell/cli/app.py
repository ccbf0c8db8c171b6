"""The ``batos`` Typer application: global options, error reporting and exit codes.

Every command opens the image named by ``--image`` (or ``BATOS_IMAGE``, or the default file
image); only the ones in ``CREATING_COMMANDS`` create it when it does not exist. Errors print
what went wrong and what to do, and exit non-zero with a code per error family (see
``batos.errors``). Command groups live one per module beside this one and add themselves
through ``register(app)``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from batos import settings
from batos.errors import BatosError
from batos.shell.cli.terminal import TerminalConsole, shown
from store.core.image import LOAD_ERRORS, acting_for, creating, database_error, load_error

if TYPE_CHECKING:
    from graph.learning import Retraining

app = typer.Typer(
    name="batos",
    help="BAT OS: a persistent, self-extending, multi-persona agent in one ZODB image.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)

console = TerminalConsole()
err_console = TerminalConsole(stderr=True)

#: ``persona, attempt -> chat model``: what generated-code missions and summaries use.
ModelFactory = Callable[..., Any]


class _NoTracebacks(logging.Filter):
    """Keeps library tracebacks (ZODB logs one for every object it cannot load) for -v."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = record.exc_text = None
        return True


#: The image the running command names, for errors raised outside any command's own handling.
_current = {"image": ""}
#: Commands that create the image when there is none yet; every other one needs it to exist,
#: so that a mistyped --image is an error rather than a new, empty image.
CREATING_COMMANDS = frozenset({"init", "run", "ingest", "zeo"})


@app.callback()
def _global(
    ctx: typer.Context,
    image: str = typer.Option(
        None,
        "--image",
        envvar="BATOS_IMAGE",
        help="URI of the living image (file://…/live_image.fs, zeo://host:port, postgres://…).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what BAT OS does."),
) -> None:
    passed = ctx.obj if isinstance(ctx.obj, dict) else {}
    ctx.obj = {**passed, "image": image or settings.get_str("image")}
    _current["image"] = ctx.obj["image"]
    ctx.with_resource(creating(ctx.invoked_subcommand in CREATING_COMMANDS))
    ctx.with_resource(acting_for(f"batos {ctx.invoked_subcommand}"))
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        for handler in logging.getLogger().handlers:
            if not any(isinstance(f, _NoTracebacks) for f in handler.filters):
                handler.addFilter(_NoTracebacks())


def image_uri(ctx: typer.Context) -> str:
    """The image URI this invocation names (from any sub-command's context)."""
    return ctx.find_root().obj["image"]


def model_factory(ctx: typer.Context) -> ModelFactory | None:
    """The chat-model factory ``main`` was given, or None for the configured backends."""
    return ctx.find_root().obj.get("model_factory")


def retraining(ctx: typer.Context) -> Retraining | None:
    """The trainer and evaluator ``main`` was given for retraining missions, or None."""
    return ctx.find_root().obj.get("retraining")


#: Modules that add their commands to ``app`` through a ``register(app)`` function, one per
#: command group, so the CLI grows without this file growing.
FEATURES: tuple[str, ...] = (
    "batos.shell.cli.image",
    "batos.shell.cli.models",
    "batos.shell.cli.threads",
    "batos.shell.cli.kernel",
    "batos.shell.cli.tools",
    "batos.shell.cli.memory",
    "batos.shell.cli.personas",
    "batos.shell.cli.learn",
    "batos.shell.cli.route",
    "batos.shell.cli.mind",
    "batos.shell.cli.cycles",
    "batos.shell.cli.heartbeat",
    "batos.shell.cli.doctor",
    "batos.shell.cli.stats",
    "batos.shell.cli.bridge",
)


def _register_features() -> None:
    for module in FEATURES:
        importlib.import_module(module).register(app)


_register_features()


def report_error(exc: BatosError) -> int:
    """Print an error and its hint as every command ends with one; its exit code."""
    err_console.print(f"[bold red]error:[/] {shown(exc.message)}")
    if exc.hint:
        err_console.print(f"[yellow]hint:[/] {shown(exc.hint)}")
    return exc.exit_code


def _unwrapped(text: str) -> str:
    """A docstring's paragraphs, each on one line: Typer's rich help keeps the source's line
    breaks in the list of commands and wraps again at the terminal, which left lines of one
    word ("ones") between full ones. A paragraph marked ``\\b`` keeps its breaks."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def _unwrap_help(command: Any) -> None:  # typer carries its own copy of click
    if command.help:
        command.help = _unwrapped(command.help)
    for sub in getattr(command, "commands", {}).values():
        _unwrap_help(sub)


def command() -> Any:
    """The ``batos`` click command, its help text in whole paragraphs."""
    built = typer.main.get_command(app)
    _unwrap_help(built)
    return built


def main(
    argv: list[str] | None = None,
    *,
    models: ModelFactory | None = None,
    retraining: Retraining | None = None,
) -> int:
    """Entry point of the ``batos`` script; returns the process exit code.

    ``models`` replaces the configured chat-model backends for this invocation (a scripted
    model in tests, a custom backend when embedding the CLI): ``models(persona, attempt=0)``.
    ``retraining`` replaces the trainer and evaluator of ``batos learn run``'s mission.
    """
    passed = {"model_factory": models, "retraining": retraining}
    try:
        result = command()(args=argv, standalone_mode=False, obj=passed)
    except BatosError as exc:
        return report_error(exc)
    except LOAD_ERRORS as exc:  # damage found while loading objects, whatever the command
        return report_error(load_error(_current["image"], exc))
    except typer.TyperException as exc:  # a usage error: unknown command or option, bad value
        # Typer carries its own copy of click: click's exception classes never match these.
        show = getattr(exc, "show", None)
        if show is not None:
            show()
        else:
            err_console.print(f"[bold red]error:[/] {shown(exc.format_message())}")
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except Exception as exc:
        # A database server lost mid-command, met outside the image's own transactions (the
        # checkpointer keeps connections of its own): said as the image's error, not a trace.
        translated = database_error(_current["image"], exc)
        if translated is None:
            raise
        return report_error(translated)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
