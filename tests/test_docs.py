"""The README and docs/ cannot drift: their examples are run or parsed here.

- ```python blocks run, each page's blocks in order in one namespace, in a fresh folder with
  ``BATOS_HOME`` there. A block preceded by ``<!-- not-tested: reason -->`` is skipped (only
  for blocks that need a server or a real model; the reason is required).
- ```console blocks run: each ``$ `` line in turn (``batos`` through the CLI in process, any
  other line through bash) against a fresh image with ``BATOS_MODEL=test``; the lines under a
  command are output it must print.
- Every ``batos ...`` line of a ```sh block is parsed by the CLI, so a renamed command or
  option fails here.
- The command table of docs/cli.md, the settings table of docs/configuration.md and the
  rooms of docs/architecture.md are held to the code.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from batos.settings import SETTINGS
from batos.shell.cli.app import app, main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", re.S | re.M)
NOT_TESTED = re.compile(r"<!--\s*not-tested:\s*(\S.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    skip: str | None  # the reason given by a not-tested marker


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_TESTED.search(before)
        line = text.count("\n", 0, match.start()) + 2
        skip = marker.group(1) if marker else None
        found.append(Block(page, line, match.group(1), match.group(2), skip))
    return found


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_pages_are_found_and_the_readme_stays_short() -> None:
    assert {p.name for p in PAGES} >= {"README.md", "cli.md", "python-api.md", "architecture.md"}
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 160


def test_skipped_blocks_are_rare_and_say_why() -> None:
    skipped = [b for page in PAGES for b in blocks(page) if b.skip is not None]
    python = [b for page in PAGES for b in blocks(page) if b.lang == "python"]
    assert all(len(b.skip or "") >= 20 for b in skipped), skipped
    assert len(skipped) * 3 <= len(python), [f"{_name(b.page)}:{b.line}" for b in skipped]


# -- python blocks ------------------------------------------------------------------------------

PYTHON_PAGES = [p for p in PAGES if any(b.lang == "python" and not b.skip for b in blocks(p))]


@pytest.fixture
def fresh_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BATOS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("BATOS_IMAGE", f"file://{tmp_path / 'home' / 'live_image.fs'}")
    monkeypatch.setenv("BATOS_MODEL", "test")
    return tmp_path


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_name)
def test_python_examples_run(page: Path, fresh_folder: Path) -> None:
    namespace: dict[str, object] = {"__name__": "__docs__"}
    environ = dict(os.environ)
    try:
        for block in blocks(page):
            if block.lang != "python" or block.skip:
                continue
            code = compile(block.code, f"{_name(page)}:{block.line}", "exec")
            exec(code, namespace)
    finally:
        os.environ.clear()
        os.environ.update(environ)


def test_a_python_example_that_is_wrong_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nx = 1\n```\n\n```python\nassert x == 2\n```\n")
    found = blocks(page)
    assert [b.line for b in found] == [4, 8]
    namespace: dict[str, object] = {}
    exec(compile(found[0].code, "a", "exec"), namespace)
    with pytest.raises(AssertionError):
        exec(compile(found[1].code, "b", "exec"), namespace)


# -- command lines -------------------------------------------------------------------------------


def command_lines(code: str) -> list[list[str]]:
    """Each ``batos`` invocation in a shell block, as argv after ``batos``: environment
    assignments before it are dropped, and so is what follows a pipe, redirection or ``&``."""
    found = []
    for raw in code.replace("\\\n", " ").splitlines():
        line = raw.strip().removeprefix("$ ")
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError as exc:
            raise AssertionError(f"cannot split {line!r}: {exc}") from exc
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
            tokens.pop(0)
        if not tokens or tokens[0] != "batos":
            continue
        argv = []
        for token in tokens[1:]:
            if token and set(token) <= set("|&;<>"):
                break
            argv.append(token)
        found.append(argv)
    return found


def parse(argv: list[str]) -> None:
    """Parse ``batos ARGV`` as the CLI would, down to the last subcommand, running nothing
    (``--help`` stops parsing as the CLI does, successfully)."""
    try:
        _parse(argv)
    except Exception as exc:  # typer's own copy of click: its Exit is not click's
        if type(exc).__name__ != "Exit" or getattr(exc, "exit_code", 1) != 0:
            raise


def _parse(argv: list[str]) -> None:
    command = typer.main.get_command(app)
    context = command.make_context("batos", list(argv))
    while hasattr(command, "commands"):
        rest = [*getattr(context, "_protected_args", []), *context.args]
        if not rest:
            return
        name, command, args = command.resolve_command(context, rest)
        context = command.make_context(name, args, parent=context)


SHELL_LINES = [
    pytest.param(argv, id=f"{_name(b.page)}:{b.line}:{' '.join(argv)[:60]}")
    for page in PAGES
    for b in blocks(page)
    if b.lang in ("sh", "bash", "console", "") and not b.skip
    for argv in command_lines(b.code)
]


def test_there_are_command_lines_to_check() -> None:
    assert len(SHELL_LINES) >= 60


@pytest.mark.parametrize("argv", SHELL_LINES)
def test_command_lines_parse(argv: list[str]) -> None:
    parse(argv)


def test_a_renamed_option_fails_to_parse() -> None:
    parse(["search", "garden", "-k", "3"])
    with pytest.raises(Exception, match="No such option"):
        parse(["search", "garden", "--top", "3"])
    with pytest.raises(Exception, match="No such command"):
        parse(["serach", "garden"])
    assert command_lines("BATOS_X=1 batos doctor --json | jq . # c\necho hi") == [
        ["doctor", "--json"]
    ]


CONSOLE = [
    pytest.param(b, id=f"{_name(b.page)}:{b.line}")
    for page in PAGES
    for b in blocks(page)
    if b.lang == "console" and not b.skip
]


def sessions(code: str) -> list[tuple[str, list[str]]]:
    """``$ `` lines and the output lines under each."""
    steps: list[tuple[str, list[str]]] = []
    for line in code.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif line.strip():
            steps[-1][1].append(line.strip())
    return steps


@pytest.mark.parametrize("block", CONSOLE)
def test_console_sessions_run(
    block: Block, fresh_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command, expected in sessions(block.code):
        argv = command_lines(command)
        if argv:
            code = main(argv[0])
            out = capsys.readouterr().out
        else:
            done = subprocess.run(
                ["bash", "-c", command], cwd=fresh_folder, capture_output=True, text=True
            )
            code, out = done.returncode, done.stdout
        assert code == 0, f"{command!r} exited {code}: {out}"
        for line in expected:
            assert line in out, f"{command!r} did not print {line!r}: {out}"


# -- tables held to the code ---------------------------------------------------------------------


def test_the_cli_page_names_every_command() -> None:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    table = [line for line in text.splitlines() if line.startswith("| `batos ")]
    named = {m for line in table for m in re.findall(r"`batos (\w+)|, `(\w+)`", line)}
    named = {a or b for a, b in named}
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert named == commands, (named - commands, commands - named)


def test_the_configuration_page_lists_every_setting() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(BATOS_\w+|OLLAMA_\w+)` \| `(\w+)` \|", text, re.M))
    assert rows == {(s.env, s.name) for s in SETTINGS.values()}


def test_every_variable_the_docs_name_is_a_setting() -> None:
    envs = {s.env for s in SETTINGS.values()}
    for page in [*PAGES, ROOT / "bench" / "RESULTS.md"]:
        text = page.read_text(encoding="utf-8")
        named = set(re.findall(r"\bBATOS_[A-Z0-9_]*[A-Z0-9]\b", text))
        assert named <= envs, (_name(page), named - envs)


def test_the_architecture_picture_follows_the_import_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = config["tool"]["importlinter"]["contracts"][0]
    layers = [name.strip() for layer in contract["layers"] for name in layer.split(":")]
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    picture = next(b.code for b in blocks(ROOT / "docs" / "architecture.md") if b.lang == "mermaid")
    chain = re.search(r"^\s*(\w+(?: --> \w+)+)\s*$", picture, re.M)
    assert chain is not None
    labels = dict(re.findall(r'^\s*(\w+)\["([^"<]+)', picture, re.M))
    drawn = [label for node in chain.group(1).split(" --> ") for label in labels[node].split(" · ")]
    assert [d.split()[0] for d in drawn] == layers
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for layer in layers:
        assert f"`{layer}`" in readme and f"`{layer}`" in text, layer


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_links_between_pages_reach_a_page_and_a_heading() -> None:
    for page in [*PAGES, ROOT / "bench" / "RESULTS.md"]:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), (_name(page), target)
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked), (_name(page), target)
