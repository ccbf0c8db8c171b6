"""The knowledge catalog's command line: batos ingest, batos search and batos curate."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from documents import BROKEN_TO_UNICODE, DEBIAN_COPYRIGHT, make_pdf
from images import open_laid_out
from rich.console import Console

from batos.shell.cli import main
from batos.shell.cli.progress import ProgressReport
from store.core.image import LivingImage
from store.knowledge.catalog import KnowledgeCatalog
from store.knowledge.curator import Curator
from store.knowledge.embeddings import Embedder

CATS = "Cats purr when they are content. Kittens learn to hunt by playing with siblings."
DOGS = "Dogs bark at strangers. Puppies chew shoes while their teeth grow."
BACKUPS = [
    "The backup job runs every night at two and copies the image to the NAS.",
    "Every night at two the backup job copies the image to the NAS.",
    "At two each night, the backup job copies the image onto the NAS.",
]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def flat(text: str) -> str:
    """``text`` without whitespace: rich wraps tables and messages to the console's width."""
    return "".join(text.split())


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "cats.md").write_text(f"# Cats\n\n{CATS}")
    (folder / "dogs.txt").write_text(DOGS)
    return folder


def test_ingest_reports_each_outcome_and_skips_unchanged_files(capsys, file_uri, notes) -> None:
    code, out, _ = run(capsys, "--image", file_uri, "ingest", str(notes), "-m", "topic=pets")
    assert code == 0 and "added 2, replaced 0, unchanged 0, failed 0" in out
    code, out, _ = run(capsys, "--image", file_uri, "ingest", str(notes))
    assert code == 0 and "added 0, replaced 0, unchanged 2, failed 0; 0 chunks in 0" in out
    (notes / "dogs.txt").write_text(DOGS + " Old dogs sleep a lot.")
    code, out, _ = run(capsys, "--image", file_uri, "ingest", str(notes / "dogs.txt"))
    assert code == 0 and "replaced 1" in out


def test_ingest_meta_reaches_unchanged_files_and_stays_without_it(capsys, file_uri, notes) -> None:
    cats = str(notes / "cats.md")
    assert run(capsys, "--image", file_uri, "ingest", str(notes), "-m", "topic=pets")[0] == 0
    # the same unchanged file given a new value takes it; a run without --meta keeps it
    code, out, _ = run(capsys, "--image", file_uri, "ingest", cats, "-m", "topic=cats")
    assert code == 0 and "replaced 1, unchanged 0" in out
    code, out, _ = run(capsys, "--image", file_uri, "ingest", str(notes), "-m", "lang=en")
    assert code == 0 and "replaced 2" in out
    code, out, _ = run(capsys, "--image", file_uri, "ingest", str(notes))
    assert code == 0 and "unchanged 2" in out
    found = {}
    for topic in ("cats", "pets"):
        code, out, _ = run(
            capsys, "--image", file_uri, "search", "animals", "--json", "-w", f"topic={topic}"
        )
        found[topic] = {hit["source"] for hit in json.loads(out)["results"]}
    assert found == {
        "cats": {str(Path(cats).resolve())},
        "pets": {str((notes / "dogs.txt").resolve())},
    }
    code, out, _ = run(capsys, "--image", file_uri, "search", "animals", "--json", "-w", "lang=en")
    assert len({hit["source"] for hit in json.loads(out)["results"]}) == 2


def test_search_where_takes_a_relative_source_and_says_when_a_filter_matches_nothing(
    capsys, file_uri, notes, monkeypatch
) -> None:
    assert run(capsys, "--image", file_uri, "ingest", str(notes))[0] == 0
    monkeypatch.chdir(notes)
    code, out, err = run(
        capsys, "--image", file_uri, "search", "animals", "--json", "-w", "source=cats.md"
    )
    sources = {hit["source"] for hit in json.loads(out)["results"]}
    assert code == 0 and sources == {str((notes / "cats.md").resolve())} and not err
    code, out, err = run(capsys, "--image", file_uri, "search", "animals", "-w", "topic=none")
    assert code == 0 and "no chunk has topic=none" in err


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        (["source=evil"], "names a field the catalog sets itself"),
        (["kind=weird"], "names a field the catalog sets itself"),
        (["topic=a", "topic=b"], "gives topic twice"),
    ],
)
def test_ingest_refuses_meta_that_would_be_lost(capsys, file_uri, notes, meta, says) -> None:
    argv = [x for pair in meta for x in ("-m", pair)]
    code, out, err = run(capsys, "--image", file_uri, "ingest", str(notes), *argv)
    assert code != 0 and flat(says) in flat(err) and "hint" in err
    assert "added" not in out


def test_ingest_walks_text_without_a_suffix_but_not_programs(capsys, file_uri, tmp_path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "README").write_text(CATS)
    (project / "runme").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(200))
    (project / "data").write_bytes(b"GZ\x1f\x8b\x00\x00")
    code, out, err = run(capsys, "--image", file_uri, "ingest", str(project))
    assert code == 0 and "added 1, replaced 0, unchanged 0, failed 0" in out, err
    # a program named on its own is still read, and says why it cannot be
    code, _, err = run(capsys, "--image", file_uri, "ingest", str(project / "runme"))
    assert code == 9 and flat("1 of 1 file(s) were not ingested") in flat(err)
    assert "the others were" not in err


def test_ingest_of_a_folder_with_nothing_to_read_says_so(capsys, file_uri, tmp_path) -> None:
    folder = tmp_path / "sheets"
    folder.mkdir()
    (folder / "data.csv").write_text("a,b\n1,2\n")
    (folder / "paper.docx").write_bytes(b"PK\x03\x04")
    code, out, err = run(capsys, "--image", file_uri, "ingest", str(folder))
    assert code == 9 and flat(f"nothing to read under {folder}") in flat(err)
    assert flat(".txt .md .rst") in flat(err)


def test_ingest_goes_on_past_missing_and_bad_files_and_exits_9(
    capsys, file_uri, notes, tmp_path
) -> None:
    (tmp_path / "latin1.txt").write_bytes("café crème".encode("latin-1"))
    missing = tmp_path / "nowhere.txt"
    code, out, err = run(
        capsys,
        "--image",
        file_uri,
        "ingest",
        str(missing),
        str(tmp_path / "latin1.txt"),
        str(notes),
    )
    assert code == 9
    assert "added 2, replaced 0, unchanged 0, failed 2" in out
    assert flat(f"no such file: {missing}") in flat(err) and flat("check the path") in flat(err)
    assert flat("not UTF-8") in flat(err) and "iconv" in err
    assert flat("2 of 4 file(s) were not ingested") in flat(err)
    with open_laid_out(file_uri) as image:
        catalog = KnowledgeCatalog(image, Embedder())
        assert catalog.stats()["documents"] == 2


def test_search_prints_a_table_json_lines_and_honours_k_file_and_filters(
    capsys, file_uri, notes, tmp_path, monkeypatch
) -> None:
    run(capsys, "--image", file_uri, "ingest", str(notes / "cats.md"), "-m", "topic=pets")
    run(capsys, "--image", file_uri, "ingest", str(notes / "dogs.txt"), "-m", "topic=dogs")
    code, out, _ = run(capsys, "--image", file_uri, "search", "why do cats purr", "-k", "1")
    assert code == 0 and "score" in out and "purr" in out and "Puppies" not in out
    assert "│ 1 │" in out and "│ 2 │" not in out  # -k 1: one row

    code, out, _ = run(capsys, "--image", file_uri, "search", "puppies", "kittens", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["query"] for line in lines] == ["puppies", "kittens"]
    top = lines[0]["results"][0]
    assert top["source"] == str((notes / "dogs.txt").resolve())
    assert DOGS[top["start"] : top["end"]] == top["text"] and top["score"] > 0
    assert {"chunk_id", "lexical_rank", "dense_rank", "metadata"} <= set(top)

    queries = tmp_path / "queries.txt"
    queries.write_text("puppies chew shoes\n\nkittens hunt\nstrangers\n")
    code, out, _ = run(
        capsys, "--image", file_uri, "search", "--file", str(queries), "--json", "-k", "1"
    )
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(lines) == 3 and all(len(line["results"]) == 1 for line in lines)
    assert lines[1]["results"][0]["source"].endswith("cats.md")

    monkeypatch.setattr("sys.stdin", io.StringIO("kittens\n"))
    code, out, _ = run(
        capsys, "--image", file_uri, "search", "--file", "-", "--json", "-w", "topic=dogs"
    )
    [line] = [json.loads(x) for x in out.splitlines()]
    assert {r["source"] for r in line["results"]} == {str((notes / "dogs.txt").resolve())}
    code, out, _ = run(
        capsys, "--image", file_uri, "search", "Puppies", "--mode", "lexical", "--json", "-k", "5"
    )
    [line] = [json.loads(x) for x in out.splitlines()]
    assert len(line["results"]) == 1 and line["results"][0]["dense_rank"] is None


def test_search_without_a_query_or_with_a_bad_mode_exits_9(capsys, file_uri) -> None:
    run(capsys, "--image", file_uri, "init")
    code, _, err = run(capsys, "--image", file_uri, "search")
    assert code == 9 and "no query given" in err and "--file" in err
    code, _, err = run(capsys, "--image", file_uri, "search", "x", "--mode", "psychic")
    assert code == 9 and "unknown search mode" in err
    code, _, err = run(capsys, "--image", file_uri, "search", "x", "--file", "/nonexistent/q")
    assert code == 9 and "cannot read queries" in err


def _ingest_backups(capsys, file_uri: str, tmp_path: Path) -> None:
    """Three files that say the same thing: a cluster the curator folds as redundant."""
    for i, text in enumerate(BACKUPS):
        (tmp_path / f"backup-{i}.txt").write_text(text)
    run(
        capsys,
        "--image",
        file_uri,
        "ingest",
        *(str(tmp_path / f"backup-{i}.txt") for i in range(3)),
    )


def test_curate_plans_lists_shows_and_restores(capsys, file_uri, tmp_path) -> None:
    _ingest_backups(capsys, file_uri, tmp_path)
    code, out, _ = run(capsys, "--image", file_uri, "curate", "--dry-run")
    assert code == 0 and "redundant: 3 chunks" in out and "1 cluster(s) would be folded" in out
    with open_laid_out(file_uri) as image:  # fold with a stand-in for BABS
        catalog = KnowledgeCatalog.open(image)  # the encoder the ingest chose
        [archive_id] = Curator(catalog, lambda texts: "Nightly NAS backups at two.").run().archives
        catalog.close()
    code, out, _ = run(capsys, "--image", file_uri, "curate", "--list")
    assert code == 0 and str(archive_id) in out
    code, out, _ = run(capsys, "--image", file_uri, "curate", "--show", str(archive_id))
    assert code == 0 and all(text.split(",")[0] in " ".join(out.split()) for text in BACKUPS)
    code, out, _ = run(capsys, "--image", file_uri, "search", "NAS backup", "--json", "-k", "5")
    assert [r["kind"] for r in json.loads(out)["results"]] == ["summary"]
    # Options that do different things are refused, changing nothing: '--restore N --dry-run'
    # used to restore for real.
    for mixed in (["--restore", str(archive_id), "--dry-run"], ["--show", "1", "--restore", "2"]):
        code, _, err = run(capsys, "--image", file_uri, "curate", *mixed)
        assert code == 2 and "give one of them" in err, err
    code, _, err = run(capsys, "--image", file_uri, "curate", "--dry-run", "--max-chunks", "0")
    assert code == 2 and "--max-chunks" in err
    code, out, _ = run(capsys, "--image", file_uri, "curate", "--list")
    assert str(archive_id) in out  # still there
    code, out, _ = run(capsys, "--image", file_uri, "curate", "--restore", str(archive_id))
    assert code == 0 and f"restored 3 chunk(s) from archive {archive_id}" in out
    code, _, err = run(capsys, "--image", file_uri, "curate", "--show", str(archive_id))
    assert code == 9 and "batos curate --list" in err


def test_forget_removes_documents_undoably_and_refuses_what_it_cannot_forget_whole(
    capsys, file_uri, notes, tmp_path
) -> None:
    # A file ingested by mistake (a secret, a file that poisons answers) could be taken out
    # only by undoing its whole ingest, with every other document of that run.
    run(capsys, "--image", file_uri, "ingest", str(notes))
    code, out, err = run(capsys, "--image", file_uri, "forget", str(notes / "dogs.txt"))
    assert code == 0, err
    assert f"forgot {notes / 'dogs.txt'} (1 chunks)" in " ".join(out.split())
    code, out, _ = run(capsys, "--image", file_uri, "search", "dogs", "--json", "-k", "5")
    assert {r["source"] for r in json.loads(out)["results"]} == {str(notes / "cats.md")}
    code, _, err = run(capsys, "--image", file_uri, "forget", str(notes / "cats.md"), "nowhere.txt")
    assert code == 9 and "holds no document 'nowhere.txt'" in err and "nothing was removed" in err
    code, out, _ = run(capsys, "--image", file_uri, "search", "cats", "--json", "-k", "5")
    assert {r["source"] for r in json.loads(out)["results"]} == {str(notes / "cats.md")}
    with LivingImage.open(file_uri) as image:
        [forgot] = [t for t in image.history(10) if t.description.startswith("catalog: forget")]
        image.undo(forgot.tid)
    code, out, _ = run(capsys, "--image", file_uri, "search", "dogs", "--json", "-k", "5")
    assert str(notes / "dogs.txt") in {r["source"] for r in json.loads(out)["results"]}
    # a document the curator folded lives on in its archive: forgetting it alone is refused
    _ingest_backups(capsys, file_uri, tmp_path)
    with open_laid_out(file_uri) as image:
        catalog = KnowledgeCatalog.open(image)
        [archive_id] = Curator(catalog, lambda texts: "Nightly NAS backups at two.").run().archives
        catalog.close()
    code, _, err = run(capsys, "--image", file_uri, "forget", str(tmp_path / "backup-0.txt"))
    assert code == 9 and f"archive(s) {archive_id}" in err and "batos curate --restore" in err


@pytest.mark.model
def test_curate_folds_with_babs_on_the_test_model(capsys, file_uri, tmp_path) -> None:
    for i, text in enumerate(BACKUPS):
        (tmp_path / f"backup-{i}.txt").write_text(text)
    run(capsys, "--image", file_uri, "ingest", str(tmp_path))
    code, out, _ = run(capsys, "--image", file_uri, "curate", "-n", "1")
    assert code == 0 and "folded 3 chunk(s) into 1 summary(ies); live chunks 3 → 1" in out
    code, out, _ = run(capsys, "--image", file_uri, "curate", "--list")
    assert code == 0 and "Curator archives" in out


def _ingest_command(file_uri: str, folder: Path) -> tuple[list[str], dict[str, str]]:
    """``batos ingest FOLDER`` as a process: its command line and environment (a progress
    line for each file, a commit for each)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "BATOS_PROGRESS_SECONDS": "0",
        "BATOS_CATALOG_COMMIT_SECONDS": "0.000001",
    }
    return [
        sys.executable,
        "-m",
        "batos.shell.cli",
        "--image",
        file_uri,
        "ingest",
        str(folder),
    ], env


def _run_to_its_end(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_piped_ingest_prints_progress_lines_before_its_summary(file_uri, tmp_path) -> None:
    """Output that is not a terminal gets plain progress lines as the work goes (here one per
    step), in order, then the summary line — also when both streams go to one log."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i, text in enumerate([CATS, DOGS, *BACKUPS]):
        (folder / f"note-{i}.txt").write_text(text)
    command, env = _ingest_command(file_uri, folder)
    done = _run_to_its_end(command, env)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    progress = [line for line in lines if line.startswith("ingest: ")]
    assert [line.split()[1] for line in progress] == [f"{n}/5" for n in range(1, 6)]
    assert all("chunks/s" in line and "added: note-" in line for line in progress)
    [summary] = [i for i, line in enumerate(lines) if line.startswith("added 5,")]
    assert summary > lines.index(progress[-1])
    assert "chunks/s" in lines[summary] and "MB/s" in lines[summary]


def test_progress_lines_are_spaced_by_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATOS_PROGRESS_SECONDS", "3600")
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=False)
    with ProgressReport(console, "curate", total=4, unit="clusters") as progress:
        for done in range(1, 5):
            progress.update(done, f"{done} folded")
    # The first step prints at once, the rest within the hour wait for the last line.
    assert stream.getvalue().splitlines() == [
        "curate: 1/4 clusters, 1 folded [0s]",
        "curate: 4/4 clusters, 4 folded [0s]",
    ]


def test_ingest_reports_each_bad_file_by_name_and_commits_the_rest(file_uri, tmp_path) -> None:
    """Through the command, as a user runs it: files the chunker once crashed on, a PDF
    whose text holds lone surrogates, bad files, a pipe and a link loop named on the
    command line. Each bad one is named with its reason, the rest is searchable."""
    folder = tmp_path / "docs"
    (folder / "purrd").mkdir(parents=True)
    (folder / "purrd" / "copyright").write_text(DEBIAN_COPYRIGHT)
    (folder / "a-sentence.txt").write_text("Hello.\n\n. Next. A sentence. . Another one.")
    (folder / "penguins.pdf").write_bytes(make_pdf("Penguins swim. A map.", BROKEN_TO_UNICODE))
    (folder / "latin1.txt").write_bytes("café crème".encode("latin-1"))
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf at all")
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    loop = tmp_path / "loop.txt"
    loop.symlink_to(tmp_path / "loop2.txt")
    (tmp_path / "loop2.txt").symlink_to(loop)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "batos.shell.cli", "--image", file_uri]
    done = subprocess.run(
        [*command, "ingest", str(pipe), str(loop), str(folder)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # reading the pipe would block for ever
        check=False,
    )
    assert done.returncode == 9, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "added 3, replaced 0, unchanged 0, failed 4;" in done.stdout
    err = flat(done.stderr)
    assert flat(f"{pipe} is not a regular file") in err
    assert flat(f"cannot read {loop}: Too many levels of symbolic links") in err
    assert flat(f"{folder / 'latin1.txt'} is not UTF-8") in err
    assert flat(f"{folder / 'broken.pdf'} is not a readable PDF") in err
    assert flat("4 of 7 file(s) were not ingested") in err
    done = subprocess.run(
        [*command, "search", "complete text of the GNU General Public License", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    [line] = [json.loads(x) for x in done.stdout.splitlines()]
    assert line["results"][0]["source"] == str(folder / "purrd" / "copyright")


def test_ctrl_c_during_ingest_says_what_was_kept_and_a_second_run_goes_on(
    file_uri, tmp_path
) -> None:
    """Ctrl-C ended the run with 'aborted' alone. Documents are committed whole as the run
    goes: the interrupted run says how many are in, and the same command goes on from there."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(200):  # some 10 chunks each: the run lasts seconds after Ctrl-C is sent
        lines = [f"Note {i}, line {j}: {CATS} {BACKUPS[j % 3]}" for j in range(40)]
        (folder / f"note-{i:03}.txt").write_text("\n\n".join(lines))
    command, env = _ingest_command(file_uri, folder)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    ) as process:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:
            seen.append(line)
            if line.startswith("ingest: 5/200"):
                process.send_signal(signal.SIGINT)
                break
        rest = process.stdout.read()
        code = process.wait(timeout=120)
    said = flat(rest)
    assert code == 130, "".join(seen) + rest
    kept = int(said.split("(added")[1].split(",")[0])
    assert 5 <= kept < 200
    assert f"interrupted:{kept}of200file(s)weredealtwith" in said
    assert "wholeornotatall" in said and "Runthesamecommandagaintogoon" in said
    again = _run_to_its_end(command, env)
    assert again.returncode == 0, again.stdout
    # A batch committed as Ctrl-C came may not have been counted: at least those said are in.
    summary = again.stdout.split("added ")[1].split(";")[0]
    added, unchanged = int(summary.split(",")[0]), int(summary.split("unchanged ")[1].split(",")[0])
    assert unchanged >= kept and added + unchanged == 200
    assert "replaced 0" in summary and "failed 0" in summary
