"""Ingest of real files from this machine: the documentation Debian installs with packages.

Made-up texts miss what real ones hold (two thirds of Debian's copyright files once crashed
the sentence splitter), so a few hundred files of /usr/share/doc go through the real ingest
path into a file image: every file is ingested or reported by name with its reason, no
chunker or write failure, every character kept, and the catalog answers afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from images import open_laid_out

from batos.errors import DocumentError
from store.knowledge.catalog import KnowledgeCatalog
from store.knowledge.ingest import expand, ingest_paths, read_document

DOC = Path("/usr/share/doc")
#: Files ingested: two thirds per-package copyright files, the rest other documentation
#: (.txt, .md, .rst, .html, README...), spread evenly over the sorted listing.
FILES = 300
#: Largest file taken: a few hundred such files embed in seconds rather than minutes.
MAX_BYTES = 3000
#: Fewest files for the test to mean something.
AT_LEAST = 100


def _small(path: Path) -> bool:
    try:
        return path.is_file() and 0 < path.stat().st_size <= MAX_BYTES
    except OSError:
        return False


def _spread(paths: list[Path], count: int) -> list[Path]:
    """``count`` of ``paths`` taken at even steps (all of them if there are fewer)."""
    if len(paths) <= count:
        return paths
    return [paths[i * len(paths) // count] for i in range(count)]


def _real_files() -> list[Path]:
    if not DOC.is_dir():
        pytest.skip(f"{DOC} does not exist here (a Debian or Ubuntu system has it)")
    copyrights = sorted(p for p in DOC.glob("*/copyright") if _small(p))
    others = [p for p in expand([DOC]) if p.name != "copyright" and _small(p)]
    files = _spread(copyrights, FILES * 2 // 3)
    files += _spread(others, FILES - len(files))
    if len(files) < AT_LEAST:
        pytest.skip(
            f"only {len(files)} text files of at most {MAX_BYTES} bytes under {DOC}; "
            f"the test needs {AT_LEAST} (a system with more packages installed has them)"
        )
    return files


@pytest.mark.slow
def test_a_few_hundred_real_files_ingest_and_stay_searchable(file_uri: str) -> None:
    files = _real_files()
    began = time.monotonic()
    with open_laid_out(file_uri) as image:
        catalog = KnowledgeCatalog.open(image)
        report = ingest_paths(catalog, files)
        catalog.close()
    seconds = time.monotonic() - began

    assert report.files == len(files)
    assert sorted(report.added + report.unchanged + [p for p, _ in report.failed]) == sorted(
        map(str, files)
    )
    for path, error in report.failed:
        assert isinstance(error, DocumentError) and path in error.message, (path, error)
        # Reading may fail on a real file (not UTF-8, say); cutting or writing must not.
        assert "could not be cut" not in error.message, error.message
        assert "could not be written" not in error.message, error.message
    assert len(report.added) >= len(files) // 2, report.failed
    # An unchanged file here is one reached twice (a package's doc folder is often a link
    # to another's), never a file left out.
    sources = {str(Path(p).resolve()) for p in report.added}
    assert all(str(Path(p).resolve()) in sources for p in report.unchanged)

    with open_laid_out(file_uri) as image:
        catalog = KnowledgeCatalog.open(image)
        assert catalog.stats()["documents"] == len(sources)
        for source in sorted(sources):
            text = read_document(Path(source))[0]
            stored = catalog.chunk_texts(source)
            assert all(text[a:b] == t for a, b, t in stored), source
            assert "".join("".join(t for _, _, t in stored).split()) == "".join(text.split())
        for source in _spread(sorted(sources), 10):
            text = read_document(Path(source))[0]
            query = " ".join(text.split()[:12])
            hits = catalog.search(query, 3, filters={"source": source}, mode="lexical")
            assert hits and hits[0].source == source, (source, query)
            anywhere = catalog.search(query, 5)
            assert anywhere and all(h.source in sources for h in anywhere)
        catalog.close()
    print(
        f"{len(files)} files, {len(report.added)} added, {len(report.unchanged)} unchanged, "
        f"{len(report.failed)} failed, {report.chunks} chunks in {seconds:.1f} s"
    )
