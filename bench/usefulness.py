"""Whether the mind's answers use the memory: the mind against the bare model and a naive RAG.

Three task families with checkable answers (``bench/data/usefulness/``, judged by
``bench/answers.py``): questions about documents ingested into the knowledge catalog,
computations a facet can write and run code for, and recall of a fact said earlier on the same
thread. Three systems answer each question, on the configured model:

- **mind**: ``batos.shell.runtime.ask`` on a thread of its own (for recall, each earlier turn
  through ``ask`` on that thread first), judged on the final state's ``response``; a cycle that ends
  FAILED is wrong, since its user is shown the failure instead.
- **bare**: one call of BABS's chat model with the question alone (for recall, after the
  earlier turns, each followed by the bare model's own reply to it).
- **rag**: what a user writes in ten lines: the catalog's top five passages for the question,
  numbered in one user message with it, and one call of the same model (for recall, after the
  bare model's conversation: the catalog holds nothing of what the user said).

Each split's ``docs/`` is ingested once into a fresh file image through the path ``batos
ingest`` takes, and the facet methods are written ahead, as ``batos init --prepare`` does
(``--facets unwritten`` leaves them to be missed, as on a fresh image before the heartbeat).
Systems take turns going first, question by question, so one system's slowness or warm caches
do not fall on another, and the model is warmed up before the clock starts; seconds are those
of the question itself (a recall item's earlier turns are timed apart). Prints, per family,
accuracy with a 95% Wilson interval and seconds per question for each system (for the mind also
its COMPLETE rate and how many answers cite a passage; for the mind and the RAG, on questions
with a source document, how many right answers cite a passage of that document: "right+src"),
then the issue's targets; writes every
reply, timing and judgement to ``bench/results/usefulness-<split>-<model>-<timestamp>.json``.

    .venv/bin/python bench/usefulness.py                             # dev split, default model
    BATOS_MODEL=test .venv/bin/python bench/usefulness.py --limit 3  # to see it work
    .venv/bin/python bench/usefulness.py --families computation --systems mind,bare
    .venv/bin/python bench/usefulness.py --split headline            # reported figures only
    .venv/bin/python bench/usefulness.py --split fresh1 --families document  # held out too
    .venv/bin/python bench/usefulness.py --split fresh2 --families document  # and a third
    .venv/bin/python bench/usefulness.py --split fresh3 --families document  # and a fourth
    .venv/bin/python bench/usefulness.py --split fresh4 --families document  # and a fifth
    .venv/bin/python bench/usefulness.py --split fresh5 --families document  # and a sixth
    .venv/bin/python bench/usefulness.py --split fresh6 --families document  # and a seventh
    .venv/bin/python bench/usefulness.py --split fresh7 --families document  # and an eighth
    .venv/bin/python bench/usefulness.py --split fresh8 --families document  # and a ninth
    .venv/bin/python bench/usefulness.py --split fresh9 --families document  # and a tenth
    .venv/bin/python bench/usefulness.py --split fresh10 --families document  # and an eleventh
    .venv/bin/python bench/usefulness.py --split fresh11 --families document  # and a twelfth
    .venv/bin/python bench/usefulness.py --split fresh12 --families document  # a thirteenth
    .venv/bin/python bench/usefulness.py --split fresh13 --families document  # a fourteenth
    .venv/bin/python bench/usefulness.py --split fresh14 --families document  # a fifteenth
    .venv/bin/python bench/usefulness.py --split fresh14 --families recall    # recall, held out
    .venv/bin/python bench/usefulness.py --split fresh15 --families document  # a sixteenth
    .venv/bin/python bench/usefulness.py --split fresh16 --families document  # a seventeenth
    .venv/bin/python bench/usefulness.py --split fresh17 --families document  # an eighteenth
    .venv/bin/python bench/usefulness.py --split fresh18 --families document  # a nineteenth

``headline/`` and ``fresh1/`` to ``fresh18/`` are for reported figures only: nobody reads their
replies to decide what to change (bench/data/usefulness/README.md). The eighteen fresh sets have
document questions only, so name ``--families document`` with them; ``fresh14`` also has the
second held-out recall set (``--families recall``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from bench.answers import judge
from bench.levers import add_option, apply_levers, parse_levers, tag
from graph.mind_state import MindServices, ModelFactory
from graph.request import content_text
from store.core.image import LivingImage
from store.knowledge.catalog import KnowledgeCatalog
from store.knowledge.chunking import clipped

DATA = Path(__file__).resolve().parent / "data" / "usefulness"
RESULTS = Path(__file__).resolve().parent / "results"
#: The held-out splits: for reported figures only, never tuned on.
HELD_OUT = ("headline", *(f"fresh{n}" for n in range(1, 19)))
SPLITS = ("dev", *HELD_OUT)
#: Family → its file in a split's folder.
FAMILIES = {
    "document": "doc_questions.jsonl",
    "computation": "computations.jsonl",
    "recall": "recall.jsonl",
}
SYSTEMS = ("mind", "bare", "rag")
#: Passages the naive RAG puts before the question.
RAG_PASSAGES = 5
RAG_PROMPT = "Answer the question using these passages:\n\n{passages}\n\nQuestion: {question}"
#: The issue's targets on the default model: (family, what, value).
TARGETS = (
    ("document", "mind - rag", 0.10),
    ("document", "mind", 0.75),
    ("computation", "mind - bare", 0.25),
    ("recall", "mind", 0.90),
)
#: An answer cites a passage with a marker such as [2] or [1, 3], or with a "Sources:" line.
CITATION = re.compile(r"\[\d{1,2}(?:\s*[,–-]\s*\d{1,2})*\]|^\W*sources?\s*:", re.I | re.M)
#: What the JSON keeps of each model call of a cycle.
CALL_FIELDS = ("node", "persona", "seconds", "first_token_s", "output_tokens", "finish_reason")
#: Longest error message kept for an item whose system raised.
ERROR_CHARS = 500


# -- the data and the world -------------------------------------------------------------------


def load_items(
    split: str,
    families: Sequence[str],
    limit: int | None = None,
    data: Path = DATA,
    only: Sequence[str] = (),
) -> dict[str, list[dict[str, Any]]]:
    """The questions of each family of ``split``, the first ``limit`` of each when given;
    with ``only``, just the questions of those ids (an id the split lacks is an error)."""
    if split not in SPLITS:
        raise SystemExit(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    found: dict[str, list[dict[str, Any]]] = {}
    for family in families:
        if family not in FAMILIES:
            raise SystemExit(f"unknown family {family!r}: use some of {', '.join(FAMILIES)}")
        path = data / split / FAMILIES[family]
        if not path.is_file():
            raise SystemExit(
                f"split {split!r} has no {family} questions: {path} is missing "
                "(choose the families it has with --families)"
            )
        with path.open(encoding="utf-8") as lines:
            items = [json.loads(line) for line in lines if line.strip()]
        if only:
            items = [item for item in items if item["id"] in only]
        found[family] = items if limit is None else items[:limit]
    missing = sorted(set(only) - {item["id"] for items in found.values() for item in items})
    if missing:
        raise SystemExit(f"split {split!r} has no questions {', '.join(missing)} in {families}")
    return found


def fresh_image(folder: Path) -> LivingImage:
    """A new file image in ``folder``, laid out and with the personas incarnated."""
    from batos.shell.runtime import open_image

    return open_image(f"file://{folder / 'usefulness.fs'}", create=True)


def ingest_corpus(image: LivingImage, corpus: Path) -> tuple[KnowledgeCatalog, dict[str, Any]]:
    """Ingest every file of ``corpus`` as ``batos ingest`` does; the catalog and what it did.

    A file that fails to ingest stops the bench: its questions would be judged on a catalog
    that lacks their source.
    """
    from store.knowledge.ingest import expand, ingest_paths

    if not corpus.is_dir():
        raise SystemExit(f"no corpus folder at {corpus}")
    catalog = KnowledgeCatalog.open(image)
    report = ingest_paths(catalog, list(expand([corpus])))
    if report.failed:
        reasons = "; ".join(f"{path}: {error.message}" for path, error in report.failed)
        raise SystemExit(f"the corpus did not ingest whole: {reasons}")
    facts = {
        "corpus": str(corpus),
        "files": len(report.added) + len(report.replaced) + len(report.unchanged),
        "chunks": report.chunks,
        "seconds": round(report.seconds, 2),
    }
    return catalog, facts


#: How the image's facet methods stand when the questions start: written ahead of use, as
#: ``batos init --prepare`` leaves them, or not yet (a fresh image before the heartbeat ran).
FACET_STATES = ("prepared", "unwritten")


def prepare_facets(
    image: LivingImage, models: ModelFactory | None, state: str = "prepared"
) -> dict[str, Any]:
    """Write every facet method the image lacks, as ``batos init --prepare`` does (for
    ``state`` 'prepared'); what was written, and what could not be and why."""
    from graph import facet_writing

    if state not in FACET_STATES:
        raise SystemExit(f"unknown facet state {state!r}: use one of {', '.join(FACET_STATES)}")
    if state == "unwritten":
        return {"state": state, "facets": []}
    with image.read() as root:
        todo = facet_writing.missing(root)
    started = time.perf_counter()
    done = facet_writing.write_all(image, models, todo)
    return {
        "state": state,
        "seconds": round(time.perf_counter() - started, 2),
        "facets": [
            {"key": r.key, "ok": r.ok, "seconds": round(r.seconds, 2), "reason": r.reason}
            for r in done
        ],
    }


def facets_line(prepared: dict[str, Any]) -> str:
    facets = prepared["facets"]
    if prepared["state"] == "unwritten":
        return "facet methods: none written (--facets unwritten)"
    line = f"facet methods: {sum(f['ok'] for f in facets)}/{len(facets)} written ahead"
    failed = [f["key"] for f in facets if not f["ok"]]
    return line + (f"; not written: {', '.join(failed)}" if failed else "")


def wilson(hits: int, n: int) -> tuple[float, float] | None:
    """The 95% Wilson score interval of ``hits`` out of ``n``; None when there is no trial."""
    if n <= 0:
        return None
    from scipy.stats import binomtest

    interval = binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
    return float(interval.low), float(interval.high)


# -- what a final state of the mind says ----------------------------------------------------


def _cycle_field(state: dict[str, Any], name: str) -> Any:
    """A field of the cycle record, else of the state itself; None when neither has it."""
    cycle = state.get("cycle") or {}
    if isinstance(cycle, dict) and name in cycle:
        return cycle[name]
    return state.get(name)


def cycle_facts(state: dict[str, Any]) -> dict[str, Any]:
    """What one cycle's final state tells a benchmark; a field the mind does not (yet) record
    is None, never a guess."""
    metrics = [m for m in state.get("metrics") or [] if isinstance(m, dict)]
    depth = _cycle_field(state, "depth") or {}
    cached = [m["cached_tokens"] for m in metrics if m.get("cached_tokens") is not None]
    partials = [p for p in state.get("partials") or [] if isinstance(p, dict)]
    return {
        "status": state.get("status"),
        "failure": state.get("failure"),
        "depth": depth.get("mode"),
        "depth_rule": depth.get("rule"),
        "personas": (state.get("route") or {}).get("chosen"),
        "model_calls": len(metrics),
        "calls": [{key: m.get(key) for key in CALL_FIELDS} for m in metrics],
        "input_tokens": sum(int(m.get("input_tokens") or 0) for m in metrics),
        "output_tokens": sum(int(m.get("output_tokens") or 0) for m in metrics),
        "cached_tokens": sum(cached) if cached else None,
        "degraded": _cycle_field(state, "degraded"),
        "truncated": _cycle_field(state, "truncated"),
        "grounding": _cycle_field(state, "grounding"),
        "thread": _cycle_field(state, "thread"),  # whether the thread answered it, and why
        "cited_passages": _cycle_field(state, "cited"),
        "evidence": _cycle_field(state, "evidence"),
        # what the gate asked for again when the answer did not give it (mind_asked)
        "gate_asked": _cycle_field(state, "gate_asked"),
        "plan": state.get("plan") or [],
        "plan_quality": _cycle_field(state, "plan_quality"),
        "partials": [
            {
                key: p.get(key)
                for key in (
                    "kind",
                    "persona",
                    "facet",
                    "ok",
                    "degraded",
                    "wrote",
                    "reason",
                    "figures",  # why copied figures were refused, when they were
                )
            }
            for p in partials
        ],
        "wrote_facets": sum(1 for p in partials if p.get("wrote")),
    }


def cites(text: str) -> bool:
    return bool(CITATION.search(text or ""))


def cited_numbers(text: str) -> list[int]:
    """The passage numbers ``text``'s markers cite ("[2]", "[1, 3]", "[1-3]" for 1 to 3)."""
    found: list[int] = []
    for marker in CITATION.finditer(text or ""):
        if not marker[0].startswith("["):
            continue
        for first, last in re.findall(r"(\d{1,2})(?:\s*[–-]\s*(\d{1,2}))?", marker[0]):
            low = int(first)
            top = max(low, int(last)) if last else low  # "[3-1]" is taken as [3]
            found += [n for n in range(low, min(top, low + 20) + 1) if n >= 1]
    return sorted(set(found))


# -- the systems --------------------------------------------------------------------------------


@dataclass
class Answer:
    """One system's answer to one question, before it is judged."""

    reply: str
    seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    #: Why the answer counts as wrong whatever it says (the mind's cycle FAILED).
    void: str = ""


@dataclass
class Systems:
    """The three systems over one image and its catalog.

    ``models`` is the chat-model factory of the bare model and the RAG (default
    ``batos.models.chat_model``); ``services`` what the mind runs with (default: its own
    defaults, as a user's ``ask`` has them).
    """

    image: LivingImage
    catalog: KnowledgeCatalog
    run_id: str
    models: ModelFactory | None = None
    services: MindServices | None = None
    #: How the bare model and the RAG decode: "persona" (BABS's Modelfile sampling, what a
    #: user's script gets) or "greedy" (temperature 0, as a careful user might set).
    baselines: str = "persona"
    _conversations: dict[str, tuple[list[BaseMessage], float]] = field(default_factory=dict)

    def babs(self, messages: list[BaseMessage]) -> tuple[str, dict[str, Any]]:
        """One call of BABS's chat model, made afresh as a user's script would."""
        factory = self.models
        if factory is None:
            from batos.models import chat_model

            factory = chat_model
        options = {"temperature": 0.0} if self.baselines == "greedy" else {}
        message = factory("BABS", **options).invoke(messages)
        usage = getattr(message, "usage_metadata", None) or {}
        return content_text(message.content), {
            "input_tokens": usage.get("input_tokens"),
            "output_tokens": usage.get("output_tokens"),
        }

    def conversation(self, item: dict[str, Any]) -> tuple[list[BaseMessage], float]:
        """A recall item's earlier turns, each followed by the bare model's reply; made once
        and shared by bare and rag, which differ only in the final question."""
        if item["id"] not in self._conversations:
            started = time.perf_counter()
            messages: list[BaseMessage] = []
            for turn in item.get("turns") or []:
                messages.append(HumanMessage(turn))
                messages.append(AIMessage(self.babs(messages)[0]))
            self._conversations[item["id"]] = (messages, time.perf_counter() - started)
        return self._conversations[item["id"]]

    def bare(self, item: dict[str, Any]) -> Answer:
        history, setup = self.conversation(item)
        started = time.perf_counter()
        reply, usage = self.babs([*history, HumanMessage(item["question"])])
        seconds = time.perf_counter() - started
        return Answer(reply, seconds, {**usage, **_setup(item, setup)})

    def rag(self, item: dict[str, Any]) -> Answer:
        history, setup = self.conversation(item)
        started = time.perf_counter()
        # record=False: the baseline leaves the retrieval times the mind's image keeps alone
        hits = self.catalog.search(item["question"], RAG_PASSAGES, record=False)
        passages = "\n\n".join(
            f"[{n}] ({Path(hit.source).name}) {clipped(hit.text)}" for n, hit in enumerate(hits, 1)
        )
        prompt = RAG_PROMPT.format(passages=passages, question=item["question"])
        reply, usage = self.babs([*history, HumanMessage(prompt)])
        seconds = time.perf_counter() - started
        extra = {
            **usage,
            **_setup(item, setup),
            "passages": [hit.citation for hit in hits],
            "source_retrieved": _has_source(item, [hit.source for hit in hits]),
            "cited": cites(reply),
            "cited_source": _has_source(
                item, [hits[n - 1].source for n in cited_numbers(reply) if n <= len(hits)]
            ),
        }
        return Answer(reply, seconds, extra)

    def mind(self, item: dict[str, Any]) -> Answer:
        from batos.shell.runtime import ask

        thread = f"usefulness-{self.run_id}-{item['id']}"
        started = time.perf_counter()
        turns = []
        for turn in item.get("turns") or []:
            state = ask(turn, thread_id=thread, image=self.image, services=self.services)
            turns.append({"status": state.get("status"), "failure": state.get("failure")})
        setup = time.perf_counter() - started
        started = time.perf_counter()
        state = ask(item["question"], thread_id=thread, image=self.image, services=self.services)
        seconds = time.perf_counter() - started
        facts = cycle_facts(state)
        reply = str(state.get("response") or "")
        # the passages the mind says the answer cites, else any marker the answer has
        cited = facts["cited_passages"]
        extra = {
            **facts,
            **_setup(item, setup),
            "cited": bool(cited) if cited is not None else cites(reply),
            # a citation is "path:start-end"
            "cited_source": _has_source(item, [c.rsplit(":", 1)[0] for c in cited or []]),
        }
        if turns:
            extra["turns"] = turns
        void = ""
        if facts["status"] != "COMPLETE":
            failure = facts["failure"] or {}
            void = f"the cycle ended {facts['status']}: {failure.get('reason', 'no reason given')}"
        return Answer(reply, seconds, extra, void)

    def answer(self, system: str, item: dict[str, Any]) -> Answer:
        return getattr(self, system)(item)


def _setup(item: dict[str, Any], seconds: float) -> dict[str, Any]:
    return {"setup_seconds": round(seconds, 3)} if item.get("turns") else {}


def _has_source(item: dict[str, Any], sources: Sequence[str]) -> bool | None:
    """Whether the question's source document is among ``sources`` (the documents of the
    passages retrieved, or cited); None for an item with no source."""
    wanted = item.get("source")
    if not wanted:
        return None
    return any(Path(source).name == wanted for source in sources)


# -- one run --------------------------------------------------------------------------------


def judged(item: dict[str, Any], system: str, systems: Systems) -> dict[str, Any]:
    """One system's answer to ``item``, judged; an error is a wrong answer that says why."""
    started = time.perf_counter()
    try:
        answer = systems.answer(system, item)
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]
        return {
            "reply": "",
            "seconds": round(time.perf_counter() - started, 3),
            "matched": False,
            "reason": f"error: {message}",
            "error": message,
        }
    if answer.void:
        matched, reason = False, answer.void
    else:
        verdict = judge(item, answer.reply)
        matched, reason = verdict.matched, verdict.reason
    return {
        "reply": answer.reply,
        "seconds": round(answer.seconds, 3),
        "matched": matched,
        "reason": reason,
        **answer.extra,
    }


def rotated(systems: Sequence[str], index: int) -> list[str]:
    """The systems in turn order for question ``index``: each goes first as often as the next."""
    shift = index % len(systems)
    return [*systems[shift:], *systems[:shift]]


def summarise(records: Sequence[dict[str, Any]], system: str) -> dict[str, Any]:
    """Accuracy, its interval and seconds of one system over ``records`` (one family's)."""
    rows = [r["systems"][system] for r in records if system in r["systems"]]
    n, hits = len(rows), sum(1 for r in rows if r["matched"])
    seconds = [r["seconds"] for r in rows]
    found: dict[str, Any] = {
        "n": n,
        "hits": hits,
        "accuracy": hits / n if n else None,
        "interval": wilson(hits, n),
        "mean_s": statistics.fmean(seconds) if seconds else None,
        "median_s": statistics.median(seconds) if seconds else None,
        "errors": sum(1 for r in rows if "error" in r),
    }
    if system == "mind":
        found["complete"] = sum(1 for r in rows if r.get("status") == "COMPLETE")
        found["cited"] = sum(1 for r in rows if r.get("cited"))
        asked = [r for r in records if (r["systems"].get(system) or {}).get("gate_asked")]
        if asked:
            found["asked_again"] = {
                "n": len(asked),
                "right": sum(1 for r in asked if r["systems"][system]["matched"]),
                "ids": [r["id"] for r in asked],
            }
    if any(r.get("cited_source") is not None for r in rows):
        # right answers citing a passage of the document the answer is in
        found["right_cited_source"] = sum(1 for r in rows if r["matched"] and r.get("cited_source"))
    return found


def comparisons(summary: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's targets that this run's families and systems can speak to."""
    rows = []
    for family, what, target in TARGETS:
        ran = summary.get(family) or {}
        names = what.split(" - ")
        if not all(ran.get(name, {}).get("n") for name in names):
            continue
        values = [ran[name]["accuracy"] for name in names]
        value = values[0] - values[1] if len(values) == 2 else values[0]
        rows.append(
            {
                "family": family,
                "what": what,
                "value": value,
                "target": target,
                "passed": value >= target - 1e-12,
            }
        )
    return rows


def paired(records: Sequence[dict[str, Any]], first: str, second: str) -> tuple[int, int]:
    """Questions only ``first`` got right, and only ``second`` did (the pairs that differ)."""
    only_first = only_second = 0
    for record in records:
        answers = record["systems"]
        if first in answers and second in answers:
            a, b = answers[first]["matched"], answers[second]["matched"]
            only_first += a and not b
            only_second += b and not a
    return only_first, only_second


def run(
    split: str = "dev",
    families: Sequence[str] = tuple(FAMILIES),
    systems: Sequence[str] = SYSTEMS,
    limit: int | None = None,
    *,
    models: ModelFactory | None = None,
    services: MindServices | None = None,
    data: Path = DATA,
    results: Path = RESULTS,
    model_name: str | None = None,
    facets: str = "prepared",
    levers: dict[str, str] | None = None,
    progress: Callable[[str], None] = print,
    baselines: str = "persona",
    only: Sequence[str] = (),
) -> tuple[dict[str, Any], Path]:
    """Run the bench and write its JSON; returns the report and where it was written.

    ``models`` and ``services`` replace the chat-model factory and the mind's services (tests
    pass scripted ones); left None, the configured model answers. ``levers`` (name → on|off,
    ``bench.levers``) are set for the run and recorded in the report and its file's name;
    ``baselines`` ("persona" or "greedy") is how the bare model and the RAG decode.
    """
    from batos import settings

    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems:
        raise SystemExit(f"unknown systems {unknown}: use some of {', '.join(SYSTEMS)}")
    items = load_items(split, families, limit, data, only)
    model_name = model_name or settings.get_str("model")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report: dict[str, Any] = {
        "split": split,
        "model": model_name,
        "started": stamp,
        "families": list(families),
        "systems": list(systems),
        "order": "systems rotate per question: each goes first in turn",
        "levers": dict(levers or {}),
        "baselines": baselines,
        "environment": apply_levers(levers or {}),
        "items": [],
    }
    results.mkdir(parents=True, exist_ok=True)
    lever_tag = tag(levers or {}) + ("-baselines-greedy" if baselines == "greedy" else "")
    path = results / f"usefulness-{split}-{_file_part(model_name)}{lever_tag}-{stamp}.json"
    with tempfile.TemporaryDirectory() as folder:
        image = fresh_image(Path(folder))
        try:
            catalog, report["ingest"] = ingest_corpus(image, data / split / "docs")
            report["facets"] = prepare_facets(
                image, services.models if services is not None else None, facets
            )
            if services is not None and services.catalog is None:
                # given services come with their own embedder, which may not be the encoder
                # the catalog's vectors were made with: the mind searches the bench's catalog
                services = replace(services, catalog=catalog)
            world = Systems(
                image, catalog, stamp, models=models, services=services, baselines=baselines
            )
            report["warmup_s"] = warm_up(world, systems)
            index = 0
            try:
                for family, questions in items.items():
                    for item in questions:
                        record = {
                            "id": item["id"],
                            "family": family,
                            "question": item["question"],
                            "answer": item["answer"],
                            "systems": {},
                        }
                        for system in rotated(systems, index):
                            record["systems"][system] = judged(item, system, world)
                        progress(_progress_line(record))
                        report["items"].append(record)
                        index += 1
            except KeyboardInterrupt:
                report["interrupted"] = True
                progress("interrupted: the items so far are written")
            catalog.close()
        finally:
            image.close()
    summary = {
        family: {
            system: summarise([r for r in report["items"] if r["family"] == family], system)
            for system in systems
        }
        for family in items
    }
    report["summary"] = summary
    report["comparisons"] = comparisons(summary)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str))
    return report, path


def warm_up(world: Systems, systems: Sequence[str]) -> float:
    """Load the model, the router and the encoders before any question is timed."""
    started = time.perf_counter()
    if "bare" in systems or "rag" in systems:
        world.babs([HumanMessage("Say hello.")])
    if "rag" in systems:
        world.catalog.search("warm up", RAG_PASSAGES, record=False)
    if "mind" in systems:
        from batos.shell.runtime import ask

        ask(
            "hello",
            thread_id=f"usefulness-{world.run_id}-warm-up",
            image=world.image,
            services=world.services,
        )
    return round(time.perf_counter() - started, 2)


def _file_part(name: str) -> str:
    """A model name fit for a file name (a GGUF path gives its stem)."""
    stem = Path(name).stem if os.sep in name else name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem) or "model"


def _progress_line(record: dict[str, Any]) -> str:
    marks = "  ".join(
        f"{system} {'ok' if answer['matched'] else 'no'} {answer['seconds']:.1f}s"
        for system, answer in record["systems"].items()
    )
    return f"{record['id']:<16}{marks}"


# -- the printed report -----------------------------------------------------------------------


def _fraction(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def table(report: dict[str, Any]) -> str:
    """The per-family tables and the targets, as printed."""
    levers = ", ".join(f"{k}={v}" for k, v in report.get("levers", {}).items()) or "defaults"
    lines = [
        f"Usefulness on split {report['split']!r}, model {report['model']!r} "
        f"(ingest: {report['ingest']['files']} files, {report['ingest']['chunks']} chunks), "
        f"levers: {levers}"
        + ("; bare and RAG decode greedily" if report.get("baselines") == "greedy" else ""),
        facets_line(report["facets"]),
    ]
    header = (
        f"{'system':<8}{'n':>4}{'accuracy':>10}{'95% interval':>16}{'mean s':>9}"
        f"{'median s':>10}{'errors':>8}{'COMPLETE':>10}{'cited':>7}{'right+src':>11}"
    )
    for family, by_system in report["summary"].items():
        lines += ["", family, header]
        for system, row in by_system.items():
            interval = row["interval"]
            shown = "-" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"
            mean = "-" if row["mean_s"] is None else f"{row['mean_s']:.1f}"
            median = "-" if row["median_s"] is None else f"{row['median_s']:.1f}"
            complete = f"{row['complete']}/{row['n']}" if "complete" in row else "-"
            cited = f"{row['cited']}/{row['n']}" if "cited" in row else "-"
            sourced = "-"
            if "right_cited_source" in row:
                sourced = f"{row['right_cited_source']}/{row['hits']}"
            lines.append(
                f"{system:<8}{row['n']:>4}{_fraction(row['accuracy']):>10}{shown:>16}"
                f"{mean:>9}{median:>10}{row['errors']:>8}{complete:>10}{cited:>7}{sourced:>11}"
            )
            if "asked_again" in row:
                again = row["asked_again"]
                lines.append(
                    f"  {system}: asked again for what its question asks on {again['n']} "
                    f"({again['right']} right after): {', '.join(again['ids'])}"
                )
    if report["comparisons"]:
        lines += ["", f"{'target':<28}{'value':>8}{'target':>9}  verdict"]
        for row in report["comparisons"]:
            sign = "+" if " - " in row["what"] else ""
            value = f"{row['value']:+.2f}" if sign else f"{row['value']:.2f}"
            lines.append(
                f"{row['family'] + ': ' + row['what']:<28}{value:>8}"
                f"{'>= ' + sign + format(row['target'], '.2f'):>9}  "
                f"{'PASS' if row['passed'] else 'MISS'}"
            )
        for row in report["comparisons"]:
            if " - " in row["what"]:
                first, second = row["what"].split(" - ")
                records = [r for r in report["items"] if r["family"] == row["family"]]
                a, b = paired(records, first, second)
                lines.append(
                    f"  {row['family']}: {a} right for {first} alone, {b} for {second} alone"
                )
    if report.get("interrupted"):
        lines.append("\n(interrupted: these figures cover the items answered before)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", choices=SPLITS, default="dev")
    parser.add_argument(
        "--families", default=",".join(FAMILIES), help=f"some of {', '.join(FAMILIES)}"
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"some of {', '.join(SYSTEMS)}"
    )
    parser.add_argument("--limit", type=int, default=None, help="first N questions per family")
    parser.add_argument("--only", default="", help="just these question ids, comma-separated")
    parser.add_argument(
        "--model", default=None, help="base model (sets BATOS_MODEL; default: the setting)"
    )
    parser.add_argument(
        "--facets",
        choices=FACET_STATES,
        default="prepared",
        help="write the facet methods before the questions (as batos init --prepare), or not",
    )
    parser.add_argument(
        "--baselines",
        choices=("persona", "greedy"),
        default="persona",
        help="how the bare model and the RAG decode: BABS's own sampling (default) or "
        "greedy, temperature 0",
    )
    add_option(parser)
    args = parser.parse_args()
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.model:
        os.environ["BATOS_MODEL"] = args.model
    if args.split in HELD_OUT:
        print(f"{args.split} split: for the reported figures only; do not tune on its replies")
    report, path = run(
        args.split,
        [f.strip() for f in args.families.split(",") if f.strip()],
        [s.strip() for s in args.systems.split(",") if s.strip()],
        args.limit,
        facets=args.facets,
        levers=parse_levers(args.lever),
        baselines=args.baselines,
        only=[i.strip() for i in args.only.split(",") if i.strip()],
    )
    print()
    print(table(report))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
