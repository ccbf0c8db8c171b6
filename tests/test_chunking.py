"""The sentence splitter and the chunker take any text.

Properties over arbitrary text (hypothesis, with the "batos" profile of conftest.py): no
exception; spans in order, disjoint, inside the text, without surrounding whitespace, and
covering every character that is not whitespace; chunks within the token budget; topic cuts
that only split chunks. Then the texts that broke them once, as plain examples.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.knowledge.chunking import MAX_CHARS, MIN_TOKENS, clipped, finish, plan, sentences
from store.knowledge.embeddings import Embedder

#: Every whitespace character of the Basic Multilingual Plane (str.isspace, as the splitter).
WHITESPACE = [chr(c) for c in range(0x10000) if chr(c).isspace()]
#: Pieces that trip sentence splitters: lone and repeated punctuation, closing quotes,
#: abbreviations and initials, every kind of line break and blank line, heading and list
#: markers, a word far longer than any token, and characters a tokenizer cuts into several
#: word pieces (Hangul), changes in length (İ), or drops (zero-width space, NUL, BOM).
PIECES = [
    ".",
    " .",
    ". ",
    " .\n",
    "..",
    "...",
    ". .",
    "!",
    "?",
    "?!",
    "?) ",
    '"',
    "'",
    ")",
    "]",
    "(",
    ".)",
    '."',
    "Dr.",
    "e.g.",
    "J.",
    "(cf.",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r\n\r\n",
    "\r",
    "\n \t\n",
    "\u00a0",
    "\u2028",
    "\u2029",
    "\u3000",
    "\x0c",
    "# ",
    "### ",
    "- ",
    "* ",
    "1. ",
    "2) ",
    "word",
    "Sentence",
    "x" * 300,
    "가각힝",
    "İstanbul",
    "e\u0301",
    "\u0301",
    "\u200b",
    "\x00",
    "\ufeff",
    "🙂",
    "日本語。",
]
TEXTS = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=150).map("".join),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), max_size=60).map("".join),
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map(lambda p: "".join(p) * 40),
    st.text(),  # any code points but lone surrogates (no file decodes to those)
    st.text(st.sampled_from(WHITESPACE)),
)
BUDGETS = st.sampled_from([MIN_TOKENS, MIN_TOKENS + 1, 13, 40, 200])


@pytest.fixture(scope="module")
def encoder() -> Embedder:
    """The catalog's encoder; the chunker only uses its tokenizer (no model is loaded)."""
    return Embedder()


def _assert_spans_hold(text: str, spans: list[tuple[int, int]]) -> None:
    """Spans in order, disjoint, inside ``text``, trimmed, and only whitespace between."""
    cursor = 0
    for start, end in spans:
        assert cursor <= start < end <= len(text), (spans, len(text))
        assert not text[start].isspace() and not text[end - 1].isspace(), (start, end)
        assert text[cursor:start].isspace() or cursor == start, (cursor, start)
        cursor = end
    assert not text[cursor:].strip(), "text after the last span"


# The splitter alone is cheap: ten times the profile's examples (so ten times "deep" too).
@settings(max_examples=10 * settings.default.max_examples)
@given(TEXTS)
def test_sentences_hold_any_text(text: str) -> None:
    _assert_spans_hold(text, sentences(text))


@given(TEXTS, BUDGETS)
def test_chunks_hold_any_text_within_the_budget(encoder: Embedder, text: str, budget: int) -> None:
    packed = plan(text, encoder, budget)
    _assert_spans_hold(text, packed.units)
    assert len(packed.tokens) == len(packed.units)
    # A unit is a sentence or a piece of one: never across a sentence boundary.
    bounds = sentences(text)
    for start, end in packed.units:
        assert any(a <= start and end <= b for a, b in bounds), (start, end)
    # Chunks are runs of units, in order, each unit in exactly one.
    flat = [i for first, last in packed.chunks for i in range(first, last)]
    assert flat == list(range(len(packed.units)))
    assert all(last > first for first, last in packed.chunks)
    assert all(encoder.count_tokens(t) <= budget for t in packed.texts())


@given(TEXTS, BUDGETS, st.data())
def test_topic_cuts_only_split_chunks(
    encoder: Embedder, text: str, budget: int, data: st.DataObject
) -> None:
    """Whatever the units' vectors say, the pieces are parts of chunks, cover every unit
    once, and a piece keeps its chunk's vector only when the chunk was not cut."""
    packed = plan(text, encoder, budget)
    topics = data.draw(st.lists(st.integers(0, 3), min_size=len(packed.units)))
    basis = np.eye(4, dtype=np.float32)
    sums = [
        basis[topics[first:last]] * np.asarray(packed.tokens[first:last], np.float32)[:, None]
        for first, last in packed.chunks
    ]
    counts = [np.asarray(packed.tokens[first:last]) for first, last in packed.chunks]
    vectors = np.arange(4 * len(packed.chunks), dtype=np.float32).reshape(-1, 4)
    pieces, found = finish(packed, vectors, sums, counts)
    _assert_spans_hold(text, [(p.start, p.end) for p in pieces])
    assert all(p.text == text[p.start : p.end] for p in pieces)
    starts = [a for a, _ in packed.units]
    for (first, last), chunk_vector in zip(packed.chunks, vectors, strict=True):
        low, high = packed.units[first][0], packed.units[last - 1][1]
        inside = [i for i, p in enumerate(pieces) if low <= p.start < high]
        assert pieces[inside[0]].start == low and pieces[inside[-1]].end == high
        assert all(pieces[i].end <= high and pieces[i].start in starts for i in inside)
        if len(inside) == 1:
            assert np.array_equal(found[inside[0]], chunk_vector)
        else:
            assert all(found[i] is None for i in inside)
    assert all(encoder.count_tokens(p.text) <= budget for p in pieces)


# -- the texts that broke it ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello.\n\n. Next.", ["Hello.", ".", "Next."]),
        ("A sentence. . Another one.", ["A sentence.", ".", "Another one."]),
        # Debian copyright files mark empty lines with a lone "." in continuation lines.
        (
            "License: X\n .\n This is free.\n .\n On Debian systems.",
            ["License: X\n .", "This is free.", ".", "On Debian systems."],
        ),
    ],
)
def test_a_lone_full_stop_is_a_sentence_not_a_crash(text: str, expected: list[str]) -> None:
    assert [text[a:b] for a, b in sentences(text)] == expected


def test_closing_quotes_and_brackets_stay_with_their_sentence() -> None:
    text = 'He said "Hi." Then (see Dr.) Smith left. Why?) Fine.'
    assert [text[a:b] for a, b in sentences(text)] == [
        'He said "Hi."',
        "Then (see Dr.) Smith left.",
        "Why?)",
        "Fine.",
    ]


def test_blank_lines_end_paragraphs_whatever_the_line_endings() -> None:
    for newline in ("\n", "\r\n", "\r"):
        text = newline.join(["Intro", "", "Body one. Body two", "- item", "  ", "End"])
        assert [text[a:b] for a, b in sentences(text)] == [
            "Intro",
            "Body one.",
            "Body two",
            "- item",
            "End",
        ], repr(newline)


def test_a_text_of_initials_splits_in_linear_time() -> None:
    """Each merge of an abbreviation with the next sentence used to copy the whole merged
    span again: two megabytes of initials took twenty seconds, plain sentences one."""
    count = 500_000
    began = time.perf_counter()
    sentences("Jo. " * count)
    plain = time.perf_counter() - began
    began = time.perf_counter()
    assert len(sentences("J. " * count + "end")) == 1
    initials = time.perf_counter() - began
    assert initials < 4 * plain + 1.0, (initials, plain)


def test_a_budget_below_a_characters_tokens_is_refused(encoder: Embedder) -> None:
    """semchunk cannot cut inside a character: with a budget under one Hangul syllable's
    three word pieces it recursed until Python's limit."""
    assert encoder.count_tokens("힝") == 3
    with pytest.raises(ValueError, match=f"below {MIN_TOKENS}"):
        plan("힝", encoder, 2)
    packed = plan("힝" * 50, encoder, MIN_TOKENS)
    assert all(encoder.count_tokens(t) <= MIN_TOKENS for t in packed.texts())


@given(TEXTS, BUDGETS, st.sampled_from([1, 7, 64, 300]))
def test_chunks_hold_any_text_within_the_character_bound(
    encoder: Embedder, text: str, budget: int, max_chars: int
) -> None:
    """The tokenizer reads an unbroken run of over 100 characters as one token: a chunk within
    its token budget is held to a number of characters too."""
    packed = plan(text, encoder, budget, max_chars)
    _assert_spans_hold(text, packed.units)
    assert all(len(t) <= max_chars for t in packed.texts())
    assert all(encoder.count_tokens(t) <= budget for t in packed.texts())


@pytest.mark.parametrize(
    "blob",
    [
        bytes(range(256)).hex() * 600,  # a hex dump: one "word"
        "\n".join(f"{n:0128x}  file-{n}.tar.gz" for n in range(400)),  # a SHA512SUMS file
        "สวัสดีครับยินดีต้อนรับ" * 2000,  # Thai: no spaces between words
        "🙂🚀" * 5000,
    ],
    ids=["hex", "sha512sums", "thai", "emoji"],
)
def test_text_the_tokenizer_reads_as_few_tokens_is_cut_at_the_character_bound(
    encoder: Embedder, blob: str
) -> None:
    text = f"Firmware notes follow.\n\n{blob}\n\nThe Zorblax reset code is 7731.\n"
    texts = plan(text, encoder).texts()
    assert max(len(t) for t in texts) <= MAX_CHARS
    assert "".join(texts).replace("\n", "") == text.replace("\n", "").strip()
    assert texts[-1].endswith("The Zorblax reset code is 7731.")
    assert len(texts[-1]) <= MAX_CHARS


def test_a_passage_read_into_a_prompt_is_clipped_to_the_character_bound() -> None:
    assert clipped("short") == "short"
    long = clipped("x" * 100_000)
    assert len(long) == MAX_CHARS and long.endswith("…")


@given(TEXTS)
def test_token_starts_tokenized_in_slices_are_those_of_the_whole_text(text: str) -> None:
    """A whole document tokenized at once held some 200 bytes a character (1 GB for 5 MB of
    Markdown); slices cut after a space or a line break give the same offsets, because the
    tokenizer splits words there. A run with neither (a hex dump) is cut where it must be."""
    from store.knowledge import embeddings
    from store.knowledge.encoder_onnx import tokenizer

    whole = [a for a, _ in tokenizer().encode(text, add_special_tokens=False).offsets]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embeddings, "TOKENIZE_CHARS", 16)
        sliced = Embedder().token_starts(text).tolist()
    if re.search(r"[^ \n]{16}", text) is None:
        assert sliced == whole
    else:
        assert sliced == sorted(sliced) and all(0 <= a < len(text) for a in sliced)


@pytest.mark.parametrize("kind", ["minilm-int8", "minilm-float32"])
def test_a_large_documents_chunks_are_embedded_a_slice_at_a_time_with_the_same_result(
    kind: str,
) -> None:
    """The encodings (and the float model's states of every token) of one document's 35,000
    chunks were held at once, gigabytes of them; slices give the same vectors and sums (the
    same directions for the int8 model, whose activations are quantised over each batch)."""
    from store.knowledge import embeddings

    texts = [f"Chunk {i}. Kittens learn to hunt. Dogs bark at strangers {i}." for i in range(7)]
    units = [[(0, 9), (10, len(t))] for t in texts]
    encoder = Embedder(kind)
    whole = encoder.encode_units(texts, units)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embeddings, "ENCODE_SLICE", 3)
        sliced = encoder.encode_units(texts, units)
    cosines = (whole[0] * sliced[0]).sum(axis=1)
    assert cosines.min() > (0.99 if kind == "minilm-int8" else 0.99999), cosines
    assert len(whole[1]) == len(sliced[1]) == 7
    for one, other in zip(whole[1], sliced[1], strict=True):
        assert one.shape == other.shape == (2, embeddings.DIMS)
        unit = np.linalg.norm(one, axis=1) * np.linalg.norm(other, axis=1)
        assert ((one * other).sum(axis=1) / unit).min() > (
            0.97 if kind == "minilm-int8" else 0.9999
        )
    assert all(np.array_equal(a, b) for a, b in zip(whole[2], sliced[2], strict=True))
    alone = encoder.encode(texts)  # the second pass, for the parts of cut chunks
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embeddings, "ENCODE_SLICE", 3)
        alone_sliced = encoder.encode(texts)
    assert (alone * alone_sliced).sum(axis=1).min() > (0.99 if kind == "minilm-int8" else 0.99999)


@given(
    st.integers(min_value=0, max_value=60),
    st.sampled_from([1, 2, 5, 4096]),
    st.integers(min_value=0, max_value=2**32 - 1),
)
def test_window_similarity_in_blocks_is_the_similarity_of_the_whole(
    units: int, block: int, seed: int
) -> None:
    """Worked out a block of gaps at a time (a large document's copies of every unit vector
    held some 700 MB), the similarity is the one of the definition: the cosine of the sums
    of up to WINDOW unit vectors, normalised, before and after each gap."""
    from store.knowledge import chunking

    vectors = np.random.default_rng(seed).normal(size=(units, 8)).astype(np.float32)
    vectors[::7] = 0.0  # a unit of no tokens
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    expected = []
    for gap in range(1, units):
        before = unit[max(0, gap - chunking.WINDOW) : gap].astype(np.float64).sum(axis=0)
        after = unit[gap : gap + chunking.WINDOW].astype(np.float64).sum(axis=0)
        norms = np.linalg.norm(before) * np.linalg.norm(after)
        expected.append(before @ after / norms if norms > 0 else 0.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunking, "SIMILARITY_BLOCK", block)
        found = chunking._window_similarity(vectors)
    assert found.dtype == np.float32 and found.shape == (max(units - 1, 0),)
    assert np.allclose(found, expected, atol=1e-5)
