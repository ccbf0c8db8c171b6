"""doesNotUnderstand on a real model: pass rate with no oracle, and seconds per installed method.

Sets of intents with checks (strings, lists, numbers, stateful ones that update slots, and
persona-flavoured ones): the twenty below (``bench``) and the held-out sets in ``bench/data/``,
listed in ``HELDOUT_SETS`` with when each was written — each before the change it measures,
never used to tune a prompt (the README says how each set's misses were used afterwards).
For each, a fresh object is sent the unknown message once, as a user would: the kernel writes
examples from the intent, samples ``--drafts`` drafts, chooses by agreement and installs one;
nothing of the check reaches the model. The intent passes when the first result holds and the
installed method then passes a second call with other arguments (no-oracle pass rate: the
headline). The old mode is kept as a secondary line: one draft at a time, no examples, and the
check fed back to the model as a finding (an oracle a real message never comes with); there
pass@1 counts intents solved by the first draft and pass@3 within three. The model is loaded
and warmed up before the clock starts.

It also times one call of an installed method, isolated in a child process (the default) and
in the host process, against the same method compiled as plain Python, on a small receiver and
on one holding a 10,000-item list (the per-call covenant check pickles the receiver's slots).

    .venv/bin/python bench/jit.py                              # default model, every set
    BATOS_MODEL=test .venv/bin/python bench/jit.py --quick     # 2 intents per set, to see it work
    .venv/bin/python bench/jit.py --set heldout --drafts 1     # one set, one draft
    .venv/bin/python bench/jit.py --modes no-oracle --limit 8  # a subset, headline mode only
    .venv/bin/python bench/jit.py --calls-only                 # only the per-call costs
    .venv/bin/python bench/jit.py --set unseen7 --only max_run_sum,babs_cite  # named intents

``--adapters on|off|both`` runs the persona models with their adapters (what users get, the
default), without them, or both. ``--author SPEC`` (repeatable, or a comma list) runs it all
once per author model, as ``BATOS_AUTHOR_MODEL`` names one (``ollama:qwen2.5-coder:7b``,
``openai:NAME``, ``embedded:test``; ``persona`` for the personas' own models), side by side.
Prints a table and writes bench/results/jit-<model>[-tag].json, one per author
(jit-author-<backend>-<model>[-tag].json, its ``model`` key naming the author).

    BATOS_MODEL=test .venv/bin/python bench/jit.py --quick --author persona,embedded:test
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from persistent.mapping import PersistentMapping

from batos import settings
from batos.errors import ConfigurationError, GeneratedCodeError, ModelError
from batos.training import voice
from graph import jit
from prototypes import examples, kernel, trust
from prototypes.kernel import Mission
from prototypes.uvm import Method, UvmObject
from store.core.image import LivingImage


@dataclass
class Case:
    selector: str
    intent: str
    args: tuple
    expect: Callable[[Any, UvmObject], bool]
    again: tuple = ()
    expect_again: Callable[[Any, UvmObject], bool] | None = None
    slots: dict[str, Any] = field(default_factory=dict)
    #: The first call as one example a user would give when asked (held-out sets only).
    example: dict[str, Any] | None = None


CASES: list[Case] = [
    Case(
        "reverse_words",
        "Given a sentence, return it with the word order reversed.",
        ("the cat sat",),
        lambda r, o: r == "sat cat the",
        ("a b",),
        lambda r, o: r == "b a",
    ),
    Case(
        "count_vowels",
        "Given a text, return how many vowels (a, e, i, o, u) it contains.",
        ("education",),
        lambda r, o: r == 5,
        ("xyz",),
        lambda r, o: r == 0,
    ),
    Case(
        "title_case",
        "Given a text, return it with the first letter of each word upper-case.",
        ("hello big world",),
        lambda r, o: r == "Hello Big World",
        ("x",),
        lambda r, o: r == "X",
    ),
    Case(
        "is_palindrome",
        "Given a word, return True if it reads the same backwards, else False.",
        ("level",),
        lambda r, o: r is True,
        ("house",),
        lambda r, o: r is False,
    ),
    Case(
        "initials",
        "Given a full name, return the upper-case initials joined without spaces.",
        ("ada king lovelace",),
        lambda r, o: r == "AKL",
        ("bo",),
        lambda r, o: r == "B",
    ),
    Case(
        "dedupe",
        "Given a list, return its items without duplicates, keeping first order.",
        ([3, 1, 3, 2, 1],),
        lambda r, o: list(r) == [3, 1, 2],
        ([],),
        lambda r, o: list(r) == [],
    ),
    Case(
        "evens",
        "Given a list of integers, return a list of the even ones in order.",
        ([1, 2, 3, 4, 6],),
        lambda r, o: list(r) == [2, 4, 6],
        ([1],),
        lambda r, o: list(r) == [],
    ),
    Case(
        "flatten",
        "Given a list of lists, return one list with all their items in order.",
        ([[1, 2], [3], []],),
        lambda r, o: list(r) == [1, 2, 3],
        ([],),
        lambda r, o: list(r) == [],
    ),
    Case(
        "chunk",
        "Given a list and a size n, return the list split into consecutive lists of n.",
        ([1, 2, 3, 4, 5], 2),
        lambda r, o: [list(c) for c in r] == [[1, 2], [3, 4], [5]],
    ),
    Case(
        "top_three",
        "Given a list of numbers, return the three largest, largest first.",
        ([5, 1, 9, 7, 3],),
        lambda r, o: list(r) == [9, 7, 5],
    ),
    Case(
        "mean",
        "Given a list of numbers, return their arithmetic mean, or 0 if it is empty.",
        ([2, 4, 9],),
        lambda r, o: abs(r - 5) < 1e-9,
        ([],),
        lambda r, o: r == 0,
    ),
    Case(
        "factorial",
        "Given a non-negative integer n, return n factorial.",
        (5,),
        lambda r, o: r == 120,
        (0,),
        lambda r, o: r == 1,
    ),
    Case(
        "celsius_to_fahrenheit",
        "Given degrees Celsius, return degrees Fahrenheit.",
        (100,),
        lambda r, o: abs(r - 212) < 1e-9,
        (0,),
        lambda r, o: abs(r - 32) < 1e-9,
    ),
    Case(
        "is_prime",
        "Given an integer, return True if it is a prime number, else False.",
        (13,),
        lambda r, o: r is True,
        (12,),
        lambda r, o: r is False,
    ),
    Case(
        "digit_sum",
        "Given a non-negative integer, return the sum of its decimal digits.",
        (4096,),
        lambda r, o: r == 19,
        (0,),
        lambda r, o: r == 0,
    ),
    Case(
        "deposit",
        "Given an amount, add it to the balance slot and return the new balance.",
        (50,),
        lambda r, o: r == 150 and o.balance == 150,
        (25,),
        lambda r, o: r == 175 and o.balance == 175,
        {"balance": 100},
    ),
    Case(
        "add_tag",
        "Given a tag, append it to the tags slot (a list) unless it is already "
        "there; return the tags.",
        ("red",),
        lambda r, o: list(o.tags) == ["blue", "red"],
        ("red",),
        lambda r, o: list(o.tags) == ["blue", "red"],
        {"tags": ["blue"]},
    ),
    Case(
        "count_word",
        "Given a word, add one to its count in the counts slot (a dict) and return the new count.",
        ("hi",),
        lambda r, o: r == 1 and dict(o.counts) == {"hi": 1},
        ("hi",),
        lambda r, o: r == 2 and dict(o.counts) == {"hi": 2},
        {"counts": {}},
    ),
    Case(
        "rename",
        "Given a new name, store it in the name slot and return the old name.",
        ("Bo",),
        lambda r, o: r == "Al" and o.name == "Bo",
        ("Cy",),
        lambda r, o: r == "Bo" and o.name == "Cy",
        {"name": "Al"},
    ),
    Case(
        "reset_counter",
        "Set the counter slot to zero and return the value it had before.",
        (),
        lambda r, o: r == 7 and o.counter == 0,
        (),
        lambda r, o: r == 0 and o.counter == 0,
        {"counter": 7},
    ),
]


HELDOUT = Path(__file__).parent / "data" / "jit_intents_heldout.json"
#: Written after the held-out set and before any change made while reading results.
FRESH = Path(__file__).parent / "data" / "jit_intents_fresh.json"
#: Written after the fresh set's first full run, before any of its misses was looked at.
UNSEEN = Path(__file__).parent / "data" / "jit_intents_unseen.json"
#: Written after the unseen set's misses were read, before the changes they led to were measured.
UNSEEN2 = Path(__file__).parent / "data" / "jit_intents_unseen2.json"
#: Written after the unseen2 set's misses were read, before the next changes were made.
UNSEEN3 = Path(__file__).parent / "data" / "jit_intents_unseen3.json"
#: Written after the unseen3 set's misses were read, before the changes they led to were made.
UNSEEN4 = Path(__file__).parent / "data" / "jit_intents_unseen4.json"
#: Written after the unseen4 set's run, before any change that followed it.
UNSEEN5 = Path(__file__).parent / "data" / "jit_intents_unseen5.json"
#: Written after the unseen5 set's run, before any change that followed it.
UNSEEN6 = Path(__file__).parent / "data" / "jit_intents_unseen6.json"
#: Written after the unseen6 set's run, before the change its misses led to.
UNSEEN7 = Path(__file__).parent / "data" / "jit_intents_unseen7.json"
#: Written after the unseen7 set's run, before any change that followed it.
UNSEEN8 = Path(__file__).parent / "data" / "jit_intents_unseen8.json"
#: Written after the unseen8 set's run, before any change that followed it.
UNSEEN9 = Path(__file__).parent / "data" / "jit_intents_unseen9.json"
#: Written after the unseen9 set's two runs, before any change that followed them.
UNSEEN10 = Path(__file__).parent / "data" / "jit_intents_unseen10.json"
#: Written after the unseen10 set's runs, before the change tried on it (a judge, reverted).
UNSEEN11 = Path(__file__).parent / "data" / "jit_intents_unseen11.json"
#: Written after the unseen11 set's runs, before any change that followed them.
UNSEEN12 = Path(__file__).parent / "data" / "jit_intents_unseen12.json"
#: Written with unseen14 and unseen15, before the selective-installation change (trust threshold,
#: Coder-Reviewer scoring) was measured; never used to tune a prompt or the threshold.
UNSEEN13 = Path(__file__).parent / "data" / "jit_intents_unseen13.json"
#: Written with unseen13, before the selective-installation change was measured.
UNSEEN14 = Path(__file__).parent / "data" / "jit_intents_unseen14.json"
#: Written with unseen13, before the selective-installation change was measured.
UNSEEN15 = Path(__file__).parent / "data" / "jit_intents_unseen15.json"
#: Written after the unseen15 set's live run, before any change that followed it.
UNSEEN16 = Path(__file__).parent / "data" / "jit_intents_unseen16.json"
#: Written after the unseen16 set's live run, before any change that followed it.
UNSEEN17 = Path(__file__).parent / "data" / "jit_intents_unseen17.json"
#: Written after the unseen17 set was written, before its first run.
UNSEEN18 = Path(__file__).parent / "data" / "jit_intents_unseen18.json"
#: Every held-out set by its --set name, in the order they were written.
HELDOUT_SETS = {
    "heldout": HELDOUT,
    "fresh": FRESH,
    "unseen": UNSEEN,
    "unseen2": UNSEEN2,
    "unseen3": UNSEEN3,
    "unseen4": UNSEEN4,
    "unseen5": UNSEEN5,
    "unseen6": UNSEEN6,
    "unseen7": UNSEEN7,
    "unseen8": UNSEEN8,
    "unseen9": UNSEEN9,
    "unseen10": UNSEEN10,
    "unseen11": UNSEEN11,
    "unseen12": UNSEEN12,
    "unseen13": UNSEEN13,
    "unseen14": UNSEEN14,
    "unseen15": UNSEEN15,
    "unseen16": UNSEEN16,
    "unseen17": UNSEEN17,
    "unseen18": UNSEEN18,
}


def cases_of(name: str) -> list[Case]:
    """A set's cases by its --set name: the bench's own (``bench``) or a held-out one."""
    return list(CASES) if name == "bench" else heldout_cases(HELDOUT_SETS[name])


def _data_check(call: dict[str, Any]) -> Callable[[Any, UvmObject], bool]:
    expected = examples.normal(call.get("returns"))
    after = {k: examples.normal(v) for k, v in (call.get("slots_after") or {}).items()}

    def check(result: Any, obj: UvmObject) -> bool:
        return examples.matches(expected, examples.normal(result)) and all(
            examples.matches(v, examples.normal(getattr(obj, k, None))) for k, v in after.items()
        )

    return check


def heldout_cases(path: Path = HELDOUT) -> list[Case]:
    """The held-out intents as cases: the first call starts the mission, the second checks."""
    data = json.loads(path.read_text(encoding="utf-8"))
    cases = []
    for item in data["intents"]:
        first, again = item["calls"][0], item["calls"][1]
        cases.append(
            Case(
                item["selector"],
                item["intent"],
                tuple(first["args"]),
                _data_check(first),
                tuple(again["args"]),
                _data_check(again),
                dict(item.get("slots") or {}),
                {
                    "args": first["args"],
                    "returns": first["returns"],
                    "slots_before": item.get("slots") or {},
                    "slots_after": first.get("slots_after") or {},
                },
            )
        )
    return cases


@dataclass
class Outcome:
    selector: str
    solved_at: int | None
    seconds: float
    error: str = ""
    drafts: int = 0
    agreement: int = 0
    examples: int = 0
    disputed: int = 0
    installed: bool = True
    #: The installed method and the examples kept with it, so a run's misses can be read.
    source: str = ""
    kept: list[dict[str, Any]] = field(default_factory=list)
    #: Diagnosis, never fed to the kernel: how many of the mission's drafts that passed the
    #: gate (candidates) would have passed this intent's check. A miss with a right draft in
    #: the pool is the choice's fault; a miss with none, the drafts'.
    pool: int = 0
    pool_right: int = 0
    #: Each trust verdict the mission reached, in order (``prototypes.trust``): what the
    #: selective gate would decide at any threshold, since a refusal ends the mission at
    #: the first verdict under it.
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    #: Whether each of the first round's independent drafts is right (a draft the gate
    #: rejected is wrong): the drafts' own pass@k on this run, never fed to the kernel.
    first_drafts_right: list[bool] = field(default_factory=list)
    #: Whether the mission asked for an example (and got the case's first call as one).
    asked: bool = False


class _Runner(jit.JitRunner):
    """The kernel's runner, keeping the last mission so its drafts can be diagnosed."""

    mission: Mission | None = None

    def _finish(self, state: dict[str, Any], context: dict[str, Any]) -> Any:  # type: ignore[override]
        self.mission = context[jit.LIVE].mission
        return jit.JitRunner._finish(state, context)


def _receiver(case: Case, **extra: Any) -> UvmObject:
    """A fresh object with the case's slots (named 'bench' unless they name it)."""
    slots = {"name": "bench", **case.slots, **extra}
    return UvmObject(**slots)


def _first_drafts(case: Case, mission: Mission | None, drafts: int) -> list[bool]:
    if mission is None:
        return []
    return [passes(case, record.source) for record in mission.attempts[:drafts]]


def _asked(mission: Mission | None) -> bool:
    return mission is not None and bool(mission.user_examples)


def _verdicts(mission: Mission | None) -> list[dict[str, Any]]:
    return [] if mission is None else [v.as_dict() for v in mission.verdicts]


def _pool(case: Case, mission: Mission | None) -> tuple[int, int]:
    """(distinct candidate sources, how many of them pass the case's two calls), each run on
    a fresh receiver outside any image."""
    if mission is None:
        return 0, 0
    sources = list(dict.fromkeys(c.source for c in mission.candidates))
    return len(sources), sum(passes(case, source) for source in sources)


def passes(case: Case, source: str) -> bool:
    """Whether ``source`` passes the case's two calls, installed through the guardian and the
    sandbox on a fresh receiver outside any image (a rejected or raising draft is wrong)."""
    obj = _receiver(case)
    try:
        kernel.add_method(obj, case.selector, source)
        method = getattr(obj, case.selector)
        ok = _holds(case.expect, method(*case.args), obj)
        if ok and case.expect_again is not None:
            ok = _holds(case.expect_again, method(*case.again), obj)
    except Exception:
        return False
    return ok


def _drafts_used(obj: UvmObject, selector: str) -> int | None:
    method = obj._methods.get(selector)
    return None if method is None else int(method.audit.get("attempt", 0))


def run_case(
    case: Case,
    attempts: int,
    *,
    oracle: bool,
    drafts: int,
    trust: float | None = None,
    ask: bool = False,
) -> Outcome:
    image = LivingImage.open("memory://")
    try:

        def build(root: Any) -> None:
            root["obj"] = _receiver(case, intents=PersistentMapping({case.selector: case.intent}))

        image.transact(build)
        started = time.perf_counter()
        with image.connection() as conn:
            conn.transaction_manager.begin()
            obj = conn.root()["obj"]
            if oracle:  # the old mode: the check is fed back like an error, one draft at a time
                runner = _Runner(
                    attempts=attempts,
                    acceptance=lambda r: _holds(case.expect, r, obj),
                    drafts=1,
                    examples=False,
                )
            else:  # what a user gets: nothing of the check reaches the model
                # The reviewer reads every chosen draft back; with no threshold nothing is
                # refused, and the summary applies the gate to the recorded verdicts.
                # Asked, a user gives the first call as the example (its result is then
                # right by construction: the second call is the check that remains).
                answer = (lambda question: case.example) if ask and case.example else None
                runner = _Runner(
                    attempts=attempts, drafts=drafts, trust=trust, review=True, ask=answer
                )
            try:
                first = runner.send(obj, case.selector, case.args, {})
            except (GeneratedCodeError, ModelError) as exc:  # a miss, not the end of the run
                seconds = time.perf_counter() - started
                pool, right = _pool(case, runner.mission)
                return Outcome(
                    case.selector,
                    None,
                    seconds,
                    exc.message.splitlines()[0],
                    installed=False,
                    pool=pool,
                    pool_right=right,
                    verdicts=_verdicts(runner.mission),
                    first_drafts_right=_first_drafts(case, runner.mission, drafts),
                    asked=_asked(runner.mission),
                )
            seconds = time.perf_counter() - started
            pool, right = _pool(case, runner.mission)
            used = _drafts_used(obj, case.selector)
            method = obj._methods[case.selector]
            stored = list(method.examples)
            facts = {
                "drafts": int(method.audit.get("drafts") or 0),
                "agreement": int(method.audit.get("agreement") or 0),
                "examples": len(stored),
                "disputed": sum(1 for e in stored if e.get("status") == "disputed"),
                "source": method.source,
                "kept": [dict(e) for e in stored],
                "pool": pool,
                "pool_right": right,
                "verdicts": _verdicts(runner.mission),
                "first_drafts_right": _first_drafts(case, runner.mission, drafts),
                "asked": _asked(runner.mission),
            }
            ok = _holds(case.expect, first, obj)
            if ok and case.expect_again is not None:
                try:
                    ok = _holds(case.expect_again, getattr(obj, case.selector)(*case.again), obj)
                except Exception as exc:  # the installed method failing is a miss, not a crash
                    return Outcome(case.selector, None, seconds, f"second call: {exc}", **facts)
            conn.transaction_manager.commit()
        return Outcome(
            case.selector, used if ok else None, seconds, "" if ok else "wrong result", **facts
        )
    finally:
        image.close()


def _holds(check: Callable[[Any, UvmObject], bool], result: Any, obj: UvmObject) -> bool:
    try:
        return bool(check(result, obj))
    except Exception:
        return False


CALL_SOURCE = "def bump(self, x):\n    self.count = self.count + x\n    return self.count\n"


def call_costs(number: int) -> list[tuple[str, float, float]]:
    """Microseconds per call: sandboxed (process, host) and plain, on two receiver sizes."""
    rows = []
    sizes = (("small receiver", {}), ("10,000-item slot", {"items": list(range(10_000))}))
    for label, extra in sizes:
        plain = UvmObject(count=0, **extra)
        plain.bump = Method("bump", CALL_SOURCE)
        boxed = UvmObject(count=0, **extra)
        kernel.add_method(boxed, "bump", CALL_SOURCE)
        base = min(timeit.repeat(lambda o=plain: o.bump(1), number=number, repeat=3)) / number
        rows.append((f"plain method, {label}", base * 1e6, base * 1e6))
        for mode in ("host", "process"):
            os.environ["BATOS_SANDBOX_ISOLATION"] = mode
            n = max(20, number // (200 if mode == "process" else 20))
            took = min(timeit.repeat(lambda o=boxed: o.bump(1), number=n, repeat=3)) / n
            rows.append((f"sandboxed, isolation={mode}, {label}", took * 1e6, base * 1e6))
    os.environ.pop("BATOS_SANDBOX_ISOLATION", None)
    return rows


def _selectors(text: str) -> frozenset[str]:
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one selector")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the first two intents per set")
    parser.add_argument("--limit", type=int, default=0, help="only the first N intents per set")
    parser.add_argument(
        "--set",
        choices=("all", "both", "bench", *HELDOUT_SETS),
        default="all",
        help="every set (all), bench and heldout (both), or one",
    )
    parser.add_argument(
        "--modes", default="no-oracle,oracle", help="no-oracle (the headline), oracle, or both"
    )
    parser.add_argument("--attempts", type=int, default=3, help="rounds (no-oracle) or drafts")
    parser.add_argument("--drafts", type=int, default=0, help="independent drafts (0: setting)")
    parser.add_argument(
        "--only",
        type=_selectors,
        default=None,
        help="comma-separated selectors: only these intents of the chosen sets",
    )
    parser.add_argument("--tag", default="", help="suffix of the results file name")
    parser.add_argument(
        "--trust",
        default=None,
        help="the selective gate's threshold to report at (0-1 or off; default: the "
        "jit_trust setting)",
    )
    parser.add_argument(
        "--ask",
        action="store_true",
        help="run the gate live at --trust; a refused mission asks, and gets the intent's "
        "first call as the user's example",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="run the gate live at --trust, as users get it (split drafts draw a second "
        "batch before a refusal); a refused mission refuses, nobody is asked",
    )
    parser.add_argument(
        "--sweep", action="store_true", help="report the selective gate at thresholds 0.1-0.9"
    )
    parser.add_argument(
        "--rescore",
        type=Path,
        nargs="+",
        default=None,
        help="results files: report their selective figures at --trust, running no model",
    )
    parser.add_argument("--calls-only", action="store_true", help="only time method calls")
    parser.add_argument("--no-calls", action="store_true", help="skip timing method calls")
    parser.add_argument(
        "--adapters",
        choices=("both", "on", "off"),
        default="on",
        help="persona adapters on (what users get), off (system prompts only), or both",
    )
    parser.add_argument(
        "--author",
        action="append",
        default=None,
        metavar="SPEC",
        help="an author model to write the methods, as BATOS_AUTHOR_MODEL names one "
        "(ollama:NAME, openai:NAME, embedded:default|test|PATH; 'persona': the personas' "
        "own); repeat it or give a comma list to compare several (an author has no adapters)",
    )
    args = parser.parse_args()
    authors: list[str | None] = [None]
    if args.author:
        authors = [a.strip() for given in args.author for a in given.split(",") if a.strip()]
        for spec in authors:
            try:
                _author_label(spec)
            except ConfigurationError as exc:
                parser.error(f"--author {spec}: {exc}")
    if args.trust is None:
        threshold = trust.threshold()
    else:
        try:
            text = settings._off_or_unit(args.trust)
        except ValueError as exc:
            parser.error(f"--trust: {exc}")
        threshold = None if text == "off" else float(text)
    if args.rescore is not None:
        only = args.set if args.set not in ("all", "both") else None
        rescore(args.rescore, threshold, args.sweep, only)
        return
    costs = [] if args.no_calls else call_costs(2_000 if args.quick else 20_000)
    print(f"{'one call of an installed method':<52}{'us/call':>10}{'vs plain':>10}")
    for label, us, base in costs:
        print(f"{label:<52}{us:>10.1f}{us / base:>9.0f}x")
    if args.calls_only:
        return
    limit = 2 if args.quick else args.limit or None
    sets = {name: cases_of(name)[:limit] for name in ("bench", *HELDOUT_SETS)}
    if args.set == "both":
        sets = {name: sets[name] for name in ("bench", "heldout")}
    elif args.set != "all":
        sets = {args.set: sets[args.set]}
    if args.only is not None:
        known = {case.selector for cases in sets.values() for case in cases}
        unknown = sorted(args.only - known)
        if unknown:
            parser.error(f"--only: no intent named {', '.join(unknown)} in --set {args.set}")
        sets = {
            name: [case for case in cases if case.selector in args.only]
            for name, cases in sets.items()
        }
        sets = {name: cases for name, cases in sets.items() if cases}
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    drafts = args.drafts or settings.get_int("jit_drafts")
    conditions = ("on", "off") if args.adapters == "both" else (args.adapters,)
    tag = ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
    compared: dict[str, dict[str, dict[str, float]]] = {}
    for author in authors:
        load = os.getloadavg()
        runs = _run_author(author, sets, modes, conditions, drafts, args, threshold)
        loads = {"before": load, "after": os.getloadavg()}
        compared[_author_label(author) or settings.get_str("model")] = _report(
            author, runs, drafts, args, threshold, costs, tag, loads
        )
    if len(compared) > 1:
        print(f"\nAuthors side by side ({drafts} draft(s) no-oracle, up to {args.attempts} rounds)")
        print(f"{'author':<34}{'run':<34}{'pass':>8}{'pass@1':>8}{'s/installed':>13}")
        for label, summary in compared.items():
            for key, s in summary.items():
                print(
                    f"{label:<34}{key:<34}{s['pass']:>8.2f}{s['pass@1']:>8.2f}"
                    f"{s['seconds_per_installed_method']:>13.1f}"
                )


def _author_label(spec: str | None) -> str | None:
    """The author ``spec`` as ``BACKEND:MODEL`` ('persona' for the personas' own models; None
    for no --author: the setting in force, untouched). ``ConfigurationError`` if malformed."""
    from batos.models import author

    if not spec or spec == "persona":
        return spec or None
    parsed = author.parse(spec)
    assert parsed is not None
    return parsed.label


def _run_author(
    author: str | None,
    sets: dict[str, list[Case]],
    modes: list[str],
    conditions: tuple[str, ...],
    drafts: int,
    args: argparse.Namespace,
    threshold: float | None,
) -> dict[str, list[Outcome]]:
    """Every set in every mode with ``author`` writing the methods (``_author_label``)."""
    from batos.models import author_model

    if author == "persona":
        os.environ.pop("BATOS_AUTHOR_MODEL", None)
    elif author is not None:
        os.environ["BATOS_AUTHOR_MODEL"] = author
    if author is not None:
        print(f"\nauthor {_author_label(author)}:", flush=True)
    author_model("BRICK", num_predict=1).invoke("hi")  # load the model before the clock starts
    runs: dict[str, list[Outcome]] = {}
    for condition in conditions:
        # The persona models with their adapters (what users get) and on their system prompts
        # alone, to show whether a persona's voice costs code quality (an author has none).
        os.environ["BATOS_ADAPTERS"] = condition
        for mode in modes:
            for name, cases in sets.items():
                key = f"{name} {mode}" + (f" adapters {condition}" if len(conditions) > 1 else "")
                print(f"{key}:", flush=True)
                outcomes = runs[key] = []
                for case in cases:
                    outcome = run_case(
                        case,
                        args.attempts,
                        oracle=mode == "oracle",
                        drafts=drafts,
                        trust=threshold if args.ask or args.live else None,
                        ask=args.ask,
                    )
                    outcomes.append(outcome)
                    mark = "pass" if outcome.solved_at else f"miss ({outcome.error})"
                    print(
                        f"  {case.selector:<22} {outcome.seconds:7.1f} s  {mark}  "
                        f"[draft {outcome.solved_at or '-'}, {outcome.agreement}/"
                        f"{outcome.drafts} agree, {outcome.disputed}/{outcome.examples} "
                        f"examples disputed, {outcome.pool_right}/{outcome.pool} distinct "
                        "drafts right]",
                        flush=True,
                    )
    os.environ.pop("BATOS_ADAPTERS", None)
    return runs


def _report(
    author: str | None,
    runs: dict[str, list[Outcome]],
    drafts: int,
    args: argparse.Namespace,
    threshold: float | None,
    costs: list[tuple[str, float, float]],
    tag: str,
    loads: dict[str, tuple[float, float, float]],
) -> dict[str, dict[str, float]]:
    """Print ``author``'s tables and write its results file; its summary per run."""
    base = settings.get_str("model")
    # No --author: the author setting in force, if any, wrote the methods.
    label = _author_label(author if author is not None else settings.get_str("author_model"))
    # The results name the model that wrote the methods: the author, else the personas' base.
    model = label if label not in (None, "persona") else base
    summary = {key: _summary(outcomes) for key, outcomes in runs.items()}
    print(
        f"\nJIT benchmark — model {model!r}"
        + (f" writing for the personas of {base!r}" if model != base else "")
        + f", {drafts} draft(s) no-oracle, up to {args.attempts} rounds; load average "
        f"{loads['before'][0]:.2f} before, {loads['after'][0]:.2f} after"
    )
    print(f"{'run':<34}{'intents':>8}{'pass':>8}{'pass@1':>8}{'s/installed':>13}{'any draft':>11}")
    for key, s in summary.items():
        print(
            f"{key:<34}{s['intents']:>8}{s['pass']:>8.2f}{s['pass@1']:>8.2f}"
            f"{s['seconds_per_installed_method']:>13.1f}{s['any_draft_right']:>11.2f}"
        )
    print(
        "any draft: intents where at least one draft that passed the gate was right "
        "(a diagnosis of the choice, never fed to the kernel)"
    )
    headline = {key: outcomes for key, outcomes in runs.items() if "no-oracle" in key}
    if len(headline) > 1:
        headline["all"] = [o for outcomes in headline.values() for o in outcomes]
    if not args.live:  # a live run's first verdicts are not its last: read them live
        print_selective(headline, threshold, args.sweep)
        print(
            "refused: the chosen method scored under the threshold (nothing installed); "
            "failed: no draft got through the gate; pass@3: the kernel's own first three drafts"
        )
    if args.ask or args.live:
        print_asked(headline, threshold, asked=args.ask)
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    if label in (None, "persona"):
        stem = Path(base).stem
    else:
        backend, _, name = label.partition(":")
        shown = Path(name).stem if backend == "embedded" else name
        stem = "author-" + re.sub(r"[^A-Za-z0-9._-]+", "-", f"{backend}-{shown}")
    path = out / f"jit-{stem}{tag}.json"
    path.write_text(
        json.dumps(
            {
                "model": model,
                "author": label or "persona",
                "persona_model": base,
                "drafts": drafts,
                "attempts": args.attempts,
                "load_average": loads,
                "trust": threshold,
                "selective": {key: selective(o, threshold) for key, o in headline.items()},
                "asked": (
                    {key: with_asking(o) for key, o in headline.items()} if args.ask else None
                ),
                "live": (
                    {key: with_asking(o) for key, o in headline.items()} if args.live else None
                ),
                "runs": {
                    key: {**summary[key], "cases": [o.__dict__ for o in runs[key]]} for key in runs
                },
                "call_costs_us": {what: us for what, us, _ in costs},
            },
            indent=2,
            default=repr,  # a kept example's value that JSON cannot spell
        )
    )
    print(f"wrote {path}")
    return summary


def gated(outcome: Outcome | dict[str, Any], threshold: float | None) -> str:
    """What the selective gate at ``threshold`` makes of a recorded mission: 'right' or
    'wrong' (installed), 'refused' (a verdict under the threshold ends the mission there,
    nothing installed) or 'failed' (no working draft)."""
    data = outcome if isinstance(outcome, dict) else outcome.__dict__
    for verdict in data.get("verdicts") or []:
        if threshold is not None and verdict["score"] < threshold:
            return "refused"
    if not data.get("installed"):
        return "failed"
    return "right" if data.get("solved_at") is not None else "wrong"


def _pass_at(right: list[bool], k: int) -> float:
    n, c = len(right), sum(right)
    if n == 0:
        return 0.0
    k = min(k, n)
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson interval of a rate of ``hits`` in ``n`` (the package's), NaNs for none."""
    if n == 0:
        return (float("nan"), float("nan"))
    return voice.wilson(hits, n, z)


def selective(outcomes: list[Outcome] | list[dict[str, Any]], threshold: float | None) -> dict:
    """Precision, coverage and refusals of installation at ``threshold``, with the drafts'
    pass@3 on the same missions (coverage is judged against it)."""
    fates = [gated(o, threshold) for o in outcomes]
    n, right = len(fates), fates.count("right")
    installed = right + fates.count("wrong")
    data = [o if isinstance(o, dict) else o.__dict__ for o in outcomes]
    pass3 = (
        statistics.mean(_pass_at(d.get("first_drafts_right") or [], 3) for d in data) if n else 0
    )
    return {
        "threshold": threshold,
        **_tally(fates),
        "right_rate": right / n if n else float("nan"),
        "drafts_pass@3": pass3,
        "coverage_vs_pass@3": (installed / n) / pass3 if n and pass3 else float("nan"),
        "seconds_per_intent": statistics.mean(d["seconds"] for d in data) if n else float("nan"),
    }


def asked_fate(outcome: Outcome | dict[str, Any]) -> str:
    """What a mission run with the live gate and an answering user ended with."""
    data = outcome if isinstance(outcome, dict) else outcome.__dict__
    if data.get("installed"):
        return "right" if data.get("solved_at") is not None else "wrong"
    verdicts = data.get("verdicts") or []
    return "refused" if verdicts and not verdicts[-1].get("trusted", True) else "failed"


def _tally(fates: list[str]) -> dict[str, Any]:
    """Counts of each fate, and the precision and coverage of installing."""
    n, right, wrong = len(fates), fates.count("right"), fates.count("wrong")
    installed = right + wrong
    return {
        "intents": n,
        "installed": installed,
        "right": right,
        "wrong": wrong,
        "refused": fates.count("refused"),
        "failed": fates.count("failed"),
        "precision": right / installed if installed else float("nan"),
        "precision_95": wilson(right, installed),
        "coverage": installed / n if n else float("nan"),
    }


def with_asking(outcomes: list[Outcome] | list[dict[str, Any]]) -> dict[str, Any]:
    data = [o if isinstance(o, dict) else o.__dict__ for o in outcomes]
    return {
        **_tally([asked_fate(o) for o in outcomes]),
        "asked": sum(1 for d in data if d.get("asked")),
    }


SWEEP = (None, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def print_selective(runs: dict[str, list[Any]], threshold: float | None, sweep: bool) -> None:
    shown = "off" if threshold is None else f"{threshold:.2f}"
    print(f"\nSelective installation at jit_trust {shown} (nothing of the checks reaches it)")
    print(
        f"{'run':<34}{'intents':>8}{'inst':>6}{'right':>6}{'wrong':>6}{'refused':>8}"
        f"{'failed':>7}{'precision [95%]':>20}{'coverage':>9}{'pass@3':>8}{'cov/p@3':>8}"
        f"{'s/intent':>9}"
    )
    for key, outcomes in runs.items():
        thresholds = SWEEP if sweep else (threshold,)
        for t in thresholds:
            s = selective(outcomes, t)
            low, high = s["precision_95"]
            label = key if not sweep else f"{key} @ {'off' if t is None else t}"
            print(
                f"{label:<34}{s['intents']:>8}{s['installed']:>6}{s['right']:>6}{s['wrong']:>6}"
                f"{s['refused']:>8}{s['failed']:>7}"
                f"{s['precision']:>7.2f} [{low:.2f},{high:.2f}]"
                f"{s['coverage']:>9.2f}{s['drafts_pass@3']:>8.2f}"
                f"{s['coverage_vs_pass@3']:>8.2f}{s['seconds_per_intent']:>9.1f}"
            )


def rescore(paths: list[Path], threshold: float | None, sweep: bool, only: str | None) -> None:
    """The selective figures of recorded runs (several files: each run, then all together),
    at another threshold; no model runs. A run made with --ask also shows what asking did
    (at the threshold it ran with)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    asked: dict[str, bool] = {}
    ran_at: set[float | None] = set()
    for path in paths:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("asked") is not None:
            ran_at.add(data.get("trust"))
        for key, run in data["runs"].items():
            if "no-oracle" in key and (only is None or key.split()[0] in only.split(",")):
                runs[key] = run["cases"]
                asked[key] = data.get("asked") is not None
    if len(runs) > 1:
        runs["all"] = [case for cases in runs.values() for case in cases]
        asked["all"] = all(asked.values())
    if ran_at and (sweep or ran_at != {threshold}):
        print(
            f"note: runs made with --ask ran the gate live at {sorted(map(str, ran_at))}; at "
            "another threshold their figures are not what that gate would have done"
        )
    print_selective(runs, threshold, sweep)
    shown = {key: cases for key, cases in runs.items() if asked.get(key)}
    if shown:
        print_asked(shown, next(iter(ran_at)) if len(ran_at) == 1 else threshold)


def print_asked(runs: dict[str, list[Any]], threshold: float | None, asked: bool = True) -> None:
    if asked:
        print(f"\nAsked for one example when refused (the intent's first call), at {threshold}")
    else:
        print(f"\nThe gate run live at {threshold}, nobody asked (what a user gets)")
    print(
        f"{'run':<34}{'intents':>8}{'asked':>6}{'inst':>6}{'right':>6}{'wrong':>6}"
        f"{'refused':>8}{'failed':>7}{'precision [95%]':>20}{'coverage':>9}{'pass@3':>8}"
        f"{'s/intent':>9}"
    )
    for key, outcomes in runs.items():
        a = with_asking(outcomes)
        low, high = a["precision_95"]
        drafts = selective(outcomes, threshold)  # pass@3 and seconds do not depend on the gate
        print(
            f"{key:<34}{a['intents']:>8}{a['asked']:>6}{a['installed']:>6}{a['right']:>6}"
            f"{a['wrong']:>6}{a['refused']:>8}{a['failed']:>7}"
            f"{a['precision']:>7.2f} [{low:.2f},{high:.2f}]{a['coverage']:>9.2f}"
            f"{drafts['drafts_pass@3']:>8.2f}{drafts['seconds_per_intent']:>9.1f}"
        )


def _summary(outcomes: list[Outcome]) -> dict[str, float]:
    n = len(outcomes)
    solved = [o for o in outcomes if o.solved_at is not None]
    installed = [o.seconds for o in outcomes if o.installed]
    return {
        "intents": n,
        "pass": len(solved) / n if n else float("nan"),
        "pass@1": sum(1 for o in solved if o.solved_at == 1) / n if n else float("nan"),
        "seconds_per_installed_method": statistics.mean(installed) if installed else float("nan"),
        "any_draft_right": sum(1 for o in outcomes if o.pool_right) / n if n else float("nan"),
    }


if __name__ == "__main__":
    main()
