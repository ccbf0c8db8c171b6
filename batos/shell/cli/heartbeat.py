"""``batos heartbeat`` and ``batos audit``: the image's upkeep, and what ALFRED's audits found.

``heartbeat`` runs the scheduled jobs until SIGINT/SIGTERM (the running jobs finish, the
queued ones stay due, then exit 0), one line per job run as it ends (``--json``: one JSON
object per line, from the same record); ``--once`` runs the due jobs and exits; ``--list``
shows what will run and when;
``--every JOB=SECONDS`` overrides a job's interval setting. ``audit report`` prints the CEM,
its weights and the missions over time in a layout that fits 80 columns (``--json``,
``--png FILE`` for a chart); ``audit show ID`` one report.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import signal
import threading
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from batos import settings
from batos.errors import BatosError, ConfigurationError
from batos.shell.cli.app import console, err_console, image_uri, model_factory
from batos.shell.cli.terminal import json_text, plain, shown, visible
from batos.shell.heartbeat import JOBS, Heartbeat, LeaseHeld, Outcome, Planned
from batos.shell.runtime import open_image, open_runtime
from graph import audit as audits
from graph import cem, learning, missions
from store.core.image import shown_uri

audit_app = typer.Typer(help="ALFRED's audits of the Composite Entropy Metric.")

#: Longest a second stop waits to leave the abandoned jobs due and give the lease back.
ABANDON_WAIT_S = 5.0


def _when(timestamp: float | dt.datetime | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    if timestamp is None:
        return "-"
    if isinstance(timestamp, dt.datetime):
        timestamp = timestamp.timestamp()
    return dt.datetime.fromtimestamp(timestamp).strftime(fmt)


def _every(seconds: float) -> str:
    """An interval as people say it: 15 min, 1 h 30 min, 1 day, 0.3 s."""
    if seconds < 60 or not float(seconds).is_integer():
        return f"{seconds:g} s"
    whole = int(seconds)
    parts = []
    for size, unit in ((86400, "day"), (3600, "h"), (60, "min"), (1, "s")):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count} {unit}" + ("s" if unit == "day" and count > 1 else ""))
    return " ".join(parts)


def _intervals(every: list[str] | None) -> dict[str, float]:
    """``--every JOB=SECONDS`` options as job → seconds."""
    found: dict[str, float] = {}
    for text in every or ():
        job, sep, seconds = text.partition("=")
        job = job.strip()
        try:
            value = float(seconds) if sep else math.nan
        except ValueError:
            value = math.nan
        # Below a second the scheduler runs a job no faster, and every run writes to the image.
        if not sep or not settings.MIN_INTERVAL_SECONDS <= value <= settings.MAX_INTERVAL_SECONDS:
            raise ConfigurationError(
                f"--every {text!r} is not JOB=SECONDS with a number of seconds from "
                f"{settings.MIN_INTERVAL_SECONDS:g} to {settings.MAX_INTERVAL_SECONDS:.0f} "
                "(a year)",
                hint="for example --every audit=600 --every methods=300",
            )
        if job not in JOBS:
            raise ConfigurationError(
                f"--every names no heartbeat job {job!r}", hint=f"the jobs are {', '.join(JOBS)}"
            )
        found[job] = value
    return found


def _next_run(row: Planned, now: dt.datetime) -> str:
    if row.next_run is None:
        return "at start" if row.corrupt is None else "-"
    if row.from_start:  # a full interval from the start comes before the stored next run
        return f"start + {_every(row.interval.seconds)}"
    shown_at = _when(row.next_run)
    return f"{shown_at} (due)" if row.next_run <= now else shown_at


def _list(beat: Heartbeat, uri: str, as_json: bool) -> None:
    rows = beat.plan()
    now = dt.datetime.now(dt.UTC)
    if as_json:
        for row in rows:
            line = {
                "job": row.job,
                "seconds": row.interval.seconds,
                "source": row.interval.source,
                "next_run": None if row.next_run is None else row.next_run.isoformat(),
                "due_at_start": row.next_run is None or row.next_run <= now,
                "from_start": row.from_start,
                "stored_seconds": row.stored,
                "corrupt": row.corrupt,
            }
            console.print(json_text(line, "a job"), markup=False, highlight=False, soft_wrap=True)
        return
    console.print("Heartbeat jobs (local times) of the image")
    console.print(f"  {shown(shown_uri(uri))}", soft_wrap=True)  # whole on its line, to copy
    table = _narrow_table()
    for column in ("job", "every", "next run", "interval from"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(
            plain(row.job),
            _every(row.interval.seconds),
            _next_run(row, now),
            plain(row.interval.source),
        )
    console.print(table)
    notes = []
    for row in rows:
        if row.corrupt is not None:
            notes.append(f"{row.job}: skipped, its record cannot be restored ({row.corrupt})")
        elif row.stored is not None:
            kept = beat.kept(row.job).seconds
            notes.append(
                f"{row.job}: the image holds every {_every(row.stored)}; the heartbeat changes "
                f"it to every {_every(kept)} when it starts"
            )
    if any(row.next_run is None and row.corrupt is None for row in rows):
        notes.append("'at start': new to this image, run as soon as a heartbeat starts")
    if any(row.from_start for row in rows):
        notes.append(
            "'start + …': one interval after the heartbeat starts, sooner than the image's next run"
        )
    if any(row.interval.source == "--every" for row in rows):
        notes.append("--every holds for this heartbeat; the image keeps the settings' intervals")
    for note in notes:
        console.paragraph(note)


def _printer(as_json: bool):
    """Prints each job run as one line, whichever thread it ends in."""
    lock = threading.Lock()

    def say(outcome: Outcome) -> None:
        if as_json:
            line: Text | str = json_text(outcome.as_dict(), "a job's record")
        else:
            line = plain(outcome.line())
            mark = line.plain.index("✓" if outcome.ok else "✗")
            line.stylize("green" if outcome.ok else "red", mark, mark + 1)
        with lock:
            # One line per run however narrow the terminal: a log, not a paragraph.
            console.print(line, markup=False, highlight=False, soft_wrap=True)

    return say


def heartbeat(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="Run every due job once, then exit."),
    list_jobs: bool = typer.Option(
        False, "--list", help="Show what will run and when: job, interval, next run."
    ),
    every: list[str] = typer.Option(
        None,
        "--every",
        metavar="JOB=SECONDS",
        help=f"A job's interval, over its BATOS_HEARTBEAT_*_SECONDS variable; repeatable. "
        f"Jobs: {', '.join(JOBS)}.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="One JSON object per line: per job run (per job with --list)."
    ),
) -> int:
    """Run the image's upkeep — audit (ALFRED's self-audit), facets (writing the facet
    methods the image lacks), curate (memory curation), prune (checkpoint pruning), methods
    (method checks), learn (adapter retraining) — on their intervals until stopped (Ctrl-C or
    SIGTERM), printing one line per job run. Examples: batos heartbeat · batos heartbeat
    --once --json · batos heartbeat --list --every audit=600
    """
    intervals = _intervals(every)
    with open_runtime(image_uri(ctx), models=model_factory(ctx)) as runtime:
        image = runtime.image
        beat = Heartbeat(
            image, runtime.services.models, intervals=intervals, on_outcome=_printer(as_json)
        )
        if list_jobs:
            _list(beat, image.uri, as_json)
            return 0
        # With --json, stdout holds the records alone; what else is said goes to stderr.
        say = err_console if as_json else console
        if once:
            received: list[int] = []

            def terminate(signum: int, _frame: Any) -> None:
                received.append(signum)
                raise KeyboardInterrupt  # in this thread, where --once runs its jobs

            # SIGTERM stops it as Ctrl-C does, the lease given back, not the process killed
            # with the lease held until it expires.
            main_thread = threading.current_thread() is threading.main_thread()
            before = signal.signal(signal.SIGTERM, terminate) if main_thread else None
            try:
                outcomes = beat.once()
            except KeyboardInterrupt:  # the job in progress aborted its transaction
                ran = ", ".join(o.job for o in beat.outcomes)
                say.print(
                    "interrupted" + (f" after {ran}" if ran else "") + "; the jobs that did not "
                    "finish stay due and run at the next heartbeat",
                    markup=False,
                )
                return 143 if signal.SIGTERM in received else 130
            finally:
                if main_thread:  # None: a handler set outside Python, which means the default
                    signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)
            if not outcomes:
                say.print("no job was due")
            return 0 if all(o.ok for o in outcomes) else 1
        stop = threading.Event()

        def stopping(signum: int, _frame: Any) -> None:
            if not stop.is_set():  # the first: stop once the running job has finished
                stop.set()
                return
            # The second: a job can run for minutes (writing facets on a slow model). It is
            # abandoned uncommitted, left due, the lease given back; the process ends at once,
            # since the job's thread cannot be stopped from outside.
            say.print(
                "stopping now: the running job is abandoned, nothing of it committed; it runs "
                "at the next heartbeat"
            )
            # From a thread of its own, waited for a few seconds at most: this handler may
            # have interrupted the main thread inside a commit (a lease renewal), holding a
            # lock the abandoning transactions would wait for as long as the process lived.
            # Then the lease expires by itself and the job waits for its next interval.
            leaving = threading.Thread(target=beat.abandon, name="heartbeat-abandon", daemon=True)
            leaving.start()
            leaving.join(ABANDON_WAIT_S)
            os._exit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, stopping)
        say.print(
            f"heartbeat on {shown_uri(image.uri)}; Ctrl-C stops it (twice: at once)", markup=False
        )
        if not beat.forever(stop):
            say.print(
                "heartbeat stopped without being asked: it lost the lease (another heartbeat "
                "took it over, or the image was out of reach for longer than the lease) or "
                "its scheduler ended (the log says which); start it again if none is running",
                markup=False,
            )
            return LeaseHeld.exit_code
        say.print("heartbeat stopped")
    return 0


def _rows(image: Any) -> list[dict[str, Any]]:
    return audits.history(image)


def _weights(weights: dict[str, float] | None) -> str:
    if not weights:
        return "-"
    return " ".join(f"{weights.get(c, 0.0):.3f}" for c in cem.COMPONENTS)


def _narrow_table() -> Table:
    """A table of few rules and one space each side of a column divider: ten short columns
    fit in 80 characters, so a pipe or a narrow terminal gets whole cells."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1, 0, 0))


def _audits_table(rows: list[dict[str, Any]]) -> Table:
    """One row per audit, columns narrow enough for 80: the CEM, its components, the verdict
    and the mission it started."""
    table = _narrow_table()
    for column in ("id", "time", "cycles", *cem.COMPONENTS, "CEM", "verdict"):
        table.add_column(column, no_wrap=True)
    for run in _idle_runs(rows):
        r, m = run[-1], run[-1]["metrics"]
        many = len(run) > 1  # audits in a row with nothing new: one line, the last one's time
        table.add_row(
            f"{run[0]['id']}-{r['id']}" if many else str(r["id"]),
            _when(r["time"], "%m-%d %H:%M"),
            str(m["cycles"]),
            *(_num(m.get(c)) for c in (*cem.COMPONENTS, "cem")),
            plain(
                f"idle ×{len(run)}"
                if many
                else r["verdict"] + (f" → m{r['mission']}" if r.get("mission") else "")
            ),
        )
    return table


def _idle_runs(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows in runs: consecutive idle audits together, every other audit alone. An image
    nobody uses gets an idle audit an hour, which would fill the table with one line each."""
    runs: list[list[dict[str, Any]]] = []
    for r in rows:
        if r["verdict"] == "idle" and runs and runs[-1][-1]["verdict"] == "idle":
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def _weights_table(rows: list[dict[str, Any]]) -> Table:
    """The weights each audit used, a row only where they changed: they move seldom."""
    table = _narrow_table()
    for column in ("from", *cem.COMPONENTS):
        table.add_column(column, no_wrap=True)
    last = None
    for r in rows:
        weights = r["metrics"].get("weights") or {}
        shown_weights = _weights(weights)
        if shown_weights != last:
            table.add_row(f"audit {r['id']}", *(_num(weights.get(c)) for c in cem.COMPONENTS))
            last = shown_weights
    return table


def _print_missions(found: list[dict[str, Any]]) -> None:
    """Each mission as a short block: lines wrap at the terminal's width under an indent,
    never as the cells of a table."""
    console.print(Text("Self-improvement missions", style="italic"))
    for m in found:
        if m["kind"] == "retrain_adapter":
            _print_retraining(m)
            continue
        what = f"{m['persona']}.{m['selector']}" if m.get("selector") else m["persona"]
        if m["kind"] == "raise_prior" and "prior_after" in m:
            what += f" {m['prior_before']:+.2f}→{m['prior_after']:+.2f}"
        h = m["hypothesis"]
        judged = m.get("judged") or {}
        why = judged.get("why") or m.get("error") or ""
        if judged.get("error"):
            why += f" ({judged['error']})"
        console.print(plain(f"mission {m['id']} (audit {m['report']}): {m['kind']} {what}"))
        for line in (
            f"expects {h['component']} ≥ {_num(h['baseline'])}{h['gain']:+g} "
            f"after {h['cycles']} cycles",
            f"{m['status']}: {why}" if why else m["status"],
        ):
            console.paragraph(line)


def _print_retraining(m: dict[str, Any]) -> None:
    """A retraining mission: what it trained on and its own verdict on the persona's voice
    (no audit judges it, and it has no CEM hypothesis to show)."""
    ev = m.get("evaluation") or {}
    model = f" on {m['model']}" if m.get("model") else ""
    audit = f" (audit {m['report']})" if m.get("report") else ""  # 0: started before any
    console.print(plain(f"mission {m['id']}{audit}: {m['kind']} {m['persona']}{model}"))
    trained = m.get("reason") or "its lessons"
    if ev:
        trained += f"; {ev.get('examples')} examples, {ev.get('start', 'cold')} start"
    console.paragraph(f"{'training' if m['status'] == 'running' else 'trained'} on {trained}")
    judged = m.get("judged") or {}  # a kept one undone since, by hand
    said = [ev.get("why"), m.get("error"), judged.get("why"), judged.get("error")]
    shown = [str(part) for part in said if part]
    status = m["status"]
    if status == "running" and learning.process_ended(m):  # as 'batos learn' says it
        status = "ended without a word (its process is gone)"
    console.paragraph(f"{status}: {'; '.join(shown)}" if shown else status)


@audit_app.command("report")
def report(
    ctx: typer.Context,
    png: Path = typer.Option(None, "--png", help="Write a chart of the CEM over time here."),
    as_json: bool = typer.Option(False, "--json", help="Print the reports as JSON."),
    last: int = typer.Option(
        None,
        "--last",
        "-n",
        min=1,
        help="Only the last N audits, and the missions they started (default: all).",
    ),
) -> None:
    """The CEM and its components over time, one row per audit; the weights where they
    changed; the missions. Example: batos audit report -n 48 --png cem.png"""
    with open_image(image_uri(ctx)) as image:
        rows = _rows(image)
        found = missions.history(image)
    total = len(rows)
    if last is not None and total > last:
        # An image audited hourly holds thousands: the recent ones are what a reader wants.
        rows = rows[-last:]
        first = rows[0]["id"]
        found = [m for m in found if int(m.get("report") or 0) >= first]
    if as_json:
        console.print_value_json({"audits": rows, "missions": found}, "the audit reports")
    elif not rows:
        console.print("audits: none yet (the heartbeat's audit job writes them)")
    else:
        cut = f" (the last {len(rows)} of {total})" if total > len(rows) else ""
        console.print(Text(f"Audits{cut}", style="italic"))
        console.print(_audits_table(rows))
        if any(r.get("mission") for r in rows):
            console.paragraph("→ mN: the audit started mission N (see the missions below)")
        if any(r["verdict"] == "idle" for r in rows):
            console.paragraph(
                "idle: no new cycles since the audit before; nothing judged or started "
                "(idle ×N: N such audits in a row, 'id' from the first to the last)"
            )
        console.print(Text("CEM weights, from the audit where they changed", style="italic"))
        console.print(_weights_table(rows))
    if not as_json:
        if found:
            _print_missions(found)
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


#: How a mission's start is marked on the chart, by what became of it.
MISSION_MARKS = {
    "kept": ("tab:green", "mission started, kept"),
    "undone": ("tab:red", "mission started, undone"),
}
OTHER_MISSION = ("tab:gray", "mission started, open or failed")
#: Where a component's undefined (n/a) readings are drawn: under the 0 line, hollow.
UNDEFINED_Y = -0.06


def draw_chart(rows: list[dict[str, Any]], found: list[dict[str, Any]]) -> Any:
    """The matplotlib figure of ``audit report --png``: above, every component and the CEM per
    audit, n/a readings as hollow markers under the axis, dotted lines where missions started;
    below, the weights. Every line drawn has its legend entry and every entry a line."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed or used
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, (ax, wax) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=(2, 1))
    ids = [r["id"] for r in rows]
    shapes = dict(zip((*cem.COMPONENTS, "cem"), ("o", "s", "^", "D", "*"), strict=True))
    # Fixed, and apart from the missions' green, red and grey: a colour means one thing.
    colours = dict(
        zip(
            (*cem.COMPONENTS, "cem"),
            ("tab:blue", "tab:orange", "tab:purple", "tab:brown", "black"),
            strict=True,
        )
    )
    for name in (*cem.COMPONENTS, "cem"):
        values = [r["metrics"].get(name) for r in rows]
        label = "CEM" if name == "cem" else name
        undefined = [i for i, v in zip(ids, values, strict=True) if v is None]
        if undefined:
            label += f" (n/a in {len(undefined)} of {len(ids)})"
        # Drawn whatever its values: a constant component is a flat line with markers (its
        # own marker shape, so it shows where it lies on another), and one never defined
        # still gets its line, of hollow markers only.
        ax.plot(
            ids,
            [math.nan if v is None else v for v in values],
            color=colours[name],
            marker=shapes[name],
            linewidth=2.5 if name == "cem" else 1.2,
            markersize=7 if name == "cem" else 5,
            label=label if len(undefined) < len(ids) else "_nolegend_",
        )
        if undefined:
            ax.plot(
                undefined,
                [UNDEFINED_Y] * len(undefined),
                linestyle="none",
                marker=shapes[name],
                markerfacecolor="none",
                color=colours[name],
                clip_on=False,
                label=label if len(undefined) == len(ids) else "_nolegend_",
            )
    handles, _ = ax.get_legend_handles_labels()
    seen = set()
    for m in found:  # where each mission started, coloured by what became of it
        colour, label = MISSION_MARKS.get(m["status"], OTHER_MISSION)
        ax.axvline(m["report"], color=colour, linestyle=":", linewidth=1.5)
        if label not in seen:
            seen.add(label)
            handles.append(Line2D([], [], color=colour, linestyle=":", label=label))
    if any(r["metrics"].get(c) is None for r in rows for c in (*cem.COMPONENTS, "cem")):
        ax.axhline(0, color="0.8", linewidth=0.8)
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o",
                markerfacecolor="none",
                color="0.4",
                label="hollow, under 0: n/a (undefined)",
            )
        )
    ax.set_ylim(UNDEFINED_Y - 0.04, 1.05)
    ax.set_ylabel("reading (0 to 1)")
    ax.set_title("Composite Entropy Metric and its components, per audit")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    # Stacked, because the weights sum to 1: equal weights drawn as lines would lie on one
    # another and show as one; as bands each keeps its own, as thick as its weight.
    wax.stackplot(
        ids,
        [[r["metrics"]["weights"].get(name, 0.0) for r in rows] for name in cem.COMPONENTS],
        labels=cem.COMPONENTS,
        colors=[colours[name] for name in cem.COMPONENTS],
        alpha=0.6,
    )
    wax.set_ylim(0, 1)
    wax.set_ylabel("weights (stacked)")
    wax.set_xlabel("audit")
    wax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    wax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    return fig


def _chart(rows: list[dict[str, Any]], found: list[dict[str, Any]], path: Path) -> None:
    if not rows:
        raise BatosError(
            "there are no audit reports to chart",
            hint="run an audit first: batos heartbeat --once",
        )
    fig = draw_chart(rows, found)
    import matplotlib.pyplot as plt  # after draw_chart chose the Agg backend

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
    console.print(
        f"verdict: {r['verdict']}" + (f" ({r['reason']})" if r.get("reason") else ""),
        markup=False,
    )
    console.print(f"weights: {_weights(m.get('weights'))} → next {_weights(r.get('weights_next'))}")
    for number, status in (r.get("judged") or {}).items():
        console.print(f"mission {number} judged: {status}", markup=False)
    if r.get("mission"):
        console.print(f"mission {r['mission']} started (see 'batos audit report')")
    # One Text, so the terminal's wrapping counts the label: printed apart, the narrative's
    # first line ran past the width.
    console.print(Text.assemble(("ALFRED: ", "bold"), visible(r["narrative"])))


def register(app: typer.Typer) -> None:
    app.command()(heartbeat)
    app.add_typer(audit_app, name="audit")
