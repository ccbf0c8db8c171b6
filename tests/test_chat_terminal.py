"""``batos chat`` as a person at a terminal uses it: a real process on a pseudo-terminal, keys
sent as the terminal sends them (arrows, Ctrl-A/E, Tab, a bracketed paste, Ctrl-C, Ctrl-D), a
paced scripted model behind the persona seam, so no real model is needed."""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import termios
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from batos.shell.cli import main
from batos.shell.cli.repl import clean_line
from batos.shell.runtime import open_image
from graph.mind import build_graph, run_config
from store.checkpoint.saver import ZODBSaver

REPO = Path(__file__).resolve().parents[1]
#: The chat's prompt as readline draws it (bold).
PROMPT = b"you>\x1b[0m "
#: Words of the slow answer and the seconds before each: minutes in all, unless stopped.
SLOW_WORDS, PACE = 2000, 0.05
#: How long a stop may take before the prompt is back: a few tokens and one checkpoint.
STOP_BOUND_S = 10.0


def runner(model: str, slow_words: int = SLOW_WORDS) -> str:
    """A script running ``batos`` with ``fakes.<model>`` (paced) answering every persona:
    requests with 'slowly' in them get ``slow_words`` words."""
    return f"""
import sys
from fakes import {model}
from batos.shell.cli import main


def reply(messages):
    request = str(messages[-1].content)
    if "slowly" in request:
        return f"About {{request}}: " + " ".join(f"step{{i}}" for i in range({slow_words}))
    return f"About {{request}}: here is the answer."


sys.exit(main(sys.argv[1:], models=lambda persona, **options: {model}(reply=reply, pace={PACE})))
"""


class Terminal:
    """A process on a pseudo-terminal of 200 columns: its output is read with ``expect``, keys
    are written as the bytes a terminal sends."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: nothing but exec between fork and exec, and
            # Ctrl-C as a terminal user's shell gives it: a test run started in the background
            # (nohup, `&` without job control) ignores SIGINT, and exec keeps an ignored signal.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(argv[0], argv, env)
        termios.tcsetwinsize(self.fd, (50, 200))
        self.output = b""
        self.status: int | None = None

    def send(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def expect(self, pattern: bytes, timeout: float = 60.0) -> bytes:
        """Everything printed up to and including the next ``pattern``."""
        deadline = time.monotonic() + timeout
        while pattern not in self.output:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError(
                    f"no {pattern!r} in {timeout}s; the end: {self.output[-1500:]!r}"
                )
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal: it exited
                data = b""
            if not data:
                raise AssertionError(f"exited before {pattern!r}: {self.output[-1500:]!r}")
            self.output += data
        end = self.output.index(pattern) + len(pattern)
        seen, self.output = self.output[:end], self.output[end:]
        return seen

    def wait(self, timeout: float = 60.0) -> int:
        """The exit code, once the child has exited (its remaining output is read)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.fd], [], [], 0.2)[0]:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                self.output += data
                if data:
                    continue
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
                return os.waitstatus_to_exitcode(status)
        raise AssertionError(f"still running after {timeout}s: {self.output[-1500:]!r}")

    def close(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


@pytest.fixture
def image(tmp_path: Path) -> str:
    uri = f"file://{tmp_path / 'live_image.fs'}"
    assert main(["--image", uri, "init"]) == 0
    return uri


@pytest.fixture
def chat(image: str) -> Iterator[list[Terminal]]:
    """Starts ``batos chat`` processes on ``image`` (call it with the chat's options)."""
    started: list[Terminal] = []

    def start(*options: str, script: str = runner("PacedPersonaModel")) -> Terminal:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)]),
            "TERM": "xterm",  # readline turns bracketed paste off on a dumb terminal
        }
        argv = [sys.executable, "-c", script, "--image", image, "chat", *options]
        started.append(Terminal(argv, env))
        return started[-1]

    yield start  # type: ignore[misc]
    for terminal in started:
        terminal.close()


def thread_and_commits(uri: str, thread_id: str) -> tuple[tuple, dict, list[str]]:
    """The thread's pending nodes and state, and the requests of every committed cycle."""
    from graph import cycle

    with open_image(uri) as living, ZODBSaver(living) as saver:
        snapshot = build_graph(checkpointer=saver).get_state(run_config(thread_id))
        with living.read() as root:
            committed = [row["request"] for row in cycle.recent(root, 50)]
    return snapshot.next, snapshot.values, committed


def test_the_chat_edits_recalls_stops_and_quits_like_a_terminal_program(
    chat, image: str, batos_home: Path
) -> None:
    term = chat("-t", "pty", "-p", "robin")
    term.expect(PROMPT)
    term.send(b"hello there\r")
    assert b"About hello there: here is the answer." in term.expect(PROMPT)
    # up-arrow recalls the line; Ctrl-A and Ctrl-E edit it at either end
    term.send(b"\x1b[A\x01oh \x05 again\r")
    assert b"About oh hello there again:" in term.expect(PROMPT)
    # a key sent raw (Ctrl-V inserts what follows as it is: here F5's escape sequence)
    term.send(b"good\x16\x1b[15~ morning\r")
    assert b"About good morning:" in term.expect(PROMPT)
    # a paste of coloured, two-line text arrives as one line of its words
    term.send(b"\x1b[200~pasted \x1b[31mred\x1b[0m\ntext\x1b[201~\r")
    assert b"About pasted red text:" in term.expect(PROMPT)
    term.send(b"/hi\t\r")  # Tab completes /history
    assert b"About pasted red text: here is the answer." in term.expect(PROMPT)

    term.send(b"tell me slowly\r")
    term.expect(b"step3")
    stopped = time.monotonic()
    term.send(b"\x03")
    shown = term.expect(PROMPT, timeout=STOP_BOUND_S)
    assert time.monotonic() - stopped < STOP_BOUND_S
    assert b"interrupted: nothing was committed" in shown
    assert b"step1999" not in shown

    term.send(b"half a line\x03")  # Ctrl-C at the prompt drops the line
    term.expect(PROMPT)
    term.send(b"third request\r")
    assert b"About third request: here is the answer." in term.expect(PROMPT)
    term.send(b"\x04")
    assert term.wait() == 0
    assert b"bye" in term.output

    pending, values, committed = thread_and_commits(image, "pty")
    assert pending == ()  # the thread is idle
    pairs = [(m.type, str(m.content)) for m in values["messages"]]
    assert [text for kind, text in pairs if kind == "human"] == [
        "hello there",
        "oh hello there again",
        "good morning",
        "pasted red text",
        "tell me slowly",
        "third request",
    ]
    assert all(kind == "ai" for kind, _ in pairs[1::2])  # every request has its answer
    mark = values["messages"][9]
    assert mark.additional_kwargs["batos_interrupted"] is True
    assert mark.additional_kwargs["batos_failed"] is True
    assert mark.content.startswith("About tell me slowly: step0 step1 step2 step3")
    assert mark.content.endswith("(interrupted)")
    assert values["messages"][-1].content == "About third request: here is the answer."
    for _, text in pairs:
        assert not [c for c in text if unicodedata.category(c) == "Cc"], repr(text)
    # the stopped cycle committed nothing: four committed cycles, not five
    assert sorted(committed) == sorted(
        ["hello there", "oh hello there again", "good morning", "pasted red text", "third request"]
    )

    history = (batos_home / "chat_history").read_bytes()
    assert b"\x1b" not in history and b"half a line" not in history
    assert history.splitlines()[-2:] == [b"tell me slowly", b"third request"]


def test_work_that_cannot_be_stopped_is_given_up_on_after_two_more_ctrl_c(chat, image: str) -> None:
    # PacedChatModel is not behind the persona seam: nothing checks its caller's cancel event
    term = chat("-t", "stuck", "-p", "robin", script=runner("PacedChatModel", slow_words=80))
    term.expect(PROMPT)
    term.send(b"tell me slowly\r")
    term.expect(b"step3")
    for _ in range(3):
        term.send(b"\x03")
        time.sleep(0.5)  # signals sent closer together may reach the process as one
    assert b"interrupted: nothing was committed" in term.expect(PROMPT, timeout=STOP_BOUND_S)
    term.send(b"\x04")
    assert term.wait() == 0  # once the abandoned call has finished in the background
    pending, values, committed = thread_and_commits(image, "stuck")
    assert pending == () and committed == []
    assert values["messages"][-1].additional_kwargs["batos_interrupted"] is True


def test_the_history_outlives_the_chat_and_stays_bounded(
    chat, image: str, batos_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_CHAT_HISTORY", "3")
    term = chat("-t", "kept")
    term.expect(PROMPT)
    for line in (b"/help", b"/thread", b"/persona robin", b"/depth fast"):
        term.send(line + b"\r")
        term.expect(PROMPT)
    term.send(b"\x04")
    assert term.wait() == 0
    assert (batos_home / "chat_history").read_bytes().splitlines() == [
        b"/thread",
        b"/persona robin",
        b"/depth fast",
    ]

    term = chat("-t", "kept")
    term.expect(PROMPT)
    term.send(b"\x1b[A\r")
    assert b"depth fast" in term.expect(PROMPT)
    term.send(b"\x1b[A" * 6 + b"\r")  # past the oldest line kept: it stays there
    assert b"thread kept" in term.expect(PROMPT)
    term.send(b"\x04")
    assert term.wait() == 0


@pytest.mark.parametrize(
    ("typed", "kept"),
    [
        ("hello there", "hello there"),
        ("  spaced  ", "spaced"),
        ("he\x1b[Allo", "hello"),  # an arrow key's sequence left in the line
        ("he\x1bOAllo", "hello"),  # the same key in application mode (SS3)
        ("\x1b[200~pasted\x1b[201~", "pasted"),  # bracketed-paste markers
        ("\x1b[1;31mred\x1b[0m text", "red text"),  # colours from a pasted log
        ("a\x1b]0;title\x07b", "ab"),  # a window title (OSC, BEL-terminated)
        ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # a hyperlink (OSC, ST)
        ("lone\x1b", "lone"),  # a stray ESC from an unbound key
        ("alt\x1bx", "alt"),  # ESC with one character: an unbound Alt key
        ("nul\x00 and bell\x07 and del\x7f", "nul and bell and del"),
        ("tab\there", "tab here"),
        ("two\nlines\r\n", "two lines"),
        ("c1 \x9b31m csi", "c1  csi"),  # the 8-bit CSI
        ("bad byte \udcff", "bad byte"),  # what an undecodable byte becomes
        ("ünïcödé ✓ 汉字 👩‍💻", "ünïcödé ✓ 汉字 👩‍💻"),  # typed text stays, joiners included
        ("pay \u202etxt.exe\u202c now", "pay txt.exe now"),  # a right-to-left override
        ("a \u2066b\u2069 c", "a b c"),  # an isolate
        ("שלום \u200fעולם", "שלום \u200fעולם"),  # right-to-left text keeps its marks
    ],
)
def test_clean_line_keeps_only_the_typed_text(typed: str, kept: str) -> None:
    assert clean_line(typed) == kept
