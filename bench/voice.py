"""Persona voice: is each reply recognisably ROBIN's, BRICK's, BABS's or ALFRED's?

    python bench/voice.py                    # the default model (about an hour on 2 CPU cores)
    python bench/voice.py --quick            # the test model, a few prompts (to see it work)
    python bench/voice.py --classifier-only  # validate the classifier; no model is loaded
    python bench/voice.py --report-only      # the table from the replies cached so far
    python bench/voice.py --seed 1 --sets far --conditions both   # the far figure on another draw
    python bench/voice.py --sets fresh --conditions both --personas alfred --mind --mind-set fresh
    python bench/voice.py --sets fresh2 --conditions both    # the second held-out far set

Replies are attributed by a style classifier — TF-IDF over word 1–2-grams and character 2–5-grams,
logistic regression — trained on the training replies only (modelfiles/data/<persona>.jsonl) and
validated on the held-out reference replies (heldout.jsonl), which no model and no training step
saw. Its validation figure is printed beside every result, and no model figure is reported when it
is under 0.90: a classifier that cannot tell the reference replies apart says nothing about a
model's.

Every persona answers every prompt of the held-out prompts (near the training topics) and of
modelfiles/data/voice_prompts.jsonl (no content word shared with any training prompt): `near`, in
one persona's territory; `far`, far from all of them; `fresh`, more far prompts written after
ALFRED's adapter had been chosen on the far ones, so that a change made to raise a far figure
is measured again on prompts it was not chosen on; and `fresh2`, more far prompts written after
the fresh set's first run, kept out of every choice made on far and fresh; and `fresh3`, written
before a candidate chosen on far, fresh and fresh2 was measured, to confirm it. Under three
conditions:

    adapter   the persona's LoRA adapter, a neutral system prompt in place of the persona's
    system    the persona's system prompt, no adapter (BATOS_ADAPTERS=off)
    both      adapter and system prompt: what a user gets

With --mind it also runs the mind (graph/mind.py) with one persona routed, on the far prompts
(--mind-set fresh, fresh2 or fresh3: that set's), and attributes its final answers the same way.

Each figure is the share of replies attributed to the persona that wrote them, with a 95% Wilson
interval (the sets are small). Under it, each reply's relevance to its prompt: the mean cosine of
their embeddings (all-MiniLM-L6-v2), the measure the retraining mission holds a new adapter to
(batos/training/retrain.py), so that a voice bought by answering beside the question shows.
Replies are sampled at each persona's Modelfile temperature with a fixed seed (--seed, 0 by
default): another seed is another draw of the same replies, which shows how much of a figure is the
luck of one draw. Replies are cached in bench/results/voice-replies.jsonl keyed by model,
condition, persona, prompt, adapter and system prompt digests and sampling (seed included), so an
interrupted run resumes and re-scoring costs nothing. Writes bench/results/voice-<model>.json
(-seed<N> added for another seed, -part for a run over some sets or conditions, so that it never
overwrites a full run's figures).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batos.models.modelfile import adapter_path
from batos.training.voice import (
    PERSONAS,
    VALIDATION_FLOOR,
    Score,
    attribution,
    classifier_rows,
    content_words,  # noqa: F401  (the bench's instruments, tested through it)
    heldout_rows,
    train_classifier,
    training_rows,  # noqa: F401
    usable,
    validate,
    voice_prompts,
    wilson,  # noqa: F401
)

CONDITIONS = ("adapter", "system", "both")
#: The prompt sets, in the order they run (see ``prompt_sets``).
SET_NAMES = ("far", "heldout", "near", "fresh", "fresh2", "fresh3")
CONDITION_LABELS = {
    "adapter": "adapter only",
    "system": "system prompt only",
    "both": "adapter + system prompt",
}
#: Stands in for the persona's SYSTEM in the adapter-only condition (a system message in the
#: call replaces the Modelfile's, as in Ollama), so neither the persona's words nor the base
#: model's own default identity line decide the voice.
NEUTRAL_SYSTEM = "You are a helpful assistant."
REPLY_TOKENS = 64
SEED = 0  # --seed; part of every cache key
RESULTS = Path(__file__).resolve().parent / "results"
CACHE = RESULTS / "voice-replies.jsonl"


# --- replies -------------------------------------------------------------------------------


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


class ReplyCache:
    """Generated replies by key, appended to a JSONL file one by one (a crash loses one reply)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.replies: dict[str, str] = {}
        self.rows: dict[str, dict[str, Any]] = {}
        self._torn = False  # the last line was cut short: the next one must start afresh
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            self._torn = bool(text) and not text.endswith("\n")
            for line in text.splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by an interrupted run
                    continue
                self.replies[row["key"]] = row["reply"]
                self.rows[row["key"]] = row

    def row(self, key: str) -> dict[str, Any] | None:
        return self.rows.get(key)

    def get(self, key: str) -> str | None:
        return self.replies.get(key)

    def put(self, key: str, reply: str, meta: dict[str, Any]) -> None:
        self.replies[key] = reply
        self.rows[key] = {"key": key, **meta, "reply": reply}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            if self._torn:
                out.write("\n")
                self._torn = False
            out.write(json.dumps({"key": key, **meta, "reply": reply}) + "\n")


class Speaker:
    """Persona replies on one base model under the three conditions, through the real backend."""

    def __init__(
        self,
        which: str,
        cache: ReplyCache,
        tokens: int = REPLY_TOKENS,
        offline: bool = False,
        seed: int = SEED,
    ) -> None:
        from batos.models.embedded import EmbeddedChatModel

        self.which = which
        self.offline = offline  # only what the cache holds; nothing is generated
        self.cache = cache
        self.tokens = tokens
        self.seed = seed
        self.generated = 0
        self.seconds = 0.0
        self._model = EmbeddedChatModel
        self._adapter_sha: dict[str, str] = {}

    def adapter_sha(self, persona: str) -> str:
        if persona not in self._adapter_sha:
            path = adapter_path(self.which, persona)
            if not path.is_file():
                raise SystemExit(f"no adapter for {persona} on model {self.which!r}: {path}")
            self._adapter_sha[persona] = _sha(path.read_bytes())
        return self._adapter_sha[persona]

    def key(self, condition: str, persona: str, prompt: str) -> str:
        model = self._chat(persona)
        system = NEUTRAL_SYSTEM if condition == "adapter" else model.system_prompt()
        adapter = "none" if condition == "system" else self.adapter_sha(persona)
        parts = [self.which, condition, persona, prompt, adapter, _sha(system), self.tokens]
        parts.append(self.seed)
        return _sha(json.dumps(parts))

    def _chat(self, persona: str) -> Any:
        return self._model(
            persona=persona,
            base_model=self.which,
            num_predict=self.tokens,
            seed=self.seed,
            timeout=900,
        )

    def reply(self, condition: str, persona: str, prompt: str) -> str | None:
        key = self.key(condition, persona, prompt)
        cached = self.cache.get(key)
        if cached is not None or self.offline:
            return cached
        from langchain_core.messages import HumanMessage, SystemMessage

        messages: list[Any] = [HumanMessage(prompt)]
        if condition == "adapter":
            messages.insert(0, SystemMessage(NEUTRAL_SYSTEM))
        previous = os.environ.get("BATOS_ADAPTERS")
        os.environ["BATOS_ADAPTERS"] = "off" if condition == "system" else "on"
        started = time.perf_counter()
        try:
            message = self._chat(persona).invoke(messages)
        finally:
            if previous is None:
                os.environ.pop("BATOS_ADAPTERS", None)
            else:
                os.environ["BATOS_ADAPTERS"] = previous
        self.seconds += time.perf_counter() - started
        self.generated += 1
        used = message.response_metadata.get("adapters", [])
        if bool(used) == (condition == "system"):  # the condition must be what actually ran
            raise SystemExit(f"{condition} reply for {persona} ran with adapters {used}")
        text = str(message.content).strip()
        self.cache.put(
            key,
            text,
            {"model": self.which, "condition": condition, "persona": persona, "prompt": prompt},
        )
        return text


def mind_replies(
    speaker: Speaker,
    prompts: Sequence[str],
    progress: Callable[[str], None] = print,
    personas: Sequence[str] = PERSONAS,
) -> tuple[list[tuple[str, str, str]], Counter[str], Counter[str]]:
    """The mind's final answers when the route is one persona, forced (``persona`` in the run
    context) on the fast path: ROUTE → SYNTHESIZING → gate → COMPLETE, on a throw-away image.

    The answer is capped at the bench's reply length (the mind's own cap is ANSWER_TOKENS);
    everything else — the persona's Modelfile, adapter, sampling, the gate — is the mind's.
    Returns ``(persona, answer, prompt)`` triples, how many cycles ended in each status, and
    per persona how many answers the gate sent back to be written again (cycles recorded
    before this was kept count as not sent back).
    """
    import tempfile

    from langchain_core.messages import HumanMessage

    from batos.models import chat_model
    from batos.shell.runtime import open_image
    from graph.mind import MindServices, build_graph, run_config
    from store.checkpoint.saver import ZODBSaver

    def capped(persona: str, **options: Any) -> Any:
        limit = min(int(options.get("num_predict") or speaker.tokens), speaker.tokens)
        return chat_model(persona, **{**options, "num_predict": limit, "backend": "embedded"})

    pairs: list[tuple[str, str, str]] = []
    statuses: Counter[str] = Counter()
    retried: Counter[str] = Counter()
    todo = [(p, who) for p in prompts for who in personas]
    missing = [
        (p, who) for p, who in todo if speaker.cache.get(speaker.key("mind", who, p)) is None
    ]
    if missing and not speaker.offline:
        with tempfile.TemporaryDirectory(prefix="batos-voice-") as folder:
            with (
                open_image(f"file://{folder}/voice.fs", create=True) as image,
                ZODBSaver(image) as saver,
            ):
                graph = build_graph(MindServices(models=capped, image=image), checkpointer=saver)
                for i, (prompt, persona) in enumerate(missing, 1):
                    started = time.perf_counter()
                    state = graph.invoke(
                        {"messages": [HumanMessage(prompt)]},
                        run_config(f"voice-{i}"),
                        context={"persona": persona, "depth": "fast"},
                    )
                    speaker.seconds += time.perf_counter() - started
                    speaker.generated += 1
                    speaker.cache.put(
                        speaker.key("mind", persona, prompt),
                        str(state.get("response") or "").strip(),
                        {
                            "model": speaker.which,
                            "condition": "mind",
                            "persona": persona,
                            "prompt": prompt,
                            "status": state.get("status"),
                            # An answer the gate sent back was written again under its retry
                            # prompt: what a user reads is then the second attempt.
                            "attempts": (state.get("cycle") or {}).get("synthesis_attempts"),
                            "gate": ((state.get("cycle") or {}).get("gate") or {}).get("reason"),
                        },
                    )
                    progress(f"  mind {i}/{len(missing)}: {state.get('status')}")
    for prompt, persona in todo:
        row = speaker.cache.row(speaker.key("mind", persona, prompt))
        if row is not None:
            statuses[str(row.get("status"))] += 1
            if (row.get("attempts") or 1) > 1:
                retried[persona] += 1
            if row["reply"]:
                pairs.append((persona, row["reply"], prompt))
    return pairs, statuses, retried


@dataclass(frozen=True)
class PromptSet:
    name: str
    prompts: tuple[str, ...]


def prompt_sets(quick: bool, names: Sequence[str] = SET_NAMES) -> list[PromptSet]:
    """The far half first (it is the target), then the shortest set, so that a run cut short
    has whole sets to report."""
    voice = voice_prompts()
    held = list(dict.fromkeys(r["prompt"] for r in heldout_rows()))
    sets = [
        PromptSet("far", tuple(r["prompt"] for r in voice if r["set"] == "far")),
        PromptSet("heldout", tuple(held)),
        PromptSet("near", tuple(r["prompt"] for r in voice if r["set"] == "near")),
        PromptSet("fresh", tuple(r["prompt"] for r in voice if r["set"] == "fresh")),
        PromptSet("fresh2", tuple(r["prompt"] for r in voice if r["set"] == "fresh2")),
        PromptSet("fresh3", tuple(r["prompt"] for r in voice if r["set"] == "fresh3")),
    ]
    sets = [s for s in sets if s.name in names]
    if quick:
        sets = [PromptSet(s.name, s.prompts[:2]) for s in sets]
    return sets


def collect(
    speaker: Speaker,
    sets: Iterable[PromptSet],
    progress: Callable[[str], None] = print,
    conditions: Sequence[str] = CONDITIONS,
    personas: Sequence[str] = PERSONAS,
) -> dict[str, dict[str, list[tuple[str, str, str]]]]:
    """``set → condition → [(persona, reply, prompt)]``, generating what the cache lacks.

    Conditions are interleaved prompt by prompt, so an interrupted run leaves them balanced.
    """
    out: dict[str, dict[str, list[tuple[str, str, str]]]] = {}
    for prompt_set in sets:
        table = out.setdefault(prompt_set.name, {c: [] for c in CONDITIONS})
        for i, prompt in enumerate(prompt_set.prompts, 1):
            for persona in personas:
                for condition in conditions:
                    text = speaker.reply(condition, persona, prompt)
                    if text is not None:
                        table[condition].append((persona, text, prompt))
            if speaker.generated:
                rate = speaker.seconds / speaker.generated
                progress(
                    f"  {prompt_set.name} {i}/{len(prompt_set.prompts)}: "
                    f"{speaker.generated} generated, {rate:.1f} s each"
                )
    return out


# --- report --------------------------------------------------------------------------------


def relevance(embedder: Any, replies: Sequence[tuple[str, str, str]]) -> dict[str, float | None]:
    """Per-persona and overall mean cosine between each prompt and its reply (the measure the
    retraining mission holds a new adapter to): a voice bought by answering beside the
    question shows here."""
    import numpy as np

    if not replies:
        return {}
    asked = embedder.encode([prompt for _, _, prompt in replies])
    said = embedder.encode([text for _, text, _ in replies])
    cosines = np.sum(asked * said, axis=1)
    out: dict[str, float | None] = {}
    for persona in (*PERSONAS, "overall"):
        mine = [
            c
            for (who, _, _), c in zip(replies, cosines, strict=True)
            if persona in (who, "overall")
        ]
        out[persona] = round(float(np.mean(mine)), 4) if mine else None
    return out


def print_relevance(means: dict[str, float | None]) -> None:
    """The relevance row under a voice row: each persona's mean, then the overall one."""
    cells = "".join(
        f"{'—' if means.get(p) is None else format(means[p], '.3f'):>19}"
        for p in (*PERSONAS, "overall")
    )
    print(f"{'  relevance (mean cosine)':26}{cells}")


def report(
    classifier: Any,
    validation: Score,
    replies: dict[str, dict[str, list[tuple[str, str, str]]]],
    embedder: Any = None,
) -> dict[str, Any]:
    """Print per-persona and overall attribution per set and condition, and with an
    ``embedder`` each reply's relevance to its prompt; return them."""
    gate = f"classifier validation {validation.rate:.2f} ({validation.hits}/{validation.n})"
    result: dict[str, Any] = {}
    merged: dict[str, list[tuple[str, str, str]]] = {c: [] for c in CONDITIONS}
    for name in ("far", "near"):
        for c in CONDITIONS:
            merged[c] += replies.get(name, {}).get(c, [])
    tables = [*((n, replies[n]) for n in ("far", "near") if n in replies)]
    if all(any(replies.get(name, {}).values()) for name in ("far", "near")):
        tables.append(("new (far + near)", merged))
    if "heldout" in replies:
        tables.append(("heldout", replies["heldout"]))
    if "fresh" in replies:
        tables.append(("fresh", replies["fresh"]))
    for name in ("fresh2", "fresh3"):
        if name in replies:
            tables.append((name, replies[name]))
    headers = {
        "far": "new prompts far from every persona's territory and every training topic",
        "near": "new prompts in one persona's territory, no training topic",
        "new (far + near)": "all new prompts",
        "heldout": "held-out prompts (near the training topics)",
        "fresh": "fresh far prompts, kept out of every choice made on the far set",
        "fresh2": "fresh2 far prompts, kept out of every choice made on far and fresh",
        "fresh3": "fresh3 far prompts, kept out of every choice made on the sets before it",
    }
    for name, table in tables:
        if not any(table.values()):
            print(f"\n{headers[name]}: no replies yet")
            continue
        count = max(len(v) for v in table.values())
        print(f"\n{headers[name]}, {count} replies a condition — {gate}")
        print(f"{'condition':26}" + "".join(f"{p:>19}" for p in (*PERSONAS, "overall")))
        result[name] = {}
        for condition in (c for c in CONDITIONS if table.get(c)):
            pairs = [(persona, text) for persona, text, _ in table[condition]]
            scores, _ = attribution(classifier, pairs)
            result[name][condition] = {k: v.as_dict() for k, v in scores.items()}
            cells = "".join(
                f"{str(scores.get(p, Score(0, 0))):>19}" for p in (*PERSONAS, "overall")
            )
            print(f"{CONDITION_LABELS[condition]:26}{cells}")
            if embedder is not None:
                means = relevance(embedder, table[condition])
                result[name].setdefault("relevance", {})[condition] = means
                print_relevance(means)
    return result


def _names(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type: a comma-separated selection from ``allowed``, in the given order."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"{', '.join(unknown) or 'nothing'}: choose from {', '.join(allowed)}"
            )
        return names

    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="test model, two prompts per set")
    parser.add_argument("--model", help="default | test (default: default, or test with --quick)")
    parser.add_argument("--classifier-only", action="store_true", help="validate; load no model")
    parser.add_argument("--report-only", action="store_true", help="score cached replies only")
    parser.add_argument(
        "--mind",
        action="store_true",
        help="also the mind's final answers on single-persona routes (see --mind-set)",
    )
    parser.add_argument(
        "--mind-set",
        choices=("far", "fresh", "fresh2", "fresh3"),
        default="far",
        help="the prompts the mind answers with --mind (default: far)",
    )
    parser.add_argument("--tokens", type=int, default=REPLY_TOKENS, help="reply length cap")
    parser.add_argument("--seed", type=int, default=SEED, help="sampling seed (default: 0)")
    parser.add_argument(
        "--sets",
        type=_names(SET_NAMES),
        default=SET_NAMES,
        help=f"prompt sets, comma-separated (default: {','.join(SET_NAMES)})",
    )
    parser.add_argument(
        "--conditions",
        type=_names(CONDITIONS),
        default=CONDITIONS,
        help=f"conditions, comma-separated (default: {','.join(CONDITIONS)})",
    )
    parser.add_argument(
        "--personas",
        type=lambda text: _names(PERSONAS)(text.upper()),
        default=PERSONAS,
        help="personas, comma-separated (default: all four; one alone when only its adapter "
        "changed, the others' replies being the same)",
    )
    args = parser.parse_args()
    which = args.model or ("test" if args.quick else "default")
    os.environ["BATOS_MODEL"] = which  # the mind's chat models read the setting

    classifier = train_classifier()
    validation = validate(classifier)
    low, high = validation.interval
    print(
        f"style classifier: trained on {len(classifier_rows())} training replies "
        "(as many a persona); "
        f"validation on the {validation.n} held-out reference replies: {validation.rate:.2f} "
        f"({validation.hits}/{validation.n}, 95% CI {low:.2f}–{high:.2f})"
    )
    if not usable(validation):
        print(
            f"validation is under {VALIDATION_FLOOR:.2f}: the classifier cannot tell the "
            "reference replies apart, so it reports no model figure"
        )
        sys.exit(1)
    if args.classifier_only:
        return

    speaker = Speaker(
        which, ReplyCache(CACHE), args.tokens, offline=args.report_only, seed=args.seed
    )
    sets = prompt_sets(args.quick, args.sets)
    print(
        f"model {which}: {sum(len(s.prompts) for s in sets)} prompts "
        f"× {len(args.personas)} personas "
        f"× {len(args.conditions)} conditions, replies capped at {args.tokens} tokens, "
        f"seed {args.seed}" + (" (cached replies only)" if args.report_only else "")
    )
    replies = collect(
        speaker,
        sets,
        progress=lambda line: print(line, flush=True),
        conditions=args.conditions,
        personas=args.personas,
    )
    from store.knowledge.embeddings import Embedder

    result = report(classifier, validation, replies, Embedder())
    if args.mind:
        chosen = next(s.prompts for s in prompt_sets(args.quick) if s.name == args.mind_set)
        pairs, statuses, retried = mind_replies(
            speaker, chosen, lambda line: print(line, flush=True), args.personas
        )
        scores, _ = attribution(classifier, [(who, text) for who, text, _ in pairs])
        means = relevance(Embedder(), pairs)
        ended = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
        print(
            "\nthe mind's final answers, one persona routed (fast path), "
            f"{args.mind_set} prompts — "
            f"classifier validation {validation.rate:.2f} ({validation.hits}/{validation.n}); "
            f"cycles: {ended or 'none'}"
        )
        print(f"{'':26}" + "".join(f"{p:>19}" for p in (*PERSONAS, "overall")))
        cells = "".join(f"{str(scores.get(p, Score(0, 0))):>19}" for p in (*PERSONAS, "overall"))
        print(f"{'mind answer':26}{cells}")
        print_relevance(means)
        again = "".join(f"{retried.get(p, 0):>19}" for p in PERSONAS)
        print(f"{'written again by the gate':26}{again}")
        result["mind"] = {
            "set": args.mind_set,
            "statuses": dict(statuses),
            "written_again": dict(retried),
            "scores": {k: v.as_dict() for k, v in scores.items()},
            "relevance": means,
        }
    RESULTS.mkdir(exist_ok=True)
    seed = f"-seed{args.seed}" if args.seed != SEED else ""
    # A run over some sets or conditions must not overwrite the full run's figures.
    whole = (
        set(args.sets) == set(SET_NAMES)
        and set(args.conditions) == set(CONDITIONS)
        and set(args.personas) == set(PERSONAS)
    )
    part = "" if whole else "-part"
    if args.mind and args.mind_set != "far":
        part += f"-mind-{args.mind_set}"
    out = RESULTS / f"voice-{which}{'-quick' if args.quick else ''}{seed}{part}.json"
    out.write_text(
        json.dumps(
            {
                "model": which,
                "tokens": args.tokens,
                "seed": args.seed,
                "validation": validation.as_dict(),
                "sets": result,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
