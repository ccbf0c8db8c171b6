"""bench/catalog.py end to end on a dozen man pages: it runs, and says what it measured.

The bench opens file images, ingests with our encoder and sentence-transformers, ranks with
bm25s and the catalog, and writes its figures; a change to how images are opened once stopped
it at its first line of work without any test noticing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "catalog.py"


@pytest.mark.slow
def test_the_ingest_part_runs_on_a_dozen_pages(tmp_path: Path) -> None:
    out = tmp_path / "catalog.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--part", "ingest", "--pages", "12"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MRR@10 (12 NAME descriptions" in done.stdout
    results = json.loads(out.read_text())
    ingest = results["ingest"]
    assert ingest["pages"] == 12
    assert ingest["median"]["chunks"] > 0 and ingest["median"]["failed"] == 0
    assert ingest["median"]["seconds"] > 0 and ingest["ratio_vs_windows"] > 0
    assert 0.0 <= ingest["quality"]["hybrid"] <= 1.0
    assert any(line.startswith(("PASS", "MISS")) for line in results["verdicts"])
