"""What makes ``batos chat`` a terminal REPL: line editing and history, clean lines, Ctrl-C.

``LineReader`` reads a line with GNU readline when stdin and stdout are a terminal (arrows,
Ctrl-A/E, history kept from one chat to the next in a bounded file under BATOS_HOME, Tab
completing the slash-commands), plainly otherwise. ``clean_line`` keeps only the typed text: a
pasted colour code or a key readline left unbound must never reach a thread.
``StopOnInterrupt`` turns the first Ctrl-C during a cycle into a stop of its model calls
(``batos.models.cancel``).
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from batos import settings
from batos.models.cancel import cancellable

log = logging.getLogger("batos.cli.chat")

#: The history file's name in the ``home`` folder.
HISTORY_FILE = "chat_history"
#: Escape sequences a terminal or a paste can put in a line: CSI (arrows, colours, bracketed
#: paste) in its 7- and 8-bit forms, the string sequences (OSC: titles and links, DCS, SOS, PM,
#: APC) up to their terminator or the end, and two-character ones (SS3 keys, ESC + one char).
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|$)"
    r"|\x1b[NO].?"
    r"|\x1b[ -~]?",
    re.DOTALL,
)
#: Layout characters become spaces; bidirectional embeddings, overrides and isolates go: they
#: reorder the text around them when shown, so a request would read otherwise than it is
#: (joiners and marks stay: emoji and right-to-left text need them).
_SPACES = str.maketrans(
    {
        **{c: " " for c in "\t\n\r\v\f"},
        **{chr(c): None for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))},
    }
)


def clean_line(text: str) -> str:
    """``text`` with escape sequences, control characters and bidirectional overrides removed
    (tabs and line breaks become spaces; unpaired surrogates, what undecodable bytes become,
    go too), stripped."""
    text = _ESCAPES.sub("", text).translate(_SPACES)
    return "".join(c for c in text if unicodedata.category(c) not in ("Cc", "Cs")).strip()


def history_path() -> Path:
    return Path(settings.get_str("home")) / HISTORY_FILE


class LineReader:
    """Reads the chat's lines: with readline's editing and history on a terminal, else plainly.

    ``read`` returns the cleaned line, None at end of input (Ctrl-D), and lets
    ``KeyboardInterrupt`` (Ctrl-C at the prompt) through for the caller to clear the line.
    """

    def __init__(self, commands: Sequence[str] = (), *, interactive: bool | None = None) -> None:
        if interactive is None:
            interactive = bool(sys.stdin and sys.stdin.isatty() and sys.stdout.isatty())
        self.commands = tuple(commands)
        self.readline: Any = None
        self.path = history_path()
        if interactive:
            try:
                import readline
            except ImportError:  # a Python built without it: plain lines, as when piped
                return
            self.readline = readline
            self._set_up()

    def _set_up(self) -> None:
        rl = self.readline
        rl.set_auto_history(False)  # the cleaned line goes into the history, not the raw one
        rl.set_history_length(settings.get_int("chat_history"))
        rl.set_completer(self._complete)
        rl.set_completer_delims(" ")
        rl.parse_and_bind("tab: complete")
        try:
            rl.read_history_file(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot read the chat history %s: %s", self.path, exc.strerror)

    def _complete(self, text: str, state: int) -> str | None:
        if not text.startswith("/"):
            return None
        found = [f"/{c} " for c in self.commands if f"/{c}".startswith(text)]
        return found[state] if state < len(found) else None

    def read(self, prompt: str = "you> ") -> str | None:
        """The next line, cleaned (``""`` for a line with nothing typed); None at end of input."""
        if self.readline is not None:
            # \x01 and \x02 tell readline the bold codes take no room on screen.
            prompt = f"\x01\x1b[1m\x02{prompt.rstrip()}\x01\x1b[0m\x02 "
        if sys.stdin is None:  # started with stdin closed: nothing will ever be read
            return None
        try:
            raw = input(prompt)
        except EOFError:
            return None
        except UnicodeDecodeError:
            raw = "\udcff"  # the same as bytes decoded with surrogateescape, below
        if any("\ud800" <= c <= "\udfff" for c in raw):
            # the terminal sent bytes that are not UTF-8 (read as lone surrogates, which
            # clean_line would drop and send the rest): nothing of it is sent anywhere
            print("that line was not UTF-8 text; type it again", file=sys.stderr)
            return ""
        line = clean_line(raw)
        if line and self.readline is not None:
            self.readline.add_history(line)
            self._save()
        return line

    def _save(self) -> None:
        """Write the history now (bounded by the ``chat_history`` setting), so a chat that is
        killed keeps it; the file is private to its owner, as a shell's is."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch(mode=0o600, exist_ok=True)
            self.readline.write_history_file(self.path)
        except OSError as exc:
            log.warning("cannot write the chat history %s: %s", self.path, exc.strerror)


class StopOnInterrupt:
    """While entered, Ctrl-C sets ``event`` instead of raising: the model calls made in this
    context stop at their next token (``cancellable``). For work that is no model call, a
    second Ctrl-C raises ``KeyboardInterrupt`` as usual (unless ``hold()`` is on); LangGraph
    still waits for the nodes running then, and a third leaves them to finish in the
    background, their results dropped.

    Outside the main thread (where signals cannot be handled) it only sets up the event.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self._forcible = True
        self._previous: Any = None
        self._scope = cancellable(self.event)

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self.event.is_set() and self._forcible:
            raise KeyboardInterrupt
        self.event.set()

    def hold(self) -> None:
        """From now on, Ctrl-C only sets the event: what follows must not be cut short."""
        self._forcible = False

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def __enter__(self) -> StopOnInterrupt:
        self._scope.__enter__()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        self._scope.__exit__(kind, exc, traceback)
