"""bench/plans.py's measures, without a model."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import plans


def test_raw_steps_are_read_as_written_and_junk_gives_none() -> None:
    reply = '{"steps": [{"facet": "BRICK.facet_steps", "query": "a\\nb"}, 3]}'
    assert plans.raw_steps(reply) == [{"facet": "BRICK.facet_steps", "query": "a\nb"}]
    assert plans.raw_steps("not json") == [] and plans.raw_steps('{"steps": 3}') == []


def test_rates_are_over_steps_of_the_plans_that_have_them() -> None:
    rows = [
        {"raw": {"steps": 3, "duplicates": 1, "off_request": 2}},
        {"raw": {"steps": 1, "duplicates": 0, "off_request": 0}},
        {"raw": None},
    ]
    assert plans.rates(rows, "raw") == {
        "plans": 2,
        "steps": 4,
        "duplicate_share": 0.25,
        "off_request_share": 0.5,
    }
