"""bench/passage_recall.py's ranks: where a question's document and stated answer fall."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.passage_recall import band, by_kind, line, names_changed, ranks, states

ITEM = {
    "id": "q1",
    "answer": "Saint-Aubrec",
    "accept": ["St Aubrec"],
    "source": "history.txt",
}


def test_an_answer_is_found_as_written_or_in_an_accepted_form() -> None:
    assert states(ITEM, "Twinned with\n  SAINT-AUBREC since 1978.")
    assert states(ITEM, "twinned with St  Aubrec")
    assert not states(ITEM, "twinned with a Breton port")


def test_ranks_count_only_passages_of_the_question_s_own_document() -> None:
    hits = [
        ("/docs/other.txt", "Saint-Aubrec is also named here."),
        ("/docs/history.txt", "The town has a harbour."),
        ("/docs/history.txt", "It is twinned with Saint-Aubrec."),
    ]
    row = ranks(ITEM, hits, "The town has a harbour. It is twinned with Saint-Aubrec.")
    assert row == {"id": "q1", "source": 2, "answer": 3, "stated": True}


def test_a_question_whose_document_is_not_retrieved_has_no_ranks() -> None:
    row = ranks(ITEM, [("/docs/other.txt", "Saint-Aubrec")], "twinned with a Breton port")
    assert row == {"id": "q1", "source": None, "answer": None, "stated": False}


def test_the_line_counts_answers_only_among_those_their_document_states() -> None:
    rows = [
        {"id": "a", "source": 1, "answer": 2, "stated": True, "reranked": 1},
        {"id": "b", "source": 4, "answer": None, "stated": False, "reranked": None},
        {"id": "c", "source": None, "answer": None, "stated": True, "reranked": None},
    ]
    assert line("dev", rows) == ("| dev | 3 | 1 / 1 / 2 / 2 | 2 | 0 / 1 / 1 / 1 | 1 / 1 / 1 / 1 |")


def test_names_changed_says_which_questions_passages_the_names_move(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Licence files that never say their package's name, and more files whose text speaks of
    # licences and packages far more: a question naming libdpkg-perl gets its file's passage
    # only by the name; a question the text answers keeps its passages.
    docs = tmp_path / "dev" / "docs"
    docs.mkdir(parents=True)
    (docs / "libdpkg-perl.txt").write_text("Upstream-Name: dpkg\nLicense: GPL-2+\n", "utf-8")
    for n in range(4):
        (docs / f"tool{n}.txt").write_text(
            f"Tool {n}. Which licence covers this package? The licence that covers the package "
            "is the GPL; you can redistribute the package under the terms of that licence.",
            "utf-8",
        )
    (docs / "ferry.txt").write_text("The ferry leaves the quay at 07:40 every day.", "utf-8")
    questions = [
        {"id": "named", "question": "Which licence covers the libdpkg-perl package?"},
        {"id": "plain", "question": "When does the ferry leave the quay?"},
    ]
    (tmp_path / "dev" / "doc_questions.jsonl").write_text(
        "".join(json.dumps({**q, "family": "document"}) + "\n" for q in questions), "utf-8"
    )
    monkeypatch.setenv("BATOS_CATALOG_NAMES", "off")
    assert names_changed("dev", data=tmp_path) == (2, ["named"])
    assert os.environ["BATOS_CATALOG_NAMES"] == "off"  # the caller's setting is given back


def test_ranks_fall_in_bands_and_questions_are_grouped_by_what_they_ask_for() -> None:
    assert [band(r) for r in (1, 3, 4, 5, 6, 10, None)] == [
        "1-3",
        "1-3",
        "4-5",
        "4-5",
        "6-10",
        "6-10",
        "none",
    ]
    rows = [
        {"id": "who1", "answer": 4, "stated": True},
        {"id": "who2", "answer": 1, "stated": True},
        {"id": "when", "answer": None, "stated": False},
        {"id": "why", "answer": None, "stated": True},
    ]
    questions = {
        "who1": "Who chairs the orchard committee?",
        "who2": "Who is the museum's curator?",
        "when": "When does the autumn term start?",
        "why": "Why was the race course changed?",
    }
    table = by_kind(rows, questions)
    assert table[2] == "| name | 2 | 0 | 1 | 1 | 0 | 0 |"
    assert "| date | 1 | 1 | 0 | 0 | 0 | 0 |" in table
    assert "| other | 1 | 0 | 0 | 0 | 0 | 1 |" in table
