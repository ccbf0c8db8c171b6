"""Showing a value without trusting its size: reprs and plain copies bounded by nodes visited.

A value that a method built can share structure: ``a = [a] * 200`` four times is a 1 KB object
graph with 3×10¹¹ leaves, and ``repr`` or a recursive copy would expand every one of them.
Everything here stops after a fixed number of nodes (and characters), whatever the value's
shape: a repr is cut with "…", a plain copy past its budget raises ``ValueTooLarge``.
"""

from __future__ import annotations

import datetime
import json
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from persistent.list import PersistentList

#: Nodes a repr visits before it stops, whatever its character limit.
REPR_NODES = 2_000
#: Nodes a plain copy may hold (the sandbox's report limit: anything larger never got in).
PLAIN_NODES = 1_000_000
#: Nesting a repr or plain copy follows; deeper levels are shown as "…" or refused.
MAX_DEPTH = 100

_SCALARS = (type(None), bool, int, float, complex, datetime.date, datetime.timedelta)


class ValueTooLarge(ValueError):
    """A value has more nodes (or levels) than the caller allowed."""


#: Digits of the longest integer ``strict_json`` reads by default.
MAX_JSON_INT_DIGITS = 100


class NotStrictJSON(ValueError):
    """Text that Python's ``json`` reads but JSON does not allow, or past a size asked for."""


def strict_json(
    text: str,
    *,
    max_int_digits: int | None = MAX_JSON_INT_DIGITS,
    parse_int: Callable[[str], Any] | None = None,
    strict: bool = True,
) -> Any:
    """``json.loads`` held to JSON: every reader of text from outside (a request, an argument,
    a service's answer, a model's reply) goes through it.

    Python's reader takes ``NaN`` and ``Infinity``, which JSON has no words for, and turns
    ``1e400`` into infinity; a value that is not a number then reaches code that compares or
    stores it. Both are refused with a ``NotStrictJSON`` (a ``ValueError``) that names the
    literal, as is an integer of more than ``max_int_digits`` digits (None: Python's own limit,
    whose message names an interpreter setting instead of the input). ``parse_int`` replaces
    the digit bound with the caller's own check; ``strict=False`` lets control characters
    into strings, as ``json.loads`` does (a model's reply may break a line inside a string).
    Nesting too deep still raises ``RecursionError``, as ``json.loads`` does."""

    def bounded(literal: str) -> int:
        if max_int_digits is not None and len(literal.lstrip("-")) > max_int_digits:
            raise NotStrictJSON(f"an integer of over {max_int_digits} digits")
        return int(literal)

    def finite(literal: str) -> float:
        number = float(literal)
        if not math.isfinite(number):
            raise NotStrictJSON(f"{literal[:40]} is beyond the largest number a float holds")
        return number

    def refused(name: str) -> Any:
        raise NotStrictJSON(f"{name} is not a JSON value")

    return json.loads(
        text,
        parse_int=parse_int or bounded,
        parse_float=finite,
        parse_constant=refused,
        strict=strict,
    )


class _Full(Exception):
    pass


def bounded_repr(value: Any, limit: int = 120, *, nodes: int = REPR_NODES) -> str:
    """``repr(value)`` cut to ``limit`` characters, visiting at most ``nodes`` values.

    Containers (lists, tuples, dicts, sets, persistent containers, deques) are walked here, so
    shared or cyclic structure costs no more than its first ``nodes`` values; other objects
    use their own repr, cut to the limit.
    """
    writer = _ReprWriter(limit + 1, nodes)
    try:
        writer.write(value, 0, set())
    except _Full:
        pass
    text = "".join(writer.parts)
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


class _ReprWriter:
    def __init__(self, chars: int, nodes: int) -> None:
        self.parts: list[str] = []
        self.chars = chars
        self.nodes = nodes

    def emit(self, text: str) -> None:
        self.parts.append(text)
        self.chars -= len(text)
        if self.chars <= 0:
            raise _Full

    def write(self, value: Any, depth: int, path: set[int]) -> None:
        self.nodes -= 1
        if self.nodes < 0:
            self.emit("…")
            raise _Full
        if isinstance(value, (str, bytes, bytearray)):
            # Cut before repr: a 100 MB string would be copied whole by repr.
            cut = value[: self.chars + 2]
            text = repr(cut)
            self.emit(text if len(cut) == len(value) else text + "…")
            return
        if isinstance(value, int) and not isinstance(value, bool):
            self.emit(_int_repr(value))
            return
        if isinstance(value, _SCALARS):
            self.emit(_own_repr(value, self.chars))
            return
        shape = _shape(value)
        if shape is None:
            self.emit(_own_repr(value, self.chars))
            return
        opening, closing, items, is_mapping = shape
        if id(value) in path or depth >= MAX_DEPTH:
            self.emit(opening + "…" + closing)
            return
        path.add(id(value))
        self.emit(opening)
        for index, item in enumerate(items):
            if index:
                self.emit(", ")
            if is_mapping:
                key, item = item
                self.write(key, depth + 1, path)
                self.emit(": ")
            self.write(item, depth + 1, path)
        if isinstance(value, tuple) and len(value) == 1:
            self.emit(",")
        self.emit(closing)
        path.discard(id(value))


def _shape(value: Any) -> tuple[str, str, Any, bool] | None:
    """(opening, closing, items, is_mapping) for the containers walked here, else None."""
    if isinstance(value, list):
        return "[", "]", value, False
    if isinstance(value, tuple):
        return "(", ")", value, False
    if isinstance(value, (set, frozenset)):
        if not value:
            return f"{type(value).__name__}(", ")", (), False
        name = type(value).__name__
        return ("{", "}", value, False) if name == "set" else (f"{name}({{", "})", value, False)
    if isinstance(value, Mapping):
        name = type(value).__name__
        opening = "{" if type(value) is dict else f"{name}({{"
        closing = "}" if type(value) is dict else "})"
        return opening, closing, value.items(), True
    if isinstance(value, PersistentList):
        return "PersistentList([", "])", value, False
    if isinstance(value, deque):
        return "deque([", "])", value, False
    return None


def _int_repr(value: int) -> str:
    if value.bit_length() > 3_000:  # repr would refuse past 4,300 digits and be slow before
        return f"<int of {value.bit_length()} bits>"
    return repr(value)


def _own_repr(value: Any, limit: int) -> str:
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<unrepresentable {type(value).__name__}: {type(exc).__name__}>"
    return text[: max(limit, 1)]


def exception_text(exc: BaseException, limit: int = 2_000) -> str:
    """``str(exc)`` cut to ``limit``, without expanding whatever values the exception holds
    (``ValueError(huge_shared_list)`` would otherwise be repr'd in full)."""
    args = exc.args
    if all(isinstance(a, (str, int, float, type(None))) for a in args):
        try:
            text = str(exc)
        except Exception:
            text = f"<{type(exc).__name__}>"
        return text if len(text) <= limit else text[: limit - 1] + "…"
    return bounded_repr(args[0] if len(args) == 1 else args, limit)


def bounded_plain(value: Any, *, nodes: int = PLAIN_NODES) -> Any:
    """``value`` with persistent containers as plain ones (dicts, lists), for printing and JSON.

    Sets become sorted lists, tuples lists, mapping keys strings; other objects are kept as
    they are. Raises ``ValueTooLarge`` past ``nodes`` values or ``MAX_DEPTH`` levels, so a
    value with shared structure cannot expand without bound.
    """
    budget = [nodes]
    return _plain(value, budget, 0)


def _plain(value: Any, budget: list[int], depth: int) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueTooLarge("the value has more than the allowed number of items")
    if depth > MAX_DEPTH:
        raise ValueTooLarge(f"the value is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, (str, bytes, int, float, type(None))):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, budget, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, PersistentList, deque)):
        return [_plain(v, budget, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v, budget, depth + 1) for v in value), key=bounded_repr)
    return value
