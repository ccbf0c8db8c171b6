"""What the ``batos`` command prints, made safe: text from the image, a model or the user is
shown, never obeyed.

Slot values, method sources, model answers and file names reach the terminal through rich,
which reads ``[...]`` as markup (``[/x]`` alone raises ``MarkupError``) and passes escape bytes
on to the terminal (``ESC [ 2 A`` moves the cursor up and can hide the lines above it from a
reviewer). ``TerminalConsole`` shows control characters as escapes (``\\x1b``) in every string
it renders, tables and titles included, and leaves emoji codes (``:fire:``) as written;
``shown`` also escapes markup, for text put into a line that carries markup of its own;
``json_text`` writes JSON that neither holds a control character a terminal obeys nor fails on
an integer too long to write.
"""

from __future__ import annotations

import json
import sys
import textwrap
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from batos.errors import BatosError
from prototypes.bounded import bounded_repr

#: Characters a terminal acts on rather than shows: C0 controls but tab and newline, DEL, the
#: C1 controls (U+009B is CSI on some terminals) and the bidirectional overrides that reorder
#: what a line seems to say.
_CONTROLS = [
    *(c for c in range(0x20) if c not in (0x09, 0x0A)),
    0x7F,
    *range(0x80, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_VISIBLE = {c: (f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}") for c in _CONTROLS}
#: In JSON the same characters become ``\\uXXXX`` escapes: the same string once parsed.
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _CONTROLS}


def visible(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\u202e``);
    tabs and newlines are kept for layout."""
    return text.translate(_VISIBLE)


def one_line(value: Any) -> str:
    """``value`` as text for a field that must stay on its line (an id in a listing of one
    line each): controls visible, newlines and tabs too (``\\n``, ``\\t``); markup is not
    escaped, so print it with ``markup=False``, or pass it through ``shown``."""
    text = visible(value if isinstance(value, str) else str(value))
    return text.replace("\n", "\\n").replace("\t", "\\t")


def shown(value: Any) -> str:
    """``value`` as text for a line with markup of its own: markup escaped, controls visible."""
    return escape(visible(value if isinstance(value, str) else str(value)))


def plain(value: Any) -> Text:
    """``value`` as a rich ``Text``: printed as it reads, controls visible, no markup."""
    return Text(visible(value if isinstance(value, str) else str(value)))


def json_text(value: Any, what: str, *, indent: int | None = None) -> str:
    """``value`` as JSON text, controls escaped; ``BatosError`` naming ``what`` when it holds an
    integer longer than Python writes (``sys.get_int_max_str_digits``), rather than a
    traceback. Values JSON has no type for are written as their bounded repr."""
    options: dict[str, Any] = {
        "indent": indent,
        "default": lambda v: bounded_repr(v, 1_000),
        "allow_nan": False,  # Python would write NaN and Infinity, which no JSON reader takes
    }
    try:
        text = json.dumps(value, ensure_ascii=False, **options)
    except ValueError as exc:
        if "not JSON compliant" in str(exc):
            raise BatosError(
                f"{what} holds NaN or an infinity, which JSON has no way to write",
                hint="leave out --json to see the value as Python shows it",
            ) from None
        if "integer string conversion" not in str(exc):
            raise
        raise BatosError(
            f"{what} holds an integer of more than {sys.get_int_max_str_digits():,} digits, "
            "too long to write as JSON",
            hint="leave out --json: the integer is then shown by its size in bits",
        ) from None
    if any("\ud800" <= c <= "\udfff" for c in text):
        # A file name's undecodable bytes: written raw they would make the output invalid
        # UTF-8; as \\udcXX escapes (all non-ASCII escaped) it stays JSON any reader takes.
        text = json.dumps(value, ensure_ascii=True, **options)
    return text.translate(_JSON_ESCAPES)


class TerminalConsole(Console):
    """A rich ``Console`` that shows the control characters of every string it renders as
    escapes; markup in strings is still read, so text from outside goes through ``shown``.

    Emoji codes are never replaced: rich reads ``:fire:`` as 🔥 even where markup is off, and
    a thread id, a file name or a slot value holding one must be shown as it is stored (an id
    shown otherwise cannot be copied back, and JSON would no longer say what is stored)."""

    def __init__(self, *args: Any, **options: Any) -> None:
        options.setdefault("emoji", False)
        super().__init__(*args, **options)

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(visible(text), **options)

    def paragraph(self, text: str, indent: int = 2, style: str | None = None) -> None:
        """``text`` as prose wrapped at words to the console's width under ``indent`` spaces,
        in ``style`` when given: no line padded with trailing spaces, controls visible, markup
        not read."""
        width = max(20, self.width - indent)
        for line in textwrap.wrap(visible(text), width, break_on_hyphens=False) or [""]:
            self.print(
                " " * indent + line, markup=False, highlight=False, soft_wrap=True, style=style
            )

    def print_value_json(self, value: Any, what: str) -> None:
        """``value`` as indented, highlighted JSON (``json_text``'s checks), non-ASCII escaped
        so no character a terminal acts on is printed raw."""
        self.print_json(json_text(value, what), ensure_ascii=True)
