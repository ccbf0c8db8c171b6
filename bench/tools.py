"""Tool methods written by the configured model for real services on loopback, end to end.

Four small JSON services run on 127.0.0.1 (``SERVICES``); each is declared as a user would,
``batos tools add NAME --about '…'`` with its URL and the shape of its answer
(``bench/data/tools/services.json``), and each task of ``bench/data/tools/tasks.jsonl`` sends
``batos send tools.NAME SELECTOR ARGS --json`` to a fresh image, the way a user does: the
kernel writes the method (drafts, guardian, trial, trust gate), installs it and calls it
through the host's client. A task is *right* when the call answers the expected value (a
number within 1e-6). Prints per task whether a method was installed, whether its answer was
right, the seconds and the first line of any error; then installed, right and precision
(right of installed) with 95% Wilson intervals, and writes
``bench/results/tools-<model>-<timestamp>.json``.

    BATOS_MODEL=test .venv/bin/python bench/tools.py --limit 2   # to see it work
    .venv/bin/python bench/tools.py                              # the default model
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from batos.training.voice import wilson  # noqa: E402 (the repository is on the path first)

DATA = ROOT / "bench" / "data" / "tools"
RESULTS = ROOT / "bench" / "results"
BATOS = Path(sys.executable).with_name("batos")

WEATHER = {"oslo": (4.5, 12), "cairo": (24.5, 19), "lisbon": (17.0, 8)}
BOOKS = {
    "9780141439518": ("Pride and Prejudice", ["Jane Austen"], 480),
    "9780262033848": (
        "Introduction to Algorithms",
        ["Thomas H. Cormen", "Charles E. Leiserson", "Ronald L. Rivest"],
        1312,
    ),
}
RATES = {"EUR": {"USD": 1.08, "GBP": 0.85, "JPY": 161.2}, "USD": {"EUR": 0.93, "GBP": 0.79}}
TODOS = {
    "7": [
        {"id": 1, "title": "water the plants", "done": False},
        {"id": 2, "title": "buy milk", "done": True},
        {"id": 3, "title": "call the bank", "done": False},
    ]
}


def answer(path: str, query: dict[str, list[str]]) -> Any:
    """The services' answers: JSON data, or None for 404."""
    parts = [p for p in path.split("/") if p]
    if parts == ["v1", "current"]:
        found = WEATHER.get((query.get("city") or [""])[0].lower())
        if found:
            city = query["city"][0]
            return {"city": city, "current": {"temperature_c": found[0], "wind_kmh": found[1]}}
    if len(parts) == 2 and parts[0] == "books" and parts[1] in BOOKS:
        title, authors, pages = BOOKS[parts[1]]
        return {
            "isbn": parts[1],
            "title": title,
            "authors": [{"name": a} for a in authors],
            "pages": pages,
        }
    if parts == ["rates"]:
        base = (query.get("base") or [""])[0].upper()
        if base in RATES:
            return {"base": base, "rates": RATES[base]}
    if len(parts) == 3 and parts[0] == "users" and parts[2] == "todos" and parts[1] in TODOS:
        return TODOS[parts[1]]
    return None


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlparse(self.path)
        data = answer(url.path, parse_qs(url.query))
        body = json.dumps(data if data is not None else {"error": "not found"}).encode()
        self.send_response(200 if data is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def same(got: Any, expected: Any) -> bool:
    if isinstance(expected, int | float) and not isinstance(expected, bool):
        try:
            return math.isclose(float(got), float(expected), abs_tol=1e-6)
        except (TypeError, ValueError):
            return False
    return bool(got == expected)


def batos(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BATOS), *args], env=env, capture_output=True, text=True, timeout=900, check=False
    )


def first_error(text: str) -> str:
    """The error a command printed, on one line, from its ``Error`` line on (library warnings
    before it left out), bounded."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lower().startswith("error")), 0)
    return re.sub(r"\s+", " ", " ".join(lines[start:]))[:600]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="the first N tasks")
    parser.add_argument(
        "--set",
        default="tasks",
        help="the task file in bench/data/tools/ without .jsonl: 'tasks' (the set the prompts "
        "were worked out on) or a fresh one written before its first run ('fresh1')",
    )
    args = parser.parse_args()
    source = DATA / f"{args.set}.jsonl"
    if not source.is_file():
        raise SystemExit(f"no task set {source.name} in {DATA}")
    tasks = [json.loads(line) for line in source.read_text().splitlines()]
    tasks = tasks[: args.limit] if args.limit else tasks
    about = json.loads((DATA / "services.json").read_text())
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    model = os.environ.get("BATOS_MODEL", "default")
    rows = []
    with tempfile.TemporaryDirectory(prefix="batos-bench-tools-") as folder:
        env = {
            **os.environ,
            "BATOS_IMAGE": f"file://{folder}/tools.fs",
            "BATOS_TOOLS_ALLOW": base,
            "BATOS_HOME": folder,
        }
        done = batos(env, "init")
        if done.returncode:
            raise SystemExit(f"batos init failed: {first_error(done.stderr)}")
        for name in sorted({t["tool"] for t in tasks}):
            done = batos(env, "tools", "add", name, "--about", about[name].format(base=base))
            if done.returncode:
                raise SystemExit(f"batos tools add {name} failed: {first_error(done.stderr)}")
        for task in tasks:
            started = time.monotonic()
            sent = [json.dumps(a) for a in task["args"]]
            done = batos(env, "send", f"tools.{task['tool']}", task["selector"], *sent, "--json")
            seconds = time.monotonic() - started
            got: Any = None
            installed = done.returncode == 0
            if installed:
                try:
                    got = json.loads(done.stdout)
                except ValueError:
                    got = done.stdout.strip()[-200:]
            row = {
                "id": task["id"],
                "installed": installed,
                "right": installed and same(got, task["expected"]),
                "got": got,
                "expected": task["expected"],
                "seconds": round(seconds, 1),
                "error": "" if installed else first_error(done.stderr or done.stdout),
            }
            rows.append(row)
            mark = "right" if row["right"] else ("WRONG" if installed else "refused")
            print(f"{task['id']:<14}{mark:>8}{seconds:>7.0f} s  {row['error'] or got!r}"[:400])
    server.shutdown()
    n, installed = len(rows), sum(r["installed"] for r in rows)
    right = sum(r["right"] for r in rows)
    low, high = wilson(installed, n)
    print(f"\n{model}: {n} tasks; installed {installed} ({low:.2f}–{high:.2f})", end="")
    low, high = wilson(right, n)
    print(f", right {right} ({low:.2f}–{high:.2f})", end="")
    if installed:
        low, high = wilson(right, installed)
        print(f", precision {right / installed:.2f} ({low:.2f}–{high:.2f})", end="")
    print(f"; {sum(r['seconds'] for r in rows) / max(n, 1):.0f} s a task")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"tools-{model}-{args.set}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"model": model, "set": args.set, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
