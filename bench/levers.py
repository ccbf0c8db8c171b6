"""Levers the mind's benches measure on and off: each is a setting's environment variable.

``--lever NAME=on|off`` in ``bench/mind.py`` and ``bench/usefulness.py`` sets one for the run;
the report records which were set, so two runs can be compared lever by lever.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

#: name → state → environment (None: unset, the setting's default). A new lever is one line.
LEVERS: dict[str, dict[str, dict[str, str | None]]] = {
    "prefix_cache": {
        "on": {"BATOS_LLM_PREFIX_CACHE_MB": None},
        "off": {"BATOS_LLM_PREFIX_CACHE_MB": "0"},
    },
    # Each passage an answer reads cut to its sentences sharing most words with the request,
    # about 60 words (graph.answer.focus), against whole passages (the default).
    "passage_words": {
        "on": {"BATOS_MIND_PASSAGE_WORDS": "60"},
        "off": {"BATOS_MIND_PASSAGE_WORDS": None},
    },
    # An answer from passages copies the sentence that holds the answer first, then answers
    # (graph.answer.split_quoted), against answering directly (the default).
    "quote_first": {
        "on": {"BATOS_MIND_QUOTE_FIRST": "on"},
        "off": {"BATOS_MIND_QUOTE_FIRST": None},
    },
    # A grounded answer reads the best 3 passages (the default; a second look, the next 3),
    # against the best 5.
    "three_passages": {
        "on": {"BATOS_MIND_PASSAGES": "3"},
        "off": {"BATOS_MIND_PASSAGES": "5"},
    },
    # A request about memory asking for a figure worked out from ones it names but does not
    # give ("how many more in 2024 than in 2023?") has a program compute it from the passages.
    "derived": {
        "on": {"BATOS_MIND_DERIVED": None},
        "off": {"BATOS_MIND_DERIVED": "off"},
    },
    # An answer from passages is asked its question before the passages as well as after
    # them, against after them only (the default).
    "question_first": {
        "on": {"BATOS_MIND_QUESTION_FIRST": "on"},
        "off": {"BATOS_MIND_QUESTION_FIRST": "off"},
    },
    # The gate asks again, on the same passages, when a fast answer only restates its question.
    "restates": {
        "on": {"BATOS_MIND_RESTATES": None},
        "off": {"BATOS_MIND_RESTATES": "off"},
    },
    # The gate asks again, on the same passages, when a fast answer does not give the kind of
    # thing its question asks for (a date, figure, code or name) and the passages do.
    "asked": {
        "on": {"BATOS_MIND_ASKED": "on"},
        "off": {"BATOS_MIND_ASKED": "off"},
    },
    # An answer from passages decoded greedily (temperature 0, the default), against the
    # persona's own sampling.
    "greedy": {
        "on": {"BATOS_MIND_GROUNDED_SAMPLING": None},
        "off": {"BATOS_MIND_GROUNDED_SAMPLING": "persona"},
    },
    # A question about memory asking how many more, fewer or by how much: BABS copies the two
    # figures (checked against the passages) and the difference is worked out in code, before
    # any program is written.
    "pairs": {
        "on": {"BATOS_MIND_PAIRS": None},
        "off": {"BATOS_MIND_PAIRS": "off"},
    },
    # A question about memory asking for a total (in total, add up to, for both, for 3
    # nights): BABS lists the figures it adds (each checked against the passages, each count
    # against the question) and the sum is worked out in code, before any program is written.
    "totals": {
        "on": {"BATOS_MIND_TOTALS": None},
        "off": {"BATOS_MIND_TOTALS": "off"},
    },
    # The passages a persona reads have their tables written out row by row, each value
    # after its column's header (graph.tables), against the stored text as it is (the
    # default).
    "tables": {
        "on": {"BATOS_MIND_TABLES": "on"},
        "off": {"BATOS_MIND_TABLES": None},
    },
    # The passages a request about memory reads are the catalog's best ten reranked by the
    # sentence in each that best answers it (graph.retrieval.rerank), against the catalog's
    # own order (the default).
    "rerank": {
        "on": {"BATOS_MIND_RERANK": "on"},
        "off": {"BATOS_MIND_RERANK": None},
    },
    # A search that names a document its text and vectors did not find reads that
    # document's best passage first (store.knowledge.names), against text and vectors alone.
    "names": {
        "on": {"BATOS_CATALOG_NAMES": None},
        "off": {"BATOS_CATALOG_NAMES": "off"},
    },
    # A short request about memory is answered from its passages however many personas were
    # routed (off: only when one was; several plan and weave).
    "memory_fast": {
        "on": {"BATOS_MIND_MEMORY_FAST": None},
        "off": {"BATOS_MIND_MEMORY_FAST": "single"},
    },
    # An answer from passages that cites none of them cites the one passage stating it.
    "attribute": {
        "on": {"BATOS_MIND_ATTRIBUTE": None},
        "off": {"BATOS_MIND_ATTRIBUTE": "off"},
    },
    # The gate sends back a fast answer from passages stating a figure none of them gives.
    "figures": {
        "on": {"BATOS_MIND_FIGURES": "on"},
        "off": {"BATOS_MIND_FIGURES": None},
    },
    # A request the user's earlier messages answer (it speaks of the conversation, or one of
    # them is nearer than any passage) is answered from the thread, greedily, with no
    # passages and no plan (graph.thread), against like any other request.
    "thread": {
        "on": {"BATOS_MIND_THREAD": None},
        "off": {"BATOS_MIND_THREAD": "off"},
    },
}


def parse_levers(values: Sequence[str]) -> dict[str, str]:
    """``NAME=on|off`` pairs, checked against ``LEVERS``."""
    chosen: dict[str, str] = {}
    for value in values:
        name, _, state = value.partition("=")
        if name not in LEVERS or state not in LEVERS[name]:
            known = ", ".join(f"{n}={'|'.join(LEVERS[n])}" for n in LEVERS)
            raise SystemExit(f"unknown lever {value!r}: use {known}")
        chosen[name] = state
    return chosen


def apply_levers(chosen: dict[str, str]) -> dict[str, str | None]:
    """Set the environment of each chosen lever; returns what was set (None: unset)."""
    applied: dict[str, str | None] = {}
    for name, state in chosen.items():
        for variable, value in LEVERS[name][state].items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value
            applied[variable] = value
    return applied


def tag(chosen: dict[str, str]) -> str:
    """The levers' part of a result file's name: ``-name-state`` for each, sorted."""
    return "".join(f"-{name}-{state}" for name, state in sorted(chosen.items()))


def add_option(parser: argparse.ArgumentParser) -> None:
    """The ``--lever NAME=on|off`` option, repeatable."""
    parser.add_argument(
        "--lever",
        action="append",
        default=[],
        metavar="NAME=on|off",
        help=f"set a lever for the run: {', '.join(LEVERS)}",
    )
