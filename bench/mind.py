"""What a mind cycle costs besides the model, and how it fares on a set of varied requests.

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

Part 3 (``--requests [FILE]``) — every request of a set (default
``bench/data/usefulness/requests.jsonl``; ``readme_requests.jsonl`` runs the README's examples
with the persona and depth each forces) once through the mind on the configured model, on a
fresh file image with ``--corpus`` ingested (default ``headline/docs/``, which the set's
document requests are about) and the facet methods written ahead (``--facets``), streamed as a
client streams it. Prints the COMPLETE rate with its 95% Wilson interval and every FAILED
request's reason; p50 and p95 of the full cycle's seconds, of the first answer token (fast and
full apart) and of the fast path's seconds (a cycle whose one model call is the answer's), next
to the targets (20 s, 8 s, 3 s; over COMPLETE cycles); the plans' quality as each cycle records
it (``cycle.plan_quality``: steps that near-duplicate an earlier step, steps with no content
word of the request) over the model's raw plans and the final ones; the depth rules that
applied, degradations by kind and the truncation rate. ``--lever NAME=on|off`` sets a lever
(``bench.levers.LEVERS``) for the run, to measure it on and off.

    python bench/mind.py                   # part 1
    python bench/mind.py --model --cycles 2
    python bench/mind.py --requests --repeat 2 --lever prefix_cache=off
    BATOS_MODEL=test python bench/mind.py --requests --limit 5 \\
        --corpus bench/data/usefulness/dev/docs       # to see it work, off the headline corpus
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver

from batos.shell.runtime import open_image
from bench.levers import add_option, apply_levers, parse_levers, tag
from graph.mind import MindServices, build_graph, run_config
from prototypes import kernel
from prototypes.incarnation import personas
from store.checkpoint.saver import ZODBSaver

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
        with open_image(f"file://{folder}/bench.fs", create=True) as image:
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
        with (
            open_image(f"file://{folder}/bench.fs", create=True) as image,
            ZODBSaver(image) as saver,
        ):
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


# -- part 3: a set of requests on the configured model ------------------------------------

DATA = Path(__file__).resolve().parent / "data" / "usefulness"
REQUESTS = DATA / "requests.jsonl"
CORPUS = DATA / "headline" / "docs"
#: Nodes whose streamed tokens are the answer a user reads.
ANSWER_NODES = frozenset({"synthesize"})
#: The issue's targets: seconds (full cycle, first answer token of a full cycle, fast path)
#: and the share of requests that end COMPLETE.
TARGET_S = {"full": 20.0, "first_token_full": 8.0, "fast": 3.0}
COMPLETE_TARGET = 0.98


def load_requests(path: Path, limit: int | None = None) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        found = [json.loads(line) for line in lines if line.strip()]
    return found if limit is None else found[:limit]


def path_of(calls: Sequence[dict[str, Any]]) -> str:
    """'fast' when every model call of the cycle wrote the answer, else 'full'.

    Not the depth the cycle records: a cycle whose plan had one step, or failed, ends on depth
    'fast' after its plan call, and a computation's fast path writes a program first.
    """
    return "fast" if all(call.get("node") in ANSWER_NODES for call in calls) else "full"


def run_request(graph: Any, request: dict[str, Any], thread: str) -> dict[str, Any]:
    """One request streamed through ``graph`` as a client streams it, and what it cost."""
    from bench.usefulness import cycle_facts
    from graph.request import content_text

    context = {key: request[key] for key in ("persona", "depth") if request.get(key)}
    config = run_config(thread)
    nodes: list[list[Any]] = []
    first_token = None
    error = None
    started = time.perf_counter()
    try:
        for mode, payload in graph.stream(
            {"messages": [HumanMessage(request["text"])]},
            config,
            context=context,
            stream_mode=["messages", "updates"],
        ):
            now = time.perf_counter() - started
            if mode == "updates":
                nodes += [[node, round(now, 3)] for node in payload]
            elif first_token is None:
                chunk, meta = payload
                if meta.get("langgraph_node") in ANSWER_NODES and content_text(chunk.content):
                    first_token = now
    except Exception as exc:  # the mind catches its own: this is a bug to see, not to hide
        error = f"{type(exc).__name__}: {exc}"[:500]
    seconds = time.perf_counter() - started
    state = graph.get_state(config).values
    facts = cycle_facts(state)
    if error is not None:
        facts.update(status="ERROR", failure={"node": "stream", "reason": error, "hint": ""})
    return {
        "id": request["id"],
        "family": request.get("family"),
        "path": path_of(facts["calls"]),
        "origin": request.get("origin"),
        "context": context,
        "seconds": round(seconds, 3),
        "first_answer_token_s": None if first_token is None else round(first_token, 3),
        "nodes": nodes,
        **facts,
        "response": str(state.get("response") or "")[:2000],
    }


def run_requests(
    path: Path,
    corpus: Path,
    *,
    repeat: int = 1,
    limit: int | None = None,
    services: MindServices | None = None,
    facets: str = "prepared",
    progress: Any = print,
) -> dict[str, Any]:
    """Every request of ``path``, ``repeat`` times, on a fresh image with ``corpus`` ingested."""
    from batos import settings
    from bench.usefulness import fresh_image, ingest_corpus, prepare_facets

    requests = load_requests(path, limit)
    out: dict[str, Any] = {
        "model": settings.get_str("model"),
        "requests": str(path),
        "repeat": repeat,
        "rows": [],
    }
    with tempfile.TemporaryDirectory() as folder:
        image = fresh_image(Path(folder))
        try:
            catalog, out["ingest"] = ingest_corpus(image, corpus)
            out["facets"] = prepare_facets(
                image, services.models if services is not None else None, facets
            )
            if services is not None and services.catalog is None:
                # given services bring their own embedder, maybe not the catalog's encoder
                services = replace(services, catalog=catalog)
            with ZODBSaver(image) as saver:
                graph = build_graph(services, checkpointer=saver)
                started = time.perf_counter()
                run_request(graph, {"id": "warm-up", "text": "hello"}, "requests-warm-up")
                out["warmup_s"] = round(time.perf_counter() - started, 2)
                for round_number in range(repeat):
                    for request in requests:
                        thread = f"requests-{round_number}-{request['id']}"
                        row = run_request(graph, request, thread)
                        row["round"] = round_number
                        out["rows"].append(row)
                        first = row["first_answer_token_s"]
                        progress(
                            f"{row['id']:<22}{row['status'] or '?':>9}{row['depth'] or '-':>6}"
                            f"{row['seconds']:>8.1f}s  first token "
                            f"{'-' if first is None else f'{first:.1f}s'}"
                        )
            catalog.close()
        finally:
            image.close()
    out["summary"] = summarise_requests(out["rows"])
    return out


def _percentiles(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "p50": None, "p95": None}
    p50, p95 = np.percentile(np.asarray(values, dtype=float), [50, 95])
    return {"n": len(values), "p50": float(p50), "p95": float(p95)}


def summarise_requests(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    from bench.usefulness import wilson

    done = [r for r in rows if r["status"] == "COMPLETE"]
    full = [r for r in done if r["path"] == "full"]
    fast = [r for r in done if r["path"] == "fast"]

    def tokens(rows: Sequence[dict[str, Any]]) -> list[float]:
        return [r["first_answer_token_s"] for r in rows if r["first_answer_token_s"] is not None]

    quality: dict[str, dict[str, Any]] = {}
    for which in ("raw", "final"):
        counts = [
            r["plan_quality"][which]
            for r in rows
            if r.get("plan_quality") and r["plan_quality"].get(which)
        ]
        steps = sum(c["steps"] for c in counts)
        quality[which] = {
            "plans": len(counts),
            "steps": steps,
            "duplicate_rate": sum(c["duplicates"] for c in counts) / steps if steps else None,
            "off_request_rate": sum(c["off_request"] for c in counts) / steps if steps else None,
        }
    degradations: Counter[str] = Counter()
    for row in rows:
        for item in row.get("degraded") or []:
            degradations[f"{item.get('where')}: {item.get('what')}"] += item.get("times") or 1
    known = [r for r in rows if r.get("truncated") is not None]
    readme = [r for r in rows if r.get("origin")]
    return {
        "n": len(rows),
        "complete": len(done),
        "complete_rate": len(done) / len(rows) if rows else None,
        "complete_interval": wilson(len(done), len(rows)),
        "failed": [
            {"id": r["id"], "status": r["status"], **(r.get("failure") or {})}
            for r in rows
            if r["status"] != "COMPLETE"
        ],
        "readme_complete": (sum(r["status"] == "COMPLETE" for r in readme), len(readme)),
        "seconds": {
            "full": _percentiles([r["seconds"] for r in full]),
            "full_no_facet_written": _percentiles(
                [r["seconds"] for r in full if not r.get("wrote_facets")]
            ),
            "first_token_full": _percentiles(tokens(full)),
            "first_token_fast": _percentiles(tokens(fast)),
            "fast": _percentiles([r["seconds"] for r in fast]),
        },
        "plan_quality": quality,
        "depth_rules": dict(
            Counter(f"{r['depth']}: {r['depth_rule']}" for r in rows).most_common()
        ),
        "degradations": dict(degradations.most_common()),
        "degradation_unknown": sum(1 for r in rows if r.get("degraded") is None),
        "truncated": (sum(1 for r in known if r["truncated"]), len(known)),
        "model_calls_mean": statistics.fmean(r["model_calls"] for r in rows) if rows else None,
        # None while the mind's metrics do not report cached prompt tokens
        "cached_tokens": (
            sum(r["cached_tokens"] or 0 for r in rows)
            if any(r.get("cached_tokens") is not None for r in rows)
            else None
        ),
        "input_tokens": sum(r["input_tokens"] for r in rows),
    }


def requests_table(report: dict[str, Any]) -> str:
    from bench.usefulness import facets_line

    s = report["summary"]
    levers = ", ".join(f"{k}={v}" for k, v in report.get("levers", {}).items()) or "defaults"
    lines = [
        f"Mind on {s['n']} request(s) of {Path(report['requests']).name} "
        f"(x{report['repeat']}), model {report['model']!r}, levers: {levers}"
    ]
    lines.append(facets_line(report["facets"]))
    if s["n"]:
        low, high = s["complete_interval"]
        verdict = "PASS" if s["complete_rate"] >= COMPLETE_TARGET else "MISS"
        lines.append(
            f"COMPLETE {s['complete']}/{s['n']} = {s['complete_rate']:.2f} "
            f"[{low:.2f}, {high:.2f}]   target >= {COMPLETE_TARGET:.2f}  {verdict}"
        )
    for failed in s["failed"]:
        lines.append(
            f"  {failed['status']} {failed['id']} at {failed.get('node', '?')}: "
            f"{' '.join(str(failed.get('reason', '')).split())[:300]}"
        )
    done, of = s["readme_complete"]
    if of:
        lines.append(f"README examples COMPLETE: {done}/{of}  {'PASS' if done == of else 'MISS'}")
    lines += ["", "COMPLETE cycles, seconds     n     p50     p95  target  verdict (p50, p95)"]
    lines.append("(fast path: the answer's model call alone; full: a plan, facet or program too)")
    names = {
        "full": "full cycle",
        "full_no_facet_written": "  of which wrote no facet",
        "first_token_full": "first answer token, full",
        "first_token_fast": "first answer token, fast",
        "fast": "fast path",
    }
    for key, label in names.items():
        row, target = s["seconds"][key], TARGET_S.get(key)
        p50 = "-" if row["p50"] is None else f"{row['p50']:.1f}"
        p95 = "-" if row["p95"] is None else f"{row['p95']:.1f}"
        verdict = ""
        if target is not None and row["n"]:
            verdict = ", ".join("PASS" if row[p] <= target else "MISS" for p in ("p50", "p95"))
        shown = "-" if target is None else f"<= {target:g}"
        lines.append(f"{label:<27}{row['n']:>4}{p50:>8}{p95:>8}{shown:>8}  {verdict}")
    lines += ["", "plans           plans  steps  near-duplicate  no word of the request"]
    for which, row in s["plan_quality"].items():
        dup = "-" if row["duplicate_rate"] is None else f"{row['duplicate_rate']:.2f}"
        off = "-" if row["off_request_rate"] is None else f"{row['off_request_rate']:.2f}"
        lines.append(f"{which:<14}{row['plans']:>7}{row['steps']:>7}{dup:>16}{off:>24}")
    lines.append("")
    lines.append("depth: " + "; ".join(f"{k} x{v}" for k, v in s["depth_rules"].items()))
    if s["degradations"]:
        lines.append(
            "degradations: " + "; ".join(f"{k} x{v}" for k, v in s["degradations"].items())
        )
    else:
        lines.append("degradations: none recorded")
    if s["degradation_unknown"]:
        lines.append(f"  ({s['degradation_unknown']} cycle(s) record no degradations field)")
    cut, known = s["truncated"]
    lines.append(
        f"truncated answers: {cut}/{known}" if known else "truncated answers: not recorded"
    )
    calls, cached = s["model_calls_mean"], s["cached_tokens"]
    lines.append(
        f"model calls per request: {'-' if calls is None else f'{calls:.1f}'}; input tokens "
        f"{s['input_tokens']}, of them cached: {'not recorded' if cached is None else cached}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="cycles per measurement")
    parser.add_argument("--model", action="store_true", help="also run on the configured model")
    parser.add_argument(
        "--requests",
        nargs="?",
        type=Path,
        const=REQUESTS,
        default=None,
        help=f"run a request set on the configured model (default {REQUESTS.name})",
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="folder ingested first")
    parser.add_argument("--repeat", type=int, default=1, help="times each request is run")
    parser.add_argument(
        "--facets",
        choices=("prepared", "unwritten"),
        default="prepared",
        help="write the facet methods first (as batos init --prepare), or not",
    )
    parser.add_argument("--limit", type=int, default=None, help="the first N requests")
    add_option(parser)
    args = parser.parse_args()
    if args.repeat < 1 or (args.limit is not None and args.limit < 1):
        parser.error("--repeat and --limit must be at least 1")
    levers = parse_levers(args.lever)
    applied = apply_levers(levers)
    RESULTS.mkdir(exist_ok=True)
    report: dict[str, Any] = {"levers": levers, "environment": applied}
    if args.requests is not None:
        found = run_requests(
            args.requests, args.corpus, repeat=args.repeat, limit=args.limit, facets=args.facets
        )
        report.update(found)
        print()
        print(requests_table(report))
        model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(found["model"]).stem)
        name = f"mind-requests-{model}{tag(levers)}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    elif not args.model:
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
        name = "mind.json"
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
        name = "mind-model.json"
    (RESULTS / name).write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    print(f"\nwrote {RESULTS / name}")


if __name__ == "__main__":
    main()
