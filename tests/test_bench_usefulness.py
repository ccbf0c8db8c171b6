"""bench/usefulness.py end to end on a scripted world: two documents, two questions per family.

The three systems run on scripted models (the mind on the tests' fakes, through ``ask`` on a
real file image with the documents ingested), so what is checked is the harness: the judgement
of each reply, the Wilson interval, the turn order, the printed table, the JSON, and that a
system raising on one question is one wrong answer with its error, not an aborted run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeEmbedder, FakeModels, FakeRouter, ModelCall, call_kind
from test_mind import SELECTOR, facet_source

from batos.errors import ModelError
from bench import usefulness
from graph import facet_writing
from graph.mind import MindServices
from graph.request import content_text

DOCS = {
    "greyhaven.txt": "The Greyhaven lighthouse stands on the point. It is 31 metres tall and was "
    "first lit in 1862 by the harbour board.",
    "coop.md": "# The Wrenfield co-op\n\nThe Wrenfield co-op has 412 members. Its shop on the "
    "quay opens at seven in the morning.",
}
ITEMS = {
    "doc_questions.jsonl": [
        {
            "id": "t-doc-1",
            "family": "document",
            "question": "How tall is the Greyhaven lighthouse in metres?",
            "answer": "31",
            "accept": [],
            "kind": "number",
            "tolerance": {"absolute": 0},
            "source": "greyhaven.txt",
        },
        {
            "id": "t-doc-2",
            "family": "document",
            "question": "How many members does the Wrenfield co-op have?",
            "answer": "412",
            "accept": [],
            "kind": "number",
            "tolerance": {"absolute": 0},
            "source": "coop.md",
        },
    ],
    "computations.jsonl": [
        {
            "id": "t-comp-1",
            "family": "computation",
            "question": "A box holds 12 eggs. How many eggs are in 7 boxes?",
            "answer": "84",
            "accept": [],
            "kind": "number",
            "tolerance": {"absolute": 0},
        },
        {
            "id": "t-comp-2",
            "family": "computation",
            "question": "What is 15% of 240?",
            "answer": "36",
            "accept": [],
            "kind": "number",
            "tolerance": {"absolute": 0},
        },
    ],
    "recall.jsonl": [
        {
            "id": "t-rec-1",
            "family": "recall",
            "turns": ["My locker code is 4471, please remember it.", "What is a good warm-up?"],
            "question": "What is my locker code?",
            "answer": "4471",
            "accept": [],
            "kind": "string",
        },
        {
            "id": "t-rec-2",
            "family": "recall",
            "turns": ["My sister's birthday is on 12 October."],
            "question": "When is my sister's birthday?",
            "answer": "12 October",
            "accept": ["October 12"],
            "kind": "string",
        },
    ],
}

#: Each system's scripted reply per question: right, wrong, a raise, or a refusal that names
#: the answer (the mind's gate asks again, the model is gone: the cycle ends FAILED).
REFUSAL = "I'm sorry, but I cannot help with 12 October birthday."
MIND = {
    "How tall is the Greyhaven lighthouse in metres?": "The lighthouse is 31 metres tall [1].",
    "How many members does the Wrenfield co-op have?": "The co-op has 412 members [1].",
    "A box holds 12 eggs. How many eggs are in 7 boxes?": "7 boxes of 12 eggs: 84 eggs.",
    "What is 15% of 240?": "15% of 240 is 36.",
    "What is my locker code?": "Your locker code is 4471.",
    "When is my sister's birthday?": REFUSAL,
}
BARE = {
    "How tall is the Greyhaven lighthouse in metres?": "The lighthouse is about 40 metres tall.",
    "How many members does the Wrenfield co-op have?": "The co-op has 350 members.",
    "A box holds 12 eggs. How many eggs are in 7 boxes?": "7 boxes of 12 eggs make 84 eggs.",
    "What is 15% of 240?": "15% of 240 is 30.",
}
RAG = {
    "How many members does the Wrenfield co-op have?": "The co-op has 400 members [1].",
    "A box holds 12 eggs. How many eggs are in 7 boxes?": "The answer is 84 eggs.",
    "What is 15% of 240?": RuntimeError("the engine died"),
}


def _texts(call: ModelCall) -> list[str]:
    return [content_text(m.content) for m in call.messages]


def baseline(call: ModelCall) -> Any:
    """The bare model and the RAG: the RAG's prompt has passages, the bare one's has not."""
    texts = _texts(call)
    last = texts[-1]
    if call.persona != "BABS" or call.options not in ({}, {"temperature": 0.0}):
        raise AssertionError(f"the baselines call chat_model('BABS') alone, not {call}")
    if last == "Say hello.":
        return "Hello."
    if last.startswith(("My ", "What is a good")):  # a recall item's earlier turns
        return "Noted."
    rag = last.startswith("Answer the question using these passages:")
    question = last.rsplit("Question: ", 1)[-1] if rag else last
    if question == "How tall is the Greyhaven lighthouse in metres?" and rag:
        # right only when the passage that holds the answer reached the prompt; its citation
        # names no passage it was given, so the answer is right with no source cited
        return "It is 31 metres tall [9]." if "31 metres tall" in last else "I cannot tell."
    if question in ("What is my locker code?", "When is my sister's birthday?"):
        history = "\n".join(texts[:-1])
        assert "Noted." in history, "the earlier turns come with the bare model's replies"
        if question == "What is my locker code?" and "4471" in history:
            return "Your locker code is 4471."
        return "I do not know."
    return (RAG if rag else BARE)[question]


def mind_reply(call: ModelCall) -> Any:
    """The mind's model: the scripted answer to the latest question its prompt holds; asked
    again after the refusal, it is gone (the cycle FAILED, the refusal left as its response)."""
    if call_kind(call) == "draft":  # the facet methods, written ahead of the questions
        return "```python\n" + facet_source(SELECTOR.search(call.text).group(1)) + "```"
    if any(text == REFUSAL for text in _texts(call)):
        return ModelError("the engine died", hint="start it again")
    for text in reversed(_texts(call)):
        for question, reply in MIND.items():
            if question in text:
                return reply
    return f"Noted: {_texts(call)[-1]}"


@pytest.fixture
def world(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "dev" / "docs").mkdir(parents=True)
    for name, text in DOCS.items():
        (data / "dev" / "docs" / name).write_text(text, encoding="utf-8")
    for name, items in ITEMS.items():
        lines = "".join(json.dumps(item) + "\n" for item in items)
        (data / "dev" / name).write_text(lines, encoding="utf-8")
    return data


def test_the_harness_judges_times_prints_and_writes_every_answer(world, tmp_path, capsys):
    results = tmp_path / "results"
    baselines, mind_models = FakeModels(baseline), FakeModels(mind_reply)
    services = MindServices(
        models=mind_models, router=FakeRouter(("BABS",)), embedder=FakeEmbedder()
    )
    report, path = usefulness.run(
        models=baselines,
        services=services,
        data=world,
        results=results,
        model_name="scripted",
        progress=lambda line: None,
    )

    assert path.parent == results and path.name.startswith("usefulness-dev-scripted-")
    written = json.loads(path.read_text())
    assert written["summary"] == json.loads(json.dumps(report["summary"]))
    assert written["ingest"]["files"] == 2 and written["ingest"]["chunks"] >= 2
    prepared = written["facets"]
    assert prepared["state"] == "prepared"
    assert [f["key"] for f in prepared["facets"] if f["ok"]] == [
        f"{persona}.{selector}" for persona, selector in facet_writing.codex_facets()
    ]
    assert [r["id"] for r in written["items"]] == [
        "t-doc-1",
        "t-doc-2",
        "t-comp-1",
        "t-comp-2",
        "t-rec-1",
        "t-rec-2",
    ]
    # systems take turns going first, question by question
    assert [list(r["systems"]) for r in written["items"][:3]] == [
        ["mind", "bare", "rag"],
        ["bare", "rag", "mind"],
        ["rag", "mind", "bare"],
    ]
    verdicts = {
        (r["id"], system): answer["matched"]
        for r in written["items"]
        for system, answer in r["systems"].items()
    }
    assert verdicts == {
        ("t-doc-1", "mind"): True,
        ("t-doc-1", "bare"): False,
        ("t-doc-1", "rag"): True,
        ("t-doc-2", "mind"): True,
        ("t-doc-2", "bare"): False,
        ("t-doc-2", "rag"): False,
        ("t-comp-1", "mind"): True,
        ("t-comp-1", "bare"): True,
        ("t-comp-1", "rag"): True,
        ("t-comp-2", "mind"): True,
        ("t-comp-2", "bare"): False,
        ("t-comp-2", "rag"): False,
        ("t-rec-1", "mind"): True,
        ("t-rec-1", "bare"): True,
        ("t-rec-1", "rag"): True,
        ("t-rec-2", "mind"): False,
        ("t-rec-2", "bare"): False,
        ("t-rec-2", "rag"): False,
    }
    answers = {r["id"]: r["systems"] for r in written["items"]}
    # the RAG's raise is one wrong answer carrying its error; the run went on
    raised = answers["t-comp-2"]["rag"]
    assert raised["error"] == "RuntimeError: the engine died"
    assert raised["reason"] == "error: RuntimeError: the engine died" and raised["reply"] == ""
    # a FAILED cycle is wrong although its response names the answer
    failed = answers["t-rec-2"]["mind"]
    assert failed["status"] == "FAILED" and "12 October" in failed["reply"]
    assert failed["reason"] == "the cycle ended FAILED: the engine died"
    assert answers["t-comp-2"]["bare"]["reason"] == "stated 30 (all the reply names), not 36"
    assert answers["t-doc-1"]["rag"]["source_retrieved"] is True
    assert answers["t-doc-1"]["mind"]["cited"] and not answers["t-comp-1"]["mind"]["cited"]
    assert [Path(c).name.split(":")[0] for c in answers["t-doc-1"]["mind"]["cited_passages"]] == [
        "greyhaven.txt"
    ]
    assert "\n\nSources: [1] " in answers["t-doc-1"]["mind"]["reply"]
    rec = answers["t-rec-1"]
    assert [t["status"] for t in rec["mind"]["turns"]] == ["COMPLETE", "COMPLETE"]
    assert all(rec[s]["setup_seconds"] >= 0 for s in usefulness.SYSTEMS)
    assert rec["mind"]["depth"] == "fast" and rec["mind"]["model_calls"] == 1
    # the bare conversation was made once and shared by bare and rag: 2 turns + 2 questions
    recall_calls = [c for c in baselines.calls if "locker" in "".join(_texts(c))]
    assert len(recall_calls) == 4

    summary = report["summary"]
    assert summary["document"]["mind"] | {"interval": None, "mean_s": 0, "median_s": 0} == {
        "n": 2,
        "hits": 2,
        "accuracy": 1.0,
        "interval": None,
        "mean_s": 0,
        "median_s": 0,
        "errors": 0,
        "complete": 2,
        "cited": 2,
        "right_cited_source": 2,
    }
    assert answers["t-doc-1"]["rag"]["cited_source"] is False
    assert summary["document"]["rag"]["right_cited_source"] == 0
    assert "right_cited_source" not in summary["computation"]["mind"]  # no sources there
    assert summary["computation"]["rag"]["errors"] == 1
    assert summary["recall"]["mind"]["complete"] == 1
    assert summary["document"]["rag"]["interval"] == pytest.approx((0.0945, 0.9055), abs=1e-4)
    assert [(c["family"], c["what"], c["value"], c["passed"]) for c in report["comparisons"]] == [
        ("document", "mind - rag", 0.5, True),
        ("document", "mind", 1.0, True),
        ("computation", "mind - bare", 0.5, True),
        ("recall", "mind", 0.5, False),
    ]

    print(usefulness.table(report))
    printed = capsys.readouterr().out
    assert f"facet methods: {len(prepared['facets'])}/{len(prepared['facets'])} written" in printed
    rows = [line.split() for line in printed.splitlines()]
    document = rows.index(["document"])
    assert rows[document + 1][:4] == ["system", "n", "accuracy", "95%"]
    mind_row, bare_row, rag_row = rows[document + 2 : document + 5]
    assert mind_row[:5] == ["mind", "2", "1.00", "[0.34,", "1.00]"]
    assert mind_row[-4:] == ["0", "2/2", "2/2", "2/2"]
    assert bare_row[:5] == ["bare", "2", "0.00", "[0.00,", "0.66]"]
    assert rag_row[:5] == ["rag", "2", "0.50", "[0.09,", "0.91]"] and rag_row[-4:] == [
        "0",
        "-",
        "-",
        "0/1",
    ]
    computation = rows.index(["computation"])
    assert rows[computation + 4][0] == "rag" and rows[computation + 4][-4:] == [
        "1",
        "-",
        "-",
        "-",
    ]
    flat = " ".join(printed.split())
    assert "document: mind - rag +0.50 >= +0.10 PASS" in flat
    assert "computation: mind - bare +0.50 >= +0.25 PASS" in flat
    assert "recall: mind 0.50 >= 0.90 MISS" in flat
    assert "document: 1 right for mind alone, 0 for rag alone" in flat


def test_wilson_interval_and_turn_order() -> None:
    assert usefulness.wilson(1, 2) == pytest.approx((0.0945, 0.9055), abs=1e-4)
    assert usefulness.wilson(0, 10)[0] == 0.0 and usefulness.wilson(10, 10)[1] == 1.0
    assert usefulness.wilson(0, 0) is None
    orders = [usefulness.rotated(usefulness.SYSTEMS, i) for i in range(6)]
    assert [order[0] for order in orders] == ["mind", "bare", "rag"] * 2
    assert all(sorted(order) == sorted(usefulness.SYSTEMS) for order in orders)


def test_a_cycle_without_the_newer_state_fields_reads_as_unknown() -> None:
    facts = usefulness.cycle_facts(
        {"status": "COMPLETE", "cycle": {"depth": {"mode": "fast", "rule": "r"}}, "metrics": []}
    )
    assert facts["depth"] == "fast" and facts["model_calls"] == 0
    assert facts["degraded"] is None and facts["truncated"] is None
    assert facts["plan_quality"] is None and facts["cached_tokens"] is None
    assert facts["thread"] is None
    assert usefulness.cites("It is 31 [2].") and usefulness.cites("Done.\nSources: a.txt")
    assert not usefulness.cites("It is 31.")


def test_unknown_systems_families_and_splits_are_refused(world) -> None:
    with pytest.raises(SystemExit, match="unknown systems"):
        usefulness.run(systems=["mind", "oracle"], data=world)
    with pytest.raises(SystemExit, match="unknown family"):
        usefulness.load_items("dev", ["poems"], data=world)
    with pytest.raises(SystemExit, match="unknown split"):
        usefulness.load_items("train", ["recall"], data=world)


def test_a_family_whose_file_a_split_lacks_is_refused_naming_the_file(world) -> None:
    # a split of document questions alone, as fresh1 is
    (world / "fresh1" / "docs").mkdir(parents=True)
    lines = "".join(json.dumps(item) + "\n" for item in ITEMS["doc_questions.jsonl"])
    (world / "fresh1" / "doc_questions.jsonl").write_text(lines, encoding="utf-8")
    found = usefulness.load_items("fresh1", ["document"], data=world)
    assert [item["id"] for item in found["document"]] == ["t-doc-1", "t-doc-2"]
    with pytest.raises(SystemExit, match=r"no recall questions: .*recall\.jsonl is missing"):
        usefulness.load_items("fresh1", ["document", "recall"], data=world)
    assert (
        set(usefulness.HELD_OUT)
        == {
            "headline",
            "fresh1",
            "fresh2",
            "fresh3",
            "fresh4",
            "fresh5",
            "fresh6",
            "fresh7",
            "fresh8",
            "fresh9",
            "fresh10",
            "fresh11",
            "fresh12",
            "fresh13",
            "fresh14",
            "fresh15",
            "fresh16",
            "fresh17",
            "fresh18",
        }
        <= set(usefulness.SPLITS)
    )


def test_a_lever_is_set_for_the_run_and_named_in_its_report(world, tmp_path, monkeypatch):
    monkeypatch.setenv("BATOS_MIND_PASSAGE_WORDS", "0")  # restored after the test
    services = MindServices(
        models=FakeModels(mind_reply), router=FakeRouter(("BABS",)), embedder=FakeEmbedder()
    )
    report, path = usefulness.run(
        families=["document"],
        systems=["mind"],
        limit=1,
        models=FakeModels(baseline),
        services=services,
        data=world,
        results=tmp_path,
        model_name="scripted",
        levers={"passage_words": "on"},
        progress=lambda line: None,
    )
    assert path.name.startswith("usefulness-dev-scripted-passage_words-on-")
    assert report["levers"] == {"passage_words": "on"}
    assert report["environment"] == {"BATOS_MIND_PASSAGE_WORDS": "60"}
    assert os.environ["BATOS_MIND_PASSAGE_WORDS"] == "60"
    assert "levers: passage_words=on" in usefulness.table(report)


@pytest.mark.parametrize(("baselines", "temperature"), [("greedy", 0.0), ("persona", None)])
def test_the_baselines_decode_as_asked(world, tmp_path, baselines, temperature):
    services = MindServices(
        models=FakeModels(mind_reply), router=FakeRouter(("BABS",)), embedder=FakeEmbedder()
    )
    models = FakeModels(baseline)
    report, path = usefulness.run(
        families=["document"],
        systems=["bare", "rag"],
        limit=1,
        models=models,
        services=services,
        data=world,
        results=tmp_path,
        model_name="scripted",
        progress=lambda line: None,
        baselines=baselines,
    )
    assert report["baselines"] == baselines and models.calls
    assert {call.options.get("temperature") for call in models.calls} == {temperature}
    assert ("-baselines-greedy-" in path.name) is (baselines == "greedy")
    assert ("decode greedily" in usefulness.table(report)) is (baselines == "greedy")


@pytest.mark.parametrize(
    ("reply", "numbers"),
    [
        ("It is 31 metres [2].", [2]),
        ("From [1, 3] and [2].", [1, 2, 3]),
        ("See [1-3].", [1, 2, 3]),
        ("See [3–1] and [0].", [3]),
        ("Sources: the minutes", []),
        ("no citation, 2024 figures", []),
    ],
)
def test_cited_numbers_reads_each_marker(reply, numbers):
    assert usefulness.cited_numbers(reply) == numbers


def test_only_some_questions_can_be_run(world) -> None:
    found = usefulness.load_items("dev", ["document", "computation"], data=world, only=["t-doc-2"])
    assert [i["id"] for i in found["document"]] == ["t-doc-2"] and found["computation"] == []
    with pytest.raises(SystemExit, match="no questions t-doc-9"):
        usefulness.load_items("dev", ["document"], data=world, only=["t-doc-2", "t-doc-9"])


def test_the_summary_names_the_questions_the_gate_asked_again_and_how_many_came_right() -> None:
    def record(id_: str, matched: bool, asked: str | None) -> dict[str, Any]:
        mind = {"matched": matched, "seconds": 1.0, "status": "COMPLETE", "gate_asked": asked}
        return {"id": id_, "family": "document", "systems": {"mind": mind}}

    records = [record("q1", True, "date"), record("q2", False, "name"), record("q3", True, None)]
    found = usefulness.summarise(records, "mind")
    assert found["hits"] == 2
    assert found["asked_again"] == {"n": 2, "right": 1, "ids": ["q1", "q2"]}
    assert "asked_again" not in usefulness.summarise(records[2:], "mind")
