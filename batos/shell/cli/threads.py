"""``batos threads``, ``batos prune`` and ``batos pack``: the conversation threads in the image.

Threads are the LangGraph checkpoints ``store.checkpoint.saver.ZODBSaver`` keeps; these commands
show them, trim their history and pack the image so the space they held is given back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

import typer
from rich.table import Table

from batos.shell.cli.app import console, image_uri
from batos.shell.cli.terminal import json_text, one_line, shown
from batos.shell.runtime import open_runtime
from store.checkpoint.saver import ZODBSaver
from store.core import packing
from store.core.image import LivingImage, shown_uri


@contextmanager
def _saver(ctx: typer.Context) -> Iterator[ZODBSaver]:
    with open_runtime(image_uri(ctx)) as runtime:
        yield runtime.saver


#: Below this many columns a thread's checkpoints are listed, not tabled.
NARROW = 72


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds).isoformat(sep=" ", timespec="seconds")


def threads(
    ctx: typer.Context,
    thread_id: str = typer.Argument(None, help="Show this thread's checkpoints."),
    limit: int = typer.Option(50, "--limit", "-n", min=1, help="Most checkpoints to show."),
    as_json: bool = typer.Option(False, "--json", help="One JSON line per thread or checkpoint."),
) -> None:
    """List conversation threads, or one thread's checkpoints newest first (its root and
    subgraph namespaces together).

    Thread and checkpoint ids are shown whole, to copy into 'batos threads ID' or 'batos chat
    -t ID'; --json has every id whole.

    Examples: batos threads · batos threads 6f1c… -n 10 · batos threads --json
    """
    with _saver(ctx) as saver:
        if thread_id is None:
            if as_json:
                for s in saver.threads():
                    console.print(
                        json_text(asdict(s), "a thread"),
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )
                return
            # One line a thread, its id first and whole: a table cell would cut or fold an id
            # at 80 columns, and an id cut short cannot be used again. Markup is off, so ids
            # are not escaped for it ('[red]' would print as '\[red]').
            console.print(
                f"Threads in {one_line(shown_uri(saver.image.uri))}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            for s in saver.threads():
                console.print(
                    f"{one_line(s.thread_id)}  {s.checkpoints} checkpoints, {s.namespaces} "
                    f"namespaces, {s.writes} writes, {_size(s.bytes)}, created {_when(s.created)}",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )
            return
        summary = saver.thread_summary(thread_id)
        # Headers only: the checkpoints' values (megabytes in a long thread) are not shown.
        headers = saver.headers(thread_id, limit=limit)
        if as_json:
            for header in headers:
                row = {
                    "namespace": header.namespace,
                    "checkpoint": header.checkpoint_id,
                    "step": header.metadata.get("step"),
                    "source": header.metadata.get("source"),
                    "run": header.metadata.get("run_id"),
                    "writes": header.writes,
                    "parent": header.parent_id or None,
                }
                console.print(
                    json_text(row, "a checkpoint"), markup=False, highlight=False, soft_wrap=True
                )
            return
        title = f"Thread {shown(one_line(thread_id))}: {summary.checkpoints} checkpoints, " + _size(
            summary.bytes
        )
        if console.width < NARROW:  # five columns beside a whole id would fold letter by letter
            console.print(title)
            for header in headers:
                console.print(shown(header.checkpoint_id), soft_wrap=True)
                console.print(
                    f"  step {shown(header.metadata.get('step', ''))} · "
                    f"{shown(header.metadata.get('source', ''))} · "
                    f"{header.writes} writes · "
                    f"{shown(header.namespace or '(root)')}"
                )
            return
        table = Table(title=title)
        # The checkpoint id whole, and what fits beside it at 80 columns: each checkpoint's
        # parent is the next row; its run and parent ids are in --json.
        for column in ("namespace", "checkpoint", "step", "source", "writes"):
            whole = column == "checkpoint"
            table.add_column(column, no_wrap=whole, overflow="fold")
        for header in headers:
            table.add_row(
                shown(header.namespace or "(root)"),
                shown(header.checkpoint_id),
                shown(header.metadata.get("step", "")),
                shown(header.metadata.get("source", "")),
                str(header.writes),
            )
        console.print(table)


def prune(
    ctx: typer.Context,
    keep: int = typer.Option(..., "--keep", "-k", min=1, help="Checkpoints kept per namespace."),
    thread_ids: list[str] = typer.Argument(None, help="Threads to prune (default: all)."),
) -> None:
    """Delete all but the newest N checkpoints of each thread (and their writes and values).

    The space is reclaimed on disk by 'batos pack'. Examples: batos prune --keep 20 ·
    batos prune --keep 1 6f1c…
    """
    with _saver(ctx) as saver:
        for thread_id in thread_ids or []:
            saver.thread_summary(thread_id)  # an unknown thread is an error, not a no-op
        deleted = saver.trim(thread_ids or None, keep=keep)
    console.print(f"deleted {deleted} checkpoints, kept the newest {keep} per namespace")


def pack(
    ctx: typer.Context,
    days: float = typer.Option(
        0.0, "--days", "-d", min=0.0, help="Keep undo history of the last DAYS days."
    ),
) -> None:
    """Pack the image: drop old object revisions and unreachable objects.

    Packing removes the undo history older than --days: transactions before that point can no
    longer be undone with 'batos undo'. A file image shrinks on disk; on PostgreSQL the rows
    of old revisions are deleted and their count and bytes are shown. Example: batos pack --days 7
    """
    with LivingImage.open(image_uri(ctx)) as image:
        with console.status("packing…"):
            report = packing.pack(image, days=days)
    before, after = report.before, report.after
    if before.revisions is None:
        console.print(
            f"packed {shown_uri(image.uri)} ({report.storage}): "
            f"{_size(before.bytes)} → {_size(after.bytes)}",
            markup=False,
        )
    else:
        console.print(
            f"packed {shown_uri(image.uri)} ({report.storage}): object revisions "
            f"{before.revisions:,} → {after.revisions:,}, their state "
            f"{_size(before.bytes)} → {_size(after.bytes)}, blob chunks "
            f"{before.blob_chunks:,} → {after.blob_chunks:,}",
            markup=False,
        )
    for note in report.notes:
        console.print(f"  {note}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(threads)
    app.command()(prune)
    app.command()(pack)
