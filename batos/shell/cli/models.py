"""``batos models list|build|status|render`` and ``batos say``: persona models from the shell."""

from __future__ import annotations

import sys

import typer
from rich.table import Table

from batos import settings
from batos.errors import ModelError
from batos.shell.cli.app import console, err_console
from batos.shell.cli.progress import ProgressReport
from batos.shell.cli.terminal import shown, visible

models_app = typer.Typer(
    help="Persona models: Modelfiles, adapters, Ollama and embedded backends.", no_args_is_help=True
)


@models_app.command("list")
def list_models() -> None:
    """Every persona's Modelfile: Ollama name, FROM, parameters, and which adapters exist.

    Example: batos models list
    """
    from batos.models.modelfile import adapter_path, persona_model
    from prototypes.codex import load_codex
    from store.core.model_files import catalog

    names = list(catalog())
    table = Table(title=f"Persona models ({settings.get_str('modelfiles')})")
    columns = ("persona", "ollama model", "FROM", "temperature", *[f"adapter:{n}" for n in names])
    for column in columns:
        table.add_column(column)
    for name in load_codex().personas:
        model = persona_model(name)
        cells = []
        for which in names:
            if not model.adapters:
                cells.append("-")
            else:
                trained = adapter_path(which, name).is_file()
                cells.append("✓" if trained else "not trained")
        table.add_row(
            shown(name),
            shown(model.name),
            shown(model.modelfile.from_),
            str(model.parameters.get("temperature", "-")),
            *cells,
        )
    console.print(table)


@models_app.command("render")
def render(
    check: bool = typer.Option(False, "--check", help="Only report; exit 1 if stale."),
) -> None:
    """Write each persona Modelfile's SYSTEM from the codex identity (other lines are kept).

    Example: batos models render --check
    """
    from batos.models.modelfile import render_all

    stale = render_all(write=not check)
    for path in stale:
        console.print(f"{'stale' if check else 'rendered'} {path}")
    if not stale:
        console.print("Modelfiles match the codex")
    if check and stale:
        raise typer.Exit(1)


@models_app.command("build")
def build(
    force: bool = typer.Option(False, "--force", help="Re-create models that exist."),
) -> None:
    """Create the persona models on the Ollama server at OLLAMA_HOST (only the missing ones).

    Example: OLLAMA_HOST=http://127.0.0.1:11434 batos models build
    """
    from batos.models.ollama import host_url, provision

    host = settings.get_str("ollama_host")
    if not host:
        raise ModelError(
            "OLLAMA_HOST is not set",
            hint="set it to your server (http://127.0.0.1:11434); without Ollama the "
            "embedded backend serves the Modelfiles directly and needs no build",
        )
    with ProgressReport(err_console, "models build", total=None, unit="steps") as progress:

        def step(text: str) -> None:
            progress.update(progress.done + 1, text)

        report = provision(host_url(host), force=force, progress=step)
    console.print(f"present: {', '.join(report.present) or '-'}", markup=False)
    console.print(f"pulled:  {', '.join(report.pulled) or '-'}", markup=False)
    console.print(f"created: {', '.join(report.created) or '-'}", markup=False)
    if report.without_adapter:
        console.print(
            "[yellow]without adapter (not trained yet):[/] "
            + shown(", ".join(report.without_adapter))
        )


@models_app.command("status")
def status() -> None:
    """Which backend serves the personas now, whether each persona's model is ready, and
    which model writes methods (BATOS_AUTHOR_MODEL).

    Example: BATOS_MODEL=test batos models status
    """
    from batos.models import author, select_backend
    from batos.models.embedded import adapter_paths
    from batos.models.modelfile import persona_model
    from prototypes.codex import load_codex

    backend = select_backend()
    console.print(f"backend: [bold]{backend}[/]")
    writer = author.configured()
    where = f" at {writer.url}" if writer is not None and writer.url else ""
    shown = f"{writer.label}{where}" if writer is not None else "each persona's own model"
    console.print(f"author: {shown}", markup=False)
    if backend == "openai":
        console.print(f"endpoint: {settings.get_str('openai_base_url')}")
        return
    if backend == "ollama":
        import ollama

        from batos.models.ollama import host_url

        host = host_url(settings.get_str("ollama_host"))
        present = {m.model for m in ollama.Client(host=host).list().models}
        for name, spec in load_codex().personas.items():
            ready = f"{spec.model}:latest" in present or spec.model in present
            console.print(
                f"  {name:7} {spec.model:14} "
                f"{'ready' if ready else 'missing: run batos models build'}",
                markup=False,
            )
        return
    from store.core.model_files import model_path

    which = settings.get_str("model")
    console.print(f"base model: {which} → {model_path(which)}")
    for name in load_codex().personas:
        adapters = adapter_paths(persona_model(name), which)
        state = ", ".join(p.name for p in adapters) if adapters else "system prompt only"
        console.print(f"  {name:7} {state}")


def say(
    persona: str = typer.Argument(..., help="ROBIN, BRICK, BABS or ALFRED."),
    text: str = typer.Argument(..., help="What to say to the persona."),
    temperature: float = typer.Option(
        None, "--temperature", "-t", min=0.0, max=2.0, help="Override the Modelfile (0 to 2)."
    ),
    max_tokens: int = typer.Option(
        None, "--max-tokens", "-n", min=1, max=32_768, help="Longest reply in tokens."
    ),
) -> None:
    """Stream one reply from one persona.

    Example: BATOS_MODEL=test batos say robin "I feel lost today"
    """
    from batos.models import chat_model
    from batos.shell.cli.repl import clean_line

    text = clean_line(text)  # as ask and chat read theirs
    if not text:
        raise typer.BadParameter("say something: the text is empty", param_hint="TEXT")

    options = {
        k: v
        for k, v in (("temperature", temperature), ("num_predict", max_tokens))
        if v is not None
    }
    model = chat_model(persona, **options)
    usage = None
    for chunk in model.stream(text):
        sys.stdout.write(visible(str(chunk.content)))
        sys.stdout.flush()
        usage = chunk.usage_metadata or usage
    sys.stdout.write("\n")
    if usage:
        console.print(
            f"[dim]{usage['input_tokens']} prompt + {usage['output_tokens']} reply tokens[/]",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
    app.command("say")(say)
