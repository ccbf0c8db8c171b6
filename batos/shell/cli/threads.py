"""``batos threads``, ``batos prune`` and ``batos pack``: the conversation threads in the image.

Threads are the LangGraph checkpoints ``store.checkpoint.saver.ZODBSaver`` keeps; these commands
show them, trim their history and pack the image so the space they held is given back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from langchain_core.runnables import RunnableConfig
from rich.table import Table

from batos.shell.cli.app import console, image_uri
from batos.shell.cli.terminal import shown
from batos.shell.runtime import open_runtime
from store.checkpoint.saver import ZODBSaver
from store.core import packing
from store.core.image import LivingImage


@contextmanager
def _saver(ctx: typer.Context) -> Iterator[ZODBSaver]:
    with open_runtime(image_uri(ctx)) as runtime:
        yield runtime.saver


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
    limit: int = typer.Option(50, "--limit", "-n", help="Most checkpoints to show."),
) -> None:
    """List conversation threads, or one thread's checkpoints newest first.

    Examples: batos threads · batos threads 6f1c… -n 10
    """
    with _saver(ctx) as saver:
        if thread_id is None:
            table = Table(title=f"Threads in {shown(saver.image.uri)}")
            for column in ("thread", "namespaces", "checkpoints", "writes", "size", "created"):
                table.add_column(column)
            for s in saver.threads():
                table.add_row(
                    shown(s.thread_id),
                    str(s.namespaces),
                    str(s.checkpoints),
                    str(s.writes),
                    _size(s.bytes),
                    _when(s.created),
                )
            console.print(table)
            return
        summary = saver.thread_summary(thread_id)
        table = Table(
            title=f"Thread {shown(thread_id)}: {summary.checkpoints} checkpoints, "
            f"{_size(summary.bytes)}"
        )
        for column in ("namespace", "checkpoint", "step", "source", "run", "writes", "parent"):
            table.add_column(column)
        config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        for item in saver.list(config, limit=limit):
            conf = item.config["configurable"]
            parent = item.parent_config and item.parent_config["configurable"]["checkpoint_id"]
            table.add_row(
                shown(conf["checkpoint_ns"] or "(root)"),
                shown(conf["checkpoint_id"]),
                shown(item.metadata.get("step", "")),
                shown(item.metadata.get("source", "")),
                shown(item.metadata.get("run_id", "") or "-"),
                str(len(item.pending_writes or [])),
                shown(parent or "-"),
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
            f"packed {image.uri} ({report.storage}): {_size(before.bytes)} → {_size(after.bytes)}",
            markup=False,
        )
    else:
        console.print(
            f"packed {image.uri} ({report.storage}): object revisions "
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
