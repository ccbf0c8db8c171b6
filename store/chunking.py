"""Chunking: sentences, then topic shifts, then packing within a token budget.

1. The text is split into sentences (paragraph breaks, headings and list items end one too).
2. Where the embedding similarity of adjacent sentences drops well below the document's usual
   level, a new section starts — the seed's semantic boundaries.
3. Each section's sentences are packed greedily into chunks of at most ``max_tokens`` model
   tokens, measured on the chunk's own text. A chunk holds whole sentences, with one
   exception: a sentence longer than the budget is cut by ``semchunk`` (at clause, then word
   boundaries) into pieces within the budget, each a chunk of its own.

The rule is "never over budget" rather than "never cut a sentence": the embedding model reads
at most 256 tokens and silently drops the rest, so an oversized chunk would be stored and
cited in full but searched only by its beginning.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np

#: Default chunk budget in model tokens (all-MiniLM-L6-v2 reads 256 at most).
MAX_TOKENS = 200
#: Sentences on each side of a candidate boundary whose mean vectors are compared; single
#: sentences are too noisy (two sentences on one topic often share few words).
WINDOW = 3
#: A boundary is a local minimum of that similarity this many standard deviations below the
#: document's mean ...
DROP_STDS = 1.0
#: ... and below this absolute cosine, so a uniformly on-topic text is not split at all.
DROP_CEILING = 0.2
#: A section smaller than this (in model tokens) joins its neighbour: a heading or a one-line
#: caption is context for what follows, not a topic of its own.
MIN_SECTION_TOKENS = 24
#: Words ending in a period that do not end a sentence.
ABBREVIATIONS = frozenset(
    "dr mr mrs ms prof sr jr st vs etc e.g i.e cf fig no vol al approx dept est".split()
)

_PARAGRAPH = re.compile(r"\n[ \t]*\n+")
# A sentence ends at . ! ? (optionally closed by quotes/brackets) followed by whitespace; a
# line that starts a heading or a list item starts a new sentence too.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+|\n(?=[ \t]*(?:#{1,6}\s|[-*+]\s|\d+[.)]\s))")


class Encoder(Protocol):
    def encode(self, texts: list[str]) -> np.ndarray: ...

    def count_tokens(self, text: str) -> int: ...


@dataclass(frozen=True)
class Piece:
    """A chunk of a document: its text and where it lies in the document ``[start, end)``."""

    start: int
    end: int
    text: str


def sentences(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` spans of the sentences of ``text``, surrounding whitespace excluded."""
    spans: list[tuple[int, int]] = []
    for para_start, para_end in _split(text, _PARAGRAPH, 0, len(text)):
        for start, end in _split(text, _SENTENCE_END, para_start, para_end):
            if spans and spans[-1][1] >= para_start and _abbreviated(text, *spans[-1]):
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((start, end))
    return spans


def _abbreviated(text: str, start: int, end: int) -> bool:
    """Whether the span ends in an abbreviation or an initial rather than a full stop."""
    if text[end - 1] != ".":
        return False
    word = text[start : end - 1].rsplit(None, 1)[-1].lower().lstrip("(\"'")
    return word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _split(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    spans = []
    cursor = start
    for match in pattern.finditer(text, start, end):
        spans.append((cursor, match.start()))
        cursor = match.end()
    spans.append((cursor, end))
    return [s for s in (_strip(text, a, b) for a, b in spans) if s[1] > s[0]]


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def semantic_sections(
    text: str, spans: list[tuple[int, int]], encoder: Encoder
) -> list[list[tuple[int, int]]]:
    """Group sentence spans into sections, starting a new one where the topic shifts."""
    if len(spans) < 3:
        return [spans] if spans else []
    vectors = encoder.encode([text[a:b] for a, b in spans])
    similarity = _window_similarity(vectors)
    threshold = min(float(similarity.mean() - DROP_STDS * similarity.std()), DROP_CEILING)
    sections: list[list[tuple[int, int]]] = [[spans[0]]]
    for i, span in enumerate(spans[1:]):
        sim = similarity[i]
        left = similarity[i - 1] if i > 0 else np.inf
        right = similarity[i + 1] if i + 1 < len(similarity) else np.inf
        if sim < threshold and sim <= left and sim <= right:
            sections.append([])
        sections[-1].append(span)
    return _merge_small(text, sections, encoder)


def _merge_small(
    text: str, sections: list[list[tuple[int, int]]], encoder: Encoder
) -> list[list[tuple[int, int]]]:
    merged: list[list[tuple[int, int]]] = []
    carry: list[tuple[int, int]] = []
    for section in sections:
        section = carry + section
        carry = []
        if encoder.count_tokens(text[section[0][0] : section[-1][1]]) < MIN_SECTION_TOKENS:
            carry = section
        else:
            merged.append(section)
    if carry:
        if merged:
            merged[-1].extend(carry)
        else:
            merged.append(carry)
    return merged


def _window_similarity(vectors: np.ndarray) -> np.ndarray:
    """Cosine between the mean of up to WINDOW sentences before each gap and after it."""
    cumulative = np.vstack([np.zeros((1, vectors.shape[1]), vectors.dtype), vectors.cumsum(0)])
    n = len(vectors)
    out = np.empty(n - 1, dtype=np.float32)
    for gap in range(1, n):
        before = cumulative[gap] - cumulative[max(0, gap - WINDOW)]
        after = cumulative[min(n, gap + WINDOW)] - cumulative[gap]
        norm = float(np.linalg.norm(before) * np.linalg.norm(after)) or 1.0
        out[gap - 1] = float(before @ after) / norm
    return out


def chunk(
    text: str,
    encoder: Encoder,
    *,
    max_tokens: int = MAX_TOKENS,
    semantic: bool = True,
) -> list[Piece]:
    """Chunks of ``text`` in document order, each within one section and ``max_tokens``."""
    spans = sentences(text)
    sections = semantic_sections(text, spans, encoder) if semantic else [spans] if spans else []
    pieces: list[Piece] = []
    for section in sections:
        pieces.extend(_pack(text, section, encoder, max_tokens))
    return pieces


def _pack(
    text: str, section: list[tuple[int, int]], encoder: Encoder, max_tokens: int
) -> list[Piece]:
    """Whole sentences, greedily, while the chunk's own token count stays within budget.

    Counting the candidate chunk's text (not summing sentence counts) keeps the bound exact
    for any tokenizer. semchunk is not used for packing: it splits on newlines first, and in
    hard-wrapped text (pypdf output, many .txt files) those fall in mid-sentence.
    """
    pieces: list[Piece] = []
    start = end = -1
    for a, b in section:
        if start >= 0 and encoder.count_tokens(text[start:b]) <= max_tokens:
            end = b
            continue
        if start >= 0:
            pieces.append(Piece(start, end, text[start:end]))
            start = -1
        if encoder.count_tokens(text[a:b]) <= max_tokens:
            start, end = a, b
        else:
            pieces.extend(_split_sentence(text, a, b, encoder, max_tokens))
    if start >= 0:
        pieces.append(Piece(start, end, text[start:end]))
    return pieces


def _split_sentence(
    text: str, start: int, end: int, encoder: Encoder, max_tokens: int
) -> list[Piece]:
    """A sentence over the budget, cut into pieces within it (the model would truncate it)."""
    import semchunk

    _, offsets = semchunk.chunk(text[start:end], max_tokens, encoder.count_tokens, offsets=True)
    pieces = []
    for a, b in offsets:
        a, b = _strip(text, start + a, start + b)
        if b > a:
            pieces.append(Piece(a, b, text[a:b]))
    return pieces
