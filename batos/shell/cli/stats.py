"""``batos stats``: the counters of every process on this machine, added up, or exported."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from batos.shell.cli.app import console
from batos.shell.cli.terminal import shown


def stats(
    as_json: bool = typer.Option(False, "--json", help="The totals as JSON."),
    prometheus: bool = typer.Option(
        False, "--prometheus", help="Prometheus text exposition format, for a scrape or a file."
    ),
) -> None:
    """Transactions committed, aborted, conflicting and retried; guardian verdicts; model
    calls and their latency — added up over every process that used BAT OS here.

    Examples: batos stats · batos stats --prometheus > /var/lib/node_exporter/batos.prom
    """
    from batos.metrics import BUCKETS_S
    from store.core.stats import prometheus_text, stats_dir, totals

    snapshot = totals()
    if prometheus:
        console.out(prometheus_text(snapshot), end="", highlight=False)
        return
    if as_json:
        console.out(json.dumps(snapshot), highlight=False)
        return
    table = Table(title=f"BAT OS counters ({stats_dir()})")
    for column in ("metric", "labels", "value"):
        table.add_column(column)
    for name, labels, value in snapshot["counters"]:
        table.add_row(shown(name), _labels(labels), f"{value:,.0f}")
    for name, labels, row in snapshot["timings"]:
        count, total = row[0], row[1]
        p95 = _quantile(row[2:], count, 0.95, BUCKETS_S)
        mean = total / count if count else 0.0
        summary = f"{count:,.0f} calls, mean {mean:.3f} s, p95 ≤ {p95}"
        table.add_row(shown(name), _labels(labels), summary)
    if not snapshot["counters"] and not snapshot["timings"]:
        console.print("nothing counted yet")
        return
    console.print(table)


def _labels(labels: dict[str, str]) -> str:
    return shown(", ".join(f"{k}={v}" for k, v in labels.items()))


def _quantile(buckets: list[float], count: float, q: float, bounds: tuple[float, ...]) -> str:
    """The bucket bound under which a ``q`` share of the timings fall (what a histogram
    can say; the exact value is not kept)."""
    seen = 0.0
    for bound, hits in zip((*bounds, float("inf")), buckets, strict=True):
        seen += hits
        if count and seen >= q * count:
            return "+Inf" if bound == float("inf") else f"{bound:g} s"
    return "n/a"


def register(app: typer.Typer) -> None:
    app.command("stats")(stats)
