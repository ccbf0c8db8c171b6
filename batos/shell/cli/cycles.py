"""``batos cycles``: the mind's committed cycles, and the threads whose last cycle FAILED.

A committed cycle is a record in the image (``graph.cycle``); a FAILED one changed nothing
there, so only its thread's checkpoints know it (``ZODBSaver.recent_threads``). ``batos chat``
shows the same two lists for its ``/cycles``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import typer
from rich.cells import cell_len
from rich.table import Table

from batos.errors import ObjectPathError
from batos.shell.cli.app import console, image_uri
from batos.shell.cli.terminal import plain, shown, visible
from batos.shell.runtime import open_image
from prototypes.bounded import bounded_repr
from store.checkpoint.saver import ZODBSaver
from store.core.image import LivingImage, shown_uri

cycles_app = typer.Typer()


def cycles_table(image: LivingImage, cycle_id: str | None, limit: int) -> list[dict[str, Any]]:
    from graph import cycle

    with image.read() as root:
        rows = [_committed(image, root, cycle_id)] if cycle_id else cycle.recent(root, limit)
    title = "Committed mind cycles, newest first"
    columns = ("cycle", "when", "thread", "personas", "facets", "seconds", "model s", "tokens")
    wrapping = ("personas", "facets")  # lists, which wrap at their commas
    # Controls written as escapes first: measured as they are shown, and never sent raw to
    # the terminal by the narrow layout below (a record is text from the image).
    cells_of = [tuple(visible(cell) for cell in _cycle_cells(row)) for row in rows]
    # Ids, times and numbers are never broken: an id folded over lines cannot be copied into
    # 'batos cycles ID'. The table is shown when it fits so; each column takes its widest
    # cell (a list its longest item), plus a space either side and a rule.
    widths = [
        max(
            [
                cell_len(column),
                *(
                    max(map(cell_len, cells[i].split(", ")))
                    if column in wrapping
                    else cell_len(cells[i])
                    for cells in cells_of
                ),
            ]
        )
        for i, column in enumerate(columns)
    ]
    if sum(width + 3 for width in widths) + 1 <= console.width:
        table = Table(title=title)
        for column in columns:
            table.add_column(column, no_wrap=column not in wrapping)
        for cells in cells_of:
            table.add_row(*(plain(cell) for cell in cells))
        console.print(table)
        return rows
    # Too narrow for the table with whole ids (80 columns, a pipe): one block a cycle, its id
    # alone on the first line, as 'batos threads' lists threads.
    console.print(title, markup=False, highlight=False)
    for cycle_cell, when, thread, personas, facets, seconds, model_s, tokens in cells_of:
        console.print(cycle_cell, markup=False, soft_wrap=True, highlight=False)
        line = f"  {when} · thread {thread}"
        console.print(line, markup=False, soft_wrap=True, highlight=False)
        console.paragraph(
            f"{personas or '-'} · {facets} · {seconds} s (model {model_s} s) · {tokens} tokens",
            indent=4,
        )
    return rows


def _cycle_cells(row: dict[str, Any]) -> tuple[str, ...]:
    """A cycle record's cells, in the table's columns' order: text from the image as it is,
    to be printed without markup."""
    # A record from an older version may lack fields: each is read with a default.
    started, tokens = row.get("started"), row.get("tokens") or {}
    when = "-" if started is None else dt.datetime.fromtimestamp(started)
    return (
        str(row["id"]),
        when if isinstance(when, str) else when.isoformat(sep=" ", timespec="seconds"),
        str(row.get("thread_id", "-")),
        ", ".join(map(str, row.get("personas") or [])),
        ", ".join(map(str, row.get("facets") or [])) or _path(row),
        _number(row.get("seconds")),
        _number(row.get("model_seconds")),
        f"{tokens.get('input', '?')} in / {tokens.get('output', '?')} out",
    )


def _committed(image: LivingImage, root: Any, cycle_id: str) -> dict[str, Any]:
    """The committed cycle ``cycle_id``'s record; ``ObjectPathError`` (exit code 4, as for any
    name the image does not hold) when there is none: exit code 10 says a request could not be
    routed or a cycle FAILED, which a mistyped id is not."""
    from graph import cycle

    found = cycle.get(root, cycle_id)
    if found is None:
        raise ObjectPathError(
            f"no committed cycle {bounded_repr(cycle_id, 80)} in {shown_uri(image.uri)}",
            hint="list them with 'batos cycles' (FAILED cycles change nothing in the image; "
            "their threads keep them: 'batos threads THREAD_ID')",
        )
    return found


def _path(row: dict[str, Any]) -> str:
    mode = (row.get("depth") or {}).get("mode")
    return f"({mode} path)" if mode else "-"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _failed_threads(image: LivingImage, limit: int) -> list[dict[str, Any]]:
    """Of the ``limit`` threads with the newest checkpoints, those whose last cycle FAILED,
    newest first: what no committed record shows."""
    from graph import records

    found = []
    with ZODBSaver(image) as saver:  # reads only: it applies no commits
        for thread_id in saver.recent_threads(limit):
            latest = saver.get_tuple({"configurable": {"thread_id": thread_id}})
            values = latest.checkpoint["channel_values"] if latest else {}
            if values.get("status") != "FAILED" or not values.get("failure"):
                continue
            # A client can write any state (Studio's editor, update_state): a failure that is
            # no mapping with a reason is skipped with a warning naming the thread.
            failure = records.readable(
                records.Failure, "failure of thread", thread_id, values["failure"]
            )
            if failure is None:
                continue
            cycle = values.get("cycle")
            shown_as = {
                "thread_id": thread_id,
                "cycle": cycle.get("id") if isinstance(cycle, Mapping) else None,
            }
            # the failure's own keys of those names never stand for the thread shown
            found.append({**shown_as, **{k: v for k, v in failure.items() if k not in shown_as}})
    return found


@cycles_app.command()
def cycles(
    ctx: typer.Context,
    cycle_id: str = typer.Argument(None, help="One cycle's id: its whole record."),
    limit: int = typer.Option(
        20, "--limit", "-n", min=1, help="How many cycles, and latest threads, to list."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Recent mind cycles: status, personas, facets, timings, tokens; of the -n most recently
    active threads, those whose last cycle FAILED (a failed cycle changes nothing in the image,
    so only its thread knows it).

    Examples: batos cycles · batos cycles -n 5 --json · batos cycles CYCLE_ID
    """
    if cycle_id is not None and not cycle_id.strip():  # else it would list every cycle
        raise typer.BadParameter("a cycle id cannot be empty", param_hint="CYCLE_ID")
    with open_image(image_uri(ctx)) as image:
        if as_json:
            from graph import cycle

            with image.read() as root:
                rows = (
                    [_committed(image, root, cycle_id)] if cycle_id else cycle.recent(root, limit)
                )
            failed = [] if cycle_id else _failed_threads(image, limit)
            console.print_value_json({"committed": rows, "failed": failed}, "the cycles")
            return
        rows = cycles_table(image, cycle_id, limit)
        if cycle_id:
            console.print_value_json(rows[0], "the cycle")
            return
        print_failed(image, limit)


def print_failed(image: LivingImage, limit: int) -> None:
    """The threads whose last cycle FAILED or was stopped: they changed nothing in the image,
    so only the threads know them."""
    for stopped in _failed_threads(image, limit):
        console.print(
            f"[red]FAILED[/] thread {shown(stopped['thread_id'])} "
            f"cycle {shown(stopped['cycle'])} at {shown(stopped.get('node'))}: "
            f"{shown(stopped['reason'])}"
        )


def register(app: typer.Typer) -> None:
    for command in cycles_app.registered_commands:
        app.registered_commands.append(command)
