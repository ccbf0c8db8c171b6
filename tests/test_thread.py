"""graph.thread: which requests the user's earlier messages answer."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeEmbedder
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from graph import thread

ENCODER = FakeEmbedder()


@pytest.mark.parametrize(
    "request_text",
    [
        "what did I just say?",
        "What was my first question about?",
        "Which antibiotic did I say I'm allergic to?",
        "What is the wifi password I told you?",
        "Repeat the name I just told you.",
        "Can you repeat that?",
        "Say that again, please",
        "Do you remember my name?",
        "What have we discussed so far?",
        "What were we talking about?",
        "What did you say about the soil?",
        "Remind me what the plumber's day was",
        "What was your last answer?",
        "Summarise this conversation",
        "Have I told you where I live?",
        "The code I gave you earlier, what was it?",
    ],
)
def test_a_request_speaking_of_the_conversation_is_seen(request_text: str) -> None:
    assert thread.speaks_of_conversation(request_text)


@pytest.mark.parametrize(
    "request_text",
    [
        "hello",
        "How do I ask for a raise?",
        "How do I tell someone I like them?",
        "Can you tell me how to bake bread?",
        "I told my boss I was quitting, what now?",
        "I said something stupid at work today",
        "How do I write a unit test in Python?",
        "Why can owls turn their heads so far?",
        "What's the weather like on Mars?",
        "Explain what a heat pump does",
    ],
)
def test_a_request_about_something_else_is_not_taken_for_one_about_the_conversation(
    request_text: str,
) -> None:
    assert not thread.speaks_of_conversation(request_text)


def test_earlier_turns_are_the_user_s_messages_before_the_request_latest_first_cut() -> None:
    long = "x" * (thread.TURN_CHARS + 50)
    said = [HumanMessage(f"turn {n}") for n in range(thread.THREAD_TURNS + 3)]
    messages = [
        SystemMessage("system"),
        *[m for turn in said for m in (turn, AIMessage("an answer"))],
        HumanMessage(long),
        AIMessage("another answer"),
        HumanMessage("   "),
        HumanMessage("the request"),
    ]
    turns = thread.earlier_turns(messages)
    assert len(turns) == thread.THREAD_TURNS
    assert turns[-1] == "x" * thread.TURN_CHARS  # cut, and the empty message left out
    assert turns[0] == f"turn {len(said) - thread.THREAD_TURNS + 1}"
    assert "the request" not in turns and "an answer" not in turns
    assert thread.earlier_turns([HumanMessage("only the request")]) == []


def probe(request: str, turns: list[str], catalog_best: float | None, bar: float = 0.5):
    return thread.probe(
        request, turns, ENCODER.encode_one(request), ENCODER.encode, catalog_best, bar
    )


def test_an_earlier_message_nearer_than_the_catalog_answers_the_request() -> None:
    turns = ["I owe Priya 25 pounds for the concert ticket.", "How do I remind someone?"]
    found = probe("How much do I owe Priya for the concert ticket?", turns, catalog_best=0.3)
    assert found.about_thread and found.why == "nearest" and found.turn == 0
    assert found.best is not None and found.best > 0.5
    record = found.as_dict()
    assert record["about_thread"] and record["turn"] == 0 and record["bar"] == 0.5


def test_a_nearer_passage_or_a_message_under_the_bar_leaves_the_request_to_memory() -> None:
    turns = ["I owe Priya 25 pounds for the concert ticket."]
    question = "How much do I owe Priya for the concert ticket?"
    assert not probe(question, turns, catalog_best=0.99).about_thread
    assert not probe(question, turns, catalog_best=None, bar=0.99).about_thread
    assert not probe("Tell me a joke about cats", turns, catalog_best=None).about_thread


def test_the_conversation_named_is_about_the_thread_whatever_the_catalog_holds() -> None:
    found = probe("what did I just say?", ["hello"], catalog_best=0.99, bar=1.0)
    assert found.about_thread and found.why == "conversation"


def test_no_earlier_message_means_nothing_to_answer_from() -> None:
    found = probe("what did I just say?", [], catalog_best=None)
    assert not found.about_thread and found.best is None and found.turn is None


def test_without_vectors_only_the_request_s_words_decide() -> None:
    def blind(texts: list[str]) -> None:
        raise AssertionError("no encoding without a request vector")

    said = thread.probe("what did I just say?", ["hello"], None, blind, None, 0.0)
    assert said.about_thread and said.best is None
    other = thread.probe("how much do I owe Priya?", ["I owe Priya 25"], None, blind, None, 0.0)
    assert not other.about_thread


@settings(max_examples=200, deadline=None)
@given(
    request_text=st.text(max_size=400),
    turns=st.lists(st.text(max_size=200), max_size=4),
    catalog_best=st.none() | st.floats(-1, 1),
)
def test_any_text_gets_a_bounded_answer(
    request_text: str, turns: list[str], catalog_best: float | None
) -> None:
    found = thread.probe(
        request_text,
        turns,
        ENCODER.encode_one(request_text),
        ENCODER.encode,
        catalog_best,
        0.5,
    )
    assert isinstance(found.about_thread, bool)
    if found.best is not None:
        assert -1.0001 <= found.best <= 1.0001 and found.turn is not None
        assert 0 <= found.turn < len(turns) and np.isfinite(found.best)
    assert found.about_thread == (
        bool(turns)
        and (
            thread.speaks_of_conversation(request_text)
            or (
                found.best is not None
                and found.best >= 0.5
                and (catalog_best is None or found.best >= catalog_best)
            )
        )
    )


def test_the_said_prompt_lists_the_user_s_messages_oldest_first_then_the_request() -> None:
    text = thread.said_prompt("What was my first question?", ["How do I descale a kettle?", "ok"])
    assert text.index('1. "How do I descale a kettle?"') < text.index('2. "ok"')
    assert text.endswith("\n\nWhat was my first question?")
    long = "y" * (thread.LISTED_CHARS + 100)
    assert f'1. "{"y" * thread.LISTED_CHARS}…"' in thread.said_prompt("Repeat that", [long])


@pytest.mark.parametrize(
    ("said", "stated"),
    [
        (
            "My locker code is 4471, please remember it.",
            "My locker code is 4471, please remember it.",
        ),
        ("My ticket cost 6.20 dollars. What should I pack?", "My ticket cost 6.20 dollars."),
        ("Please keep in mind that I'm allergic to penicillin.", None),
        ("Correction: the train leaves at 6:45.", None),
        ("What's a good warm-up before a run?", ""),
        ("Tell me about the Tidewater report.", ""),
        ("Please explain the fees", ""),
        ("Can you suggest a present for my sister", ""),
        ("And which colours hide stains best?", ""),
        ("Let's talk about chillies.", ""),
    ],
)
def test_what_the_user_stated_is_kept_and_questions_and_requests_are_not(
    said: str, stated: str | None
) -> None:
    assert thread.statements(said) == (said if stated is None else stated)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_statements_are_words_of_the_message(text: str) -> None:
    stated = thread.statements(text)
    assert len(stated) <= len(text)
    assert set(stated.split()) <= set(text.split())


def test_a_follow_up_to_an_earlier_question_is_not_answered_by_it() -> None:
    """An earlier question answers nothing: the follow-up of a question about a document
    resembles it most, and must keep the catalog's passages."""
    turns = ["What does the Tidewater report say about membership fees?"]
    found = probe("What does the Tidewater report say about fees for students?", turns, 0.3)
    assert not found.about_thread and found.best is None
    stated = ["The Tidewater report says membership fees are 40 pounds."]
    assert probe("What are the Tidewater report membership fees?", stated, 0.3).about_thread


def test_earlier_messages_are_encoded_once_per_encoder() -> None:
    class Counting:
        def __init__(self, scale: float) -> None:
            self.scale, self.seen = scale, []

        def encode(self, texts: list[str]) -> np.ndarray:
            self.seen.extend(texts)
            return np.array([[len(t) * self.scale, 1.0] for t in texts], dtype=np.float32)

    first, second = Counting(1.0), Counting(-1.0)
    turns = ["I owe Priya 25 pounds.", "My sister lives in Leeds."]
    vector = np.array([1.0, 0.0], dtype=np.float32)
    before = thread.probe("How much do I owe?", turns, vector, first.encode, None, 0.0)
    again = thread.probe(
        "How much do I owe?", [*turns, "Leeds is rainy."], vector, first.encode, None, 0.0
    )
    assert first.seen == [*turns, "Leeds is rainy."]  # the new message alone the second time
    assert again.best is not None and before.best is not None
    other = thread.probe("How much do I owe?", turns, vector, second.encode, None, 0.0)
    assert second.seen == turns  # another encoder's vectors are never read back
    assert other.best is not None and other.best < 0 < before.best
