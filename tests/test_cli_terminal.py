"""What reaches the terminal: rich markup, emoji codes and control characters in slot values,
method sources, results, thread ids and error messages are shown as text, never obeyed; a
result too large for JSON is refused with a message, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeModels
from images import open_laid_out
from test_cli_kernel import run
from test_mind import responder

from batos.shell.cli.terminal import json_text, shown, visible
from store.checkpoint.saver import ZODBSaver
from store.core.image import LivingImage

ESC = "\x1b"


@pytest.fixture
def image(capsys, file_uri: str) -> str:
    assert run(capsys, "--image", file_uri, "init")[0] == 0
    return file_uri


def set_slot(uri: str, name: str, value: Any) -> None:
    with LivingImage.open(uri) as image:

        def put(root: Any) -> None:
            setattr(root["objects"]["brick"], name, value)

        image.transact(put, note=f"test: brick.{name}")


def add_method(capsys, uri: str, tmp_path: Path, selector: str, source: str) -> None:
    file = tmp_path / f"{selector}.py"
    file.write_text(source, encoding="utf-8")
    code, out, err = run(capsys, "--image", uri, "methods", "add", "brick", selector, str(file))
    assert code == 0, out + err


def test_markup_in_a_slot_value_is_shown_by_inspect_and_send(capsys, image) -> None:
    set_slot(image, "note", "[/x] and [bold]not bold[/bold]")
    code, out, err = run(capsys, "--image", image, "inspect", "brick")
    assert code == 0, err
    assert "[/x] and [bold]not bold[/bold]" in out
    code, out, err = run(capsys, "--image", image, "send", "brick", "note")
    assert code == 0, err
    assert out.strip() == "'[/x] and [bold]not bold[/bold]'"
    code, out, err = run(capsys, "--image", image, "inspect", "brick.note")
    assert code == 0 and "[/x]" in out, err


def test_markup_in_a_method_result_and_its_source_is_shown(capsys, image, tmp_path) -> None:
    add_method(capsys, image, tmp_path, "mark", "def mark(self):\n    return '[/x]'\n")
    code, out, err = run(capsys, "--image", image, "send", "brick", "mark")
    assert code == 0 and out.strip() == "'[/x]'", err
    code, out, err = run(capsys, "--image", image, "inspect", "brick")
    assert code == 0 and "return '[/x]'" in out, err


def test_escape_bytes_in_a_method_source_are_shown_not_sent(capsys, image, tmp_path) -> None:
    # Up two lines and erase them: on a terminal the lines above would vanish from view.
    hiding = "\x1b[2A\x1b[2K\u202e hidden"
    source = f"def tidy(self):\n    '''{hiding}'''\n    self.secret = 1\n    return 1\n"
    add_method(capsys, image, tmp_path, "tidy", source)
    for argv in (("methods",), ("methods", "-p", "brick"), ("inspect", "brick")):
        code, out, err = run(capsys, "--image", image, *argv)
        assert code == 0, err
        assert ESC not in out + err and "\u202e" not in out + err, argv
        assert "\\x1b[2A\\x1b[2K\\u202e hidden" in out, argv
        assert "self.secret = 1" in out, argv
    code, out, _ = run(capsys, "--image", image, "methods", "--json")
    assert ESC not in out and "\u202e" not in out
    assert json.loads(out)[0]["source"] == source  # the JSON still says exactly what is stored


def test_a_huge_integer_is_refused_by_send_json_and_shown_by_size(capsys, image) -> None:
    set_slot(image, "count", 2**196_000)
    code, out, err = run(capsys, "--image", image, "send", "brick", "count", "--json")
    assert code == 1 and "Traceback" not in out + err
    assert "brick.count holds an integer of more than 4,300 digits" in " ".join(err.split())
    assert "hint:" in err and len(out + err) < 1_000
    code, out, err = run(capsys, "--image", image, "send", "brick", "count")
    assert code == 0 and out.strip() == "<int of 196001 bits>", err


def test_a_huge_integer_in_a_method_result_is_refused_as_json(capsys, image, tmp_path) -> None:
    source = "def big(self):\n    x = 3 ** 40000\n    return [x * x * x]\n"
    add_method(capsys, image, tmp_path, "big", source)
    code, out, err = run(capsys, "--image", image, "send", "brick", "big", "--json")
    if code == 7:  # the sandbox bounds integer products: then the method never returns it
        assert "bits" in err and "Traceback" not in out + err
        return
    assert code == 1 and "Traceback" not in out + err
    assert "brick.big holds an integer of more than" in " ".join(err.split())


def test_an_error_message_holding_markup_is_printed_as_text(capsys, image) -> None:
    code, out, err = run(capsys, "--image", image, "inspect", "brick.[/x]")
    assert code == 4 and "Traceback" not in out + err
    assert "[/x]" in err and "hint:" in err


def test_visible_shows_every_control_but_layout() -> None:
    text = "a\tb\nc\rd\x07\x1b[31m\x9b2J\u202eevil\u2066\x7f"
    assert visible(text) == "a\tb\nc\\x0dd\\x07\\x1b[31m\\x9b2J\\u202eevil\\u2066\\x7f"
    assert shown("[/x] \x1b") == "\\[/x] \\x1b"
    assert json.loads(json_text({"k": text}, "x")) == {"k": text}
    assert not set(json_text({"k": text}, "x")) & {"\x1b", "\x9b", "\u202e", "\r", "\x7f"}


def test_json_of_a_file_name_with_undecodable_bytes_is_valid_utf8() -> None:
    name = "/docs/bad\udcffname.txt"  # how Python reads the byte 0xff in a path
    text = json_text({"source": name, "title": "café"}, "x")
    assert json.loads(text.encode("utf-8").decode("utf-8")) == {"source": name, "title": "café"}
    assert json_text({"title": "café"}, "x") == '{"title": "café"}'  # else left as written


def test_emoji_codes_in_ids_and_values_are_shown_as_written(capsys, image) -> None:
    # rich reads ':fire:' as an emoji even with markup off; an id shown as one cannot be
    # copied back, and in JSON it would no longer be the id that is stored
    thread = "work:fire:log"
    models = FakeModels(responder())
    code, out, err = run(capsys, "--image", image, "ask", "hi", "-t", thread, models=models)
    assert code == 0, err
    assert f"on thread {thread}" in out
    code, out, err = run(capsys, "--image", image, "threads")
    assert code == 0 and f"\n{thread}  " in out, err
    code, out, err = run(capsys, "--image", image, "threads", "--json")
    assert code == 0 and json.loads(out)["thread_id"] == thread, err
    code, out, err = run(capsys, "--image", image, "threads", thread)
    assert code == 0 and f"Thread {thread}:" in out, err
    code, out, err = run(capsys, "--image", image, "cycles")
    assert code == 0 and f"thread {thread}" in out, err
    set_slot(image, "note", ":smile: :fire:")
    code, out, err = run(capsys, "--image", image, "inspect", "brick")
    assert code == 0 and ":smile: :fire:" in out, err
    code, out, err = run(capsys, "--image", image, "inspect", "brick.:fire:")
    assert code == 4 and ":fire:" in err
    code, out, err = run(capsys, "--image", image, "search", "cats", "-w", "source=a:fire:.md")
    assert "source=a:fire:.md" in " ".join(err.split())
    assert not {"🔥", "😄"} & set(out + err)


def test_thread_ids_are_listed_exactly_and_one_line_each(capsys, image, monkeypatch) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    stored = ["[red]x[/red]", "t" * 120, "nl\nid", "esc\x1b[2J"]
    with open_laid_out(image) as living, ZODBSaver(living) as saver:
        for thread in stored:
            config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            saver.put(config, generate_checkpoint(), {}, {})
    monkeypatch.setenv("COLUMNS", "80")  # as in a pipe: a long line was folded at 80
    code, out, err = run(capsys, "--image", image, "threads")
    assert code == 0, err
    lines = out.splitlines()[1:]
    assert len(lines) == len(stored) and all(" checkpoints, " in line for line in lines)
    # markup is not read there, so '[' is not escaped; controls are, newlines too
    assert {line.split("  ")[0] for line in lines} == {
        "[red]x[/red]",
        "t" * 120,
        "nl\\nid",
        "esc\\x1b[2J",
    }
    code, out, err = run(capsys, "--image", image, "threads", "[red]x[/red]")
    assert code == 0 and "Thread [red]x[/red]: 1 checkpoints" in out, err
