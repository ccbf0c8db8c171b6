"""``batos heartbeat`` and ``batos audit``: the image's upkeep, and what ALFRED's audits found.

``heartbeat`` runs the scheduled jobs until SIGINT/SIGTERM (the running job finishes, then
exit 0); ``--once`` runs the due jobs and exits; ``--list`` shows the jobs. ``audit report``
prints the CEM, its weights and the missions over time (``--json``, ``--png FILE`` for a
chart); ``audit show ID`` one report.
"""

from __future__ import annotations

import datetime as dt
import signal
import threading
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from batos.errors import BatosError
from batos.shell.cli.app import console, image_uri, model_factory
from batos.shell.cli.terminal import shown
from batos.shell.heartbeat import Heartbeat
from graph import audit as audits
from graph import cem, missions
from graph.boot import open_image

audit_app = typer.Typer(help="ALFRED's audits of the Composite Entropy Metric.")


def _when(timestamp: float | dt.datetime | None) -> str:
    if timestamp is None:
        return "-"
    if isinstance(timestamp, dt.datetime):
        timestamp = timestamp.timestamp()
    return dt.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def heartbeat(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="Run every due job once, then exit."),
    list_jobs: bool = typer.Option(False, "--list", help="Show the jobs and their next runs."),
) -> int:
    """Run the image's upkeep — ALFRED's audit, memory curation, checkpoint pruning — on
    their intervals until stopped (Ctrl-C or SIGTERM). Examples: batos heartbeat ·
    batos heartbeat --once · batos heartbeat --list
    """
    with open_image(image_uri(ctx)) as image:
        beat = Heartbeat(image, model_factory(ctx))
        if list_jobs:
            table = Table(title=f"Heartbeat jobs of {image.uri}")
            for column in ("job", "trigger", "next run", "note"):
                table.add_column(column)
            for job_id, trigger, after, corrupt in beat.jobs():
                note = f"[red]corrupt, skipped: {shown(corrupt)}[/]" if corrupt else ""
                table.add_row(shown(job_id), shown(trigger), _when(after), note)
            console.print(table)
            return 0
        if once:
            outcomes = beat.once()
            for o in outcomes:
                mark = "[green]✓[/]" if o.ok else "[red]✗[/]"
                console.print(f"{mark} {shown(o.job)} ({o.seconds:.1f}s): {shown(o.said)}")
            if not outcomes:
                console.print("no job was due")
            return 0 if all(o.ok for o in outcomes) else 1
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        console.print(f"heartbeat on {image.uri}; Ctrl-C stops it", markup=False)
        beat.forever(stop)
        console.print("heartbeat stopped")
    return 0


def _rows(image: Any) -> list[dict[str, Any]]:
    return audits.history(image)


def _weights(weights: dict[str, float] | None) -> str:
    if not weights:
        return "-"
    return " ".join(f"{weights.get(c, 0.0):.3f}" for c in cem.COMPONENTS)


def _mission_rows(found: list[dict[str, Any]]) -> Table:
    table = Table(title="Self-improvement missions")
    for column in ("id", "audit", "mission", "hypothesis", "outcome"):
        table.add_column(column, overflow="fold")
    for m in found:
        what = f"{m['persona']}.{m['selector']}" if m.get("selector") else m["persona"]
        if m["kind"] == "raise_prior" and "prior_after" in m:
            what += f" {m['prior_before']:+.2f}→{m['prior_after']:+.2f}"
        h = m["hypothesis"]
        judged = m.get("judged") or {}
        why = judged.get("why") or m.get("error") or ""
        if judged.get("error"):
            why += f" ({judged['error']})"
        table.add_row(
            str(m["id"]),
            str(m["report"]),
            shown(f"{m['kind']} {what}"),
            shown(
                f"{h['component']} ≥ {_num(h['baseline'])}{h['gain']:+g} after {h['cycles']} cycles"
            ),
            shown(f"{m['status']}: {why}" if why else m["status"]),
        )
    return table


@audit_app.command("report")
def report(
    ctx: typer.Context,
    png: Path = typer.Option(None, "--png", help="Write a chart of the CEM over time here."),
    as_json: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
) -> None:
    """The CEM and its components over time, one row per audit. Example: batos audit
    report --png cem.png"""
    with open_image(image_uri(ctx)) as image:
        rows = _rows(image)
        found = missions.history(image)
    if as_json:
        console.print_value_json({"audits": rows, "missions": found}, "the audit reports")
    else:
        table = Table(title="Audits")
        weights = "weights (" + " ".join(cem.COMPONENTS) + ")"
        for column in ("id", "time", "cycles", *cem.COMPONENTS, "CEM", "verdict", weights):
            table.add_column(column)
        for r in rows:
            m = r["metrics"]
            table.add_row(
                str(r["id"]),
                _when(r["time"]),
                str(m["cycles"]),
                *(_num(m.get(c)) for c in (*cem.COMPONENTS, "cem")),
                shown(r["verdict"] + (f" → mission {r['mission']}" if r.get("mission") else "")),
                _weights(m.get("weights")),
            )
        console.print(table)
        if found:
            console.print(_mission_rows(found))
            kept = sum(m["status"] == "kept" for m in found)
            undone = sum(m["status"] == "undone" for m in found)
            console.print(f"missions: {len(found)} started, {kept} kept, {undone} undone")
        else:
            console.print("missions: none started yet")
    if png is not None:
        _chart(rows, found, png)
        if not as_json:
            console.print(f"chart written to {png}", markup=False)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _chart(rows: list[dict[str, Any]], found: list[dict[str, Any]], path: Path) -> None:
    if not rows:
        raise BatosError(
            "there are no audit reports to chart",
            hint="run an audit first: batos heartbeat --once",
        )
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or used
    import matplotlib.pyplot as plt

    fig, (ax, wax) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(2, 1))
    ids = [r["id"] for r in rows]
    for name in (*cem.COMPONENTS, "cem"):
        values = [r["metrics"].get(name) for r in rows]
        ax.plot(
            ids,
            [float("nan") if v is None else v for v in values],
            marker="o",
            linewidth=2.5 if name == "cem" else 1.2,
            label="CEM" if name == "cem" else name,
        )
    colours = {"kept": "tab:green", "undone": "tab:red"}
    for m in found:  # where each mission started, coloured by what became of it
        ax.axvline(m["report"], color=colours.get(m["status"], "tab:gray"), linestyle=":")
    ax.set_ylim(0, 1.05)
    ax.set_title("Composite Entropy Metric (dotted: missions; green kept, red undone)")
    ax.legend(loc="best", fontsize="small")
    for name in cem.COMPONENTS:
        wax.plot(ids, [r["metrics"]["weights"].get(name, 0.0) for r in rows], label=name)
    wax.set_ylabel("weight")
    wax.set_xlabel("audit")
    wax.legend(loc="best", fontsize="small")
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise BatosError(f"cannot write {path}: {exc}", hint="name a writable file") from exc
    finally:
        plt.close(fig)


@audit_app.command("show")
def show(ctx: typer.Context, report_id: int = typer.Argument(..., help="Audit report number.")):
    """One audit report: the numbers, what moved and ALFRED's account. Example: batos audit
    show 3"""
    with open_image(image_uri(ctx)) as image:
        r = audits.show(image, report_id)
    m, d = r["metrics"], r["deltas"]
    console.print(f"[bold]audit {r['id']}[/] at {_when(r['time'])}: {m['cycles']} cycles")
    for name in (*cem.COMPONENTS, "cem"):
        moved = "" if d.get(name) is None else f" ({d[name]:+.3f})"
        console.print(f"  {name:8} {_num(m.get(name))}{moved}")
    for persona, terms in m["by_persona"].items():
        console.print(
            f"  {persona:8} share {terms['share']:.2f} · H_cog term {terms['H_cog_term']:.3f}"
            f" · novelty {_num(terms['H_sol_mean'])}"
        )
    console.print(f"verdict: {r['verdict']}", markup=False)
    console.print(f"weights: {_weights(m.get('weights'))} → next {_weights(r.get('weights_next'))}")
    for number, status in (r.get("judged") or {}).items():
        console.print(f"mission {number} judged: {status}", markup=False)
    if r.get("mission"):
        console.print(f"mission {r['mission']} started (see 'batos audit report')")
    console.print("[bold]ALFRED:[/] ", end="")
    console.print(r["narrative"], markup=False)


def register(app: typer.Typer) -> None:
    app.command()(heartbeat)
    app.add_typer(audit_app, name="audit")
