"""The batos command line: init, inspect, history, undo, schema, config and error exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from batos.errors import ImageLockedError
from batos.shell.cli import main
from prototypes.codex import load_codex
from prototypes.uvm import Method
from store.core.image import LivingImage
from store.core.zeo import _answers, free_port


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_init_creates_and_shows_personas(capsys, file_uri):
    code, out, _ = run(capsys, "--image", file_uri, "init")
    assert code == 0
    codex = f"codex-{load_codex().version}"
    for name in ("ROBIN", "BRICK", "BABS", "ALFRED", "root-1", "tools-1", codex):
        assert name in out


def test_inspect_objects_slots_and_method_source(capsys, file_uri):
    run(capsys, "--image", file_uri, "init")
    with LivingImage.open(file_uri) as image:
        image.transact(
            lambda root: setattr(
                root["objects"]["brick"],
                "double",
                Method("double", "def double(self, x):\n    return 2 * x\n", intent="twice x"),
            )
        )
    code, out, _ = run(capsys, "--image", file_uri, "inspect")
    assert code == 0 and "robin" in out and "traits" in out
    code, out, _ = run(capsys, "--image", file_uri, "inspect", "brick")
    assert code == 0
    assert "parent*" in out and "double" in out and "return 2 * x" in out
    code, out, _ = run(capsys, "--image", file_uri, "inspect", "robin.intents")
    assert code == 0 and "reflect_feelings" in out


def test_inspect_unknown_path_exits_4_with_choices(capsys, file_uri):
    run(capsys, "--image", file_uri, "init")
    code, _, err = run(capsys, "--image", file_uri, "inspect", "robin.nothing_here")
    assert code == 4
    assert "no 'nothing_here' in robin" in err and "intents" in err
    # a list or tuple is walked by index, and says which indexes it has
    code, out, _ = run(capsys, "--image", file_uri, "inspect", "robin.router_examples.0")
    assert code == 0 and out.strip()
    code, _, err = run(capsys, "--image", file_uri, "inspect", "robin.router_examples.99999")
    assert code == 4 and "0 to" in err and "(its indexes)" in err


def test_history_and_undo(capsys, file_uri):
    run(capsys, "--image", file_uri, "init")
    with LivingImage.open(file_uri) as image:
        image.transact(lambda root: root.__setitem__("scratch", 1), note="scratch write")
        tid = image.history(1)[0].tid
    code, out, _ = run(capsys, "--image", file_uri, "history", "-n", "3")
    assert code == 0 and tid in out and "scratch write" in out
    code, out, _ = run(capsys, "--image", file_uri, "undo", tid)
    assert code == 0
    with LivingImage.open(file_uri) as image, image.read() as root:
        assert "scratch" not in root
    code, _, err = run(capsys, "--image", file_uri, "undo", "ffffffffffffffff")
    assert code == 3 and "batos history" in err
    with LivingImage.open(file_uri) as image:
        upgrade = next(r for r in image.history(100) if r.description.startswith("upgrade: "))
    code, out, _ = run(capsys, "--image", file_uri, "undo", upgrade.tid)
    assert code == 0 and "layout upgrade" in out and "applies it again" in " ".join(out.split())


def test_history_records_the_os_user_and_the_command(capsys, file_uri):
    import getpass

    run(capsys, "--image", file_uri, "init")
    with LivingImage.open(file_uri) as image:
        users = {record.user for record in image.history(5)}
    assert f"{getpass.getuser()} (batos init)" in users
    code, out, _ = run(capsys, "--image", file_uri, "history")
    assert code == 0 and getpass.getuser() in out


def test_schema_and_config(capsys, file_uri):
    run(capsys, "--image", file_uri, "init")
    code, out, _ = run(capsys, "--image", file_uri, "schema")
    assert code == 0 and f"codex-{load_codex().version}" in out
    code, out, _ = run(capsys, "config")
    assert code == 0 and "BATOS_IMAGE" in out and "BATOS_MODEL" in out


@pytest.mark.parametrize(
    "command",
    [
        ["inspect", "robin"],
        ["history"],
        ["schema"],
        ["undo", "ffffffffffffffff"],
        ["threads"],
        ["prune", "--keep", "1"],
        ["pack"],
        ["methods"],
        ["tools"],
        ["tools", "remove", "weather"],
        ["send", "brick", "x"],
        ["search", "anything"],
        ["curate", "--dry-run"],
        ["learn"],
        ["learn", "undo", "1"],
    ],
)
def test_commands_that_need_an_image_never_create_one(capsys, tmp_path, command):
    typo = tmp_path / "typo" / "live_image.fs"
    code, _, err = run(capsys, "--image", f"file://{typo}", *command)
    flat = err.replace("\n", "")  # rich wraps long paths
    assert code == 3
    assert f"no image at {typo}" in flat and "init' to create one" in flat
    assert not (tmp_path / "typo").exists()


def test_failed_open_leaves_nothing_beside_the_file(tmp_path):
    """A file that is no image at all: refused, and nothing appears next to it."""
    garbage = tmp_path / "garbage.fs"
    garbage.write_bytes(b"FS30" + b"\0" * 100)  # the magic, then nothing a header could be
    for command in (["init"], ["inspect"]):
        assert main(["--image", f"file://{garbage}", *command]) == 3
        assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.fs"]


def test_bad_uri_exits_3(capsys):
    code, _, err = run(capsys, "--image", "gopher://x", "init")
    assert code == 3 and "no storage for URI scheme" in err


def test_console_script_exit_code_and_help(file_uri):
    batos = [sys.executable, "-m", "batos.shell.cli"]
    ok = subprocess.run([*batos, "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "inspect" in ok.stdout
    bad = subprocess.run([*batos, "--image", "nope://", "init"], capture_output=True, text=True)
    assert bad.returncode == 3 and "hint:" in bad.stderr


@pytest.mark.model
def test_run_shows_image_model_and_personas_and_answers(capsys, file_uri, monkeypatch):
    monkeypatch.setenv("BATOS_MIND_RELEVANCE", "-1")  # any reply of the tiny model passes
    code, out, _ = run(capsys, "--image", file_uri, "run", "--request", "hello")
    assert code == 0, out
    assert "SmolLM2" in out or "smollm2" in out.lower()
    assert "ALFRED" in out
    assert "COMPLETE" in out and "committed with its checkpoint" in out


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGHUP])
def test_zeo_start_stops_its_server_on_a_stop_signal(file_uri, tmp_path, stop_signal):
    temp = tmp_path / "temp"
    temp.mkdir()
    port = free_port()
    serving = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batos.shell.cli",
            "--image",
            file_uri,
            "zeo",
            "start",
            "-a",
            f"127.0.0.1:{port}",
        ],
        env={**os.environ, "TMPDIR": str(temp)},  # where the server's config file goes
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 180  # a loaded 2-core machine starts Python slowly
    while not _answers("127.0.0.1", port):
        assert serving.poll() is None, serving.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    serving.send_signal(stop_signal)
    out, err = serving.communicate(timeout=60)
    assert serving.returncode == 0, err
    assert "stopped serving" in out
    assert not _answers("127.0.0.1", port)  # the server is gone with its port...
    with LivingImage.open(file_uri) as image:  # ...and the image's lock
        image.transact(lambda root: root.__setitem__("after", 1))
    assert list(temp.iterdir()) == []  # and its config file


@pytest.mark.slow
def test_zeo_start_killed_outright_takes_its_server_with_it(file_uri, tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    port = free_port()
    serving = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batos.shell.cli",
            "--image",
            file_uri,
            "zeo",
            "start",
            "-a",
            f"127.0.0.1:{port}",
        ],
        env={**os.environ, "TMPDIR": str(temp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        said = serving.stdout.readline()  # it says so once the server answers
        assert said.startswith("serving"), said + serving.stdout.read()
        assert _answers("127.0.0.1", port)
        assert list(temp.iterdir()) == []  # the config was read and removed before serving
    finally:
        serving.send_signal(signal.SIGKILL)  # no handler runs: only the server's lifeline can tell
    serving.wait(timeout=10)
    deadline = time.monotonic() + 60
    while _answers("127.0.0.1", port):
        assert time.monotonic() < deadline, "runzeo outlived the process that started it"
        time.sleep(0.1)
    deadline = time.monotonic() + 60
    while True:  # the server's last act is to close the storage, releasing the lock
        try:
            with LivingImage.open(file_uri) as image:
                image.transact(lambda root: root.__setitem__("after", 1))
            break
        except ImageLockedError:
            assert time.monotonic() < deadline, "the image's lock is still held"
            time.sleep(0.1)
    assert list(temp.iterdir()) == []


def _help_texts(command, name="batos"):
    yield name, command
    for sub_name, sub in getattr(command, "commands", {}).items():
        yield from _help_texts(sub, f"{name} {sub_name}")


def test_every_help_text_is_whole_paragraphs_that_rewrap_at_any_width(capsys, monkeypatch):
    """A docstring's own line breaks would stay in the help and the terminal would wrap again,
    leaving one-word lines between full ones."""
    from batos.shell.cli.app import command

    monkeypatch.setenv("COLUMNS", "80")
    for name, _ in _help_texts(command()):
        if name == "batos":
            continue
        assert main([*name.split()[1:], "--help"]) == 0
        out = capsys.readouterr().out
        described = out.split("Usage:", 1)[1].split("╭", 1)[0].splitlines()[2:]
        lines = [line.strip() for line in described]
        for line, after in zip(lines, lines[1:], strict=False):
            # A line ends short only at a paragraph's end, or before a word too long for it.
            fits_more = after and len(line) + 1 + len(after.split()[0]) <= 70
            assert not line or not fits_more, (name, line)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["say", "robin", ""], "the text is empty"),
        (["say", "robin", "\x1b[0m \x07"], "the text is empty"),  # nothing typed but controls
        (["say", "robin", "hi", "-t", "9"], "less than or equal to 2"),
        (["say", "robin", "hi", "-t", "-1"], "greater than or equal to 0"),
        (["say", "robin", "hi", "-n", "99999999"], "less than or equal to 32768"),
    ],
)
def test_say_refuses_what_no_model_call_should_get(capsys, argv, said):
    assert main(argv) == 2
    assert said in " ".join(capsys.readouterr().err.split())
