"""bench/passage_recall.py's ranks: where a question's document and stated answer fall."""

from __future__ import annotations

from bench.passage_recall import line, ranks, states

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
