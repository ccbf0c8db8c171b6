"""UvmObject against plain Python, and FileStorage commits against SQLite, side by side.

Prints one table with nanoseconds per operation and the ratio to the plain-Python baseline;
writes the same numbers to bench/results/uvm.json. Targets from the issue: local slot read
within 5x, depth-3 delegated read within 10x of a plain attribute read. The cold rows (a read
right after a slot write elsewhere, which empties the lookup caches) have no target.

    python bench/uvm.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

import transaction
from persistent.mapping import PersistentMapping
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prototypes.uvm import Method, UvmObject  # noqa: E402
from store.image import LivingImage  # noqa: E402


class Plain:
    def __init__(self) -> None:
        self.x = 1

    def m(self) -> int:
        return self.x


class D1(Plain):
    pass


class D2(D1):
    pass


class D3(D2):
    pass


def ns_per_op(stmt: str, env: dict, number: int) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=5)) / number * 1e9


Row = tuple[str, float, float, str]


def lookups(number: int) -> list[Row]:
    plain, deep_plain = Plain(), D3()
    a = UvmObject(x=1)
    a.m = Method("m", "def m(self):\n    return self.x\n")
    d = UvmObject(UvmObject(UvmObject(a)))
    elsewhere = UvmObject(y=0)
    env = {"plain": plain, "deep_plain": deep_plain, "a": a, "d": d, "elsewhere": elsewhere}
    base_read = ns_per_op("plain.x", env, number)
    base_call = ns_per_op("plain.m()", env, number)
    # A slot write anywhere empties every lookup cache; what a read costs right after one is
    # the write and the read together, less the write alone.
    write = ns_per_op("elsewhere.y = 1", env, number)
    cold_read = ns_per_op("elsewhere.y = 1; d.x", env, number) - write
    cold_send = ns_per_op("elsewhere.y = 1; d.m()", env, number) - write
    return [
        ("plain attribute read", base_read, base_read, ""),
        ("UvmObject local slot read", ns_per_op("a.x", env, number), base_read, "5x"),
        ("UvmObject depth-3 delegated read", ns_per_op("d.x", env, number), base_read, "10x"),
        ("UvmObject depth-3 read, cold (after a write elsewhere)", cold_read, base_read, ""),
        ("plain method call", base_call, base_call, ""),
        ("plain depth-3 inherited call", ns_per_op("deep_plain.m()", env, number), base_call, ""),
        ("UvmObject local method send", ns_per_op("a.m()", env, number), base_call, ""),
        ("UvmObject depth-3 method send", ns_per_op("d.m()", env, number), base_call, ""),
        ("UvmObject depth-3 send, cold (after a write elsewhere)", cold_send, base_call, ""),
        ("UvmObject slot write", write, base_read, ""),
    ]


def commits(count: int) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        image = LivingImage.open(f"file://{tmp}/bench.fs")
        image.transact(lambda root: root.__setitem__("c", PersistentMapping(n=0)))
        fs = []
        with image.connection() as conn:
            tm = conn.transaction_manager
            counter = conn.root()["c"]
            for _ in range(count):
                start = time.perf_counter()
                tm.begin()
                counter["n"] += 1
                tm.commit()
                fs.append(time.perf_counter() - start)
        image.close()

        db = sqlite3.connect(f"{tmp}/bench.sqlite", isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE c (k TEXT PRIMARY KEY, n INTEGER)")
        db.execute("INSERT INTO c VALUES ('n', 0)")
        sq = []
        for _ in range(count):
            start = time.perf_counter()
            db.execute("BEGIN")
            db.execute("UPDATE c SET n = n + 1 WHERE k = 'n'")
            db.execute("COMMIT")
            sq.append(time.perf_counter() - start)
        db.close()
    assert transaction.manager is not None
    sqlite_us = statistics.median(sq) * 1e9
    return [
        ("SQLite WAL commit (1 row, sync=FULL), median", sqlite_us, sqlite_us, ""),
        ("FileStorage commit (1 object), median", statistics.median(fs) * 1e9, sqlite_us, ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    number = 20_000 if args.quick else 300_000
    rows = lookups(number) + commits(50 if args.quick else 500)

    table = Table(title="UvmObject vs plain Python; FileStorage vs SQLite")
    table.add_column("operation")
    table.add_column("ns/op", justify="right")
    table.add_column("ratio to baseline", justify="right")
    table.add_column("target", justify="right")
    for name, value, base, target in rows:
        table.add_row(name, f"{value:,.0f}", f"{value / base:.2f}x", target and f"≤ {target}")
    Console().print(table)
    results = {
        name: {"ns_per_op": value, "ratio": value / base, "target": target or None}
        for name, value, base, target in rows
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "uvm.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
