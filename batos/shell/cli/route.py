"""``batos route``: which personas would answer each request, ranked with calibrated scores.

The router lives in the image and is trained there on first use (and again when the codex's
examples change), so the first call after such a change takes a few seconds longer.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.table import Table

from batos.errors import RoutingError
from batos.shell.cli.app import console, image_uri
from batos.shell.cli.terminal import json_text, shown

#: Largest request file read (bytes; characters for stdin).
MAX_FILE_BYTES = 1_000_000
#: Requests routed per batch: output appears as each batch is done.
BATCH = 64


def _read(file: Path) -> str:
    """The text of ``file`` ('-': stdin), refusing what is too large or not UTF-8 text."""
    if str(file) == "-":
        text = sys.stdin.read(MAX_FILE_BYTES + 1)
        if len(text) > MAX_FILE_BYTES:
            raise RoutingError(
                f"more than {MAX_FILE_BYTES:,} characters on stdin",
                hint="split the requests over several calls",
            )
        return text
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            raise RoutingError(
                f"{file} is {size:,} bytes; the most read is {MAX_FILE_BYTES:,}",
                hint="split the requests over several files",
            )
        return file.read_bytes().decode("utf-8")
    except OSError as exc:
        raise RoutingError(
            f"cannot read requests from {file}: {exc.strerror or exc}",
            hint="check the path, or pass the requests as arguments",
        ) from exc
    except UnicodeDecodeError as exc:
        raise RoutingError(
            f"{file} is not UTF-8 text: {exc.reason} at byte {exc.start}",
            hint="give a text file with one request a line",
        ) from exc


def _batches(texts: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(texts), BATCH):
        yield texts[start : start + BATCH]


def route(
    ctx: typer.Context,
    texts: list[str] = typer.Argument(None, help="One or more requests."),
    file: Path = typer.Option(
        None, "--file", "-f", help="Read requests from FILE, one a line ('-': stdin)."
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON line per request."),
) -> None:
    """Rank the personas for each request with calibrated scores, and say who answers.

    A second persona answers too when its score comes close to the best one's (docs/mind.md).

    Examples: batos route "why do I feel so restless?" · batos route --file requests.txt --json
    """
    from batos.shell.runtime import open_image
    from graph.router import load_router, prefetch_runner_up

    wanted = list(texts or [])
    for n, text in enumerate(wanted, start=1):
        if not text.strip():
            raise RoutingError(f"request {n} is empty", hint="give each request some text")
    if file is not None:
        wanted.extend(line.strip() for line in _read(file).splitlines() if line.strip())
    if not wanted:
        raise RoutingError("no request given", hint='batos route "your request" (or --file FILE)')
    with open_image(image_uri(ctx)) as image:
        router = load_router(image)
    table = Table(title=f"Routes (router trained on codex version {router.codex_version})")
    table.add_column("request")
    for persona in router.personas:
        table.add_column(persona, justify="right")
    table.add_column("answers")
    for batch in _batches(wanted):
        for found in router.route_many(batch):
            prefetch_runner_up(found)  # only where a model is already loaded in this process
            if as_json:
                sys.stdout.write(json_text(found.to_json(), "the route") + "\n")
                continue
            scores = dict(found.ranked)
            table.add_row(
                shown(found.text if len(found.text) <= 60 else found.text[:59] + "…"),
                *(f"{scores[p]:.2f}" for p in router.personas),
                ", ".join(found.chosen),
            )
    if not as_json:
        console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(route)
