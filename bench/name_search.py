"""Whether a document can be found by its name: questions that name a file, not its words.

A user who ingests ``/usr/share/doc/*/copyright`` and asks "Which licence covers the
libdpkg-perl package?" names a document that is called ``libdpkg-perl/copyright`` and whose text
says "Upstream-Name: dpkg" and never "libdpkg-perl". Most of this machine's copyright files are
like that: the package's name is in their path alone.

This bench takes the Debian copyright files of the machine it runs on (real files, not written
for it), draws a sample of packages with a fixed seed, ingests those files into a fresh file
image as ``batos ingest`` does, and asks one question per package that names the package and
nothing else of its file. The question's wording is drawn per package from a few phrasings a
user might type. It reports where the first passage of the named package's file ranks among the
catalog's best ten (the mind reads three, the naive RAG five): over every package, and over the
packages whose file never states the package's name.

A file found can still be read at the wrong place: its header ("Format: …  Upstream-Name:
dpkg") says nothing of the licence. So it also reports where the first passage of the named
file that could answer the question ranks: one that holds the field the question asks about,
by the file's own layout and nothing else (a licence question, a ``License:`` line or a
licence's name; a copyright question, a copyright line with a year; the upstream source, a
``Source:`` line, an address other than the format's, or "downloaded from"). That says whether
the passage read can answer, not whether a model reads it right.

No model is run. The samples are disjoint: ``--sample dev`` (seed 1) for working on retrieval,
``--sample held`` (seed 2) to be run once a change is settled, and ``--sample held2`` (seed 3,
drawn from the held half without the held sample's packages at the same size) for the next
change, after ``held`` was run on an earlier one.

    .venv/bin/python bench/name_search.py --sample dev
    .venv/bin/python bench/name_search.py --sample held --packages 60
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.passage_recall import AT, DEPTH, within  # noqa: E402
from bench.usefulness import RESULTS, fresh_image  # noqa: E402

DOCS = Path("/usr/share/doc")
#: Phrasings a user might type; each package gets one, drawn with the sample's seed.
PHRASINGS = (
    "Which licence covers the {p} package?",
    "Who holds the copyright on {p}?",
    "What licence is {p} distributed under?",
    "Where does the upstream source of {p} come from?",
    "Can I redistribute {p}, and under what terms?",
    "who wrote {p}",
)
SEEDS = {"dev": 1, "held": 2, "held2": 3}
_LICENCE = re.compile(
    r"^\s*licen[cs]e:\s*\S|\b(?:l?gpl|bsd|mit|apache|artistic|mpl|zlib|expat|public domain)\b",
    re.I | re.M,
)
_COPYRIGHT = re.compile(r"copyright\b[^\n]{0,12}?(?:\(c\)|©)?\s*\d{4}", re.I)
_SOURCE = re.compile(
    r"^\s*source:\s*\S|(?:downloaded|obtained|retrieved|fetched) from|"
    r"(?:https?|ftp)://(?!www\.debian\.org/doc/packaging-manuals)",
    re.I | re.M,
)
#: What a passage must hold to answer each phrasing, by the file's layout alone.
ANSWERS = {
    PHRASINGS[0]: _LICENCE,
    PHRASINGS[1]: _COPYRIGHT,
    PHRASINGS[2]: _LICENCE,
    PHRASINGS[3]: _SOURCE,
    PHRASINGS[4]: _LICENCE,
    PHRASINGS[5]: _COPYRIGHT,
}


def packages(docs: Path = DOCS) -> list[str]:
    """Packages with a copyright file of their own (symlinked doc folders point at another
    package's file and are left out), sorted."""
    return sorted(
        folder.name
        for folder in docs.iterdir()
        if not folder.is_symlink()
        and (folder / "copyright").is_file()
        and not (folder / "copyright").is_symlink()
    )


def sample(names: Sequence[str], which: str, n: int) -> list[str]:
    """``n`` packages for sample ``which``; no two samples share a package."""
    order = sorted(names)  # the same packages give the same samples, in any order
    random.Random(0).shuffle(order)
    half = len(order) // 2
    pool = order[:half] if which == "dev" else order[half:]
    if which == "held2":
        taken = set(sample(names, "held", n))
        pool = [name for name in pool if name not in taken]
    return sorted(random.Random(SEEDS[which]).sample(pool, min(n, len(pool))))


def rank_of(hits: Sequence[str], wanted: str) -> int | None:
    for n, source in enumerate(hits, start=1):
        if source == wanted:
            return n
    return None


def answering(phrasing: str, text: str) -> bool:
    """Whether a passage holds what ``phrasing`` asks about (see the module's docstring)."""
    return bool(ANSWERS[phrasing].search(text))


def measure(which: str, n: int, docs: Path = DOCS) -> dict[str, Any]:
    from store.knowledge.catalog import KnowledgeCatalog
    from store.knowledge.ingest import ingest_paths

    chosen = sample(packages(docs), which, n)
    files = [docs / name / "copyright" for name in chosen]
    wording = random.Random(SEEDS[which] + 100)
    with tempfile.TemporaryDirectory() as folder:
        image = fresh_image(Path(folder))
        try:
            catalog = KnowledgeCatalog.open(image)
            started = time.perf_counter()
            report = ingest_paths(catalog, files)
            ingest_s = time.perf_counter() - started
            if report.failed:
                raise SystemExit(f"{len(report.failed)} files did not ingest: {report.failed[:3]}")
            rows = []
            for name, path in zip(chosen, files, strict=True):
                phrasing = wording.choice(PHRASINGS)
                question = phrasing.format(p=name)
                hits = catalog.search(question, DEPTH, record=False)
                text = path.read_text(errors="replace").lower()
                answer_ranks = [
                    n
                    for n, hit in enumerate(hits, start=1)
                    if hit.source == str(path) and answering(phrasing, hit.text)
                ]
                rows.append(
                    {
                        "package": name,
                        "question": question,
                        "rank": rank_of([h.source for h in hits], str(path)),
                        "answer_rank": answer_ranks[0] if answer_ranks else None,
                        "answerable": answering(phrasing, text),
                        "named_in_text": name.lower() in text,
                    }
                )
        finally:
            image.close()
    return {"sample": which, "chunks": report.chunks, "ingest_s": round(ingest_s, 1), "rows": rows}


def table(result: Mapping[str, Any]) -> str:
    rows = result["rows"]
    unnamed = [r for r in rows if not r["named_in_text"]]
    lines = [
        f"sample {result['sample']}: {len(rows)} packages, {result['chunks']} chunks "
        f"(ingested in {result['ingest_s']} s)",
        "packages                          n   file's first passage at " + " / ".join(map(str, AT)),
    ]
    for label, group in (("all", rows), ("name only in the path", unnamed)):
        found = " / ".join(str(within(group, "rank", k)) for k in AT)
        lines.append(f"{label:<32} {len(group):>3}   {found}")
    # rows of results written before the answer check have no answer rank
    answerable = [r for r in rows if r.get("answerable")]
    if answerable:
        lines.append(
            "packages whose file holds the answer  n   first passage that could answer at "
            + " / ".join(map(str, AT))
        )
        unnamed_answerable = [r for r in answerable if not r["named_in_text"]]
        for label, group in (("all", answerable), ("name only in the path", unnamed_answerable)):
            found = " / ".join(str(within(group, "answer_rank", k)) for k in AT)
            lines.append(f"{label:<32} {len(group):>3}   {found}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sample", choices=sorted(SEEDS), default="dev")
    parser.add_argument("--packages", type=int, default=60)
    parser.add_argument("--docs", type=Path, default=DOCS)
    args = parser.parse_args()
    if args.packages < 1:
        parser.error("--packages must be at least 1")
    if not args.docs.is_dir():
        parser.error(f"no folder at {args.docs}: name one that holds <package>/copyright files")
    result = measure(args.sample, args.packages, args.docs)
    print(table(result))
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS / f"name-search-{args.sample}-{stamp}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
