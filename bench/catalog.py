"""Knowledge catalog benchmark: ingest rate, and query latency against bm25s and numpy cosine.

    python bench/catalog.py            # ingest 2,000 chunks; queries at 10k and 100k chunks
    python bench/catalog.py --quick    # ingest 200 chunks; queries at 2k and 10k chunks

Corpus: synthetic passages of 40-70 words, each drawn from one of 40 topic vocabularies plus
common English words (Zipf-weighted), so BM25 and the embeddings both have signal.
Ingest runs the real pipeline (read → chunk → embed → batched commits) into a file image.
For the latency part, embedding 100k passages on a small CPU would take hours, so a base set of
passages is embedded for real and the rest are *tiled*: passage i reuses base vector i mod B
plus Gaussian noise (σ = 0.02 per dimension, renormalised), and gets freshly generated text.
The catalog, bm25s and numpy all see the same texts and vectors. Catalog latency includes
embedding the query; the numpy baseline is given precomputed query vectors (pure search cost),
so the ratio against numpy also shows what query embedding costs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from store.catalog import KnowledgeCatalog, PreparedDocument  # noqa: E402
from store.embeddings import Embedder  # noqa: E402
from store.image import LivingImage  # noqa: E402
from store.ingest import ingest_paths, write_batch  # noqa: E402

COMMON = (
    "the of and to in is that it for as with was on be by this are from at or an which "
    "have has not but they were can all their more when one will there also into other "
    "system process value time data result first used between each two where most"
).split()
TOPICS = 40
TOPIC_WORDS = 60
QUERIES = 60
K = 10


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


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return statistics.median(ordered) * 1000, p95 * 1000


def bench_ingest(n_chunks: int, rng: random.Random, vocab: list[list[str]], tmp: Path) -> dict:
    docs = tmp / "docs"
    docs.mkdir()
    per_doc = 10
    for d in range(n_chunks // per_doc):
        topic = d % TOPICS
        text = "\n\n".join(passage(rng, vocab, topic) for _ in range(per_doc))
        (docs / f"doc{d:05}.txt").write_text(text)
    embedder = Embedder()
    embedder.encode(["warm up"])
    with LivingImage.open(f"file://{tmp / 'ingest.fs'}") as image:
        catalog = KnowledgeCatalog.open(image, embedder)
        started = time.perf_counter()
        report = ingest_paths(catalog, [docs])
        elapsed = time.perf_counter() - started
        texts = [t for d in report.added for _, _, t in catalog.chunk_texts(str(Path(d).resolve()))]
    started = time.perf_counter()
    embedder.encode(texts)
    embed_only = time.perf_counter() - started
    return {
        "chunks": report.chunks,
        "documents": len(report.added),
        "commits": report.commits,
        "seconds": elapsed,
        "chunks_per_s": report.chunks / elapsed,
        "embed_only_chunks_per_s": len(texts) / embed_only,
    }


def build(
    n: int, base_texts: list[str], base_vectors: np.ndarray, rng: random.Random, vocab, tmp: Path
) -> tuple[LivingImage, KnowledgeCatalog, list[str], np.ndarray]:
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
    catalog = KnowledgeCatalog.open(image, Embedder())
    per_doc, batch = 100, []
    for start in range(0, n, per_doc):
        rows = range(start, min(n, start + per_doc))
        batch.append(
            PreparedDocument(
                source=f"synthetic/{start // per_doc:05}",
                content_hash=str(start),
                format="text",
                metadata={},
                spans=[(0, len(texts[i]), texts[i]) for i in rows],
                vectors=matrix[list(rows)],
            )
        )
        if len(batch) == 20:
            write_batch(catalog, batch)
            batch = []
    if batch:
        write_batch(catalog, batch)
    return image, catalog, texts, matrix


def bench_queries(n: int, base_texts, base_vectors, rng, vocab, tmp: Path) -> dict:
    import bm25s

    started = time.perf_counter()
    image, catalog, texts, matrix = build(n, base_texts, base_vectors, rng, vocab, tmp)
    build_s = time.perf_counter() - started
    queries = [" ".join(rng.sample(vocab[rng.randrange(TOPICS)][:15], 3)) for _ in range(QUERIES)]
    qvecs = catalog.embedder.encode(queries)
    catalog.search(queries[0], K)  # loads the vector cache (timed apart)
    started = time.perf_counter()
    catalog.vectors.clear()
    catalog.search(queries[0], K)
    cache_load_s = time.perf_counter() - started
    timings: dict[str, list[float]] = {m: [] for m in ("hybrid", "lexical", "dense")}
    for q in queries:
        for mode in timings:
            t = time.perf_counter()
            catalog.search(q, K, mode=mode, record=False)
            timings[mode].append(time.perf_counter() - t)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, show_progress=False), show_progress=False)
    bm25_t = []
    for q in queries:
        t = time.perf_counter()
        retriever.retrieve(bm25s.tokenize([q], show_progress=False), k=K, show_progress=False)
        bm25_t.append(time.perf_counter() - t)
    numpy_t = []
    for qv in qvecs:
        t = time.perf_counter()
        scores = matrix @ qv
        top = np.argpartition(-scores, K)[:K]
        top[np.argsort(-scores[top])]
        numpy_t.append(time.perf_counter() - t)
    image.close()
    rows = {m: percentiles(v) for m, v in timings.items()}
    rows["bm25s"] = percentiles(bm25_t)
    rows["numpy cosine"] = percentiles(numpy_t)
    return {"chunks": n, "build_s": build_s, "cache_load_s": cache_load_s, "latency_ms": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    args = parser.parse_args()
    ingest_n, sizes, base_n = (
        (200, (2_000, 10_000), 300) if args.quick else (2_000, (10_000, 100_000), 2_000)
    )
    rng = random.Random(7)
    vocab = vocabulary(rng)
    results: dict = {"quick": args.quick, "machine": platform.platform(), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        results["ingest"] = bench_ingest(ingest_n, rng, vocab, tmp)
        ing = results["ingest"]
        print(
            f"ingest: {ing['chunks']} chunks in {ing['seconds']:.1f}s = "
            f"{ing['chunks_per_s']:.1f} chunks/s ({ing['commits']} commits); embedding alone "
            f"{ing['embed_only_chunks_per_s']:.1f} chunks/s; "
            f"ratio {ing['chunks_per_s'] / ing['embed_only_chunks_per_s']:.2f}"
        )
        base_texts = [passage(rng, vocab, i % TOPICS) for i in range(base_n)]
        base_vectors = Embedder().encode(base_texts)
        results["queries"] = []
        print(
            f"\nquery latency, k={K}, {QUERIES} queries; {base_n} real embeddings tiled with "
            "noise σ=0.02 beyond that (see docstring)"
        )
        header = f"{'chunks':>8} {'engine':<14} {'p50 ms':>8} {'p95 ms':>8} {'p95 / ours':>11}"
        print(header)
        for n in sizes:
            row = bench_queries(n, base_texts, base_vectors, rng, vocab, tmp)
            results["queries"].append(row)
            lat = row["latency_ms"]
            for engine, (p50, p95) in lat.items():
                ref = lat["lexical"][1] if engine == "bm25s" else lat["hybrid"][1]
                if engine == "numpy cosine":
                    ref = lat["dense"][1]
                print(f"{n:>8} {engine:<14} {p50:8.2f} {p95:8.2f} {p95 / ref:11.2f}")
            print(
                f"{n:>8} build {row['build_s']:.1f}s, vector cache load "
                f"{row['cache_load_s'] * 1000:.0f} ms"
            )
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "catalog.json").write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out / 'catalog.json'}")
    print("ratios: bm25s vs our lexical mode, numpy vs our dense mode, the rest vs hybrid")


if __name__ == "__main__":
    main()
