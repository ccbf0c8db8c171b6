"""Knowledge catalog benchmark: ingest time by where it goes, query latency against bm25s and
numpy cosine at 10k and 100k chunks for three kinds of query and a filter, and the curator.

    python bench/catalog.py            # ingest 100 files; queries at 10k and 100k chunks
    python bench/catalog.py --quick    # ingest 10 files; queries at 2k and 10k chunks

Corpus: synthetic passages of 40-70 words, each drawn from one of 40 topic vocabularies plus
common English words (Zipf-weighted), so BM25 and the embeddings both have signal.

Ingest runs the real pipeline (read → sentences → topic shifts → packing → embed → batched
commits) on files of 10 passages into a file image, and splits its time: the embedding model
(every encode — chunk vectors and the sentence vectors the chunker compares for topic shifts),
the model's tokenizer (token counts for packing), the image (write transactions: BM25 and
field indexing, commits, and the cache updates after them) and the rest (reading files,
splitting sentences).

Queries: embedding 100k passages on a small CPU would take hours, so the ingested chunks'
real vectors are *tiled*: passage i reuses base vector i mod B plus Gaussian noise (σ = 0.02
per dimension, renormalised) and gets freshly generated text. The catalog, bm25s and numpy all
see the same texts and vectors. Query kinds, 60 queries each:

    rare      two words from the tail of one topic's vocabulary
    natural   an English question around one or two topic words
    common    three frequent words that are not stop words
    filtered  the natural questions, restricted by a metadata filter to half the documents
              (one filter for the whole run, as in a batch with --where: the catalog maps it
              to rows once per catalog version and reuses that)

Each set runs twice: the first pass ("cold") is the first use of each word's postings since
the caches loaded, the second is the latency reported. Columns: embed = the query embedding
alone; hybrid = our end-to-end search, embedding included (the 50 ms target applies to it);
lexical vs bm25s, both given the query text; dense vs numpy, both given the query vector (ours
is catalog.search(query_vector=...), cited hits included; numpy is matrix @ q + argpartition).
Our dense pass runs on one thread, and so does numpy's BLAS here (it is pinned before numpy
loads): with its default threads next to torch's, a 2,000-row product took 8 ms, not 0.1.
The curator folds the coldest chunks of the ingested image and of the smaller query image down
to 80% of their size, with an extractive stand-in for BABS (a model call per cluster comes on
top of the times shown).
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

from store.catalog import KnowledgeCatalog, PreparedDocument, stored_vector  # noqa: E402
from store.curator import Curator  # noqa: E402
from store.embeddings import FLOAT32, INT8, Embedder  # noqa: E402
from store.encoder_onnx import tokenizer  # noqa: E402
from store.image import LivingImage  # noqa: E402
from store.ingest import ingest_paths, write_batch  # noqa: E402

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
    image = LivingImage.open(f"file://{image_path}")
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
    for rep in range(reps):
        spent = {"st_windows_s": 0.0, "st_windows_cpu_s": 0.0, "st_own_chunks_s": 0.0}
        spent["st_own_chunks_cpu_s"] = 0.0

        def baselines(i: int, catalog: Any, spent: dict = spent) -> None:
            names = {str(p.resolve()) for p in slices[i]}
            with catalog.image.read() as root:
                own = [c.text for c in root["catalog"]["chunks"].values() if c.source in names]
            for key, texts in (("st_windows", windows[i]), ("st_own_chunks", own)):
                started, cpu_started = time.perf_counter(), time.process_time()
                raw.encode(texts)
                spent[f"{key}_s"] += time.perf_counter() - started
                spent[f"{key}_cpu_s"] += time.process_time() - cpu_started

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
    float32_row, f32_image, f32_catalog = ingest_once(slices, FLOAT32, tmp / "ingest-f32.fs")
    print(f"  float32 ingest {float32_row['seconds']:.1f} s ({load()})", flush=True)
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
        "float32_ingest": float32_row,
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
    """Cosine between the int8 encoder's chunk vectors and float32 ones of the same texts."""
    with catalog.image.read() as root:
        chunks = list(root["catalog"]["chunks"].values())[:500]
        ours = np.vstack([stored_vector(root["catalog"], c) for c in chunks])
        texts = [c.text for c in chunks]
    theirs = f32_catalog.embedder.encode(texts)
    cosines = (ours * theirs).sum(axis=1)
    return {"median": float(np.median(cosines)), "min": float(cosines.min()), "n": len(texts)}


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
    f32 = ing["float32_ingest"]
    share = 100 * f32["model_s"] / f32["seconds"]
    print(
        f"  the same pipeline with the float32 encoder: {f32['seconds']:.1f} s "
        f"({f32['chunks'] / f32['seconds']:.1f} chunks/s, model {share:.0f}%)"
    )
    q, d = ing["quality"], ing["drift"]
    print(
        f"  MRR@10 ({ing['pages']} NAME descriptions → their page): hybrid {q['hybrid']:.3f}"
        f" (float32 encoder {q['hybrid_float32']:.3f}), lexical {q['lexical']:.3f}, dense "
        f"{q['dense']:.3f}, bm25s {q['bm25s']:.3f}; int8 vs float32 chunk vectors: cosine median "
        f"{d['median']:.4f}, min {d['min']:.4f}"
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
    image = LivingImage.open(f"file://{tmp / f'query-{n}.fs'}")
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
        if len(batch) == 20:
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
            "lexical": percentiles(
                timed(
                    lambda q, f=filters: catalog.search(
                        q, K, filters=f, mode="lexical", record=False
                    ),
                    queries,
                )
            ),
            "bm25s": percentiles(
                timed(lambda q, m=weight_mask if filters else None: bm25(q, m), queries)
            ),
            "dense": percentiles(
                timed(
                    lambda p, f=filters: catalog.search(
                        p[0], K, filters=f, mode="dense", record=False, query_vector=p[1]
                    ),
                    pairs,
                )
            ),
            "numpy": percentiles(timed(lambda qv, m=mask: numpy_cosine(qv, m), qvecs)),
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
from store.catalog import KnowledgeCatalog
from store.image import LivingImage
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
    args = parser.parse_args()
    # --quick measures on the development half of the man pages, a full run on the held-out half.
    pages_n, held_out, reps = (30, False, 2) if args.quick else (300, True, 2)
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
            corpus = manpages.pages(pages_n, held_out=held_out)
            half = "held-out" if held_out else "development"
            print(f"ingest: {len(corpus)} man pages, {half} half of {manpages.MAN1}", flush=True)
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
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "catalog.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {out / 'catalog.json'}")


if __name__ == "__main__":
    main()
