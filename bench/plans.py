"""Do the mind's plans decompose? The planner prompt before and after, on the same requests.

For every request of a set (default ``bench/data/usefulness/requests.jsonl``) the router picks
the personas, and the lead persona's model writes a plan — under the same JSON schema the mind
uses — once with the planner prompt the mind had before plans were checked (``BEFORE``, kept
here verbatim) and once with the prompt it has now (``graph/prompts/mind.toml``). Each raw plan
(as the model wrote it, before any step is dropped) is measured with ``graph.plan.plan_quality``:
steps that repeat an earlier step nearly word for word, and steps sharing no content word with
the request. Printed: both rates for both prompts, and how often the kept plan was rejected.
Only plans are written: no facet, no answer.

    python bench/plans.py                  # the 50 requests, default model
    BATOS_MODEL=test python bench/plans.py --limit 5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import HumanMessage

from batos import settings
from batos.models import chat_model
from graph import prompts
from graph.mind_nodes import PLAN_TOKENS
from graph.plan import (
    PlanRejected,
    depth_for,
    facets_of,
    parse_plan,
    plan_quality,
    plan_schema,
)
from prototypes.codex import load_codex

RESULTS = Path(__file__).resolve().parent / "results"
REQUESTS = Path(__file__).resolve().parent / "data" / "usefulness" / "requests.jsonl"
#: The planner prompt before plans were checked for generic and repeated steps.
BEFORE = """Plan how to answer the request below by splitting it into {most} or fewer \
sub-questions. Give each one to the facet best suited to it:
{facets}
Reply with JSON only, in this form: {{"steps": [{{"facet": "PERSONA.facet_name", \
"query": "a short, self-contained sub-question"}}]}}

Request: {request}"""


def raw_steps(reply: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(reply, strict=False)
    except ValueError:
        return []
    steps = data.get("steps") if isinstance(data, dict) else None
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def plan_once(template: str, request: str, chosen: list[str]) -> dict[str, Any]:
    most = settings.get_int("mind_max_facets")
    available = facets_of(chosen)
    codex = load_codex()
    listed = "\n".join(
        f"- {name}: {codex.persona(name.split('.')[0]).role.split(':')[0]}; "
        f"{name.split('.facet_')[1].replace('_', ' ')}"
        for name in available
    )
    model = chat_model(
        chosen[0],
        format=plan_schema(list(available), most),
        temperature=0.2,
        num_predict=PLAN_TOKENS,
    )
    started = time.perf_counter()
    reply = model.invoke(
        [HumanMessage(template.format(most=most, facets=listed, request=request))]
    ).content
    seconds = time.perf_counter() - started
    text = reply if isinstance(reply, str) else str(reply)
    try:
        kept: list[dict[str, str]] | None = parse_plan(text, available, most, request)
        rejected = ""
    except PlanRejected as exc:
        kept, rejected = None, str(exc)
    return {
        "reply": text,
        "seconds": round(seconds, 2),
        "raw": plan_quality(raw_steps(text), request).as_dict(),
        "kept": None if kept is None else plan_quality(kept, request).as_dict(),
        "rejected": rejected,
    }


def rates(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    counted = [r[key] for r in rows if r.get(key)]
    steps = sum(c["steps"] for c in counted)
    return {
        "plans": len(counted),
        "steps": steps,
        "duplicate_share": sum(c["duplicates"] for c in counted) / steps if steps else 0.0,
        "off_request_share": sum(c["off_request"] for c in counted) / steps if steps else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=Path, default=REQUESTS)
    parser.add_argument("--limit", type=int, default=0, help="only the first N requests")
    args = parser.parse_args()
    from batos.shell.runtime import open_image
    from graph.router import load_router

    lines = args.requests.read_text(encoding="utf-8").splitlines()
    items = [json.loads(line) for line in lines if line.strip()]
    items = items[: args.limit] if args.limit > 0 else items
    after = prompts.load("mind")["plan"]
    rows: list[dict[str, Any]] = []
    with open_image("memory://") as image:
        router = load_router(image)
        plan_once(after, "hello there", ["BRICK"])  # warm: the model and its grammar
        for item in items:
            request = item["text"]
            chosen = list(router.route(request).chosen)
            depth = depth_for(request, chosen, settings.get_int("mind_fast_words"), None)
            row: dict[str, Any] = {"id": item["id"], "chosen": chosen, "depth": depth.mode}
            for name, template in (("before", BEFORE), ("after", after)):
                row[name] = plan_once(template, request, chosen)
            rows.append(row)
            print(
                f"{item['id']:<12} {'+'.join(chosen):<14} before {row['before']['raw']}  "
                f"after {row['after']['raw']}",
                flush=True,
            )
    summary = {}
    print(f"\nPlans of {len(rows)} requests on model {settings.get_str('model')!r}")
    print(
        f"{'prompt':<8}{'plans':>7}{'steps':>7}{'near-duplicate':>16}{'off-request':>13}"
        f"{'rejected':>10}{'s/plan':>8}"
    )
    for name in ("before", "after"):
        plans = [r[name] for r in rows]
        raw = rates(plans, "raw")
        rejected = sum(1 for p in plans if p["rejected"])
        seconds = sum(p["seconds"] for p in plans) / max(len(plans), 1)
        summary[name] = {**raw, "rejected": rejected, "seconds_per_plan": seconds}
        print(
            f"{name:<8}{raw['plans']:>7}{raw['steps']:>7}{raw['duplicate_share']:>16.1%}"
            f"{raw['off_request_share']:>13.1%}{rejected:>10}{seconds:>8.1f}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"plans-{settings.get_str('model')}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
