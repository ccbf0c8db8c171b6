"""bench/prompt_lookup.py's question set: one dev question a document, with its own text."""

from __future__ import annotations

from bench import prompt_lookup


def test_each_question_comes_with_the_start_of_its_own_document() -> None:
    chosen = prompt_lookup.questions(3, 200)
    assert len(chosen) == 3
    assert len({text for _, text in chosen}) == 3  # three documents, not one thrice
    for question, text in chosen:
        assert question.endswith("?") and 0 < len(text) <= 200
