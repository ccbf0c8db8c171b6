"""Whether retrieval or reading loses a document question: where the answer sits among passages.

For each document question of a usefulness split (``bench/data/usefulness/``), the split's
documents are ingested into a fresh file image as ``batos ingest`` does, the catalog is searched
with the question as the mind and the naive RAG search it, and two ranks are noted among the
best ten passages: the first passage from the question's source document, and the first passage
of that document that states the answer as the question file writes it (its ``answer`` or an
``accept`` form, letters and spaces compared loosely). An answer that its document never states
in that form (a date written "2 June 2025" for "2025-06-02", a figure the question derives from
two others) has no such passage anywhere, and is counted apart.

The last column ranks the same ten passages in the order the mind reads them
(``graph.retrieval.rerank``: the catalog's order, the best sentence's rarer shared words and its
embedding's closeness, fused).

With ``--kinds``, the rows of every split named are pooled and grouped by what each question
asks for (``graph.answer.asked_kind``: a date, code, figure, name, or none of these), with
where the first passage stating the answer falls in the catalog's order (what the mind and
the naive RAG read: 1–3, 4–5, 6–10, not among the ten): whether questions of one kind need
more passages than the mind's three.

With ``--names``, it says instead which questions' first five passages (what the naive RAG
reads; the mind reads three) change when the catalog reads the documents a query names
(``BATOS_CATALOG_NAMES``, ``store.knowledge.names``) against text and vectors alone: a question
whose passages do not change is one the names cannot change the answer of.

No model is run: this is the catalog alone, in seconds. Where the answer-bearing passage is in
the best three (what the mind reads) for nearly every question whose document states it, a
wrong answer was lost in the reading, not in the retrieval.

    .venv/bin/python bench/passage_recall.py                  # dev split
    .venv/bin/python bench/passage_recall.py --split dev --split fresh3
    .venv/bin/python bench/passage_recall.py --split fresh15 --names
    .venv/bin/python bench/passage_recall.py --split dev --split fresh16 --kinds
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.usefulness import DATA, SPLITS, fresh_image, ingest_corpus, load_items  # noqa: E402
from graph.retrieval import rerank  # noqa: E402

#: Passages looked at, and the depths reported (the mind reads 3, the naive RAG 5).
DEPTH = 10
AT = (1, 3, 5, 10)


def _loose(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def states(item: Mapping[str, Any], text: str) -> bool:
    """Whether ``text`` states ``item``'s answer as written (or an accepted form of it)."""
    here = _loose(text)
    forms = [item["answer"], *(item.get("accept") or [])]
    return any(_loose(str(form)) and _loose(str(form)) in here for form in forms)


def ranks(
    item: Mapping[str, Any], hits: Sequence[tuple[str, str]], document: str
) -> dict[str, Any]:
    """``hits`` are (source, text) best first; ``document`` the source document's text.

    Ranks from 1, or None when not among ``hits``: ``source`` (the first passage of the
    question's document), ``answer`` (the first of its passages stating the answer).
    ``stated``: whether the document states the answer in that form at all."""
    wanted = item.get("source")
    source = answer = None
    for n, (name, text) in enumerate(hits, start=1):
        if Path(name).name != wanted:
            continue
        source = source or n
        if answer is None and states(item, text):
            answer = n
    return {"id": item["id"], "source": source, "answer": answer, "stated": states(item, document)}


def within(rows: Sequence[Mapping[str, Any]], key: str, k: int) -> int:
    return sum(1 for row in rows if row[key] is not None and row[key] <= k)


def measure(split: str) -> list[dict[str, Any]]:
    items = load_items(split, ["document"])["document"]
    with tempfile.TemporaryDirectory() as folder:
        image = fresh_image(Path(folder))
        try:
            catalog, _ = ingest_corpus(image, DATA / split / "docs")
            # each document's text as the catalog holds it, read once per split
            texts = {
                path.name: "\n".join(t for _, _, t in catalog.chunk_texts(str(path)))
                for path in (DATA / split / "docs").iterdir()
            }
            rows = []
            for item in items:
                hits = catalog.search(item["question"], DEPTH, record=False)
                document = texts.get(str(item.get("source")), "")
                row = ranks(item, [(h.source, h.text) for h in hits], document)
                # the same ten in the order the mind reads them (graph.retrieval.rerank)
                mind = rerank(item["question"], hits, catalog.embedder.encode)
                row["reranked"] = ranks(item, [(h.source, h.text) for h in mind], document)[
                    "answer"
                ]
                rows.append(row)
            return rows
        finally:
            image.close()


#: Passages compared with names read and without: what the naive RAG reads (the mind reads 3).
COMPARED = 5


def names_changed(split: str, data: Path = DATA) -> tuple[int, list[str]]:
    """How many document questions ``split`` has, and the ids of those whose first
    ``COMPARED`` passages differ between names read and text and vectors alone."""
    items = load_items(split, ["document"], data=data)["document"]
    changed = []
    before = os.environ.get("BATOS_CATALOG_NAMES")
    with tempfile.TemporaryDirectory() as folder:
        image = fresh_image(Path(folder))
        try:
            catalog, _ = ingest_corpus(image, data / split / "docs")
            for item in items:
                found = []
                for value in ("on", "off"):
                    os.environ["BATOS_CATALOG_NAMES"] = value
                    hits = catalog.search(item["question"], COMPARED, record=False)
                    found.append([(h.source, h.start) for h in hits])
                if found[0] != found[1]:
                    changed.append(item["id"])
        finally:
            image.close()
            if before is None:
                os.environ.pop("BATOS_CATALOG_NAMES", None)
            else:
                os.environ["BATOS_CATALOG_NAMES"] = before
    return len(items), changed


def line(split: str, rows: Sequence[Mapping[str, Any]]) -> str:
    stated = [r for r in rows if r["stated"]]
    sources = " / ".join(str(within(rows, "source", k)) for k in AT)
    answers = " / ".join(str(within(stated, "answer", k)) for k in AT)
    reranked = " / ".join(str(within(stated, "reranked", k)) for k in AT)
    return f"| {split} | {len(rows)} | {sources} | {len(stated)} | {answers} | {reranked} |"


#: Where a stated answer's first passage falls, in the order the bands are printed.
BANDS = (("1-3", 1, 3), ("4-5", 4, 5), ("6-10", 6, DEPTH))


def band(rank: int | None) -> str:
    """The band of ``rank`` (from 1) among ``BANDS``, or "none" when not among the ten."""
    for name, low, high in BANDS:
        if rank is not None and low <= rank <= high:
            return name
    return "none"


def by_kind(rows: Sequence[Mapping[str, Any]], questions: Mapping[str, str]) -> list[str]:
    """Table lines: per kind of question (``asked_kind`` of ``questions[row["id"]]``), how
    many questions, how many their document does not state as written, and where the stated
    answers' first passage falls among ``BANDS``."""
    from graph.answer import asked_kind

    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        kind = asked_kind(questions[row["id"]]) or "other"
        count = counts.setdefault(kind, {"n": 0, "unstated": 0})
        count["n"] += 1
        key = band(row["answer"]) if row["stated"] else "unstated"
        count[key] = count.get(key, 0) + 1
    names = [name for name, _, _ in BANDS] + ["none"]
    out = [
        "| asks for | questions | not stated as written | "
        + " | ".join(f"stated, first at {n}" for n in names)
        + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for kind in sorted(counts, key=lambda k: -counts[k]["n"]):
        c = counts[kind]
        cells = " | ".join(str(c.get(n, 0)) for n in names)
        out.append(f"| {kind} | {c['n']} | {c['unstated']} | {cells} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", action="append", choices=SPLITS)
    parser.add_argument(
        "--names",
        action="store_true",
        help="say which questions' passages change when the documents a query names are read",
    )
    parser.add_argument(
        "--kinds",
        action="store_true",
        help="pool the splits' questions by what each asks for and say where its answer falls",
    )
    args = parser.parse_args()
    if args.kinds:
        rows: list[dict[str, Any]] = []
        questions: dict[str, str] = {}
        for split in args.split or ["dev"]:
            items = load_items(split, ["document"])["document"]
            questions.update({item["id"]: item["question"] for item in items})
            rows += measure(split)
            print(f"{split}: measured", flush=True)
        print("\n".join(by_kind(rows, questions)))
        return
    if args.names:
        for split in args.split or ["dev"]:
            total, changed = names_changed(split)
            print(
                f"{split}: the first {COMPARED} passages of {len(changed)} of {total} questions "
                f"change with names read: {', '.join(changed) or 'none'}",
                flush=True,
            )
        return
    print(
        "| split | questions | source document's first passage at 1 / 3 / 5 / 10 "
        "| answers their document states as written | a passage stating it at 1 / 3 / 5 / 10 "
        "| the same ten reranked as the mind reads them |"
    )
    print("|---|---|---|---|---|---|")
    for split in args.split or ["dev"]:
        print(line(split, measure(split)), flush=True)


if __name__ == "__main__":
    main()
