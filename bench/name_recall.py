"""Finding a document by its file name: Debian's licence files, named only by their folder.

Debian keeps each package's licence text in ``/usr/share/doc/<package>/copyright``, and most of
those texts never name the package. A sample of them is ingested into a fresh image as
``batos ingest`` does, and for every package whose file leaves its name out, the catalog is
searched as a user would search it:

- the package's name alone, as ``batos search <package>`` does (hybrid);
- a question naming it, ``Which licence covers the <package> package?``, hybrid, as the mind
  and the naive RAG search.

Counted: the package's file first, and among the first three. The same files go into a second
image indexed and searched as catalogs were before ``catalog-4`` (each chunk's text alone, no
file name, no ranking of named files), and the two are printed side by side with their ratio.
No model is run.

    .venv/bin/python bench/name_recall.py                 # 200 files
    .venv/bin/python bench/name_recall.py --files 60
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from store.core.image import LivingImage  # noqa: E402
from store.core.schema import upgrade  # noqa: E402
from store.knowledge import catalog as catalog_module  # noqa: E402
from store.knowledge.catalog import KnowledgeCatalog  # noqa: E402
from store.knowledge.embeddings import Embedder  # noqa: E402
from store.knowledge.ingest import ingest_paths, read_document  # noqa: E402
from store.upgrades import STORE_STEPS  # noqa: E402

DOC = Path("/usr/share/doc")
#: Largest file taken, as in tests/test_ingest_real_files.py: hundreds embed in seconds.
MAX_BYTES = 3000
QUESTION = "Which licence covers the {} package?"


def sample(count: int) -> list[Path]:
    """``count`` small copyright files at even steps through the sorted listing."""
    found = sorted(
        p for p in DOC.glob("*/copyright") if p.is_file() and 0 < p.stat().st_size <= MAX_BYTES
    )
    if len(found) <= count:
        return found
    return [found[i * len(found) // count] for i in range(count)]


def unnamed(sources: Sequence[str]) -> list[str]:
    """The sources whose text never names their folder (the package)."""
    return [s for s in sources if Path(s).parent.name.lower() not in _text(s).lower()]


def _text(source: str) -> str:
    return read_document(Path(source))[0]


@contextmanager
def text_alone() -> Iterator[None]:
    """Index and search chunks as catalogs did before ``catalog-4``: by their text, with no
    file name in the index and no ranking of the files a query names."""
    kept = catalog_module.indexed_text, catalog_module.name_terms
    setattr(catalog_module, "indexed_text", lambda chunk: chunk.text)  # noqa: B010
    setattr(catalog_module, "name_terms", lambda chunk: set())  # noqa: B010
    try:
        yield
    finally:
        setattr(catalog_module, "indexed_text", kept[0])  # noqa: B010
        setattr(catalog_module, "name_terms", kept[1])  # noqa: B010


def ranks(catalog: KnowledgeCatalog, sources: Sequence[str], template: str) -> list[int | None]:
    """Where each source's file comes (1-based) for ``template`` filled with its package."""
    found: list[int | None] = []
    for source in sources:
        hits = catalog.search(template.format(Path(source).parent.name), 3, record=False)
        order = [h.source for h in hits]
        found.append(order.index(source) + 1 if source in order else None)
    return found


def within(found: Sequence[int | None], k: int) -> int:
    return sum(1 for n in found if n is not None and n <= k)


def measure(files: Sequence[Path]) -> dict[str, dict[str, list[int | None]]]:
    """Ranks for both searches, in an image indexed as now and one indexed as before."""
    results: dict[str, dict[str, list[int | None]]] = {}
    sources: list[str] = []
    embedder: Embedder | None = None  # the configured encoder, loaded once
    arms: tuple[tuple[str, Callable[[], AbstractContextManager[None]]], ...] = (
        ("file names indexed", nullcontext),
        ("text alone (before)", text_alone),
    )
    for label, indexing in arms:
        image = LivingImage.open("memory://")
        try:
            upgrade(image, STORE_STEPS)
            catalog = KnowledgeCatalog.open(image, embedder)
            embedder = catalog.embedder
            with indexing():
                report = ingest_paths(catalog, list(files))
            if not sources:
                sources = unnamed(sorted({str(Path(p).resolve()) for p in report.added}))
            results[label] = {
                "the name alone": ranks(catalog, sources, "{}"),
                "a question naming it": ranks(catalog, sources, QUESTION),
            }
        finally:
            image.close()
    return results


def table(results: dict[str, dict[str, list[int | None]]]) -> list[str]:
    named, before = results["file names indexed"], results["text alone (before)"]
    lines = [
        "| search | packages | first: names indexed / text alone (ratio) "
        "| first three: names indexed / text alone (ratio) |",
        "|---|---|---|---|",
    ]
    for query, found in named.items():
        old = before[query]
        cells = []
        for k in (1, 3):
            a, b = within(found, k), within(old, k)
            ratio = f"{a / b:.1f}x" if b else "n/a"
            cells.append(f"{a} / {b} ({ratio})")
        lines.append(f"| {query} | {len(found)} | {cells[0]} | {cells[1]} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=200, help="copyright files to ingest")
    args = parser.parse_args()
    if not DOC.is_dir():
        raise SystemExit(f"{DOC} does not exist here (a Debian or Ubuntu system has it)")
    files = sample(args.files)
    results = measure(files)
    print(f"{len(files)} copyright files from {DOC}")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
