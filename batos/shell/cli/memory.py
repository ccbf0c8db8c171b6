"""``batos ingest``, ``batos search`` and ``batos curate``: the knowledge catalog (O-RAG).

Ingest reads files into the image's catalog, search prints ranked passages with their sources
and spans, curate folds cold or redundant chunks into summaries written by BABS.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from batos.errors import BatosError, CatalogError, DocumentError
from batos.shell.cli.app import console, err_console, image_uri, model_factory
from batos.shell.cli.progress import ProgressReport
from batos.shell.cli.terminal import json_text, shown
from graph.curation import babs_summarizer
from store.knowledge.catalog import BUILTIN_FIELDS, KnowledgeCatalog

if TYPE_CHECKING:
    from store.knowledge.ingest import IngestReport


@contextmanager
def _catalog(ctx: typer.Context) -> Iterator[KnowledgeCatalog]:
    from batos.shell.runtime import open_image

    with open_image(image_uri(ctx)) as image:
        catalog = KnowledgeCatalog.open(image)
        try:
            yield catalog
        finally:
            catalog.close()


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CatalogError(f"{what} {item!r} is not NAME=VALUE", hint=f"e.g. {what} topic=cats")
        if what == "--meta" and name in BUILTIN_FIELDS:
            # the catalog sets these itself; one given here would be stored and never found
            raise CatalogError(
                f"--meta {name}=… names a field the catalog sets itself",
                hint=f"choose another name than {', '.join(BUILTIN_FIELDS)}, e.g. -m topic=cats",
            )
        if pairs.get(name, value) != value:
            raise CatalogError(
                f"{what} gives {name} twice ({pairs[name]!r} and {value!r})",
                hint=f"give each name once; a document holds one value of {name}",
            )
        pairs[name] = value
    return pairs


def ingest(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(
        ...,
        help="Files or folders (walked for text: .txt .text .md .markdown .rst and names with "
        "no suffix that hold no NUL byte; HTML: .html .htm .xhtml; PDF: .pdf).",
    ),
    meta: list[str] = typer.Option(
        None,
        "--meta",
        "-m",
        help="NAME=VALUE stored on every chunk, added to what the document holds already.",
    ),
) -> None:
    """Read text, Markdown, HTML and PDF files into the knowledge catalog.

    Unchanged files are skipped (given new --meta values, they take them); changed ones
    replace their chunks; a file that cannot be read (or does not exist) is reported and the
    others go on; the exit code is then 9, as when nothing is found to read.

    Examples: batos ingest notes/ · batos ingest paper.pdf -m topic=physics
    """
    from store.knowledge.ingest import IngestReport, expand, ingest_paths

    files = list(expand(paths))  # a missing path stays in the list and fails on its own
    if not files:
        raise DocumentError(
            f"nothing to read under {', '.join(map(str, paths))}",
            hint="ingest reads text (.txt .md .rst, or no suffix), HTML and PDF files; "
            "name such files, or a folder that holds them",
        )
    so_far = IngestReport()
    try:
        with (
            _catalog(ctx) as catalog,
            ProgressReport(err_console, "ingest", total=len(files), unit="files") as progress,
        ):

            def advance(path: Path, outcome: str, report: IngestReport) -> None:
                nonlocal so_far
                so_far = report
                rate = report.chunks / report.seconds if report.seconds else 0.0
                progress.update(
                    report.files,
                    f"{report.chunks} chunks, {rate:.1f} chunks/s, {outcome}: {path.name}",
                )

            report = ingest_paths(
                catalog,
                files,
                metadata=_pairs(meta, "--meta"),
                on_file=advance,
                on_note=lambda note: progress.update(note=note),
            )
    except KeyboardInterrupt:
        # Documents are committed whole as the run goes: say what is in, and how to go on.
        # A batch committed just before the stop may not have been counted yet.
        console.print(
            f"interrupted: {so_far.files} of {len(files)} file(s) were dealt with (added "
            f"{len(so_far.added)}, replaced {len(so_far.replaced)}, unchanged "
            f"{len(so_far.unchanged)}, failed {len(so_far.failed)}); each file is in the "
            "catalog whole or not at all. Run the same command again to go on: the files "
            "already in are skipped as unchanged.",
            markup=False,
            highlight=False,
        )
        _print_failures(so_far)
        raise typer.Exit(130) from None
    seconds = max(report.seconds, 1e-9)
    console.print(
        f"added {len(report.added)}, replaced {len(report.replaced)}, "
        f"unchanged {len(report.unchanged)}, failed {len(report.failed)}; "
        f"{report.chunks} chunks in {report.commits} commit(s); {report.seconds:.1f} s, "
        f"{report.chunks / seconds:.1f} chunks/s, {report.bytes / seconds / 1e6:.2f} MB/s",
        highlight=False,
        soft_wrap=True,  # one line in a log, however narrow the (absent) terminal
    )
    _print_failures(report)
    if report.failed:
        others = "the others were; " if len(report.failed) < len(files) else ""
        raise DocumentError(
            f"{len(report.failed)} of {len(files)} file(s) were not ingested",
            hint=f"{others}fix the files listed above and run the command again",
        )


def _print_failures(report: IngestReport) -> None:
    for _path, error in report.failed:
        err_console.print(f"[red]✗[/] {shown(error.message)}")
        if error.hint:
            err_console.print(f"  [yellow]hint:[/] {shown(error.hint)}")


def search(
    ctx: typer.Context,
    queries: list[str] = typer.Argument(None, help="One or more queries."),
    file: Path = typer.Option(
        None, "--file", "-f", help="Read queries from FILE, one a line ('-': stdin)."
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON line per query."),
    k: int = typer.Option(5, "-k", min=1, help="Results per query."),
    mode: str = typer.Option("hybrid", "--mode", help="hybrid, lexical (BM25) or dense."),
    where: list[str] = typer.Option(
        None, "--where", "-w", help="FIELD=VALUE filter (source, kind, format, --meta names)."
    ),
) -> None:
    """Search the knowledge catalog: ranked passages with source, span and score.

    Examples: batos search "how do cats purr" -k 3 · batos search --file queries.txt --json
    """
    wanted = [query for query in queries or [] if query.strip()]
    if queries and len(wanted) < len(queries):
        raise CatalogError("a query is empty", hint='batos search "your question"')
    if file is not None:
        try:
            text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CatalogError(
                f"cannot read queries from {file}: {exc}",
                hint="give a UTF-8 text file with one query a line, or '-' for stdin",
            ) from exc
        wanted.extend(line.strip() for line in text.splitlines() if line.strip())
    if not wanted:
        raise CatalogError("no query given", hint='batos search "your question" (or --file FILE)')
    filters = _pairs(where, "--where")
    if "source" in filters and Path(filters["source"]).exists():
        # a file's source is kept as ingest names it: its absolute path, links resolved
        filters["source"] = str(Path(filters["source"]).resolve())
    with _catalog(ctx) as catalog:
        missing = catalog.unmatched(filters) if filters else []
        for name in missing:
            err_console.print(
                f"no chunk has {shown(name)}={shown(filters[name])}: the search finds nothing",
                markup=True,
            )
        for query in wanted:
            hits = catalog.search(query, k, filters=filters, mode=mode)
            if as_json:
                line = {"query": query, "results": [h.to_json() for h in hits]}
                sys.stdout.write(json_text(line, "the search results") + "\n")
                continue
            table = Table(title=shown(query))
            for column in ("#", "score", "source", "span", "text"):
                table.add_column(column)
            for n, hit in enumerate(hits, start=1):
                snippet = " ".join(hit.text.split())
                table.add_row(
                    str(n),
                    f"{hit.score:.4f}",
                    shown(hit.source),
                    f"{hit.start}-{hit.end}",
                    shown(snippet if len(snippet) <= 100 else snippet[:99] + "…"),
                )
            console.print(table)


def curate(
    ctx: typer.Context,
    max_chunks: int = typer.Option(
        None, "--max-chunks", min=1, help="Live-chunk budget (setting catalog_max_chunks)."
    ),
    clusters: int = typer.Option(
        None, "--clusters", "-n", min=1, help="Fold at most this many clusters."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the plan, change nothing."),
    show: int = typer.Option(None, "--show", help="Print the originals kept in archive ID."),
    restore: int = typer.Option(None, "--restore", help="Put archive ID's chunks back."),
    list_archives: bool = typer.Option(False, "--list", help="List the curator's archives."),
) -> None:
    """Fold rarely used or redundant chunks into summaries (BABS writes them); originals
    are archived compressed in the image and stay retrievable.

    Examples: batos curate --dry-run · batos curate -n 10 · batos curate --show 1234
    """
    from store.knowledge import curator

    # One thing at a time: '--restore N --dry-run' restored for real, and '--show 1
    # --restore 2' only showed, each without a word.
    chosen = [
        name
        for name, given in (
            ("--list", list_archives),
            ("--show", show is not None),
            ("--restore", restore is not None),
            ("--dry-run", dry_run),
        )
        if given
    ]
    if len(chosen) > 1:
        raise typer.BadParameter(
            f"{' and '.join(chosen)} do different things: give one of them",
            param_hint=chosen[1],
        )
    with _catalog(ctx) as catalog:
        if list_archives:
            table = Table(title="Curator archives")
            for column in ("archive", "summary chunk", "bytes"):
                table.add_column(column)
            for a in curator.archives(catalog):
                table.add_row(str(a["id"]), str(a["summary"]), str(a["bytes"]))
            console.print(table)
            return
        if show is not None:
            for record in curator.originals(catalog, show):
                where = f"{record['source']}:{record['start']}-{record['end']}"
                console.print(f"[bold]{shown(where)}[/]")
                console.print(record["text"], markup=False)
            return
        if restore is not None:
            restored = curator.Curator(catalog, _no_summaries).restore(restore)
            console.print(f"restored {len(restored)} chunk(s) from archive {restore}")
            return
        if dry_run:
            plan = curator.Curator(catalog, _no_summaries, max_chunks=max_chunks).plan()
            for cluster in plan[:clusters]:
                console.print(
                    f"{cluster.reason}: {len(cluster.chunk_ids)} chunks {list(cluster.chunk_ids)}",
                    markup=False,
                )
            console.print(f"{len(plan)} cluster(s) would be folded")
            return
        folder = curator.Curator(
            catalog, babs_summarizer(model_factory(ctx)), max_chunks=max_chunks
        )
        with ProgressReport(err_console, "curate", total=None, unit="clusters") as progress:

            def advance(done: int, total: int, report: curator.CurationReport) -> None:
                progress.total = total
                progress.update(
                    done,
                    f"{report.archived_chunks} chunk(s) folded, {report.skipped_clusters} skipped",
                )

            report = folder.run(clusters, on_cluster=advance)
    console.print(
        f"folded {report.archived_chunks} chunk(s) into {len(report.archives)} summary(ies); "
        f"live chunks {report.live_before} → {report.live_after}; "
        f"skipped {report.skipped_clusters}"
    )
    for chunk_ids in report.too_long:
        err_console.print(
            f"skipped chunks {list(chunk_ids)}: together too long for BABS's context",
            markup=False,
        )


def forget(
    ctx: typer.Context,
    documents: list[str] = typer.Argument(
        ...,
        help="Documents to remove: a file as it was ingested (its path), or a source as "
        "'batos search --json' shows it.",
    ),
) -> None:
    """Remove documents and their chunks from the knowledge catalog, in one transaction.

    A document whose chunks the curator folded into archives is refused (their text lives
    on there): restore the archives first. 'batos undo TID' brings the documents back.

    Example: batos forget notes/old-secrets.txt
    """
    with _catalog(ctx) as catalog:
        sources = [_known_source(catalog, name) for name in documents]
        removed = catalog.forget(sources)
    for source, chunks in removed.items():
        console.print(f"forgot {shown(source)} ({chunks} chunks)", soft_wrap=True)
    console.print("'batos history' shows the transaction; 'batos undo TID' brings them back")


def _known_source(catalog: KnowledgeCatalog, name: str) -> str:
    """``name`` as the catalog keeps it: as given when it holds that source, else the
    absolute path a file of that name was ingested under."""
    if catalog.document(name) is not None:
        return name
    try:
        resolved = str(Path(name).resolve())
    except (OSError, RuntimeError):  # a symlink loop: it names no ingested file either
        return name
    return resolved if catalog.document(resolved) is not None else name


def _no_summaries(texts: list[str]) -> str:
    raise BatosError("this curator run does not summarise")  # pragma: no cover


def register(app: typer.Typer) -> None:
    app.command()(ingest)
    app.command()(search)
    app.command()(curate)
    app.command()(forget)
