"""Knowledge catalog benchmark: ingest of real text against sentence-transformers, retrieval
quality against bm25s, query latency against bm25s and numpy cosine at 10k and 100k chunks, the
first search of a new process, and the curator.

    python bench/catalog.py            # 300 held-out man pages; queries at 10k and 100k chunks
    python bench/catalog.py --quick    # 30 development man pages; queries at 2k and 10k chunks
    python bench/catalog.py --part ingest|queries

Ingest corpus: this machine's manual pages (bench/manpages.py: /usr/share/man/man1 rendered by
``man -l | col -bx``, every 7th page, 1-60 KB of text). The full run uses the held-out half of
that walk, --quick the development half; nothing was tuned on the held-out half. Ingest runs
the real pipeline (read → sentences → packing → one model pass for chunk vectors and topic
shifts → cut parts encoded again → commits every few seconds) into a file image with the int8
encoder, its time split between the model, its tokenizer, the image (write transactions and
cache updates) and the rest. Beside it, slice by slice (a few pages each, so the machine's
load falls on both alike), sentence-transformers in float32 — what a user would run — encodes
(a) the same pages cut every 200 tokens and (b) the chunks our ingest made. Ratios are their
time over ours (>1: our whole ingest is faster than their encoding alone), by wall clock and by
CPU time. The chunks sentence-transformers encoded in (b) go into a second catalog with those
float32 vectors: the same chunks, searched with float32 vectors — the quality effect of int8.

Quality: each page's NAME description (the text after the dash, without the command's name)
is a query whose answer is its page; the NAME section is left out of what is indexed. MRR@10
over distinct pages among 50 retrieved chunks, for hybrid (int8 and float32 vectors),
lexical, dense and bm25s over the same chunks.

Queries: embedding 100k passages on a small CPU would take hours, so 1,000 synthetic passages
(40 topic vocabularies plus Zipf-weighted common English words) are embedded and *tiled*:
passage i reuses base vector i mod B plus Gaussian noise (σ = 0.02 per dimension,
renormalised) and gets freshly generated text. The catalog, bm25s and numpy all see the same
texts and vectors. Query kinds, 60 queries each:

    rare      two words from the tail of one topic's vocabulary
    natural   an English question around one or two topic words
    common    three frequent words that are not stop words
    filtered  the natural questions, restricted by a metadata filter to half the documents
              (one filter for the whole run, as in a batch with --where)

Hybrid runs each set twice (cold: first use of each word's postings; then warm, reported).
Lexical and bm25s, and dense and numpy, are timed query by query in turn, five rounds over the
set; p50 and p95 are the medians over the rounds. embed = the query embedding alone;
hybrid = our end-to-end search, embedding included (the 50 ms target applies to it);
lexical vs bm25s, both given the query text, ours returning cited hits; dense vs numpy, both
given the query vector. Our dense pass runs on one thread, and so does numpy's BLAS here.
First search: a new Python process opens the 100k image and searches once, lexical alone, or
hybrid with the encoder loaded beforehand (its load time printed apart).
The curator folds the coldest chunks of the ingested image and of the smaller query image down
to 80% of their size, with an extractive stand-in for BABS (a model call per cluster comes on
top of the times shown). Every line prints the load average: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for _blas_threads in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas_threads, "1")

import manpages  # noqa: E402
import numpy as np  # noqa: E402

from batos.shell.runtime import open_image  # noqa: E402
from store.core.image import LivingImage  # noqa: E402
from store.knowledge.catalog import KnowledgeCatalog, PreparedDocument, stored_vector  # noqa: E402
from store.knowledge.curator import Curator  # noqa: E402
from store.knowledge.embeddings import FLOAT32, INT8, Embedder  # noqa: E402
from store.knowledge.encoder_onnx import tokenizer  # noqa: E402
from store.knowledge.ingest import ingest_paths, write_batch  # noqa: E402

COMMON = (
    "the of and to in is that it for as with was on be by this are from at or an which "
    "have has not but they were can all their more when one will there also into other "
    "system process value time data result first used between each two where most"
).split()
#: Frequent words the BM25 stop list keeps (the ones a "common" query is made of).
FREQUENT = "system process value time data result first used between each two where most".split()
QUESTIONS = (
    "what does the {a} value have to do with {b} in the system",
    "how is {a} used when the process has more {b}",
    "where is the {a} data from and which result does it give",
    "why can {a} not be used with {b} at the same time",
    "which {a} is most used between each {b}",
)
TOPICS = 40
TOPIC_WORDS = 60
QUERIES = 60
K = 10
TARGET_MS = 50.0
FIRST_SEARCH_S = 0.5
#: Rounds over each query set when two contenders are timed query by query in turn.
ROUNDS = 5
#: Slices of the ingest corpus that alternate with the baselines.
SLICES = 10


def vocabulary(rng: random.Random) -> list[list[str]]:
    syllables = "ka lo mi ren tas vor qui zel bra dun fei gor hap jit lum nex".split()
    return [
        [
            "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))
            for _ in range(TOPIC_WORDS)
        ]
        for _ in range(TOPICS)
    ]


def passage(rng: random.Random, vocab: list[list[str]], topic: int) -> str:
    words = []
    for _ in range(rng.randint(40, 70)):
        if rng.random() < 0.45:
            words.append(vocab[topic][min(int(rng.paretovariate(1.2)) - 1, TOPIC_WORDS - 1)])
        else:
            words.append(rng.choice(COMMON))
    sentences, out = [], []
    for i, word in enumerate(words, 1):
        out.append(word)
        if i % rng.randint(9, 14) == 0:
            sentences.append(" ".join(out).capitalize() + ".")
            out = []
    if out:
        sentences.append(" ".join(out).capitalize() + ".")
    return " ".join(sentences)


def query_sets(rng: random.Random, vocab: list[list[str]]) -> dict[str, list[str]]:
    def topic() -> list[str]:
        return vocab[rng.randrange(TOPICS)]

    rare = [" ".join(rng.sample(topic()[20:], 2)) for _ in range(QUERIES)]
    natural = []
    for _ in range(QUERIES):
        words = topic()
        template = rng.choice(QUESTIONS)
        natural.append(template.format(a=rng.choice(words[:10]), b=rng.choice(words[:30])))
    common = [" ".join(rng.sample(FREQUENT, 3)) for _ in range(QUERIES)]
    return {"rare": rare, "natural": natural, "common": common}


def percentiles(samples: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return statistics.median(ordered) * 1000, p95 * 1000


def timed(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[float]:
    samples = []
    for item in items:
        started = time.perf_counter()
        fn(item)
        samples.append(time.perf_counter() - started)
    return samples


def interleaved(
    contenders: dict[str, Callable[[Any], Any]], items: Sequence[Any]
) -> dict[str, tuple[float, float]]:
    """p50 and p95 (ms) of each contender, run item by item in turn, ROUNDS times over the
    items: the medians of the rounds' p50 and p95, so one burst of load elsewhere on the
    machine moves one round of both, not all of one."""
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(ROUNDS):
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        for item in items:
            for name, fn in contenders.items():
                started = time.perf_counter()
                fn(item)
                samples[name].append(time.perf_counter() - started)
        for name, values in samples.items():
            rounds[name].append(percentiles(values))
    return {
        name: (statistics.median(r[0] for r in got), statistics.median(r[1] for r in got))
        for name, got in rounds.items()
    }


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} {five:.1f} {fifteen:.1f}"


# -- ingest ---------------------------------------------------------------------------------


class TimedEmbedder(Embedder):
    """The real embedder, adding up the time spent in the model and in its tokenizer."""

    def __init__(self, encoder: str) -> None:
        super().__init__(encoder)
        self.model_s = 0.0
        self.tokenizer_s = 0.0

    def _timed(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            setattr(self, key, getattr(self, key) + time.perf_counter() - started)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self._timed("model_s", super().encode, texts)

    def encode_units(self, texts: Sequence[str], units: Any) -> Any:
        return self._timed("model_s", super().encode_units, texts, units)

    def count_tokens(self, text: str) -> int:
        return self._timed("tokenizer_s", super().count_tokens, text)

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        return self._timed("tokenizer_s", super().count_tokens_batch, texts)

    def token_starts(self, text: str) -> np.ndarray:
        return self._timed("tokenizer_s", super().token_starts, text)


def ingest_once(
    slices: list[list[Path]],
    encoder: str,
    image_path: Path,
    between: Callable[[int, Any], None] | None = None,
) -> tuple[dict, Any, Any]:
    """Real ``ingest_paths`` runs, one per slice of the files, into one new file image, their
    time split by where it went; ``between(i, catalog)`` runs after slice i, untimed."""
    embedder = TimedEmbedder(encoder)
    embedder.encode(["warm up", "the model"])  # loading the model is not ingest work
    embedder.model_s = embedder.tokenizer_s = 0.0
    image = open_image(f"file://{image_path}", create=True)
    catalog = KnowledgeCatalog.open(image, embedder)
    writing = {"s": 0.0}
    transact, committed = image.transact, catalog.committed

    def timed_transact(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return transact(*args, **kwargs)
        finally:
            writing["s"] += time.perf_counter() - started

    def timed_committed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return committed(*args, **kwargs)
        finally:
            writing["s"] += time.perf_counter() - started

    image.transact, catalog.committed = timed_transact, timed_committed
    totals = {"chunks": 0, "documents": 0, "failed": 0, "bytes": 0, "commits": 0}
    elapsed = cpu = 0.0
    commits_at: list[float] = []
    for i, paths in enumerate(slices):
        started, cpu_started = time.perf_counter(), time.process_time()
        offset = elapsed
        seen = totals["commits"]

        def on_file(
            path: Path, outcome: str, report: Any, at: float = offset - started, n: int = seen
        ) -> None:
            if len(commits_at) < n + report.commits:
                commits_at.append(at + time.perf_counter())

        report = ingest_paths(catalog, paths, on_file=on_file)
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu_started
        totals["chunks"] += report.chunks
        totals["documents"] += len(report.added)
        totals["failed"] += len(report.failed)
        totals["bytes"] += report.bytes
        totals["commits"] += report.commits
        if between is not None:
            image.transact, catalog.committed = transact, committed
            between(i, catalog)
            image.transact, catalog.committed = timed_transact, timed_committed
    image.transact, catalog.committed = transact, committed
    gaps = np.diff([0.0, *commits_at]) if commits_at else np.zeros(1)
    row = {
        "encoder": encoder,
        **totals,
        "first_commit_s": commits_at[0] if commits_at else None,
        "longest_between_commits_s": float(gaps.max()),
        "seconds": elapsed,
        "cpu_s": cpu,
        "model_s": embedder.model_s,
        "tokenizer_s": embedder.tokenizer_s,
        "image_s": writing["s"],
        "other_s": elapsed - embedder.model_s - embedder.tokenizer_s - writing["s"],
    }
    return row, image, catalog


def bench_ingest(corpus: list[manpages.Page], tmp: Path, reps: int) -> tuple[dict, Any, Any]:
    """Our ingest against sentence-transformers (float32, torch) encoding the same text:
    (a) the pages cut every 200 tokens, (b) our own chunks' texts. The three alternate slice by
    slice (a few pages each), so a change in the machine's load falls on all of them."""
    paths = manpages.write(corpus, tmp / "pages")
    raw = Embedder(FLOAT32)
    raw.encode(["warm up", "the model"])
    per_slice = max(1, len(paths) // SLICES)
    slices = [paths[i : i + per_slice] for i in range(0, len(paths), per_slice)]

    def offsets(text: str) -> list[tuple[int, int]]:
        return tokenizer().encode(text, add_special_tokens=False).offsets

    windows = [
        [w for p in s for w in manpages.pieces(p.read_text(encoding="utf-8"), offsets, 200)]
        for s in slices
    ]
    runs: list[dict] = []
    keep: tuple[Any, Any] | None = None
    float32_docs: list[PreparedDocument] = []
    for rep in range(reps):
        spent = {"st_windows_s": 0.0, "st_windows_cpu_s": 0.0, "st_own_chunks_s": 0.0}
        spent["st_own_chunks_cpu_s"] = 0.0

        def baselines(i: int, catalog: Any, spent: dict = spent, rep: int = rep) -> None:
            names = {str(p.resolve()) for p in slices[i]}
            with catalog.image.read() as root:
                cat = root["catalog"]
                docs = [cat["documents"][n] for n in sorted(names) if n in cat["documents"]]
                own = [[cat["chunks"][c] for c in d.chunk_ids] for d in docs]
            texts = [c.text for chunks in own for c in chunks]
            for key, batch in (("st_windows", windows[i]), ("st_own_chunks", texts)):
                started, cpu_started = time.perf_counter(), time.process_time()
                vectors = raw.encode(batch)
                spent[f"{key}_s"] += time.perf_counter() - started
                spent[f"{key}_cpu_s"] += time.process_time() - cpu_started
            if rep == 0:  # the same chunks with float32 vectors: the quality effect of int8
                at = 0
                for doc, chunks in zip(docs, own, strict=True):
                    float32_docs.append(
                        PreparedDocument(
                            doc.source,
                            doc.content_hash,
                            doc.format,
                            {},
                            [(c.start, c.end, c.text) for c in chunks],
                            vectors[at : at + len(chunks)],
                        )
                    )
                    at += len(chunks)

        row, image, catalog = ingest_once(slices, INT8, tmp / f"ingest-{rep}.fs", baselines)
        row.update(spent, load=load())
        runs.append(row)
        print(
            f"  run {rep + 1}: ingest {row['seconds']:.1f} s, sentence-transformers on 200-token "
            f"windows {row['st_windows_s']:.1f} s, on our chunks {row['st_own_chunks_s']:.1f} s "
            f"({load()})",
            flush=True,
        )
        if keep is None:
            keep = (image, catalog)
        else:
            image.close()
    f32_image = open_image(f"file://{tmp / 'ingest-f32.fs'}", create=True)
    f32_catalog = KnowledgeCatalog.open(f32_image, raw)
    for first in range(0, len(float32_docs), 50):
        write_batch(f32_catalog, float32_docs[first : first + 50])
    median = {
        k: statistics.median(r[k] for r in runs)
        for k in runs[0]
        if k not in ("encoder", "load", "first_commit_s")
    }
    image, catalog = keep
    result = {
        "pages": len(corpus),
        "bytes": runs[0]["bytes"],
        "windows": sum(len(w) for w in windows),
        "slices": len(slices),
        "runs": runs,
        "median": median,
        "ratio_vs_windows": median["st_windows_s"] / median["seconds"],
        "ratio_vs_own_chunks": median["st_own_chunks_s"] / median["seconds"],
        "cpu_ratio_vs_windows": median["st_windows_cpu_s"] / median["cpu_s"],
        "quality": quality(corpus, catalog, f32_catalog),
        "drift": drift(catalog, f32_catalog),
    }
    f32_image.close()
    return result, image, catalog


def quality(corpus: list[manpages.Page], catalog: Any, f32_catalog: Any) -> dict:
    """MRR@10 of the right page for each page's NAME description, ours against bm25s over the
    same chunks (both asked for 50 chunks, ranked as distinct pages)."""
    import bm25s

    queries = [p.query for p in corpus]
    wanted = [str(Path("pages") / f"{p.name}.txt") for p in corpus]
    with catalog.image.read() as root:
        chunks = list(root["catalog"]["chunks"].values())
        texts = [c.text for c in chunks]
        sources = [c.source for c in chunks]
    tail = {s: str(Path("pages") / Path(s).name) for s in sources}
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, show_progress=False), show_progress=False)
    found, _ = retriever.retrieve(
        bm25s.tokenize(queries, show_progress=False), k=50, show_progress=False
    )
    out = {"bm25s": manpages.mrr_at_10([[tail[sources[i]] for i in row] for row in found], wanted)}
    for label, cat, mode in (
        ("hybrid", catalog, "hybrid"),
        ("lexical", catalog, "lexical"),
        ("dense", catalog, "dense"),
        ("hybrid_float32", f32_catalog, "hybrid"),
    ):
        ranked = [
            [tail.get(h.source, h.source) for h in cat.search(q, 50, mode=mode, record=False)]
            for q in queries
        ]
        out[label] = manpages.mrr_at_10(ranked, wanted)
    return out


def drift(catalog: Any, f32_catalog: Any) -> dict:
    """Cosine between the int8 encoder's chunk vectors and float32 ones of the same chunks."""

    def vectors(cat_: Any) -> dict[tuple[str, int, int], np.ndarray]:
        with cat_.image.read() as root:
            cat = root["catalog"]
            return {
                (c.source, c.start, c.end): stored_vector(cat, c) for c in cat["chunks"].values()
            }

    ours, theirs = vectors(catalog), vectors(f32_catalog)
    cosines = np.array([float(ours[k] @ theirs[k]) for k in ours if k in theirs])
    return {"median": float(np.median(cosines)), "min": float(cosines.min()), "n": len(cosines)}


def print_ingest(ing: dict) -> None:
    m = ing["median"]
    total = m["seconds"]
    first = ing["runs"][0]["first_commit_s"] or 0.0
    print(
        f"ingest of {ing['pages']} man pages ({ing['bytes'] / 1e6:.2f} MB of text): "
        f"{m['chunks']:.0f} chunks in {total:.1f} s = {m['chunks'] / total:.1f} chunks/s, "
        f"{ing['bytes'] / total / 1e6:.3f} MB/s (median of {len(ing['runs'])} runs); "
        f"{m['commits']:.0f} commits, the first after {first:.1f} s, "
        f"at most {m['longest_between_commits_s']:.1f} s apart"
    )
    for name, key, what in (
        ("model", "model_s", "int8 encoder: chunk vectors (+ unit states), cut parts again"),
        ("tokenizer", "tokenizer_s", "token offsets and counts for packing"),
        ("image", "image_s", "write transactions (indexing, commits) and cache updates"),
        ("other", "other_s", "reading files, splitting sentences, topic shifts"),
    ):
        print(f"  {name:<10} {m[key]:7.1f} s {100 * m[key] / total:5.1f}%   {what}")
    print(
        f"  sentence-transformers float32 alone: the pages in {ing['windows']} 200-token windows "
        f"{m['st_windows_s']:.1f} s ({ing['bytes'] / m['st_windows_s'] / 1e6:.3f} MB/s), our "
        f"{m['chunks']:.0f} chunks {m['st_own_chunks_s']:.1f} s "
        f"({m['chunks'] / m['st_own_chunks_s']:.1f} chunks/s)"
    )
    print(
        f"  ratio, ingest end to end / encoding alone: {ing['ratio_vs_windows']:.2f}x against the "
        f"200-token windows (same text; {ing['cpu_ratio_vs_windows']:.2f}x in CPU time), "
        f"{ing['ratio_vs_own_chunks']:.2f}x against our chunks"
    )
    q, d = ing["quality"], ing["drift"]
    print(
        f"  MRR@10 ({ing['pages']} NAME descriptions → their page): hybrid {q['hybrid']:.3f}"
        f" (same chunks, float32 vectors {q['hybrid_float32']:.3f}), lexical "
        f"{q['lexical']:.3f}, dense {q['dense']:.3f}, bm25s {q['bm25s']:.3f}; int8 vs float32 "
        f"chunk vectors: cosine median {d['median']:.4f}, min {d['min']:.4f}"
    )


# -- queries --------------------------------------------------------------------------------


def build(
    n: int, base_texts: list[str], base_vectors: np.ndarray, rng: random.Random, vocab, tmp: Path
) -> tuple[LivingImage, KnowledgeCatalog, list[str], np.ndarray, np.ndarray]:
    nprng = np.random.default_rng(n)
    texts, vectors = [], []
    for i in range(n):
        b = i % len(base_texts)
        texts.append(base_texts[b] if i < len(base_texts) else passage(rng, vocab, b % TOPICS))
        v = base_vectors[b] + (
            nprng.normal(0, 0.02, base_vectors.shape[1]) if i >= len(base_texts) else 0
        )
        vectors.append(v / np.linalg.norm(v))
    matrix = np.asarray(vectors, dtype=np.float32)
    image = open_image(f"file://{tmp / f'query-{n}.fs'}", create=True)
    catalog = KnowledgeCatalog.open(image, Embedder(INT8))
    per_doc, batch = 100, []
    shelf = np.zeros(n, dtype=bool)  # True: on shelf "a", what the filtered queries accept
    for start in range(0, n, per_doc):
        rows = range(start, min(n, start + per_doc))
        on_a = (start // per_doc) % 2 == 0
        shelf[list(rows)] = on_a
        batch.append(
            PreparedDocument(
                source=f"synthetic/{start // per_doc:05}",
                content_hash=str(start),
                format="text",
                metadata={"shelf": "a" if on_a else "b"},
                spans=[(0, len(texts[i]), texts[i]) for i in rows],
                vectors=matrix[list(rows)],
            )
        )
        if len(batch) == 100:  # few commits: each rewrites the index buckets it touched
            write_batch(catalog, batch)
            batch = []
    if batch:
        write_batch(catalog, batch)
    return image, catalog, texts, matrix, shelf


def bench_queries(n: int, base_texts, base_vectors, rng, vocab, tmp: Path) -> dict:
    import bm25s

    started = time.perf_counter()
    image, catalog, texts, matrix, shelf = build(n, base_texts, base_vectors, rng, vocab, tmp)
    build_s = time.perf_counter() - started
    sets = query_sets(rng, vocab)
    sets["filtered"] = sets["natural"]
    where = {"shelf": "a"}
    started = time.perf_counter()
    catalog.search("warm up", K, record=False)  # loads the vector matrix and the chunk lengths
    cache_load_s = time.perf_counter() - started
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, show_progress=False), show_progress=False)
    weight_mask = shelf.astype(np.float32)

    def bm25(q: str, mask: np.ndarray | None = None) -> Any:
        tokens = bm25s.tokenize([q], show_progress=False)
        return retriever.retrieve(tokens, k=K, show_progress=False, weight_mask=mask)

    def numpy_cosine(qv: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        scores = matrix @ qv
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        top = np.argpartition(-scores, K)[:K]
        return top[np.argsort(-scores[top])]

    rows: dict[str, dict[str, Any]] = {}
    for kind, queries in sets.items():
        filters = where if kind == "filtered" else None
        qvecs = [catalog.embedder.encode_one(q) for q in queries]

        def hybrid(q: str, filters: dict | None = filters) -> Any:
            return catalog.search(q, K, filters=filters, record=False)

        cold = timed(hybrid, queries)
        warm = timed(hybrid, queries)
        pairs = list(zip(queries, qvecs, strict=True))
        mask = shelf if filters else None
        rows[kind] = {
            "embed": percentiles(timed(catalog.embedder.encode_one, queries)),
            "hybrid": percentiles(warm),
            "hybrid_cold": percentiles(cold),
            **interleaved(
                {
                    "lexical": lambda p, f=filters: catalog.search(
                        p[0], K, filters=f, mode="lexical", record=False
                    ),
                    "bm25s": lambda p, m=weight_mask if filters else None: bm25(p[0], m),
                },
                pairs,
            ),
            **interleaved(
                {
                    "dense": lambda p, f=filters: catalog.search(
                        p[0], K, filters=f, mode="dense", record=False, query_vector=p[1]
                    ),
                    "numpy": lambda p, m=mask: numpy_cosine(p[1], m),
                },
                pairs,
            ),
        }
    result: dict[str, Any] = {
        "chunks": n,
        "build_s": build_s,
        "image_write_chunks_per_s": n / build_s,
        "cache_load_s": cache_load_s,
        "latency_ms": rows,
        "load": load(),
    }
    result["catalog"] = (image, catalog)
    return result


def print_queries(row: dict) -> None:
    n = row["chunks"]
    lat = row["latency_ms"]
    for kind, r in lat.items():
        print(
            f"{n:>7} {kind:<9}"
            f" {r['embed'][0]:6.1f} {r['embed'][1]:6.1f} |"
            f" {r['hybrid'][0]:6.1f} {r['hybrid'][1]:6.1f} {r['hybrid_cold'][1]:6.1f} |"
            f" {r['lexical'][0]:6.1f} {r['lexical'][1]:6.1f}"
            f" {r['bm25s'][0]:6.1f} {r['bm25s'][1]:6.1f} {r['lexical'][1] / r['bm25s'][1]:5.2f} |"
            f" {r['dense'][0]:6.1f} {r['dense'][1]:6.1f}"
            f" {r['numpy'][0]:6.1f} {r['numpy'][1]:6.1f} {r['dense'][1] / r['numpy'][1]:5.2f}"
        )
    print(
        f"{n:>7} built in {row['build_s']:.0f} s ({row['image_write_chunks_per_s']:.0f} chunks/s "
        f"written to the image, no model); caches loaded by the first search in "
        f"{row['cache_load_s'] * 1000:.0f} ms; {row['load']}"
    )


FIRST_SEARCH = """
import sys, time
started = time.perf_counter()
from store.knowledge.catalog import KnowledgeCatalog
from store.core.image import LivingImage
image = LivingImage.open("file://" + sys.argv[1])
catalog = KnowledgeCatalog.open(image)
opened = time.perf_counter()
if sys.argv[2] == "hybrid":
    catalog.embedder.encode_one("load the model first")
loaded = time.perf_counter()
catalog.search("vorlum kaqui time data", 10, mode=sys.argv[2], record=False)
searched = time.perf_counter()
print(opened - started, loaded - opened, searched - loaded)
"""


def first_search(path: Path) -> dict:
    """The first search of a new process on the image at ``path``: lexical alone, and hybrid
    with the model loaded beforehand (its load is reported apart)."""
    out = {}
    for mode in ("lexical", "hybrid"):
        done = subprocess.run(
            [sys.executable, "-c", FIRST_SEARCH, str(path), mode],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
        opened, loaded, searched = map(float, done.stdout.split()[-3:])
        out[f"{mode}_s"] = searched
        out["open_s"] = opened
        if mode == "hybrid":
            out["model_load_s"] = loaded
    return out


def print_first_search(n: int, row: dict) -> None:
    print(
        f"{n:>7} first search in a new process: lexical {row['lexical_s'] * 1000:.0f} ms, hybrid "
        f"{row['hybrid_s'] * 1000:.0f} ms (after opening the image {row['open_s']:.2f} s and "
        f"loading the encoder {row['model_load_s']:.2f} s); {load()}"
    )


# -- curator --------------------------------------------------------------------------------


def extractive(texts: list[str]) -> str:
    """Stand-in for BABS: the first sentence of each passage."""
    return " ".join(t.split(". ")[0].rstrip(".") + "." for t in texts)


def bench_curator(catalog: KnowledgeCatalog, label: str) -> dict:
    live = catalog.stats()["chunks"]
    curator = Curator(catalog, extractive, max_chunks=int(live * 0.8))
    started = time.perf_counter()
    clusters = curator.plan()
    plan_s = time.perf_counter() - started
    started = time.perf_counter()
    report = curator.run()
    run_s = time.perf_counter() - started
    return {
        "image": label,
        "live_before": report.live_before,
        "live_after": report.live_after,
        "clusters": len(report.archives),
        "folded": report.archived_chunks,
        "plan_s": plan_s,
        "run_s": run_s,
        "folded_per_s": report.archived_chunks / run_s,
        "planned_clusters": len(clusters),
    }


def print_curator(row: dict) -> None:
    print(
        f"curator ({row['image']}): {row['live_before']} → {row['live_after']} live chunks, "
        f"{row['folded']} folded into {row['clusters']} summaries in {row['run_s']:.1f} s "
        f"(plan {row['plan_s']:.2f} s) = {row['folded_per_s']:.0f} chunks folded/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument(
        "--part", choices=("all", "ingest", "queries"), default="all", help="run only one part"
    )
    parser.add_argument("--pages", type=int, help="man pages to ingest (300; --quick 30)")
    parser.add_argument("--reps", type=int, default=1, help="ingest runs (median reported)")
    parser.add_argument(
        "--skip", type=int, default=0, help="leave out the walk's first N pages (a later slice)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "results" / "catalog.json",
        help="where the figures are written as JSON",
    )
    args = parser.parse_args()
    # --quick measures on the development half of the man pages, a full run on the held-out half.
    pages_n, held_out = (30, False) if args.quick else (300, True)
    pages_n, reps = args.pages or pages_n, args.reps
    base_n, sizes = (300, (2_000, 10_000)) if args.quick else (1_000, (10_000, 100_000))
    rng = random.Random(7)
    vocab = vocabulary(rng)
    results: dict = {
        "quick": args.quick,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load_before": load(),
        "curator": [],
    }
    print(f"{platform.platform()}, {os.cpu_count()} CPUs, {load()}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.part in ("all", "ingest"):
            corpus = manpages.pages(args.skip + pages_n, held_out=held_out)[args.skip :]
            half = "held-out" if held_out else "development"
            print(
                f"ingest: {len(corpus)} man pages ({args.skip} skipped), {half} half of "
                f"{manpages.MAN1}",
                flush=True,
            )
            results["ingest"], image, catalog = bench_ingest(corpus, tmp, reps)
            print_ingest(results["ingest"])
            results["curator"].append(
                bench_curator(catalog, f"man pages, {catalog.stats()['chunks']} chunks")
            )
            image.close()
        if args.part in ("all", "queries"):
            base_texts = [passage(rng, vocab, i % TOPICS) for i in range(base_n)]
            base_vectors = Embedder(INT8).encode(base_texts)
            print(
                f"\nquery latency in ms, k={K}, {QUERIES} queries per kind; {base_n} real "
                "embeddings tiled with noise σ=0.02 beyond that (see docstring)"
            )
            print(
                f"{'chunks':>7} {'kind':<9} {'embed':>13} | {'hybrid (ours, end to end)':>20} |"
                f" {'lexical':>13} {'bm25s':>13} {'ratio':>5} | {'dense*':>13} {'numpy*':>13}"
                f" {'ratio':>5}"
            )
            print(
                f"{'':>7} {'':<9} {'p50':>6} {'p95':>6} | {'p50':>6} {'p95':>6} {'cold95':>6} |"
                f" {'p50':>6} {'p95':>6} {'p50':>6} {'p95':>6} {'p95':>5} |"
                f" {'p50':>6} {'p95':>6} {'p50':>6} {'p95':>6} {'p95':>5}"
            )
            results["queries"] = []
            for n in sizes:
                row = bench_queries(n, base_texts, base_vectors, rng, vocab, tmp)
                image, catalog = row.pop("catalog")
                print_queries(row)
                if n == sizes[0]:
                    results["curator"].append(bench_curator(catalog, f"query image, {n} chunks"))
                image.close()
                if n == sizes[-1]:
                    row["first_search"] = first_search(tmp / f"query-{n}.fs")
                    print_first_search(n, row["first_search"])
                results["queries"].append(row)
            print("* given the query vector (embedding not included); ratios are ours / theirs")
    for row in results["curator"]:
        print_curator(row)
    verdicts = []
    if "ingest" in results:
        ing = results["ingest"]
        q = ing["quality"]
        verdicts.append(
            f"{'PASS' if ing['ratio_vs_windows'] >= 1.0 else 'MISS'}: ingest end to end at "
            f"{ing['ratio_vs_windows']:.2f}x sentence-transformers' float32 encoding of the same "
            "text (target ≥ 1.0x)"
        )
        verdicts.append(
            f"{'PASS' if q['hybrid'] >= q['bm25s'] else 'MISS'}: held-out MRR@10 hybrid "
            f"{q['hybrid']:.3f} against bm25s {q['bm25s']:.3f}"
        )
    if "queries" in results:
        largest = results["queries"][-1]
        worst = max(r["hybrid"][1] for r in largest["latency_ms"].values())
        verdicts.append(
            f"{'PASS' if worst <= TARGET_MS else 'MISS'}: hybrid search p95 at "
            f"{largest['chunks']:,} chunks, worst query kind {worst:.1f} ms against the "
            f"{TARGET_MS:.0f} ms target"
        )
        ratio = max(r["lexical"][1] / r["bm25s"][1] for r in largest["latency_ms"].values())
        verdicts.append(
            f"{'PASS' if ratio <= 1.0 else 'MISS'}: lexical p95 at {largest['chunks']:,} chunks, "
            f"worst query kind {ratio:.2f}x bm25s (target ≤ 1.0x)"
        )
        first = largest["first_search"]
        worst_first = max(first["lexical_s"], first["hybrid_s"])
        verdicts.append(
            f"{'PASS' if worst_first < FIRST_SEARCH_S else 'MISS'}: first search in a new "
            f"process at {largest['chunks']:,} chunks {worst_first:.2f} s (target < "
            f"{FIRST_SEARCH_S} s)"
        )
    for line in verdicts:
        print(f"{line} ({load()})")
    results["verdicts"] = verdicts
    results["load_after"] = load()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
