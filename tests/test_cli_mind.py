"""``batos ask``, ``chat``, ``cycles`` and ``run`` against a file image, with a scripted model."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeModels, ModelCall, PacedPersonaModel, call_kind, image_digest
from langchain_core.messages import BaseMessage, HumanMessage
from test_heartbeat import fits_80_columns, piped
from test_mind import plan_of, request_of, responder

from batos.errors import CycleInterrupted, GraphRequestError
from batos.shell.cli import main
from batos.shell.cli.mind import Session
from batos.shell.runtime import open_runtime
from graph import cycle
from graph import mind as graph_mind
from graph.mind import run_config
from store.core import layout
from store.core.image import LivingImage

#: Words of a slow reply, streamed one every PACE seconds (about a minute unless stopped), and
#: how soon after Ctrl-C the command must be back.
SLOW_WORDS, PACE, STOP_BOUND_S = 5000, 0.01, 10.0


def run(capsys, *argv: str, models=None) -> tuple[int, str, str]:
    code = main(list(argv), models=models)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def image(capsys, file_uri: str) -> str:
    assert run(capsys, "--image", file_uri, "init")[0] == 0
    return file_uri


def test_ask_streams_the_cycle_and_says_what_it_committed(capsys, image) -> None:
    plan = plan_of(
        ("ALFRED.facet_audit", "is the image healthy"),
        ("ALFRED.facet_assumptions", "what image health assumes"),
    )
    models = FakeModels(responder(plan=plan))
    code, out, err = run(
        capsys,
        "--image",
        image,
        "ask",
        "audit the image health",
        "-p",
        "alfred",
        "-t",
        "t1",
        models=models,
    )
    assert code == 0, err
    assert "route → ALFRED" in out and "depth full: planning cue 'audit'" in out
    assert "plan  ALFRED.facet_audit: is the image healthy" in out
    assert "✓ facet ALFRED.facet_audit" in out and "in the answer's outline" in out
    # not written yet: the part is answered by ALFRED directly, and the stream says so
    assert "degraded: its method is not written yet" in out
    assert "answer: About audit the image health" in out
    assert "COMPLETE cycle" in out and "on thread t1" in out
    assert "degraded facet ALFRED.facet_audit: its method is not written yet" in out

    code, out, _ = run(capsys, "--image", image, "cycles", "--json")
    rows = json.loads(out)["committed"]
    assert rows[0]["facets"] == ["ALFRED.facet_audit", "ALFRED.facet_assumptions"]
    assert rows[0]["methods_written"] == []
    assert [d["what"] for d in rows[0]["degraded"]] == rows[0]["facets"]
    code, out, _ = run(capsys, "--image", image, "cycles", rows[0]["id"])
    assert code == 0 and "ALFRED.facet_audit" in out


def test_ask_prints_a_facet_missing_for_several_steps_once(capsys, image) -> None:
    plan = plan_of(
        ("ALFRED.facet_audit", "is the image healthy"),
        ("ALFRED.facet_audit", "is the log healthy"),
    )
    models = FakeModels(responder(plan=plan))
    code, out, err = run(
        capsys, "--image", image, "ask", "audit the image and the log", "-p", "alfred",
        models=models,
    )  # fmt: skip
    assert code == 0, err
    line = "degraded facet ALFRED.facet_audit (2 times): its method is not written yet"
    assert " ".join(out.split()).count("degraded facet") == 1 and line in " ".join(out.split())


def test_ask_json_and_a_failed_cycle(capsys, image) -> None:
    models = FakeModels(responder())
    code, out, _ = run(
        capsys, "--image", image, "ask", "hello there", "-p", "robin", "--json", models=models
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["status"] == "COMPLETE" and summary["depth"]["mode"] == "fast"
    assert summary["response"] == "About hello there: here is the answer."

    code, out, err = run(capsys, "--image", image, "ask", "  ", "-p", "robin", models=models)
    assert code == 10
    assert "FAILED at route: the request is empty" in err and "image is unchanged" in err
    code, out, err = run(capsys, "--image", image, "ask", "hi", "-p", "joker", models=models)
    assert code == 10 and "unknown persona 'joker'" in err
    code, out, err = run(capsys, "--image", image, "ask", "hi", "-t", "no/slash", models=models)
    assert code == 10 and "thread id 'no/slash' is malformed" in err
    code, out, _ = run(capsys, "--image", image, "cycles")
    assert code == 0 and "FAILED thread" in out and "unknown persona" in out


def test_an_empty_thread_id_is_refused_not_taken_for_a_new_thread(
    capsys, image, monkeypatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("hello there\n/quit\n"))
    models = FakeModels(responder())
    for argv in (["ask", "hello there", "-t", ""], ["chat", "-t", ""], ["ask", "hi", "-t", " "]):
        code, out, err = run(capsys, "--image", image, *argv, "-p", "robin", models=models)
        flat = " ".join(err.split())
        assert code == 2 and "a thread id cannot be empty" in flat, err
        assert "leave --thread out to start a new thread" in flat and "COMPLETE" not in out
    assert models.calls == []  # nothing was answered, on any thread


def test_cycles_shows_whole_ids_at_80_columns_in_a_pipe(capsys, image) -> None:
    plan = plan_of(
        ("ALFRED.facet_audit", "is the image healthy"),
        ("ALFRED.facet_assumptions", "what image health assumes"),
    )
    models = FakeModels(responder(plan=plan))
    for text, persona in (("audit the image health", "alfred"), ("hello there", "robin")):
        assert run(capsys, "--image", image, "ask", text, "-p", persona, models=models)[0] == 0
    code, out, _ = run(capsys, "--image", image, "cycles", "--json")
    committed = json.loads(out)["committed"]

    shown = piped("--image", image, "cycles")
    assert shown.returncode == 0, shown.stderr
    fits_80_columns(shown.stdout)
    lines = shown.stdout.splitlines()
    for row in committed:  # its id alone on a line, to copy into 'batos cycles ID'
        at = lines.index(row["id"])
        when, thread = lines[at + 1].strip().split(" · thread ")
        assert thread == row["thread_id"] and len(when.split()) == 2  # date and time
    assert "ALFRED · ALFRED.facet_audit, ALFRED.facet_assumptions ·" in shown.stdout
    assert "ROBIN · (fast path) ·" in shown.stdout
    assert run(capsys, "--image", image, "cycles", lines[1])[0] == 0

    # wide enough, it is a table whose cells are whole
    wide = piped("--image", image, "cycles", COLUMNS="200")
    assert wide.returncode == 0, wide.stderr
    header = next(line for line in wide.stdout.splitlines() if line.startswith("┃ cycle"))
    assert [cell.strip() for cell in header.strip("┃").split("┃")] == [
        "cycle",
        "when",
        "thread",
        "personas",
        "facets",
        "seconds",
        "model s",
        "tokens",
    ]
    assert all(f"│ {row['id']} │ " in wide.stdout for row in committed)


def test_cycles_measures_cells_as_they_are_shown(capsys, image) -> None:
    """A record is text from the image: a control character in it is shown as an escape,
    four characters for one, so a table measured on the raw text came out wider than the
    terminal and a cell that must stay whole was cut."""
    from rich.cells import cell_len

    from batos.shell.cli.cycles import _cycle_cells

    models = FakeModels(responder())
    assert run(capsys, "--image", image, "ask", "hello there", "-p", "robin", models=models)[0] == 0
    with LivingImage.open(image) as img:

        def taint(root):
            from graph import cycle

            key, record = cycle.stored(root, 1)[0]
            root[layout.CYCLES][key] = {**record, "facets": ["BRICK.\x1b\x1b\x1b\x1bfacet"]}

        img.transact(taint)
        with img.read() as root:
            from graph import cycle

            cells = _cycle_cells(cycle.recent(root, 20)[0])
    headers = ("cycle", "when", "thread", "personas", "facets", "seconds", "model s", "tokens")
    raw = sum(max(cell_len(h), cell_len(c)) + 3 for h, c in zip(headers, cells, strict=True)) + 1
    shown = piped("--image", image, "cycles", COLUMNS=str(raw))
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "…" not in shown.stdout  # nothing cut to fit
    assert "BRICK.\\x1b\\x1b\\x1b\\x1bfacet" in shown.stdout.replace("\n", "")


def test_cycles_refuses_an_unknown_or_empty_id(capsys, image) -> None:
    assert (
        run(capsys, "--image", image, "ask", "hi", "-p", "robin", models=FakeModels(responder()))[0]
        == 0
    )
    for argv in (["nonexistent"], ["nonexistent", "--json"]):
        code, out, err = run(capsys, "--image", image, "cycles", *argv)
        # an unknown name, as for 'batos tools show': 10 is a cycle that FAILED
        assert code == 4 and "no committed cycle 'nonexistent'" in err and out == ""
    for empty in ("", "  "):
        code, out, err = run(capsys, "--image", image, "cycles", empty)
        assert code == 2 and "a cycle id cannot be empty" in err and out == ""


def test_chat_keeps_a_thread_and_undoes_the_last_exchange(capsys, image, monkeypatch) -> None:
    models = FakeModels(responder())
    # a pasted colour code is no part of the request
    lines = (
        "hello there\nhow \x1b[1mare\x1b[0m you\n/history\n/undo\n/history\n/thread\n/nope\n/quit\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    code, out, err = run(
        capsys, "--image", image, "chat", "-t", "kitchen", "-p", "robin", models=models
    )
    assert code == 0, err
    history = out.split("the last exchange is undone")
    assert "you: how are you" in history[0]
    assert "you: hello there" in history[1] and "you: how are you" not in history[1]
    assert "thread kitchen" in out and "unknown command /nope" in out
    with LivingImage.open(image) as living, living.read() as root:
        assert root["objects"]["robin"].stats["cycles"] == 2  # the image keeps both


def _chat(
    capsys, image: str, monkeypatch, typed: str, *options: str, models: Any = None
) -> tuple[int, str, str]:
    """``batos chat OPTIONS`` given ``typed`` as its input, on scripted models."""
    monkeypatch.setattr("sys.stdin", io.StringIO(typed))
    models = models or FakeModels(responder())
    return run(capsys, "--image", image, "chat", *options, models=models)


def test_undo_walks_back_one_exchange_at_a_time_and_then_to_a_new_thread(
    capsys, image, monkeypatch
) -> None:
    lines = "first one\nsecond one\nthird one\n/undo\n/undo\n/history\n/undo\n/undo\n/quit\n"
    code, out, err = _chat(capsys, image, monkeypatch, lines, "-t", "walk", "-p", "robin")
    assert code == 0, err
    assert out.count("the last exchange is undone") == 2  # the third, then the second
    shown = out.split("the last exchange is undone")[2]  # /history after two undos
    assert "you: first one" in shown and "second one" not in shown and "third one" not in shown
    # the first exchange has nothing before it: a new, empty thread, with nothing to undo
    new = shown.split("nothing before the first request: starting a new thread")[1]
    assert "nothing to undo" in new


def _said_by(request: str) -> Callable[[ModelCall], Any]:
    """Answers about ``request`` that fail the gate (empty) once a request says 'boom', and
    Ctrl-C's KeyboardInterrupt for a request that says 'stop'."""

    def answer(call: ModelCall) -> Any:
        if "stop" in request_of(call):
            return KeyboardInterrupt()
        # the gate's second try asks again in words of its own: the request is further back
        boom = any("boom" in str(message.content) for message in call.messages)
        return "" if boom else f"About {request}: here is the answer."

    return answer


def _head(image: str, thread_id: str) -> dict[str, Any]:
    session = Session(open_runtime(image, models=FakeModels(responder())))
    try:
        return session.graph.get_state(run_config(thread_id)).values
    finally:
        session.close()


def test_ask_on_a_thread_another_run_is_answering_on_is_refused(capsys, image) -> None:
    # Another process's cycle, stopped before its synthesis as it would be while working.
    with open_runtime(image, models=FakeModels(responder())) as runtime:
        runtime.mind().invoke(
            {"messages": [HumanMessage("plan a garden")]},
            run_config("busy"),
            context={"persona": "BRICK", "depth": "fast"},
            interrupt_before=["synthesize"],
        )
        before = runtime.saver.get_tuple(run_config("busy")).config["configurable"]
    code, out, err = run(capsys, "--image", image, "ask", "-t", "busy", "and a pond?")
    assert code == 8, out + err
    said = " ".join((out + err).split())
    assert "thread 'busy' is answering another request" in said and "send it again" in said
    with open_runtime(image, models=FakeModels(responder())) as runtime:
        after = runtime.saver.get_tuple(run_config("busy")).config["configurable"]
    assert after["checkpoint_id"] == before["checkpoint_id"]  # nothing of it was stored


def test_after_an_undo_the_next_request_reports_its_own_cycle(capsys, image, monkeypatch) -> None:
    lines = "hello one\nhello two\n/undo\nhello three\n/undo\nboom four\n/quit\n"
    models = FakeModels(responder(answer=_said_by("it")))
    code, out, err = _chat(
        capsys, image, monkeypatch, lines, "-t", "walk", "-p", "robin", models=models
    )
    assert code == 0, err
    flat = " ".join(out.split())
    reported = re.findall(r"COMPLETE cycle (\S+) on thread walk", flat)
    with LivingImage.open(image) as living, living.read() as root:
        committed = [row["id"] for row in cycle.recent(root, 10)][::-1]
    # the third request's own cycle, not the first's (the checkpoint the undo went back to)
    assert reported == committed and len(set(reported)) == 3
    # a cycle that FAILED after an undo is said to have failed, not to have committed
    assert flat.count("COMPLETE") == 3 and "the cycle FAILED at gate" in flat
    assert _head(image, "walk")["status"] == "FAILED"


def test_ctrl_c_after_an_undo_marks_the_request_interrupted(capsys, image, monkeypatch) -> None:
    lines = "hello one\nhello two\n/undo\nstop three\n/history\n/quit\n"
    models = FakeModels(responder(answer=_said_by("it")))
    code, out, err = _chat(
        capsys, image, monkeypatch, lines, "-t", "undone", "-p", "robin", models=models
    )
    assert code == 0, err
    flat = " ".join(out.split())
    assert flat.count("COMPLETE") == 2 and "marked interrupted" in flat
    head = _head(image, "undone")
    # the undone exchange is gone, and the stopped request is answered, marked: the thread is
    # idle, not left waiting at the answer
    assert [m.content for m in head["messages"]] == [
        "hello one",
        "About it: here is the answer.",
        "stop three",
        "(interrupted)",
    ]
    assert head["status"] == "FAILED" and head["failure"]["reason"] == "interrupted by the user"


def test_a_refused_input_leaves_its_thread_readable_and_every_command_works(
    capsys, image, monkeypatch
) -> None:
    session = Session(open_runtime(image, models=FakeModels(responder())))
    try:
        for thread in ("history", "undo"):
            config = run_config(thread)
            session.cycle("hi", config, {"persona": "ROBIN"}, show=False)
            # as the LangGraph server or the bridge passes a client's input on: refused
            with pytest.raises(GraphRequestError, match="malformed"):
                session.graph.invoke({"messages": [{"role": "robot", "content": "beep"}]}, config)
            # and the thread reads as it was (every read raised the same error before)
            state = session.graph.get_state(config)
            assert [m.content for m in state.values["messages"]] == [
                "hi",
                "About hi: here is the answer.",
            ]
            assert [t.name for t in state.tasks] == ["__start__"] and state.tasks[0].error
    finally:
        session.close()
    code, out, err = _chat(capsys, image, monkeypatch, "/history\n/quit\n", "-t", "history")
    assert code == 0, err
    assert "you: hi robin: About hi: here is the answer." in " ".join(out.split())
    code, out, err = _chat(capsys, image, monkeypatch, "/undo\n/quit\n", "-t", "undo")
    assert code == 0, err
    assert "nothing before the first request: starting a new thread" in out
    assert "cannot be read" not in out


def test_a_command_on_a_thread_holding_a_refused_input_says_so_and_the_chat_goes_on(
    capsys, image, monkeypatch
) -> None:
    # A thread stored by a version that did not check the input in the start task holds the
    # refused input as the start task's writes, which every read applies again and refuses.
    monkeypatch.setattr(graph_mind, "admit_checked_input", lambda compiled: compiled)
    session = Session(open_runtime(image, models=FakeModels(responder())))
    try:
        for command in ("history", "undo", "good"):
            config = run_config(command)
            session.cycle("hi", config, {"persona": "ROBIN"}, show=False)
            with pytest.raises(GraphRequestError):
                session.graph.invoke({"messages": [{"role": "robot", "content": "beep"}]}, config)
            with pytest.raises(GraphRequestError):
                session.graph.get_state(config)
    finally:
        session.close()
    monkeypatch.undo()
    for command in ("history", "undo", "good"):
        typed = f"/{command}\nhello again\n/history\n/quit\n"
        code, out, err = _chat(capsys, image, monkeypatch, typed, "-t", command, "-p", "robin")
        assert code == 0, err  # was 2: the chat ended at the command
        flat = " ".join(out.split())
        assert f"thread {command} cannot be read: the messages are malformed" in flat
        assert "its next request goes on as usual" in flat
        assert "robin: About hello again: here is the answer." in flat  # and the thread healed


def test_run_answers_a_sample_request_end_to_end(capsys, image) -> None:
    plan = plan_of(
        ("BRICK.facet_steps", "steps for a first week of learning to program"),
        ("BRICK.facet_design", "why learning to program is worth it"),
    )
    models = FakeModels(responder(plan=plan))
    code, out, err = run(capsys, "--image", image, "run", models=models)
    assert code == 0, err
    assert "Plan my first week of learning to program" in out
    assert "✓ facet BRICK.facet_steps" in out and "✓ facet BRICK.facet_design" in out
    assert "COMPLETE cycle" in out


def test_chat_says_at_once_when_a_persona_or_depth_does_not_exist(
    capsys, image, monkeypatch
) -> None:
    lines = "/persona nobody\n/depth bogus\n/persona robin\n/depth fast\nhello there\n/quit\n"
    code, out, err = _chat(capsys, image, monkeypatch, lines, "-t", "set")
    models = FakeModels(responder())
    assert code == 0, err
    flat = " ".join(out.split())
    assert "no persona nobody: /persona robin|brick|babs|alfred|auto" in flat
    assert "no depth bogus: /depth auto|fast|full" in flat
    assert "persona ROBIN" in flat and "depth fast" in flat and "FAILED" not in flat
    code, _, err = run(capsys, "--image", image, "ask", "hi", "--depth", "deep", models=models)
    assert code == 2 and "--depth" in err and "auto, fast, full" in err


def _first_request(image: str, thread_id: str) -> Any:
    """The first message the thread holds, as the thread stored it."""
    session = Session(open_runtime(image, models=FakeModels(responder())))
    try:
        return session.graph.get_state(run_config(thread_id)).values["messages"][0].content
    finally:
        session.close()


def test_ask_keeps_escape_codes_and_controls_out_of_the_thread(capsys, image) -> None:
    models = FakeModels(responder())
    typed = "\x1b[31mhello\x1b[0m there\x07"
    code, _, err = run(capsys, "--image", image, "ask", typed, "-t", "esc", models=models)
    assert code == 0, err
    assert _first_request(image, "esc") == "hello there"


def test_a_request_that_begins_with_a_slash_is_sent_with_two(capsys, image, monkeypatch) -> None:
    typed = "//etc/hosts: what is it for?\n/quit\n"
    code, out, err = _chat(capsys, image, monkeypatch, typed, "-t", "slash")
    assert code == 0 and "unknown command" not in out, err
    assert _first_request(image, "slash") == "/etc/hosts: what is it for?"


def test_chat_cycles_lists_the_failed_threads_too(capsys, image, monkeypatch) -> None:
    models = FakeModels(responder())
    assert run(capsys, "--image", image, "ask", "hi", "-p", "joker", models=models)[0] == 10
    code, out, err = _chat(capsys, image, monkeypatch, "/cycles\n/quit\n", "-t", "c")
    assert code == 0 and "FAILED thread" in out and "unknown persona" in out, err


def test_cycles_lists_the_failed_threads_among_the_most_recent(capsys, image) -> None:
    models = FakeModels(responder())
    ask = ("--image", image, "ask", "hello", "-p")
    assert run(capsys, *ask, "joker", "-t", "zzz-old", models=models)[0] == 10
    for thread in ("zoo-1", "zoo-2", "zoo-3"):
        assert run(capsys, *ask, "robin", "-t", thread, models=models)[0] == 0
    assert run(capsys, *ask, "joker", "-t", "kitchen", models=models)[0] == 10

    def failed(limit: int) -> list[str]:
        code, out, err = run(capsys, "--image", image, "cycles", "-n", str(limit), "--json")
        assert code == 0, err
        return [row["thread_id"] for row in json.loads(out)["failed"]]

    # the newest FAILED thread, though its id sorts first; not the one whose id sorts last,
    # which is older than the 3 latest threads
    assert failed(3) == ["kitchen"]
    assert failed(5) == ["kitchen", "zzz-old"]  # newest first


def test_cycles_skips_a_failure_a_client_wrote_malformed(capsys, caplog, image) -> None:
    edited = {
        "text": "model exploded",
        "no-reason": {"node": "gate"},
        "list": ["a", "b"],
        "keys": {"reason": "it broke", "thread_id": "elsewhere", "cycle": "not-this"},
    }
    session = Session(open_runtime(image, models=FakeModels(responder())))
    try:
        for thread_id, failure in edited.items():
            session.cycle("hi", run_config(thread_id), {"persona": "ROBIN"}, show=False)
            # what Studio's state editor or a client's threads.update_state can send
            update = {"status": "FAILED", "failure": failure}
            session.graph.update_state(run_config(thread_id), update)
    finally:
        session.close()
    caplog.set_level(logging.WARNING, logger="batos.records")
    code, out, err = run(capsys, "--image", image, "cycles", "--json")
    assert code == 0, err
    [kept] = json.loads(out)["failed"]
    assert kept["thread_id"] == "keys" and kept["reason"] == "it broke"
    assert kept["cycle"] != "not-this"  # the thread's own cycle
    for thread_id in ("text", "no-reason", "list"):
        assert f"failure of thread '{thread_id}' is malformed and was skipped" in caplog.text
    code, out, err = run(capsys, "--image", image, "cycles")
    assert code == 0 and "Traceback" not in err, err
    assert "FAILED thread keys" in " ".join(out.split()) and "elsewhere" not in out


class _Terminal(io.StringIO):
    """Typed lines on a stdin that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_run_says_a_failed_first_answer_before_the_chat_opens(capsys, image, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", _Terminal("/thread\n/quit\n"))
    models = FakeModels(responder())
    code, out, err = run(capsys, "--image", image, "run", "-r", "   ", models=models)
    # reported, and the chat then ran to its end: before, the error waited for the chat to
    # end and then became the exit code
    assert code == 0 and "the request is empty" in err and "thread run-" in out, err


def test_run_and_chat_with_stdin_closed_end_cleanly(capsys, image, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", None)
    models = FakeModels(responder())
    code, _, err = run(capsys, "--image", image, "run", "-r", "   ", models=models)
    assert code == 10 and "the request is empty" in err and "Traceback" not in err
    code, _, err = run(capsys, "--image", image, "chat", "-t", "closed")
    assert code == 0 and "Traceback" not in err


def test_a_line_that_is_not_utf8_is_sent_nowhere(capsys, monkeypatch) -> None:
    from batos.shell.cli.repl import LineReader

    typed = "caf\udce9 ok"  # what input() makes of the bytes caf\xe9 ok
    monkeypatch.setattr("builtins.input", lambda prompt="": typed)
    assert LineReader(interactive=False).read() == ""
    assert "not UTF-8 text; type it again" in capsys.readouterr().err


def test_serve_refuses_other_than_loopback(capsys, image) -> None:
    code, _, err = run(capsys, "--image", image, "serve", "--host", "0.0.0.0")
    assert code == 1 and "loopback only" in err


def test_serve_refuses_a_missing_image_and_a_busy_port_before_it_starts(
    capsys, tmp_path, monkeypatch
) -> None:
    import socket

    config = Path(__file__).resolve().parent.parent / "langgraph.json"
    typo = tmp_path / "typo" / "liv_image.fs"
    argv = ["--image", typo.as_uri(), "serve", "--config", str(config)]
    code, _, err = run(capsys, *argv, "--port", "2999")
    assert code == 3 and "no image at" in err and "init" in err
    assert not (tmp_path / "typo").exists()  # a mistyped path never becomes an empty image
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code, _, err = run(capsys, *argv, "--port", str(port))
    assert code == 1 and f"127.0.0.1:{port} cannot be served" in err and "--port" in err
    code, _, err = run(capsys, *argv, "--port", "99999")
    assert code == 2 and "65535" in err


class Paced:
    """A model factory behind the persona seam: ``respond`` answers each call, and the calls
    ``slow`` picks stream a long reply instead; ``started`` is set when the first of those
    begins, ``calls`` keeps every call."""

    def __init__(
        self, respond: Callable[[ModelCall], Any], slow: Callable[[ModelCall], bool]
    ) -> None:
        self.respond, self.slow = respond, slow
        self.started = threading.Event()
        self.calls: list[ModelCall] = []

    def __call__(self, persona: str, **options: Any) -> PacedPersonaModel:
        def reply(messages: list[BaseMessage]) -> str:
            call = ModelCall(persona, dict(options), messages)
            self.calls.append(call)
            if self.slow(call):
                self.started.set()
                return "About it: " + " ".join(f"step{i}" for i in range(SLOW_WORDS))
            return str(self.respond(call))

        return PacedPersonaModel(reply=reply, pace=PACE)


def interrupt_when(started: threading.Event) -> None:
    """Ctrl-C (SIGINT to this process) as soon as ``started`` is set."""

    def send() -> None:
        if started.wait(60):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=send, daemon=True).start()


def test_ctrl_c_stops_the_answer_commits_nothing_and_marks_the_request(capsys, image) -> None:
    models = Paced(responder(), slow=lambda call: "slowly" in call.text)
    ask = ("--image", image, "ask", "-p", "robin", "-t", "t1")
    assert run(capsys, *ask, "hello there", models=models)[0] == 0
    with LivingImage.open(image) as living:
        before = image_digest(living.db, exclude=("checkpoints",))

    handler = signal.getsignal(signal.SIGINT)  # ignored when the test run is in the background
    interrupt_when(models.started)
    started = time.monotonic()
    code, out, err = run(capsys, *ask, "tell me slowly", models=models)
    assert time.monotonic() - started < STOP_BOUND_S  # not the minute the answer would take
    assert code == 130, err
    assert "interrupted: nothing was committed" in err and "marked interrupted" in err
    assert signal.getsignal(signal.SIGINT) is handler  # Ctrl-C as before the command

    session = Session(open_runtime(image, models=models))
    try:
        assert image_digest(session.image.db, exclude=("checkpoints",)) == before
        snapshot = session.graph.get_state(run_config("t1"))
    finally:
        session.close()
    assert snapshot.next == () and snapshot.values["status"] == "FAILED"
    request, mark = snapshot.values["messages"][-2:]
    assert request.content == "tell me slowly"
    assert mark.additional_kwargs["batos_interrupted"] and mark.additional_kwargs["batos_failed"]
    assert mark.content.endswith("(interrupted)") and mark.name == "robin"
    code, out, _ = run(capsys, "--image", image, "cycles", "--json")
    failed = json.loads(out)["failed"]
    assert [(f["thread_id"], f["reason"]) for f in failed] == [("t1", "interrupted by the user")]

    # the thread answers its next request, and the model is not shown the stopped answer
    assert run(capsys, *ask, "and now", models=models)[0] == 0
    shown = [str(m.content) for m in models.calls[-1].messages]
    assert "About hello there: here is the answer." in shown
    assert not any("(interrupted)" in text or "step0" in text for text in shown)


def test_ctrl_c_during_parallel_facets_stops_every_branch(capsys, file_uri, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_MIND_WRITE_FACETS", "inline")  # both branches write their facet
    plan = plan_of(
        ("BRICK.facet_steps", "which steps build a shed"),
        ("BRICK.facet_design", "what design of shed"),
    )
    models = Paced(responder(plan=plan), slow=lambda call: call_kind(call) == "draft")
    assert run(capsys, "--image", file_uri, "init")[0] == 0
    session = Session(open_runtime(file_uri, models=models))
    try:
        # a first cycle brings the image's layout up to date, which is no part of the test
        session.cycle("hello there", run_config("hi"), {"persona": "BRICK"}, show=False)
        before = image_digest(session.image.db, exclude=("checkpoints",))
        interrupt_when(models.started)
        started = time.monotonic()
        with pytest.raises(CycleInterrupted, match="marked interrupted"):
            session.cycle(
                "plan the steps to build a shed",
                run_config("shed"),
                {"persona": "BRICK", "depth": "full"},
                show=False,
            )
        assert time.monotonic() - started < STOP_BOUND_S
        snapshot = session.graph.get_state(run_config("shed"))
        # the facet methods the cycle wrote are not installed: the image is as it was
        assert image_digest(session.image.db, exclude=("checkpoints",)) == before
    finally:
        session.close()
    assert snapshot.next == () and snapshot.values["failure"]["node"] == "facet"
    mark = snapshot.values["messages"][-1]
    assert mark.content == "(interrupted)" and mark.additional_kwargs["batos_interrupted"]


def test_a_stop_before_the_request_reached_the_thread_drops_it() -> None:
    session = Session(open_runtime("memory://", models=FakeModels(responder())))
    config = run_config("early")
    try:
        assert session.cycle("hello there", config, {"persona": "ROBIN"}, show=False)
        # a run stopped right after it stored its input, before the first step took it in
        session.graph.update_state(config, {"messages": [HumanMessage("again")]}, "__input__")
        stopped = session.graph.get_state(config)
        assert stopped.next == ("__start__",)
        assert session.mark_interrupted(stopped, "") is False
        snapshot = session.graph.get_state(config)
        assert snapshot.next == ()
        assert [m.content for m in snapshot.values["messages"]] == [
            "hello there",
            "About hello there: here is the answer.",
        ]
        assert session.mark_interrupted(snapshot, "") is None  # an idle thread: nothing to mark
        assert session.mark_interrupted(None, "") is False  # a run that stored nothing
    finally:
        session.close()


def test_an_answer_the_gate_replaces_with_its_computed_result_is_shown(capsys) -> None:
    from test_mind import program

    source = "    before = 16975\n    after = 18412\n    return after - before\n"
    models = FakeModels(
        lambda call: (
            program(source)(call)
            if call_kind(call) == "program"
            else responder(answer="The computed result is 1027.")(call)
        )
    )
    session = Session(open_runtime("memory://", models=models))
    try:
        question = "A ferry carried 18412 passengers this year and 16975 last year. How many more?"
        state = session.cycle(question, run_config("sums"), {"persona": "BABS"}, show=True)
    finally:
        session.close()
    out = capsys.readouterr().out
    assert state["response"].startswith("1437")  # twice wrong: the result and its program
    assert "kept as: 1437" in out  # the user sees what was kept, not only what streamed


def test_what_the_kept_answer_changed_from_the_streamed_one_is_shown(capsys) -> None:
    from batos.shell.cli.mind import _show_kept

    cited = "The fee is £40 [1].\n\nSources: [1] coop.md (0–751)"
    _show_kept({"response": cited}, "The fee is £40 [3].")  # a citation corrected
    out = capsys.readouterr().out
    assert "kept as: The fee is £40 [1]." in out and "Sources: [1] coop.md" in out
    _show_kept({"response": cited}, "The fee is £40 [1].")  # only the sources line is new
    out = capsys.readouterr().out
    assert "kept as" not in out and "Sources: [1] coop.md" in out
    cut = {"response": "One. Two.", "cycle": {"truncated": True}}
    _show_kept(cut, "One. Two. Thre")  # cut at a sentence: the stream already showed it
    out = capsys.readouterr().out
    assert "cut at its last full sentence" in out and "kept as" not in out
