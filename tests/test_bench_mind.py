"""bench/mind.py's request set on scripted models: what each cycle records and the summary.

Three requests through the real mind graph on a file image with a one-document corpus: a
greeting (fast path), a plan (full: a plan with a near-duplicate step and a step off the
request, its facets not written yet) and a README example that forces its persona and depth
and whose answering model fails (FAILED). Checked: the rows, the COMPLETE rate and its interval, the
failed list, the percentiles, the plan counts, the levers and the printed table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fakes import FakeEmbedder, FakeModels, FakeRouter, ModelCall, call_kind

from batos.errors import ModelError
from bench import mind as bench_mind
from graph.mind import MindServices

SELECTOR_LINE = "Write the method `"
PLAN = json.dumps(
    {
        "steps": [
            {"facet": "BRICK.facet_steps", "query": "which steps build a garden shed"},
            {"facet": "BRICK.facet_design", "query": "which steps build the garden shed"},
            {"facet": "BRICK.facet_design", "query": "weather in Paris tomorrow"},
        ]
    }
)
REQUESTS = [
    {"id": "r-hello", "family": "greeting", "text": "hello there"},
    {"id": "r-plan", "family": "plan", "text": "plan the steps to build a garden shed"},
    {
        "id": "r-readme",
        "family": "feeling",
        "text": "cheer me up",
        "origin": "README, an example",
        "persona": "robin",
        "depth": "fast",
    },
]


def respond(call: ModelCall) -> str | Exception:
    kind = call_kind(call)
    if kind == "plan":
        return PLAN
    if kind == "draft":
        selector = call.text.split(SELECTOR_LINE, 1)[1].split("`", 1)[0]
        return (
            f"```python\ndef {selector}(self, query):\n"
            f"    return {{'instruction': 'Work on this: ' + query, 'temperature': 0.2}}\n```"
        )
    if kind == "facet":
        return "Notes on building a garden shed: measure, frame, roof."
    text = "\n".join(str(m.content) for m in call.messages)
    if "cheer me up" in text:
        return ModelError("the engine died", hint="start it again")
    if "garden shed" in text:
        return "To build a garden shed: plan the steps, measure, frame and roof it."
    return "Hello there, hello to you too!"


@pytest.fixture
def request_set(tmp_path: Path) -> tuple[Path, Path]:
    corpus = tmp_path / "docs"
    corpus.mkdir()
    # nothing on sheds: a request about the catalog would be answered from it, not planned
    (corpus / "coop.txt").write_text("The Wrenfield co-op has 412 members and a shop.")
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    return path, corpus


def test_the_request_set_records_each_cycle_and_summarises_them(request_set, capsys) -> None:
    path, corpus = request_set
    models = FakeModels(respond)
    services = MindServices(models=models, router=FakeRouter(("BRICK",)), embedder=FakeEmbedder())
    report = bench_mind.run_requests(
        path, corpus, services=services, facets="unwritten", progress=lambda line: None
    )
    report.update(levers={"prefix_cache": "off"})

    assert report["ingest"]["files"] == 1
    rows = {row["id"]: row for row in report["rows"]}
    assert list(rows) == ["r-hello", "r-plan", "r-readme"]
    hello, plan, readme = rows.values()
    assert (hello["status"], hello["depth"], hello["model_calls"]) == ("COMPLETE", "fast", 1)
    assert hello["path"] == "fast" and plan["path"] == "full"
    assert hello["first_answer_token_s"] is not None
    assert hello["first_answer_token_s"] <= hello["seconds"]
    assert [node for node, _ in hello["nodes"]] == ["route", "synthesize", "gate", "complete"]
    assert plan["status"] == "COMPLETE" and plan["depth"] == "full"
    # the near-duplicate step is dropped from the final plan; the quality is the mind's record
    assert [step["query"] for step in plan["plan"]] == [
        "which steps build a garden shed",
        "weather in Paris tomorrow",
    ]
    assert plan["plan_quality"]["raw"] == {"steps": 3, "duplicates": 1, "off_request": 1}
    assert plan["plan_quality"]["final"] == {"steps": 2, "duplicates": 0, "off_request": 1}
    assert {d["what"] for d in plan["degraded"]} == {"BRICK.facet_steps", "BRICK.facet_design"}
    assert readme["context"] == {"persona": "robin", "depth": "fast"}
    assert readme["status"] == "FAILED" and readme["failure"]["node"] == "synthesize"

    summary = report["summary"]
    assert (summary["n"], summary["complete"]) == (3, 2)
    assert summary["complete_interval"] == pytest.approx((0.2077, 0.9385), abs=1e-4)
    assert [f["id"] for f in summary["failed"]] == ["r-readme"]
    assert summary["readme_complete"] == (0, 1)
    seconds = summary["seconds"]
    assert seconds["fast"]["n"] == 1 and seconds["fast"]["p50"] == hello["seconds"]
    assert seconds["full"]["n"] == 1 and seconds["full_no_facet_written"]["n"] == 1
    assert seconds["first_token_full"]["n"] == 1
    assert summary["plan_quality"] == {
        "raw": {"plans": 1, "steps": 3, "duplicate_rate": 1 / 3, "off_request_rate": 1 / 3},
        "final": {"plans": 1, "steps": 2, "duplicate_rate": 0.0, "off_request_rate": 0.5},
    }
    assert summary["degradations"] == {
        "facet: BRICK.facet_steps": 1,
        "facet: BRICK.facet_design": 1,
    }
    assert summary["truncated"] == (0, 3) and summary["degradation_unknown"] == 0
    assert summary["depth_rules"] == {
        "fast: 1 persona, 2 words <= 12, no planning cue": 1,
        "full: planning cue 'plan'": 1,
        "fast: depth 'fast' asked for by the caller": 1,
    }

    print(bench_mind.requests_table(report))
    flat = " ".join(capsys.readouterr().out.split())
    assert "levers: prefix_cache=off" in flat
    assert "facet methods: none written (--facets unwritten)" in flat
    assert "COMPLETE 2/3 = 0.67 [0.21, 0.94] target >= 0.98 MISS" in flat
    assert "FAILED r-readme at synthesize: the engine died" in flat
    assert "raw 1 3 0.33 0.33" in flat and "final 1 2 0.00 0.50" in flat
    assert "truncated answers: 0/3" in flat
    assert "README examples COMPLETE: 0/1 MISS" in flat
    assert f"fast path 1 {hello['seconds']:.1f} {hello['seconds']:.1f} <= 3" in flat
    assert summary["cached_tokens"] == 0 and "of them cached: 0" in flat
    # a cycle whose metrics do not say what was cached: unknown, not zero
    rows = [{**row, "cached_tokens": None} for row in report["rows"]]
    assert bench_mind.summarise_requests(rows)["cached_tokens"] is None


def test_levers_set_the_environment_and_unknown_ones_are_refused(monkeypatch) -> None:
    monkeypatch.setenv("BATOS_LLM_PREFIX_CACHE_MB", "64")
    applied = bench_mind.apply_levers(bench_mind.parse_levers(["prefix_cache=off"]))
    assert applied == {"BATOS_LLM_PREFIX_CACHE_MB": "0"}
    assert os.environ["BATOS_LLM_PREFIX_CACHE_MB"] == "0"
    bench_mind.apply_levers(bench_mind.parse_levers(["prefix_cache=on"]))
    assert "BATOS_LLM_PREFIX_CACHE_MB" not in os.environ  # the default applies
    for wrong in ("warp=on", "prefix_cache=maybe", "prefix_cache"):
        with pytest.raises(SystemExit, match="unknown lever"):
            bench_mind.parse_levers([wrong])


def test_the_fast_path_is_a_cycle_whose_one_call_wrote_the_answer() -> None:
    assert bench_mind.path_of([{"node": "synthesize"}]) == "fast"
    assert bench_mind.path_of([{"node": "synthesize"}, {"node": "synthesize"}]) == "fast"
    # depth 'fast' after a one-step plan, or a computation's program: not the fast path
    assert bench_mind.path_of([{"node": "decompose"}, {"node": "synthesize"}]) == "full"
    assert bench_mind.path_of([{"node": "facet"}, {"node": "synthesize"}]) == "full"
    rows = [
        {**row, "status": "COMPLETE", "path": path, "seconds": seconds}
        for row, path, seconds in (
            (ROW, "fast", 1.0),
            (ROW | {"depth": "fast", "depth_rule": "the plan has one step"}, "full", 9.0),
        )
    ]
    seconds = bench_mind.summarise_requests(rows)["seconds"]
    assert (seconds["fast"]["n"], seconds["fast"]["p50"]) == (1, 1.0)
    assert (seconds["full"]["n"], seconds["full"]["p50"]) == (1, 9.0)


#: A cycle's row as ``run_request`` writes it, the fields the summary reads.
ROW = {
    "id": "r",
    "depth": "fast",
    "depth_rule": "1 persona",
    "first_answer_token_s": 0.5,
    "wrote_facets": 0,
    "plan_quality": None,
    "degraded": [],
    "truncated": False,
    "model_calls": 1,
    "cached_tokens": 0,
    "input_tokens": 10,
}
