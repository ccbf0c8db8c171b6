"""bench/voice.py's instruments: the prompt set, the style classifier's gate, intervals, cache.

The benchmark itself runs a model for an hour; what it stands on is checked here without one:
the new prompts share no topic word with the training prompts, the classifier trained on the
training replies tells the reference replies apart (or the benchmark reports nothing), and an
interrupted run resumes from its cache.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from batos.training.voice import data_dir
from bench import voice


def test_voice_prompts_share_no_topic_word_with_the_training_or_heldout_prompts() -> None:
    seen = {r["prompt"] for r in voice.training_rows()} | {
        r["prompt"] for r in voice.heldout_rows()
    }
    known = set().union(*(voice.content_words(p) for p in seen))
    for row in voice.voice_prompts():
        shared = voice.content_words(row["prompt"]) & known
        assert not shared, (row["prompt"], shared)


@pytest.mark.parametrize("name", ["fresh2", "fresh3"])
def test_a_later_fresh_set_shares_no_topic_word_with_any_prompt_before_it(name: str) -> None:
    """fresh2 and fresh3 were each written after every set before them and every training file,
    to stay far from all: the training and held-out prompts, ALFRED's far-topic examples and
    the other voice rows (fresh3 was also written after fresh2, so fresh2 is checked against
    it as well: no word of either is in the other)."""
    rows = voice.voice_prompts()
    far_topics = data_dir() / "experiments" / "alfred_far_topics.jsonl"
    seen = (
        {r["prompt"] for r in voice.training_rows()}
        | {r["prompt"] for r in voice.heldout_rows()}
        | {json.loads(line)["prompt"] for line in far_topics.read_text().splitlines() if line}
        | {r["prompt"] for r in rows if r["set"] != name}
    )
    known = set().union(*(voice.content_words(p) for p in seen))
    fresh = [r["prompt"] for r in rows if r["set"] == name]
    assert len(fresh) >= 30
    for prompt in fresh:
        shared = voice.content_words(prompt) & known
        assert not shared, (prompt, shared)


def test_voice_prompts_are_half_near_a_persona_half_far_from_all() -> None:
    rows = voice.voice_prompts()
    assert len({r["prompt"].lower() for r in rows}) == len(rows)
    kinds = Counter(r["set"] for r in rows)
    assert set(kinds) == {"near", "far", "fresh", "fresh2", "fresh3"}
    assert kinds["near"] == kinds["far"] >= 20
    assert kinds["fresh"] >= 20
    assert kinds["fresh2"] >= 30
    assert kinds["fresh3"] >= 30
    territories = Counter(r["territory"] for r in rows if r["set"] == "near")
    assert set(territories) == set(voice.PERSONAS)
    assert len(set(territories.values())) == 1  # as many prompts in each persona's territory
    far_sets = ("far", "fresh", "fresh2", "fresh3")
    assert all(r["territory"] is None for r in rows if r["set"] in far_sets)


def test_content_words_drop_stop_words_and_endings() -> None:
    assert voice.content_words("Why do the cats purr at night?") == {"cat", "purr", "night"}
    assert voice.content_words("The server crashed") == voice.content_words("servers crash")


def test_the_classifier_reads_as_many_replies_of_each_persona_the_first_of_each_file() -> None:
    rows = voice.classifier_rows()
    counts = Counter(r["persona"] for r in rows)
    assert set(counts) == set(voice.PERSONAS) and len(set(counts.values())) == 1
    every = voice.training_rows()
    for persona in voice.PERSONAS:
        own = [r for r in every if r["persona"] == persona]
        assert [r for r in rows if r["persona"] == persona] == own[: counts[persona]]


def test_style_classifier_tells_the_reference_replies_apart() -> None:
    score = voice.validate(voice.train_classifier())
    assert score.n == 40
    assert voice.usable(score), score


def test_a_classifier_that_learnt_nothing_is_refused() -> None:
    rows = voice.training_rows()
    labels = [r["persona"] for r in rows]
    random.Random(0).shuffle(labels)
    shuffled = [{**r, "persona": p} for r, p in zip(rows, labels, strict=True)]
    score = voice.validate(voice.train_classifier(shuffled))
    assert not voice.usable(score), score
    assert not voice.usable(voice.Score(0, 0))


def test_attribution_counts_per_persona_and_overall() -> None:
    class Echo:
        def predict(self, texts: list[str]) -> list[str]:
            return [t.split()[0] for t in texts]

    scores, predicted = voice.attribution(
        Echo(), [("ROBIN", "ROBIN hi"), ("BRICK", "ROBIN no"), ("BRICK", "BRICK yes")]
    )
    assert predicted == ["ROBIN", "ROBIN", "BRICK"]
    assert (scores["ROBIN"].hits, scores["ROBIN"].n) == (1, 1)
    assert (scores["BRICK"].hits, scores["BRICK"].n) == (1, 2)
    assert (scores["overall"].hits, scores["overall"].n) == (2, 3)
    assert scores["BABS"].n == 0 and str(scores["BABS"]) == "—"


def test_wilson_interval() -> None:
    low, high = voice.wilson(29, 32)
    assert low == pytest.approx(0.7578, abs=1e-3) and high == pytest.approx(0.9676, abs=1e-3)
    assert voice.wilson(0, 10)[0] == 0.0 and voice.wilson(10, 10)[1] == 1.0
    with pytest.raises(ValueError):
        voice.wilson(0, 0)


def test_reply_cache_resumes_and_skips_a_line_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "replies.jsonl"
    cache = voice.ReplyCache(path)
    cache.put("k1", "first", {"persona": "ROBIN"})
    with path.open("a") as out:
        out.write('{"key": "k2", "reply": "cut sh')  # the run was killed mid-line
    again = voice.ReplyCache(path)
    assert again.get("k1") == "first" and again.get("k2") is None
    again.put("k2", "second", {})
    assert voice.ReplyCache(path).get("k2") == "second"
    assert json.loads(path.read_text().splitlines()[0])["persona"] == "ROBIN"


def test_sets_and_conditions_are_chosen_by_name_and_unknown_names_refused() -> None:
    parse = voice._names(voice.CONDITIONS)
    assert parse("both, system,both") == ("both", "system")
    for bad in ("both,loud", ","):
        with pytest.raises(argparse.ArgumentTypeError, match="choose from adapter, system, both"):
            parse(bad)
    assert [s.name for s in voice.prompt_sets(False, ("near", "far"))] == ["far", "near"]
    assert [len(s.prompts) for s in voice.prompt_sets(True, ("heldout",))] == [2]
    fresh = voice.prompt_sets(False, ("fresh",))[0].prompts
    far = voice.prompt_sets(False, ("far",))[0].prompts
    assert len(fresh) >= 20 and not set(fresh) & set(far)
    fresh2 = voice.prompt_sets(False, ("fresh2",))[0].prompts
    assert len(fresh2) >= 30 and not set(fresh2) & (set(far) | set(fresh))


class _Scripted:
    """A speaker that answers from a script and records what it was asked."""

    generated, seconds = 0, 0.0

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str]] = []

    def reply(self, condition: str, persona: str, prompt: str) -> str:
        self.asked.append((condition, persona, prompt))
        return f"{persona} on {prompt}"


def test_collect_asks_only_the_chosen_conditions_and_the_report_skips_the_rest() -> None:
    speaker = _Scripted()
    sets = voice.prompt_sets(True, ("far",))
    replies = voice.collect(speaker, sets, progress=lambda _: None, conditions=("both",))
    assert {c for c, _, _ in speaker.asked} == {"both"}
    assert len(speaker.asked) == 2 * len(voice.PERSONAS)
    assert replies["far"]["system"] == [] and len(replies["far"]["both"]) == 8
    result = voice.report(voice.train_classifier(), voice.Score(38, 40), replies)
    assert set(result["far"]) == {"both"}


class _TopicEmbedder:
    """Unit vectors by topic: a text about pigeons points one way, anything else the other."""

    def encode(self, texts):
        import numpy as np

        return np.array([[1.0, 0.0] if "pigeon" in t.lower() else [0.0, 1.0] for t in texts])


def test_relevance_is_the_mean_cosine_of_each_reply_to_its_own_prompt() -> None:
    replies = [
        ("ALFRED", "Pigeons want the sandwich.", "Why do pigeons follow me?"),
        ("ALFRED", "Verdict: buy a hat.", "Why do pigeons nest on ledges?"),
        ("ROBIN", "Oh, the rain!", "What is rain?"),
    ]
    means = voice.relevance(_TopicEmbedder(), replies)
    assert means["ALFRED"] == 0.5 and means["ROBIN"] == 1.0 and means["BRICK"] is None
    assert means["overall"] == round(2 / 3, 4)


def test_the_report_prints_relevance_beside_the_voice_when_given_an_embedder(capsys) -> None:
    speaker = _Scripted()
    sets = voice.prompt_sets(True, ("far",))
    replies = voice.collect(speaker, sets, progress=lambda _: None, conditions=("both",))
    result = voice.report(voice.train_classifier(), voice.Score(38, 40), replies, _TopicEmbedder())
    assert "relevance (mean cosine)" in capsys.readouterr().out
    # the scripted reply repeats its prompt, so it is as relevant as a reply can be
    assert result["far"]["relevance"]["both"]["overall"] == 1.0
