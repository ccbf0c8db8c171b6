"""Chunking: sentences, packed within a token budget, then cut again where the topic shifts.

1. The text is split into sentences (paragraph breaks, headings and list items end one too).
   A sentence longer than the budget is cut by ``semchunk`` (at clause, then word boundaries)
   into pieces within it; these *units* are what the rest works on.
2. Units are packed greedily into chunks of at most ``max_tokens`` model tokens and
   ``max_chars`` characters.
3. The chunks are embedded. The same forward pass gives every unit a vector — the mean of its
   tokens' contextual states — and where the similarity of adjacent units drops well below the
   document's usual level, a new section starts (the seed's semantic boundaries): a chunk
   holding such a shift is cut there, and only its parts are encoded again. Sentences are
   never encoded on their own (that cost as much as the chunks, and more).

The rule is "never over budget" rather than "never cut a sentence": the embedding model reads
at most 256 tokens and silently drops the rest, so an oversized chunk would be stored and
cited in full but searched only by its beginning. Token counts come from one tokenisation of
the whole document (a unit's count is the tokens that start inside it); every packed chunk is
then counted on its own text in one batch, and a section whose chunks a tokenizer counts
differently is packed again the slow, exact way.

Tokens alone do not bound a chunk's size: the tokenizer reads any unbroken run of over 100
characters as one unknown token, so a hex dump, a checksum list, Thai written without spaces
or a run of emoji made "200-token" chunks of kilobytes, up to the whole file, which no prompt
could hold. Hence the second bound, in characters.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

#: Default chunk budget in model tokens (all-MiniLM-L6-v2 reads 256 at most).
MAX_TOKENS = 200
#: Most characters in a chunk, whatever its token count. Chunks of English within 200 tokens
#: held about 700 characters (median) and 1,250 at most over the project's docs and Debian's
#: copyright files, so prose is never cut by it; a passage of dense text (hex, digits) of this
#: length is some 600 tokens of the persona model, so the passages a mind's prompt quotes
#: still fit its 4,096-token context. What reads stored chunks into a prompt cuts them here
#: too (``clipped``): chunks made before this bound may be larger.
MAX_CHARS = 1500
#: Smallest budget accepted. semchunk cannot cut below one character, and one character can
#: be several tokens (a Hangul syllable is three word pieces, a byte-level BPE spends up to
#: four); below that, it recurses until Python's recursion limit.
MIN_TOKENS = 8
#: Units on each side of a candidate boundary whose mean vectors are compared; single
#: sentences are too noisy (two sentences on one topic often share few words).
WINDOW = 3
#: A boundary is a local minimum of that similarity this many standard deviations below the
#: document's mean ...
DROP_STDS = 1.0
#: ... and below this absolute cosine, so a uniformly on-topic text is not split at all.
#: Contextual unit vectors from one pass over a chunk sit closer together than sentences
#: encoded alone (on-topic windows 0.65-0.9, a change of subject 0.3-0.5), hence not 0.2.
DROP_CEILING = 0.55
#: A part smaller than this (in model tokens) is not cut off: a heading or a one-line caption
#: is context for what follows, not a topic of its own.
MIN_SECTION_TOKENS = 24
#: Words ending in a period that do not end a sentence.
ABBREVIATIONS = frozenset(
    "dr mr mrs ms prof sr jr st vs etc e.g i.e cf fig no vol al approx dept est".split()
)

#: A word before a full stop that is longer than this is no abbreviation.
_LONGEST_ABBREVIATION = max(map(len, ABBREVIATIONS))
_CLOSERS = "\"')]"
_OPENERS = "(\"'"

# _split cuts at the ``gap`` group of each match, whitespace only: what a match holds before
# its gap (a full stop, a closing quote) stays in the sentence it ends, so the spans cover
# every character that is not whitespace.
#
# A paragraph ends at a blank line, whatever the line endings (LF, CRLF or CR).
_PARAGRAPH = re.compile(r"(?P<gap>(?:\r\n?|\n)(?:[^\S\r\n]*(?:\r\n?|\n))+)")
# A sentence ends at . ! ? (optionally closed by quotes/brackets) followed by whitespace; a
# line that starts a heading or a list item starts a new sentence too.
_SENTENCE_END = re.compile(
    r"(?:[.!?][\"')\]]*|(?=[\r\n][ \t]*(?:#{1,6}\s|[-*+]\s|\d+[.)]\s)))(?P<gap>\s+)"
)


class Encoder(Protocol):
    """What the chunker needs of an embedding model."""

    def count_tokens(self, text: str) -> int: ...

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]: ...

    def token_starts(self, text: str) -> np.ndarray:
        """Character offset where each of ``text``'s tokens starts (no special tokens)."""
        ...

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_units(
        self, texts: Sequence[str], units: Sequence[Sequence[tuple[int, int]]]
    ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """Unit vectors of ``texts``, and for each text the sums of its tokens' contextual
        states over each ``[start, end)`` span of ``units`` with the number of tokens summed."""
        ...


@dataclass(frozen=True)
class Piece:
    """A chunk of a document: its text and where it lies in the document ``[start, end)``."""

    start: int
    end: int
    text: str


@dataclass
class Plan:
    """A document cut into units and packed into chunks, before anything is embedded.

    ``chunks`` are ``[first, last)`` unit index ranges, in document order.
    """

    text: str
    units: list[tuple[int, int]]
    tokens: list[int]
    chunks: list[tuple[int, int]]

    def texts(self) -> list[str]:
        return [self.text[self.units[i][0] : self.units[j - 1][1]] for i, j in self.chunks]

    def unit_spans(self) -> list[list[tuple[int, int]]]:
        """Each chunk's units as spans relative to the chunk's own text."""
        out = []
        for i, j in self.chunks:
            origin = self.units[i][0]
            out.append([(a - origin, b - origin) for a, b in self.units[i:j]])
        return out


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
    """Whether the span ends in an abbreviation or an initial rather than a full stop.

    Only the span's last word is read (scanning the whole of a span that has grown by many
    merges would make a text of initials quadratic), and no further than an abbreviation's
    length: a longer word is not one.
    """
    stop = end
    while stop > start and text[stop - 1] in _CLOSERS:
        stop -= 1
    stop -= 1  # the full stop
    if stop < start or text[stop] != ".":
        return False
    first = stop
    while first > start and not text[first - 1].isspace():
        first -= 1
        if stop - first > _LONGEST_ABBREVIATION + len(_OPENERS):
            return False
    word = text[first:stop].lower().lstrip(_OPENERS)
    return word in ABBREVIATIONS or (len(word) == 1 and word.isalpha())


def _split(text: str, pattern: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    spans = []
    cursor = start
    for match in pattern.finditer(text, start, end):
        spans.append((cursor, match.start("gap")))
        cursor = match.end("gap")
    spans.append((cursor, end))
    return [s for s in (_strip(text, a, b) for a, b in spans) if s[1] > s[0]]


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def clipped(text: str, max_chars: int = MAX_CHARS) -> str:
    """``text`` cut to ``max_chars`` characters, the cut marked with "…" (a passage read into
    a prompt: a chunk stored before chunks were bounded in characters can be far larger)."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def plan(
    text: str, encoder: Encoder, max_tokens: int = MAX_TOKENS, max_chars: int = MAX_CHARS
) -> Plan:
    """Units of ``text`` packed greedily into chunks within ``max_tokens`` and ``max_chars``
    (cheap: no model)."""
    if max_tokens < MIN_TOKENS:
        raise ValueError(f"a chunk budget of {max_tokens} tokens is below {MIN_TOKENS}")
    if max_chars < 1:
        raise ValueError(f"a chunk budget of {max_chars} characters is below 1")
    units: list[tuple[int, int]] = []
    tokens: list[int] = []
    spans = sentences(text)
    starts = encoder.token_starts(text)
    counts = np.diff(np.searchsorted(starts, [a for a, _ in spans] + [len(text)]))
    for (a, b), count in zip(spans, counts.tolist(), strict=True):
        if count <= max_tokens and b - a <= max_chars:
            units.append((a, b))
            tokens.append(count)
            continue
        for piece in _split_sentence(text, a, b, encoder, max_tokens, max_chars):
            units.append((piece.start, piece.end))
            tokens.append(encoder.count_tokens(piece.text))
    packed = Plan(text, units, tokens, _greedy(units, tokens, max_tokens, max_chars))
    # Counts from one pass over the document add up exactly for BERT's word pieces; a
    # tokenizer that merges across whitespace could count a chunk differently on its own.
    exact = encoder.count_tokens_batch(packed.texts())
    if any(n > max_tokens for n in exact):
        packed.chunks = _exact_pack(packed, encoder, max_tokens, max_chars)
    return packed


def _greedy(
    units: list[tuple[int, int]], tokens: list[int], max_tokens: int, max_chars: int
) -> list[tuple[int, int]]:
    chunks: list[tuple[int, int]] = []
    first, total = 0, 0
    for i, count in enumerate(tokens):
        if i > first and (total + count > max_tokens or units[i][1] - units[first][0] > max_chars):
            chunks.append((first, i))
            first, total = i, 0
        total += count
    if tokens:
        chunks.append((first, len(tokens)))
    return chunks


def _exact_pack(
    packed: Plan, encoder: Encoder, max_tokens: int, max_chars: int
) -> list[tuple[int, int]]:
    """Greedy packing that counts every candidate chunk on its own text."""
    text, units = packed.text, packed.units
    chunks: list[tuple[int, int]] = []
    first = 0
    for i in range(1, len(units) + 1):
        if (
            i == len(units)
            or units[i][1] - units[first][0] > max_chars
            or encoder.count_tokens(text[units[first][0] : units[i][1]]) > max_tokens
        ):
            chunks.append((first, i))
            first = i
    return chunks


def finish(
    packed: Plan,
    vectors: np.ndarray,
    sums: Sequence[np.ndarray],
    counts: Sequence[np.ndarray],
    *,
    semantic: bool = True,
) -> tuple[list[Piece], list[np.ndarray | None]]:
    """Cut the packed chunks at topic shifts; returns the pieces and their vectors, None for a
    part of a cut chunk (the caller encodes those, batched with other documents' parts).

    ``vectors``, ``sums`` and ``counts`` are ``encode_units`` over ``packed.texts()`` and
    ``packed.unit_spans()``. A part's own tokens' states, pooled, are no stand-in for its
    vector: they attended to the other part, and sit at cosine 0.75-0.9 from the real one.
    """
    text, units = packed.text, packed.units
    cuts: list[int] = []
    if semantic and len(sums):
        means = np.vstack(sums)
        means /= np.maximum(np.concatenate(counts).astype(np.float32), 1.0)[:, None]  # in place
        cuts = sorted(_shifts(means, packed.tokens))
        del means
    pieces: list[Piece] = []
    out: list[np.ndarray | None] = []
    for c, (first, last) in enumerate(packed.chunks):
        inner = cuts[bisect.bisect_right(cuts, first) : bisect.bisect_left(cuts, last)]
        for a, b in zip([first, *inner], [*inner, last], strict=True):
            pieces.append(Piece(units[a][0], units[b - 1][1], _cut(text, a, b, units)))
            out.append(vectors[c] if not inner else None)
    return pieces, out


def _cut(text: str, first: int, last: int, units: list[tuple[int, int]]) -> str:
    return text[units[first][0] : units[last - 1][1]]


def _shifts(unit_sums: np.ndarray, tokens: list[int]) -> set[int]:
    """Unit indices where a new section starts: the topic shifts, minus tiny parts."""
    if len(unit_sums) < 3:
        return set()
    similarity = _window_similarity(unit_sums)
    threshold = min(float(similarity.mean() - DROP_STDS * similarity.std()), DROP_CEILING)
    cuts = []
    for i in range(len(similarity)):
        sim = similarity[i]
        left = similarity[i - 1] if i > 0 else np.inf
        right = similarity[i + 1] if i + 1 < len(similarity) else np.inf
        if sim < threshold and sim <= left and sim <= right:
            cuts.append(i + 1)
    # A part under MIN_SECTION_TOKENS stays with its neighbour rather than standing alone.
    kept: list[int] = []
    total = np.concatenate([[0], np.cumsum(tokens)])
    for cut in cuts:
        before = kept[-1] if kept else 0
        if total[cut] - total[before] >= MIN_SECTION_TOKENS:
            kept.append(cut)
    while kept and total[-1] - total[kept[-1]] < MIN_SECTION_TOKENS:
        kept.pop()
    return set(kept)


#: Gaps between units whose similarity is worked out together.
SIMILARITY_BLOCK = 4096


def _window_similarity(vectors: np.ndarray) -> np.ndarray:
    """Cosine between the mean of up to WINDOW units before each gap and after it.

    A block of gaps at a time, each from its own running sums: done at once over a large
    document's 100,000 units, the copies of every unit's vector held some 700 MB, and a
    running sum over all of them lost the float32 precision the differences need."""
    n = len(vectors)
    out = np.empty(max(n - 1, 0), dtype=np.float32)
    for start in range(1, n, SIMILARITY_BLOCK):
        end = min(n, start + SIMILARITY_BLOCK)  # gaps start..end-1
        low, high = max(0, start - WINDOW), min(n, end - 1 + WINDOW)
        block = vectors[low:high]
        block = block / np.maximum(np.linalg.norm(block, axis=1, keepdims=True), 1e-12)
        cumulative = np.vstack([np.zeros((1, block.shape[1]), block.dtype), block.cumsum(0)])
        gaps = np.arange(start, end) - low
        before = cumulative[gaps] - cumulative[np.maximum(0, gaps - WINDOW)]
        after = cumulative[np.minimum(high - low, gaps + WINDOW)] - cumulative[gaps]
        norms = np.linalg.norm(before, axis=1) * np.linalg.norm(after, axis=1)
        out[start - 1 : end - 1] = (before * after).sum(axis=1) / np.where(norms > 0, norms, 1.0)
    return out


def chunk_and_embed(
    text: str,
    encoder: Encoder,
    *,
    max_tokens: int = MAX_TOKENS,
    max_chars: int = MAX_CHARS,
    semantic: bool = True,
) -> tuple[list[Piece], np.ndarray]:
    """Chunks of ``text`` in document order with their vectors, each within ``max_tokens``
    and ``max_chars``."""
    packed = plan(text, encoder, max_tokens, max_chars)
    vectors, sums, counts = encoder.encode_units(packed.texts(), packed.unit_spans())
    pieces, found = finish(packed, vectors, sums, counts, semantic=semantic)
    missing = [i for i, v in enumerate(found) if v is None]
    if missing:
        encoded = encoder.encode([pieces[i].text for i in missing])
        for i, vector in zip(missing, encoded, strict=True):
            found[i] = vector
    dims = vectors.shape[1] if vectors.ndim == 2 else 0
    filled = cast(list[np.ndarray], found)  # every missing vector was encoded above
    matrix = np.vstack(filled).astype(np.float32) if found else np.zeros((0, dims), np.float32)
    return pieces, matrix


def chunk(
    text: str,
    encoder: Encoder,
    *,
    max_tokens: int = MAX_TOKENS,
    max_chars: int = MAX_CHARS,
    semantic: bool = True,
) -> list[Piece]:
    """Chunks of ``text`` in document order, each within one section, ``max_tokens`` and
    ``max_chars``."""
    if not semantic:
        packed = plan(text, encoder, max_tokens, max_chars)
        return [
            Piece(packed.units[i][0], packed.units[j - 1][1], t)
            for (i, j), t in zip(packed.chunks, packed.texts(), strict=True)
        ]
    return chunk_and_embed(text, encoder, max_tokens=max_tokens, max_chars=max_chars)[0]


def _split_sentence(
    text: str, start: int, end: int, encoder: Encoder, max_tokens: int, max_chars: int
) -> list[Piece]:
    """A sentence over the budget, cut into pieces within it (the model would truncate it)."""
    import semchunk

    def count(piece: str) -> int:
        # a piece over the character bound counts as over the token budget: never tokenized
        return max_tokens + 1 if len(piece) > max_chars else encoder.count_tokens(piece)

    # with offsets=True semchunk returns (chunks, offsets); its annotation is the union of both
    _, offsets = cast(
        tuple[list[str], list[tuple[int, int]]],
        semchunk.chunk(text[start:end], max_tokens, count, offsets=True),
    )
    pieces = []
    for a, b in offsets:
        a, b = _strip(text, start + a, start + b)
        if b > a:
            pieces.append(Piece(a, b, text[a:b]))
    return pieces
