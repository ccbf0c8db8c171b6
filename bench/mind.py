"""What a mind cycle costs besides the model: orchestration overhead, and the model's share.

Part 1 — orchestration, with a zero-latency model (answers at once, fixed text), a fixed router
and a hashing embedder, the facet methods already installed: milliseconds per fast-path and
per full cycle (plan, two facets in parallel — each a sandboxed method call in a forked
process — synthesis, gate, commit) on the ZODBSaver (file image: every checkpoint and the
commit synced to disk) against the same graph on InMemorySaver (the commit then one
transaction of its own on the same image).

Part 2 (``--model``) — the configured model (default: the 1.5B default model, embedded):
seconds per fast-path and full cycle, time to the first answer token, and the share of each
cycle spent outside model calls (target: under 5%). The first full cycle writes the facets it
needs (doesNotUnderstand): it is reported on its own.

    python bench/mind.py                   # part 1
    python bench/mind.py --model --cycles 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from graph.boot import open_image  # noqa: E402
from graph.mind import MindServices, build_graph, run_config  # noqa: E402
from prototypes import kernel  # noqa: E402
from prototypes.incarnation import personas  # noqa: E402
from store.checkpointer import ZODBSaver  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FAST = "hello there"
FULL = "plan the steps to build a garden shed"
PLAN = json.dumps(
    {
        "steps": [
            {"facet": "BRICK.facet_steps", "query": "which steps build a shed"},
            {"facet": "BRICK.facet_design", "query": "what design suits a shed"},
        ]
    }
)
FACETS = {
    "facet_steps": "List the numbered steps: ",
    "facet_design": "Describe the simplest design: ",
}


class InstantModel(BaseChatModel):
    """Answers at once: the plan when asked for structured output, else a fixed reply."""

    structured: bool = False

    @property
    def _llm_type(self) -> str:
        return "instant"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        text = PLAN if self.structured else "A garden shed: measure, cut, build. Hello there."
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])


def _busy(metrics: list[dict]) -> float:
    """Seconds during which at least one model call ran: parallel facets' calls overlap (and
    queue for one engine), so their sum would count the same seconds twice."""
    spans = sorted((m["at"], m["at"] + m["seconds"]) for m in metrics if "at" in m)
    total, end = 0.0, float("-inf")
    for start, stop in spans:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def instant_models(persona: str, **options: Any) -> BaseChatModel:
    return InstantModel(structured="format" in options)


class HashEmbedder:
    """Hashed bag of words: costs microseconds, so part 1 times the orchestration only."""

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, hash(word) % 384] += 1.0
            out[row] /= max(float(np.linalg.norm(out[row])), 1e-9)
        return out


class Route:
    def __init__(self, text: str, vector: np.ndarray) -> None:
        self.text, self.vector = text, vector
        self.chosen = ("BRICK",)
        self.ranked = (("BRICK", 0.7), ("ROBIN", 0.1), ("BABS", 0.1), ("ALFRED", 0.1))


class FixedRouter:
    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    def route(self, text: str) -> Route:
        return Route(text, self.embedder.encode([text])[0])


def install_facets(image: Any) -> None:
    def install(root: Any) -> None:
        brick = personas(root)["BRICK"]
        for selector, prefix in FACETS.items():
            if selector not in brick._slots():
                source = f"def {selector}(self, query):\n    return {prefix!r} + query\n"
                kernel.add_method(brick, selector, source, author="bench")

    image.transact(install, note="bench: facet methods")


def orchestration(cycles: int) -> dict[str, dict[str, float]]:
    embedder = HashEmbedder()
    services = MindServices(models=instant_models, router=FixedRouter(embedder), embedder=embedder)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        with open_image(f"file://{folder}/bench.fs") as image:
            install_facets(image)
            services.image = image
            with ZODBSaver(image) as saver:
                savers = {"ZODBSaver": saver, "InMemorySaver": InMemorySaver()}
                for name, checkpointer in savers.items():
                    graph = build_graph(services, checkpointer=checkpointer)
                    row: dict[str, float] = {}
                    for label, text in (("fast", FAST), ("full", FULL)):
                        graph.invoke(  # warm: imports, caches, the first fork
                            {"messages": [HumanMessage(text)]}, run_config(f"warm-{name}")
                        )
                        times = []
                        for i in range(cycles):
                            started = time.perf_counter()
                            state = graph.invoke(
                                {"messages": [HumanMessage(text)]},
                                run_config(f"{name}-{label}-{i}"),
                            )
                            times.append(time.perf_counter() - started)
                            assert state["status"] == "COMPLETE", state.get("failure")
                        row[f"{label} ms/cycle"] = 1000 * statistics.median(times)
                    results[name] = row
    return results


def with_model(cycles: int) -> dict[str, Any]:
    """Cycles on the configured model; BRICK answers (the router is not part of this)."""
    from batos import settings

    out: dict[str, Any] = {"model": settings.get_str("model"), "cycles": []}
    with tempfile.TemporaryDirectory() as folder:
        with open_image(f"file://{folder}/bench.fs") as image, ZODBSaver(image) as saver:
            graph = build_graph(MindServices(), checkpointer=saver)
            plan = [("full (writes facets)", FULL, "full")]
            plan += [("fast", FAST, "fast")] * cycles + [("full", FULL, "full")] * cycles
            for number, (label, text, depth) in enumerate(plan):
                config = run_config(f"model-{number}")
                started = time.perf_counter()
                first_token = None
                for chunk, meta in graph.stream(
                    {"messages": [HumanMessage(text)]},
                    config,
                    context={"persona": "BRICK", "depth": depth},
                    stream_mode="messages",
                ):
                    if (
                        first_token is None
                        and meta.get("langgraph_node") == "synthesize"
                        and chunk.content
                    ):
                        first_token = time.perf_counter() - started
                seconds = time.perf_counter() - started
                state = graph.get_state(config).values
                metrics = state.get("metrics") or []
                model_s = _busy(metrics)
                row = {
                    "label": label,
                    "status": state["status"],
                    "seconds": round(seconds, 2),
                    "first_answer_token_s": None if first_token is None else round(first_token, 2),
                    "model_s": round(model_s, 2),
                    # a failed call records no metric: no share for a cycle that FAILED
                    "outside_model_share": (
                        round(1 - model_s / seconds, 4) if state["status"] == "COMPLETE" else None
                    ),
                    "model_calls": len(metrics),
                    "output_tokens": sum(m["output_tokens"] for m in metrics),
                    "failure": (state.get("failure") or {}).get("reason"),
                }
                out["cycles"].append(row)
                print(json.dumps(row), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="cycles per measurement")
    parser.add_argument("--model", action="store_true", help="also run on the configured model")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    report: dict[str, Any] = {}
    if not args.model:
        found = orchestration(args.cycles)
        report["orchestration"] = found
        print(f"\nMind cycle with a zero-latency model, median of {args.cycles} cycles")
        print(f"{'checkpointer':<16}{'fast ms/cycle':>16}{'full ms/cycle':>16}")
        for name, row in found.items():
            print(f"{name:<16}{row['fast ms/cycle']:>16.1f}{row['full ms/cycle']:>16.1f}")
        zodb, memory = found["ZODBSaver"], found["InMemorySaver"]
        for label in ("fast", "full"):
            key = f"{label} ms/cycle"
            print(f"{label}: ZODBSaver / InMemorySaver = {zodb[key] / memory[key]:.2f}x")
    else:
        found = with_model(args.cycles)
        report["model"] = found
        print(f"\nMind cycles on model {found['model']!r}")
        print(f"{'cycle':<22}{'status':>9}{'s':>8}{'1st tok s':>11}{'model s':>9}{'outside':>9}")
        for row in found["cycles"]:
            first, share = row["first_answer_token_s"], row["outside_model_share"]
            print(
                f"{row['label']:<22}{row['status']:>9}{row['seconds']:>8.1f}"
                f"{'-' if first is None else f'{first:.1f}':>11}{row['model_s']:>9.1f}"
                f"{'-' if share is None else f'{share:.1%}':>9}"
            )
    name = "mind-model.json" if args.model else "mind.json"
    (RESULTS / name).write_text(json.dumps(report, indent=2))
    print(f"\nwrote {RESULTS / name}")


if __name__ == "__main__":
    main()
