"""How far choosing among drafts could take doesNotUnderstand: pass@k of the author model.

``bench/jit.py`` measures what the kernel installs. This measures what it has to choose from:
for each intent, the author model is sent the prompt of a first-round draft ``--samples`` times,
each independent (the kernel's hotter draft temperature, its own seed), and every draft is
checked against the intent's two calls after going through the guardian and the sandbox, as
the kernel would install it. From n drafts of which c are right, the unbiased estimator of
Chen et al. (2021, "Evaluating Large Language Models Trained on Code") gives pass@k, the chance
that at least one of k drafts is right:

    pass@k = 1 - C(n - c, k) / C(n, k)

pass@k bounds any way of choosing among k drafts (agreement, examples, a judge): none can
install a right method for an intent where no draft is right. It is a diagnosis of the model,
with the check as an oracle no user has, so it is never a headline and nothing of it reaches
the kernel.

    .venv/bin/python bench/jit_ceiling.py --set unseen11 --samples 6
    BATOS_MODEL=test .venv/bin/python bench/jit_ceiling.py --set unseen11 --limit 2 --samples 2

Prints a table and writes bench/results/jit-ceiling-<model>[-tag].json after each set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from math import comb
from pathlib import Path
from typing import Any

from persistent.mapping import PersistentMapping

# Run as a script, only bench/ is on the path; the sets and checks live in bench/jit.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from batos import settings
from bench import jit as bench_jit
from graph import jit
from prototypes.kernel import Mission

RESULTS = Path(__file__).parent / "results"


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k drafts drawn from n, c of them right, is right."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def sample_case(
    case: bench_jit.Case,
    samples: int,
    factory: jit.ModelFactory = jit.default_model_factory,
    **sampling: Any,
) -> dict[str, Any]:
    """``samples`` independent first-round drafts of one intent, each checked; ``factory``
    makes the author's model as the kernel's runner does (``factory(persona, **options)``),
    at the kernel's draft temperature unless ``sampling`` says otherwise."""
    receiver = bench_jit._receiver(case, intents=PersistentMapping({case.selector: case.intent}))
    mission = Mission(receiver, case.selector, case.args, {})
    messages = jit.messages_for(mission.brief(), [])
    drafts: list[dict[str, Any]] = []
    for i in range(samples):
        model = factory(
            mission.author,
            **{
                "num_predict": jit.DRAFT_MAX_TOKENS,
                "temperature": jit.SAMPLE_TEMPERATURE,
                **sampling,
                "seed": 1_000 + i,
            },
        )
        started = time.perf_counter()
        source = jit.extract_code(jit._text(model.invoke(messages)), case.selector)
        seconds = time.perf_counter() - started
        drafts.append(
            {"source": source, "right": bench_jit.passes(case, source), "seconds": seconds}
        )
    return {
        "selector": case.selector,
        "n": samples,
        "right": sum(d["right"] for d in drafts),
        "distinct": len({d["source"] for d in drafts}),
        "drafts": drafts,
    }


def summary(cases: list[dict[str, Any]], ks: list[int]) -> dict[str, Any]:
    return {
        "intents": len(cases),
        **{
            f"pass@{k}": round(statistics.mean(pass_at_k(c["n"], c["right"], k) for c in cases), 3)
            for k in ks
        },
        "seconds_per_draft": round(
            statistics.mean(d["seconds"] for c in cases for d in c["drafts"]), 1
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ["bench", *bench_jit.HELDOUT_SETS]
    parser.add_argument(
        "--set", action="append", choices=names, help="a set of intents (repeat for several)"
    )
    parser.add_argument("--samples", type=int, default=6, help="independent drafts per intent")
    parser.add_argument("--limit", type=int, default=0, help="only the first N intents per set")
    parser.add_argument(
        "--temperature",
        type=float,
        default=jit.SAMPLE_TEMPERATURE,
        help="sampling temperature (default: the kernel's, for drafts after the first)",
    )
    parser.add_argument(
        "--repeat-penalty",
        type=float,
        default=None,
        help="repetition penalty (default: the persona Modelfile's)",
    )
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    args = parser.parse_args()
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    if args.limit < 0:
        parser.error("--limit must be 0 (every intent) or more")
    chosen = args.set or ["unseen11"]
    ks = sorted({k for k in (1, 3, args.samples) if k <= args.samples})
    model = settings.get_str("model")
    from batos.models import chat_model

    chat_model("BRICK", num_predict=1).invoke("hi")  # load the model before the clock starts
    out = RESULTS / f"jit-ceiling-{model}{'-' + args.tag if args.tag else ''}.json"
    out.parent.mkdir(exist_ok=True)
    sampling: dict[str, Any] = {"temperature": args.temperature}
    if args.repeat_penalty is not None:
        sampling["repeat_penalty"] = args.repeat_penalty
    results: dict[str, Any] = {
        "model": model,
        "samples": args.samples,
        "sampling": sampling,
        "sets": {},
    }
    for name in chosen:
        cases = bench_jit.cases_of(name)[: args.limit or None]
        print(f"{name}:", flush=True)
        rows = []
        for case in cases:
            row = sample_case(case, args.samples, **sampling)
            rows.append(row)
            print(
                f"  {case.selector:<22} {row['right']}/{row['n']} right, "
                f"{row['distinct']} distinct",
                flush=True,
            )
        results["sets"][name] = {"summary": summary(rows, ks), "cases": rows}
        out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    header = f"{'set':<12}{'intents':>8}" + "".join(f"{f'pass@{k}':>9}" for k in ks)
    print(
        f"\nDrafts' ceiling — model {model!r}, {args.samples} independent drafts per intent, "
        f"sampling {sampling}"
    )
    print(header + f"{'s/draft':>9}")
    for name, data in results["sets"].items():
        s = data["summary"]
        cells = "".join(f"{s[f'pass@{k}']:>9.2f}" for k in ks)
        print(f"{name:<12}{s['intents']:>8}{cells}{s['seconds_per_draft']:>9.1f}")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
