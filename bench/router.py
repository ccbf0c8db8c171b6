"""The CPU router against what a user would otherwise pick, on held-out requests.

    python bench/router.py [--quick]

Three ways to pick a persona from the same all-MiniLM-L6-v2 embedding: the router (logistic
regression, C and temperature cross-validated on the codex's examples), nearest centroid of
those examples (cosine), and zero-shot similarity to each persona's codex description (role
and activation, no examples). The alternatives' softmax temperature is fitted the same way,
on the training examples, so calibration is compared fairly. Accuracy, log-loss and ECE are
measured on tests/data/router_heldout.toml, which nothing was tuned on. Latency is per request
on CPU, end to end (encoding included, one request at a time, the methods interleaved) and for
the classifier alone on an encoded request. Targets from the issue: p50 ≤ 10 ms, top-1 ≥ 90%.
Prints a table with ratios to the router and writes bench/results/router.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from graph.router import FOLDS, Router, fit_temperature, train_router, training_set  # noqa: E402
from prototypes.codex import PERSONAS, Codex, load_codex  # noqa: E402
from store.embeddings import Embedder  # noqa: E402

HELDOUT = ROOT / "tests" / "data" / "router_heldout.toml"
#: Equal-width confidence bins of the expected calibration error.
ECE_BINS = 10


def heldout() -> tuple[list[str], list[str]]:
    data = tomllib.loads(HELDOUT.read_text(encoding="utf-8"))
    pairs = [(text, name) for name in PERSONAS for text in data[name]["requests"]]
    return [t for t, _ in pairs], [n for _, n in pairs]


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _linear(codex: Codex, embedder: Embedder, prototypes: np.ndarray, temperature: float) -> Router:
    """A similarity classifier as a Router: cosine to each prototype, softmax at a temperature."""
    return Router(
        tuple(codex.personas),
        prototypes,
        np.zeros(len(prototypes), dtype=np.float32),
        temperature,
        codex_version=codex.version,
        digest="",
        embedder=embedder,
    )


def nearest_centroid(codex: Codex, embedder: Embedder, vectors: np.ndarray, y: np.ndarray):
    """Centroids of the training examples; temperature from out-of-fold cosines."""
    from sklearn.model_selection import StratifiedKFold

    k = len(codex.personas)
    logits = np.zeros((len(y), k))
    for train, test in StratifiedKFold(FOLDS, shuffle=True, random_state=0).split(vectors, y):
        centroids = _unit(np.stack([vectors[train][y[train] == c].mean(0) for c in range(k)]))
        logits[test] = vectors[test] @ centroids.T
    temperature, _ = fit_temperature(logits, y)
    centroids = _unit(np.stack([vectors[y == c].mean(0) for c in range(k)]))
    return _linear(codex, embedder, centroids, temperature)


def zero_shot(codex: Codex, embedder: Embedder, vectors: np.ndarray, y: np.ndarray):
    """Cosine to each persona's description; only the temperature is fitted, on the examples."""
    descriptions = [f"{spec.role}. {spec.activation}" for spec in codex.personas.values()]
    prototypes = embedder.encode(descriptions)
    temperature, _ = fit_temperature(vectors @ prototypes.T, y)
    return _linear(codex, embedder, prototypes, temperature)


def quality(router: Router, vectors: np.ndarray, labels: list[str]) -> dict:
    names = list(router.personas)
    y = np.array([names.index(n) for n in labels])
    probs = router.probabilities(vectors).astype(float)
    top = probs.argmax(1)
    confidence = probs.max(1)
    correct = top == y
    ece = 0.0
    edges = np.linspace(0, 1, ECE_BINS + 1)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (confidence > lo) & (confidence <= hi)
        if inside.any():
            ece += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    routes = router.routes(labels, vectors)
    per_persona = {p: float(correct[y == i].mean()) for i, p in enumerate(names)}
    return {
        "top1": float(correct.mean()),
        "top2": float((np.argsort(-probs, 1)[:, :2] == y[:, None]).any(1).mean()),
        "log_loss": float(-np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, None)).mean()),
        "ece": float(ece),
        "mean_confidence": float(confidence.mean()),
        "answered_by_two": float(np.mean([len(r.chosen) > 1 for r in routes])),
        "right_persona_answers": float(
            np.mean([n in r.chosen for n, r in zip(labels, routes, strict=True)])
        ),
        "top1_per_persona": per_persona,
    }


def latency(methods: dict[str, Router], texts: list[str], count: int) -> dict:
    """Per-request seconds, end to end and for the classifier alone; methods interleaved."""
    ends: dict[str, list[float]] = {name: [] for name in methods}
    alone: dict[str, list[float]] = {name: [] for name in methods}
    for router in methods.values():
        router.route(texts[0])  # warm: the model, the thread pools
    for i in range(count):
        text = texts[i % len(texts)]
        for name, router in methods.items():
            started = time.perf_counter()
            found = router.route(text)
            ends[name].append(time.perf_counter() - started)
            vector = found.vector[None]
            started = time.perf_counter()
            router.routes([text], vector)
            alone[name].append(time.perf_counter() - started)

    def pct(values: list[float], q: float) -> float:
        return float(np.percentile(values, q))

    return {
        name: {
            "p50_ms": pct(ends[name], 50) * 1e3,
            "p95_ms": pct(ends[name], 95) * 1e3,
            "classifier_p50_us": pct(alone[name], 50) * 1e6,
        }
        for name in methods
    }


def batched(router: Router, texts: list[str], runs: int) -> float:
    """Milliseconds per request when ``route_many`` gets all of them at once (median)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        router.route_many(texts)
        times.append((time.perf_counter() - started) / len(texts))
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed requests")
    args = parser.parse_args()
    count, runs = (60, 2) if args.quick else (400, 5)

    codex = load_codex()
    embedder = Embedder()
    embedder.encode(["load the model before anything is timed"])
    started = time.perf_counter()
    router = train_router(codex, embedder=embedder)
    train_s = time.perf_counter() - started
    texts, names = training_set(codex)
    y = np.array([list(codex.personas).index(n) for n in names])
    vectors = embedder.encode(texts)
    methods = {
        "router": router,
        "nearest centroid": nearest_centroid(codex, embedder, vectors, y),
        "zero-shot description": zero_shot(codex, embedder, vectors, y),
    }
    held_texts, held_labels = heldout()
    held_vectors = embedder.encode(held_texts)
    scores = {name: quality(m, held_vectors, held_labels) for name, m in methods.items()}
    speed = latency(methods, held_texts, count)
    per_request_batched = batched(router, held_texts, runs)

    load = os.getloadavg()
    console = Console()
    console.print(
        f"{len(texts)} training examples, {len(held_texts)} held-out requests; router trained "
        f"in {train_s:.1f} s (C={router.info['C']:g}, T={router.temperature:.3f}, "
        f"cross-validated top-1 {router.info['cv_accuracy']:.3f}); "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {load[0]:.1f} at the end"
    )
    table = Table(title="Routing held-out requests on CPU (ratios: method / router)")
    for column in (
        "method",
        "top-1",
        "ratio",
        "top-2",
        "log-loss",
        "ECE",
        "ratio",
        "p50 ms",
        "p95 ms",
        "ratio p50",
        "classifier µs",
    ):
        table.add_column(column, justify="left" if column == "method" else "right")
    base_q, base_s = scores["router"], speed["router"]
    for name in methods:
        q, s = scores[name], speed[name]
        table.add_row(
            name,
            f"{q['top1']:.3f}",
            f"{q['top1'] / base_q['top1']:.2f}x",
            f"{q['top2']:.3f}",
            f"{q['log_loss']:.3f}",
            f"{q['ece']:.3f}",
            f"{q['ece'] / base_q['ece']:.2f}x" if base_q["ece"] else "-",
            f"{s['p50_ms']:.1f}",
            f"{s['p95_ms']:.1f}",
            f"{s['p50_ms'] / base_s['p50_ms']:.2f}x",
            f"{s['classifier_p50_us']:.0f}",
        )
    console.print(table)
    console.print(
        f"router: {base_q['answered_by_two']:.1%} of held-out requests answered by two personas; "
        f"the right persona answers {base_q['right_persona_answers']:.1%}; batched route_many "
        f"{per_request_batched:.2f} ms per request; per persona top-1 "
        + ", ".join(f"{p} {v:.2f}" for p, v in base_q["top1_per_persona"].items())
    )
    console.print(
        f"targets: p50 ≤ 10 ms ({'met' if base_s['p50_ms'] <= 10 else 'NOT met'}: "
        f"{base_s['p50_ms']:.1f} ms), top-1 ≥ 0.90 "
        f"({'met' if base_q['top1'] >= 0.9 else 'NOT met'}: {base_q['top1']:.3f})"
    )
    results = {
        "training_examples": len(texts),
        "heldout_requests": len(held_texts),
        "train_s": train_s,
        "router": {"C": router.info["C"], "temperature": router.temperature, **router.info},
        "quality": scores,
        "latency": speed,
        "batched_ms_per_request": per_request_batched,
        "timed_requests_per_method": count,
        "cpus": os.cpu_count(),
        "load_average": load,
        "targets": {"p50_ms": 10, "top1": 0.9},
    }
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "router.json").write_text(json.dumps(results, indent=2))
    console.print(f"wrote {out / 'router.json'}")


if __name__ == "__main__":
    main()
