"""The validated style classifier: which persona's voice a reply is in.

TF-IDF over word 1–2-grams and character 2–5-grams, logistic regression, fitted on the training
replies only (``modelfiles/data/<persona>.jsonl``, as many from each persona) and validated on the
held-out reference replies (``heldout.jsonl``), which no model and no training step saw. A
classifier whose validation is under ``VALIDATION_FLOOR`` says nothing about a model's replies
(``usable``).
``bench/voice.py`` measures the personas with it; ``batos.training.retrain`` judges a retrained
adapter with it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batos.models.modelfile import modelfiles_dir

PERSONAS = ("ROBIN", "BRICK", "BABS", "ALFRED")
VALIDATION_FLOOR = 0.90


# --- data ----------------------------------------------------------------------------------


def data_dir() -> Path:
    return modelfiles_dir() / "data"


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def training_rows() -> list[dict[str, str]]:
    """Every training pair, tagged with its persona."""
    return [
        {**row, "persona": persona}
        for persona in PERSONAS
        for row in _jsonl(data_dir() / f"{persona.lower()}.jsonl")
    ]


def classifier_rows() -> list[dict[str, str]]:
    """The training pairs the classifier is fitted on: the same number from each persona, the
    first lines of each file, as many as the smallest file holds.

    Balanced, so that growing one persona's data (ALFRED's, to widen his voice) neither tilts
    the classifier towards that persona nor changes the instrument a before-and-after
    comparison of his adapter is read with: new lines are appended, so the first ones stay.
    """
    rows = training_rows()
    least = min(sum(r["persona"] == p for r in rows) for p in PERSONAS)
    return [r for p in PERSONAS for r in [r for r in rows if r["persona"] == p][:least]]


def heldout_rows() -> list[dict[str, str]]:
    return _jsonl(data_dir() / "heldout.jsonl")


def voice_prompts() -> list[dict[str, Any]]:
    """The prompt sets on topics the training data never touches (``set``: near | far | fresh |
    fresh2 | fresh3)."""
    return _jsonl(data_dir() / "voice_prompts.jsonl")


_WORD = re.compile(r"[a-z]+")
#: Function words scikit-learn's stop-word list lacks (it has 'do' but not 'does').
_AUXILIARIES = frozenset({"does", "did", "doing", "don", "didn", "doesn", "isn", "aren", "won"})


def content_words(text: str) -> set[str]:
    """Lower-case word stems of ``text`` (three letters or more) that are not stop-words.

    The stem drops a plural or verb ending, so 'cats' meets 'cat' and 'crashed' meets 'crash':
    enough to show two prompts share a topic word, which is all it is used for.
    """
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    words = (w for w in _WORD.findall(text.lower()) if len(w) >= 3)
    return {_stem(w) for w in words if w not in ENGLISH_STOP_WORDS and w not in _AUXILIARIES}


def _stem(word: str) -> str:
    for suffix in ("ing", "ies", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


# --- the classifier ------------------------------------------------------------------------


def train_classifier(rows: Sequence[dict[str, str]] | None = None) -> Any:
    """A style classifier fitted on the training replies (never on a model's or a reference's):
    ``classifier_rows`` unless ``rows`` are given."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion, make_pipeline

    rows = classifier_rows() if rows is None else rows
    features = FeatureUnion(
        [
            ("words", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)),
            (
                "chars",
                TfidfVectorizer(
                    analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2
                ),
            ),
        ]
    )
    model = make_pipeline(features, LogisticRegression(max_iter=2000))
    model.fit([r["reply"] for r in rows], [r["persona"] for r in rows])
    return model


@dataclass(frozen=True)
class Score:
    """``hits`` of ``n`` replies attributed to their author, with a 95% Wilson interval."""

    hits: int
    n: int

    @property
    def rate(self) -> float:
        return self.hits / self.n if self.n else float("nan")

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.hits, self.n)

    def __str__(self) -> str:
        if not self.n:
            return "—"
        low, high = self.interval
        return f"{self.rate:.2f} [{low:.2f}–{high:.2f}]"

    def as_dict(self) -> dict[str, Any]:
        low, high = self.interval if self.n else (None, None)
        return {
            "hits": self.hits,
            "n": self.n,
            "rate": self.rate if self.n else None,
            "low": low,
            "high": high,
        }


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion: sound at small n and at 0 or n hits."""
    if n <= 0:
        raise ValueError("no trials")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def attribution(
    classifier: Any, replies: Sequence[tuple[str, str]]
) -> tuple[dict[str, Score], list[str]]:
    """Per-persona and overall scores of ``(persona, reply)`` pairs, and each predicted author."""
    if not replies:
        return {}, []
    predicted = list(classifier.predict([text for _, text in replies]))
    scores = {}
    for persona in (*PERSONAS, "overall"):
        pairs = [
            (who, guess)
            for (who, _), guess in zip(replies, predicted, strict=True)
            if persona in ("overall", who)
        ]
        scores[persona] = Score(sum(w == g for w, g in pairs), len(pairs))
    return scores, predicted


def validate(classifier: Any) -> Score:
    """The classifier on the held-out reference replies: the gate for every model figure."""
    rows = heldout_rows()
    return attribution(classifier, [(r["persona"], r["reply"]) for r in rows])[0]["overall"]


def usable(validation: Score) -> bool:
    """Whether a classifier with this validation may attribute model replies at all."""
    return validation.n > 0 and validation.rate >= VALIDATION_FLOOR
