"""Load through the LangGraph server, short: four clients for a few seconds on a ZEO and on a
PostgreSQL image; no run fails, no acknowledged cycle is lost, every one is applied once.
The full comparison (1, 4 and 16 clients, minutes each) is ``bench/load.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import load


@pytest.mark.slow
def test_four_clients_through_the_server_lose_no_update(
    shared_image_uri: str, tmp_path: Path
) -> None:
    backend = shared_image_uri.split(":", 1)[0]
    run = load.run_backend(backend, [4], 8.0, tmp_path, uri=shared_image_uri)
    (step,) = run.steps
    assert step.failed == 0 and step.cycles >= 4
    assert run.acknowledged == step.cycles + 1  # the warm-up run too
    assert run.lost == 0 and run.disagreements == []
    assert len(step.latencies) == step.cycles and step.percentile(95) >= step.percentile(50)
