"""The report a sandboxed call's process sends its host: data only, bounded, checked in full.

The child encodes its result and the new state of every object it changed as msgpack, whose
decoder builds only strings, numbers, bytes, lists and booleans — nothing of the report can
name a class or run code. Every other value is a small tagged list (``[TAG, …]``) that the
host rebuilds itself from a fixed table: tuples, dicts, sets, frozensets, complex numbers,
dates and times, ``Counter``, ``OrderedDict``, ``deque``; integers past 64 bits travel as
bytes. A persistent object is never sent by value unless it is new: an object the host
handed out is an opaque token (its index in the host's list of the call's objects, or an oid
the host served to the child), checked against what the host gave.

The host reads a report as a stream (``Decoder``): one msgpack value at a time, each array by
its header, which is checked against what is left of the budget before any item of it is
built, and each value rebuilt as it is read. A hostile report is refused after at most the
bound's worth of work and memory, never after the whole message was expanded.

Limits, on both ends: ``MAX_REPORT_BYTES`` of message, ``MAX_NODES`` values in all (slot names
included; counted as the tree expands, so shared structure counts every time it is reached
and a graph with cycles never ends up in a report), ``MAX_DEPTH`` levels of nesting, integers
of ``MAX_INT_BITS``, and at most ``MAX_COLLISIONS`` distinct dict keys or set members with one
hash (a dict of keys that all collide would take the host quadratic time to build).

A state is checked for its class before anything is applied: a prototype's parent slots hold
prototypes, its method table only methods it already had (each under its own selector, none
shadowed by a data slot of the same name), and no slot is private or a name the class answers.

Values cross as copies: a list the result shares with a slot arrives as two equal lists, as
two persistent objects sharing a plain list would come back from the database. Identity is
kept only for persistent objects (tokens), which is where the image keeps it too.
"""

from __future__ import annotations

import datetime
import time
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import persistent
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping

from prototypes.uvm import Method, UvmObject, _answered_by_class

#: Largest report a child may send, in bytes.
MAX_REPORT_BYTES = 16 * 1024 * 1024
#: Values a report may hold in all (its result and every state, shared structure expanded).
MAX_NODES = 1_000_000
#: Deepest nesting of containers in a value.
MAX_DEPTH = 100
#: Largest integer in a report, in bits: under Python's 4,300 digits for ``str(int)``, so
#: whatever crosses back can be printed and written as JSON.
MAX_INT_BITS = 14_000
#: Distinct keys of one dict (or members of one set) that may share a hash.
MAX_COLLISIONS = 8
#: Longest text of an error report's message and findings, and how many findings it keeps.
MAX_ERROR_TEXT = 4_000
MAX_FINDINGS = 50

(
    _LIST,
    _TUPLE,
    _DICT,
    _SET,
    _FROZENSET,
    _KNOWN,
    _OID,
    _NEW,
    _COMPLEX,
    _BYTEARRAY,
    _DATE,
    _DATETIME,
    _TIME,
    _TIMEDELTA,
    _COUNTER,
    _ORDERED,
    _DEQUE,
) = range(17)
_BIGINT = 1  # msgpack extension code
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
#: New persistent objects a child may create (by ``clone()`` or a container's ``copy()``).
_NEW_KINDS: dict[str, type[Any]] = {
    "UvmObject": UvmObject,
    "PersistentList": PersistentList,
    "PersistentMapping": PersistentMapping,
}
_SCALARS = frozenset({str, float, bool, type(None), bytes})
_SCALAR_TYPES = _SCALARS | {int}
_NOT_SLOTS = _answered_by_class(UvmObject)


class Unsendable(Exception):
    """A value the child cannot put in a report; the text says what it is."""


class TooLarge(Unsendable):
    """A value past one of the report's size limits (items, depth, bits, bytes)."""


class ReportRefused(Exception):
    """A report the host will not use; the text says which rule it broke."""


# -- the child's side -------------------------------------------------------------------------


class Encoder:
    """Turns the child's result and changed objects into one report.

    ``known`` maps ``id(obj)`` to the token of each object the host handed out; ``jar`` is the
    child's connection, whose objects travel by oid.
    """

    def __init__(self, known: dict[int, int], jar: Any, *, fast: bool = True) -> None:
        self.known = known
        self.jar = jar
        self.fast = fast
        self.nodes = 0
        self.news: list[persistent.Persistent] = []
        self.new_index: dict[int, int] = {}

    def value(self, value: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise TooLarge(f"a value of more than {MAX_NODES:,} items (shared parts counted)")
        kind = type(value)
        if kind in _SCALARS:
            return value
        if kind is int:
            return value if _INT_MIN <= value <= _INT_MAX else _big_int(value)
        if depth >= MAX_DEPTH:
            raise TooLarge(f"a value nested deeper than {MAX_DEPTH} levels (or inside itself)")
        depth += 1
        if kind is list:
            return self._items(_LIST, value, depth)
        if kind is dict:
            return self._pairs(_DICT, value, depth)
        if kind is tuple:
            return self._items(_TUPLE, value, depth)
        if kind is set:
            return self._items(_SET, value, depth)
        if kind is frozenset:
            return self._items(_FROZENSET, value, depth)
        if isinstance(value, persistent.Persistent):
            return self.reference(value)
        encode = _OTHER_ENCODERS.get(kind)
        if encode is None:
            hint = " (convert it with dict(...))" if kind is defaultdict else ""
            raise Unsendable(f"a {kind.__module__}.{kind.__qualname__} object{hint}")
        return encode(self, value, depth)

    def _items(self, tag: int, items: Any, depth: int) -> list[Any]:
        if self.fast and _SCALAR_TYPES.issuperset(map(type, items)):
            # Only scalars (the usual list of numbers or strings): copied at C speed; an
            # integer past 64 bits makes ``report`` encode again the slow way.
            self.nodes += len(items)
            if self.nodes > MAX_NODES:
                raise TooLarge(f"a value of more than {MAX_NODES:,} items (shared parts counted)")
            wire = [tag]
            wire.extend(items)
            return wire
        wire = [tag]
        append = wire.append
        # Plain scalars inline: most values are lists of numbers or strings.
        for item in items:
            kind = type(item)
            if kind in _SCALARS or (kind is int and _INT_MIN <= item <= _INT_MAX):
                self.nodes += 1
                append(item)
            else:
                append(self.value(item, depth))
        if self.nodes > MAX_NODES:
            raise TooLarge(f"a value of more than {MAX_NODES:,} items (shared parts counted)")
        return wire

    def _pairs(self, tag: int, mapping: Any, depth: int) -> list[Any]:
        wire: list[Any] = [tag]
        for key, item in mapping.items():
            wire.append(self.value(key, depth))
            wire.append(self.value(item, depth))
        return wire

    def reference(self, obj: persistent.Persistent, *, method: bool = False) -> list[Any]:
        """The token of a persistent object; a new one is queued to travel by value."""
        if isinstance(obj, Method) != method:
            raise Unsendable("a method object" if not method else "a method slot holding data")
        token = self.known.get(id(obj))
        if token is not None:
            return [_KNOWN, token]
        if obj._p_oid is not None:
            if obj._p_jar is not self.jar:
                raise Unsendable(f"a {type(obj).__name__} of another database connection")
            return [_OID, bytes(obj._p_oid)]
        if method:
            raise Unsendable("a new method (methods can only be kept or removed by a method)")
        if type(obj).__name__ not in _NEW_KINDS or _NEW_KINDS[type(obj).__name__] is not type(obj):
            raise Unsendable(f"a new {type(obj).__module__}.{type(obj).__qualname__} object")
        index = self.new_index.get(id(obj))
        if index is None:
            index = self.new_index[id(obj)] = len(self.news)
            self.news.append(obj)
        return [_NEW, index]

    def state(self, obj: persistent.Persistent) -> list[Any]:
        """[slot, value, slot, value, …] of ``obj``'s state (its ``_methods`` as tokens)."""
        state = obj.__getstate__()
        if not isinstance(state, dict):
            raise Unsendable(f"the state of a {type(obj).__name__}")
        wire: list[Any] = []
        for name, value in state.items():
            if name[:1] == "_" and name != "_methods":
                continue  # private slots: no method can change them, the host keeps its own
            self._count(1)  # the slot's name: the host counts it too
            if name == "_methods" and isinstance(obj, UvmObject):
                methods: list[Any] = [_DICT]
                for selector, method in value.items():
                    self._count(2)
                    methods += [selector, self.reference(method, method=True)]
                wire += [name, methods]
                continue
            try:
                wire += [name, self.value(value)]
            except Unsendable as exc:
                raise type(exc)(f"slot {name!r} of {_label(obj)} now holds {exc}") from None
        return wire

    def report(self, result: Any, changed: list[persistent.Persistent]) -> bytes:
        """The whole report; raises ``Unsendable`` saying which part could not be sent."""
        try:
            data = msgpack.packb(self._envelope(result, changed), use_bin_type=True)
        except OverflowError:  # an integer past 64 bits in a list copied whole
            slow = Encoder(self.known, self.jar, fast=False)
            data = msgpack.packb(slow._envelope(result, changed), use_bin_type=True)
        if len(data) > MAX_REPORT_BYTES:
            raise TooLarge(f"a report of {len(data):,} bytes (the limit is {MAX_REPORT_BYTES:,})")
        return data

    def _count(self, items: int) -> None:
        self.nodes += items
        if self.nodes > MAX_NODES:
            raise TooLarge(f"a value of more than {MAX_NODES:,} items (shared parts counted)")

    def _envelope(self, result: Any, changed: list[persistent.Persistent]) -> list[Any]:
        """["R", kinds of the new objects, result, states, states of the new objects]: the
        kinds come first so that the host can make every new object before any value that
        refers to one."""
        try:
            wire_result = self.value(result)
        except Unsendable as exc:
            raise type(exc)(f"the method returned {exc}") from None
        self._count(len(changed))
        states = [[self.reference(obj), self.state(obj)] for obj in changed]
        news = []
        index = 0
        while index < len(self.news):  # new objects found while encoding queue more
            news.append(self.state(self.news[index]))
            index += 1
        self._count(len(self.news))
        return ["R", [type(obj).__name__ for obj in self.news], wire_result, states, news]


def _label(obj: Any) -> str:
    if isinstance(obj, UvmObject):
        return repr(obj)
    return f"a {type(obj).__name__}"


def _big_int(value: int) -> msgpack.ExtType:
    bits = value.bit_length()
    if bits > MAX_INT_BITS:
        raise TooLarge(f"an integer of {bits:,} bits (the limit is {MAX_INT_BITS:,})")
    return msgpack.ExtType(_BIGINT, value.to_bytes(bits // 8 + 1, "big", signed=True))


def _encode_deque(encoder: Encoder, value: deque, depth: int) -> list[Any]:
    items = encoder._items(_DEQUE, value, depth)
    items.insert(1, value.maxlen)
    return items


_OTHER_ENCODERS: dict[type, Callable[[Encoder, Any, int], Any]] = {
    Counter: lambda e, v, d: e._pairs(_COUNTER, v, d),
    OrderedDict: lambda e, v, d: e._pairs(_ORDERED, v, d),
    deque: _encode_deque,
    complex: lambda e, v, d: [_COMPLEX, v.real, v.imag],
    bytearray: lambda e, v, d: [_BYTEARRAY, bytes(v)],
    datetime.datetime: lambda e, v, d: [_DATETIME, v.isoformat()],
    datetime.date: lambda e, v, d: [_DATE, v.isoformat()],
    datetime.time: lambda e, v, d: [_TIME, v.isoformat()],
    datetime.timedelta: lambda e, v, d: [_TIMEDELTA, v.days, v.seconds, v.microseconds],
}


def error_report(name: str, mro: list[str], message: str, findings: list[str], where: str) -> bytes:
    """An exception as the child reports it: names and text only."""
    return msgpack.packb(
        ["E", name, mro, message[:MAX_ERROR_TEXT], findings[:MAX_FINDINGS], where],
        use_bin_type=True,
    )


# -- the host's side --------------------------------------------------------------------------


@dataclass
class Report:
    """A decoded, fully checked report: nothing in it has touched the host's objects yet."""

    result: Any
    #: (existing object, its new state) for every object the child changed.
    states: list[tuple[persistent.Persistent, dict[str, Any]]]
    #: (new object, its state): objects the child created, not yet given their state.
    news: list[tuple[persistent.Persistent, dict[str, Any]]]


@dataclass
class ErrorReport:
    name: str
    bases: list[str]
    message: str
    findings: list[str]
    where: str


#: msgpack's first byte of an array: fixarray, array 16, array 32.
_ARRAY_HEADS = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])
#: Bytes msgpack's decoder takes from a report at a time.
_READ_SIZE = 1 << 16
#: Values decoded between two looks at the clock.
_CLOCK_EVERY = 1 << 14


class _Wire:
    """A report's bytes, read one msgpack value at a time.

    Arrays are read by their header only, so the caller checks each container's size before
    any item of it is built; every other value is decoded by msgpack's C decoder, within its
    own limit (text, bytes, extensions; maps are refused). The decoder never builds an array
    itself: a value whose first byte says array is read by its header, never unpacked whole.
    """

    def __init__(self, data: bytes | bytearray, max_bytes: int) -> None:
        if len(data) > max_bytes:
            raise ReportRefused(f"a report of {len(data):,} bytes exceeds {max_bytes:,}")
        self.data = data
        self.unpacker = msgpack.Unpacker(
            _Chunks(data),
            read_size=min(_READ_SIZE, max_bytes),
            max_buffer_size=max_bytes,
            raw=False,
            use_list=True,
            strict_map_key=True,
            timestamp=0,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=MAX_NODES + 8,
            max_map_len=0,
            max_ext_len=MAX_INT_BITS // 8 + 1,
        )

    def at_array(self) -> bool:
        """Whether the next value is an array (refused if the report ends before it)."""
        try:
            return self.data[self.unpacker.tell()] in _ARRAY_HEADS
        except IndexError:
            raise ReportRefused("it is not a well-formed report (it ends early)") from None

    def array(self, what: str) -> int:
        """The item count of the next value, which must be an array."""
        if not self.at_array():
            raise ReportRefused(f"{what} is malformed")
        try:
            return self.unpacker.read_array_header()
        except Exception as exc:  # past max_array_len, or cut short
            raise _not_well_formed(exc) from None

    def scalar(self) -> Any:
        """The next value, which must not be an array."""
        if self.at_array():
            raise ReportRefused("a value is malformed")
        try:
            return self.unpacker.unpack()
        except Exception as exc:  # malformed bytes, past a length limit, a map, cut short
            raise _not_well_formed(exc) from None

    def text(self, what: str) -> str:
        value = self.scalar()
        if type(value) is not str:
            raise ReportRefused(f"{what} is malformed")
        return value

    def end(self) -> None:
        if self.unpacker.tell() != len(self.data):
            raise ReportRefused("it is not a well-formed report (bytes after its end)")


class _Chunks:
    """``data`` as the file msgpack's streaming decoder reads, a chunk at a time (so it
    never holds a second copy of the whole report)."""

    def __init__(self, data: bytes | bytearray) -> None:
        self.view = memoryview(data)
        self.at = 0

    def read(self, size: int) -> bytes:
        chunk = bytes(self.view[self.at : self.at + size])
        self.at += len(chunk)
        return chunk


def _not_well_formed(exc: Exception) -> ReportRefused:
    return ReportRefused(f"it is not a well-formed report ({type(exc).__name__})")


def decode_error(data: bytes | bytearray) -> ErrorReport:
    """The child's error report, every part cut to its limit as it is read."""
    wire = _Wire(data, 1024 * 1024)
    if wire.array("its error report") != 6 or wire.scalar() != "E":
        raise ReportRefused("its error report is malformed")
    name = wire.text("its error report")[:200]
    bases = _texts(wire, 50, 200)
    message = wire.text("its error report")[:MAX_ERROR_TEXT]
    findings = _texts(wire, MAX_FINDINGS, MAX_ERROR_TEXT)
    where = wire.text("its error report")[:MAX_ERROR_TEXT]
    wire.end()
    return ErrorReport(name, bases, message, findings, where)


def _texts(wire: _Wire, most: int, limit: int) -> list[str]:
    count = wire.array("its error report")
    if count > most:
        raise ReportRefused("its error report is malformed")
    return [wire.text("its error report")[:limit] for _ in range(count)]


class Decoder:
    """Rebuilds a report in the host as it reads it: every token checked, every state
    validated, none applied.

    ``known`` is the list of objects the host handed out (a ``_KNOWN`` token is an index in
    it); ``resolve_oid`` returns the object of an oid the child could have been given, or
    None. Past ``deadline`` (a ``time.monotonic()`` value) decoding stops with a refusal.
    """

    def __init__(
        self,
        known: list[Any],
        resolve_oid: Callable[[bytes], Any],
        deadline: float | None = None,
    ) -> None:
        self.known = known
        self.resolve_oid = resolve_oid
        self.deadline = deadline
        self.nodes = 0
        self.clock = _CLOCK_EVERY
        self.news: list[persistent.Persistent] = []

    def report(self, data: bytes | bytearray) -> Report:
        """The checked report, or ``ReportRefused`` naming the first rule it breaks."""
        wire = _Wire(data, MAX_REPORT_BYTES)
        if wire.array("its envelope") != 5 or wire.scalar() != "R":
            raise ReportRefused("its envelope is malformed")
        kinds = self._reserve(wire.array("its list of new objects"))
        for _ in range(kinds):  # first every new object, so any value may refer to any
            kind = wire.scalar()
            if type(kind) is not str or kind not in _NEW_KINDS:
                raise ReportRefused("a new object of a kind a method cannot create")
            cls = _NEW_KINDS[kind]
            # each kind's own __new__ (Persistent's for persistent kinds), as unpickling does
            self.news.append(cls.__new__(cls))  # type: ignore[call-overload]
        self._reserve(1)
        result = self.value(wire, 0)
        states = []
        seen = {id(new) for new in self.news}  # a new object's state travels with the news
        for _ in range(self._reserve(wire.array("its list of changed objects"))):
            if wire.array("a changed object's entry") != 2:
                raise ReportRefused("a changed object's entry is malformed")
            obj = self.reference(wire)
            if id(obj) in seen:
                raise ReportRefused("an object's state is sent twice")
            seen.add(id(obj))
            states.append((obj, self.state(obj, wire)))
        if wire.array("its list of new objects' states") != len(self.news):
            raise ReportRefused("a new object's state is missing")
        news = [(obj, self.state(obj, wire)) for obj in self.news]
        wire.end()
        return Report(result, states, news)

    def _reserve(self, count: int) -> int:
        """Count ``count`` values before any of them is read; refuse past the budget."""
        self.nodes += count
        if self.nodes > MAX_NODES:
            raise ReportRefused(f"it holds more than {MAX_NODES:,} values")
        if self.nodes > self.clock:
            self.clock = self.nodes + _CLOCK_EVERY
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise ReportRefused("reading it took past the call's deadline")
        return count

    # -- values ----------------------------------------------------------------------------

    def value(self, wire: _Wire, depth: int) -> Any:
        """The next value, already counted by the caller."""
        if not wire.at_array():
            return self.scalar(wire.scalar())
        size = wire.array("a value")
        if size == 0:
            raise ReportRefused("a value is malformed")
        if depth >= MAX_DEPTH + 1:
            raise ReportRefused(f"a value is nested deeper than {MAX_DEPTH} levels")
        tag = wire.scalar()
        build = _DECODERS.get(tag) if type(tag) is int else None
        if build is None:
            raise ReportRefused(f"unknown value tag {str(tag)[:20]}")
        try:
            return build(self, wire, size - 1, depth + 1)
        except (TypeError, ValueError, OverflowError) as exc:
            why = type(exc).__name__
            raise ReportRefused(f"a value of tag {tag} is malformed ({why})") from None

    def scalar(self, value: Any) -> Any:
        kind = type(value)
        if kind in _SCALAR_TYPES:
            return value
        if kind is msgpack.ExtType:
            if value.code != _BIGINT:
                raise ReportRefused(f"unknown extension {value.code}")
            number = int.from_bytes(value.data, "big", signed=True)
            if number.bit_length() > MAX_INT_BITS:
                raise ReportRefused(f"an integer of more than {MAX_INT_BITS:,} bits")
            return number
        raise ReportRefused("a value is malformed")

    def items(self, wire: _Wire, count: int, depth: int) -> list[Any]:
        """The next ``count`` values: scalars decoded at C speed, arrays one by one."""
        self._reserve(count)
        data, tell, unpack = wire.data, wire.unpacker.tell, wire.unpacker.unpack
        heads = _ARRAY_HEADS
        out: list[Any] = []
        append = out.append
        try:
            for _ in range(count):
                if data[tell()] in heads:
                    append(self.value(wire, depth))
                    continue
                item = unpack()
                append(item if type(item) in _SCALAR_TYPES else self.scalar(item))
        except IndexError:
            raise ReportRefused("it is not a well-formed report (it ends early)") from None
        except (msgpack.UnpackException, ValueError) as exc:
            raise _not_well_formed(exc) from None
        return out

    def pairs(self, wire: _Wire, count: int, depth: int) -> list[tuple[Any, Any]]:
        if count % 2:
            raise ReportRefused("a mapping has a key without a value")
        flat = self.items(wire, count, depth)
        keys = flat[0::2]
        _check_hashes(keys)
        return list(zip(keys, flat[1::2], strict=True))

    def reference(self, wire: _Wire) -> Any:
        """The object a ``[tag, token]`` array names."""
        if wire.array("a reference") != 2:
            raise ReportRefused("a reference is malformed")
        return self.token(wire.scalar(), wire.scalar())

    def token(self, tag: Any, token: Any) -> Any:
        if tag == _KNOWN and type(token) is int and 0 <= token < len(self.known):
            return self.known[token]
        if tag == _OID and type(token) is bytes and len(token) == 8:
            found = self.resolve_oid(token)
            if found is not None:
                return found
            raise ReportRefused(f"reference {token.hex()} was never given to the method")
        if tag == _NEW and type(token) is int and 0 <= token < len(self.news):
            return self.news[token]
        raise ReportRefused("a reference names no object the host handed out")

    def persistent_value(self, wire: _Wire, count: int, tag: int) -> Any:
        if count != 1:
            raise ReportRefused("a reference is malformed")
        obj = self.token(tag, wire.scalar())
        if isinstance(obj, Method):
            raise ReportRefused("a method can only be referred to from a method slot")
        return obj

    # -- states ----------------------------------------------------------------------------

    def state(self, obj: Any, wire: _Wire) -> dict[str, Any]:
        """The validated state of ``obj``: only what the host would accept for its class."""
        if not isinstance(obj, (UvmObject, PersistentList, PersistentMapping)):
            raise ReportRefused(f"a {type(obj).__name__} cannot be changed by a method")
        size = wire.array("an object's state")
        if size % 2:
            raise ReportRefused("an object's state is malformed")
        self._reserve(size // 2)
        state: dict[str, Any] = {}
        for _ in range(size // 2):
            name = wire.scalar()
            if type(name) is not str or name in state:
                raise ReportRefused("an object's state must name each slot once")
            if isinstance(obj, UvmObject) and name == "_methods":
                state[name] = self.methods(wire)
            elif name.startswith("_") or not name:
                raise ReportRefused(f"slot {name[:40]!r} cannot be set by a method (private)")
            else:
                self._reserve(1)
                state[name] = self.value(wire, 0)
        if isinstance(obj, UvmObject):
            _check_prototype(obj, state)
        else:
            expected = list if isinstance(obj, PersistentList) else dict
            if set(state) != {"data"} or type(state["data"]) is not expected:
                raise ReportRefused(
                    f"a {type(obj).__name__}'s state holds only its data, a {expected.__name__}"
                )
        return state

    def methods(self, wire: _Wire) -> dict[str, Method]:
        size = wire.array("a method table")
        if size % 2 != 1 or wire.scalar() != _DICT:
            raise ReportRefused("a method table is malformed")
        methods: dict[str, Method] = {}
        for _ in range(self._reserve(size - 1) // 2):
            selector = wire.scalar()
            method = self.reference(wire)
            if not (
                type(selector) is str and isinstance(method, Method) and method.selector == selector
            ):
                raise ReportRefused("methods can only be kept or removed by a method")
            methods[selector] = method
        return methods


def _check_prototype(obj: UvmObject, state: dict[str, Any]) -> None:
    """A prototype's new state keeps to the object model: the very methods it had, no data
    slot named like one of them, prototypes in its parent slots, no name the class answers.

    A method may neither add nor remove methods: removing one (by writing a data slot of its
    name) would take out a parent's shared or a hand-written method with no record and no
    undo; methods come and go only through the kernel and ``batos methods``."""
    if "_methods" not in state:
        raise ReportRefused("a prototype's state must keep its method table")
    obj._p_activate()  # the host's own record, to compare with
    held = obj.__dict__.get("_methods") or {}
    for selector, method in state["_methods"].items():
        if held.get(selector) is not method:
            raise ReportRefused(
                f"methods can only be kept by a method: {selector!r} is not a method "
                f"{_label(obj)} had"
            )
    gone = sorted(set(held) - set(state["_methods"]))
    if gone:
        raise ReportRefused(
            f"a method may not remove methods: {_label(obj)} would lose {gone[0]!r} "
            "('batos methods reject' takes one out)"
        )
    taken = set(state) & _NOT_SLOTS
    if taken:
        raise ReportRefused(f"slot {sorted(taken)[0]!r} is a name the class answers")
    for name, value in state.items():
        if name == "_methods":
            continue
        if name in state["_methods"]:
            raise ReportRefused(f"slot {name!r} would be both data and a method")
        if name[-1:] == "*" and not isinstance(value, UvmObject) and not _kept(obj, name, value):
            raise ReportRefused(
                f"parent slot {name!r} must hold a prototype, not a value of type "
                f"{type(value).__name__}"
            )


def _kept(obj: UvmObject, name: str, value: Any) -> bool:
    """Whether ``obj`` already held ``value`` in slot ``name`` (an image written before
    parent slots were checked): sending it back unchanged is not a new write."""
    state = obj.__dict__
    if name not in state or name in (state.get("_v_borrowed") or ()):
        return False
    held = state[name]
    try:
        return type(held) is type(value) and bool(held == value)
    except Exception:
        return False


def _check_hashes(keys: list[Any]) -> None:
    """Refuse unhashable keys, and many distinct keys with one hash (quadratic to insert)."""
    try:
        hashes = [hash(k) for k in keys]
    except TypeError:
        raise ReportRefused("a dict key or set member is unhashable") from None
    if len(hashes) > MAX_COLLISIONS:
        most = Counter(hashes).most_common(1)[0][1]
        if most > MAX_COLLISIONS:
            raise ReportRefused(f"{most} dict keys or set members share one hash")


def _members(decoder: Decoder, wire: _Wire, count: int, depth: int) -> list[Any]:
    members = decoder.items(wire, count, depth)
    _check_hashes(members)
    return members


def _decode_deque(decoder: Decoder, wire: _Wire, count: int, depth: int) -> deque:
    if count < 1:
        raise ReportRefused("a deque is malformed")
    maxlen = decoder.scalar(wire.scalar())
    if not (maxlen is None or (type(maxlen) is int and 0 <= maxlen <= MAX_NODES)):
        raise ReportRefused("a deque's length limit is malformed")
    return deque(decoder.items(wire, count - 1, depth), maxlen)


def _fields(decoder: Decoder, wire: _Wire, count: int, expected: int) -> list[Any]:
    """The ``count`` scalar fields of a value that has exactly ``expected`` (a few per value,
    counted with it, as the child counts them)."""
    if count != expected:
        raise ReportRefused("a value has the wrong number of fields")
    return [decoder.scalar(wire.scalar()) for _ in range(count)]


def _float(value: Any) -> float:
    if type(value) not in (float, int):
        raise TypeError("not a number")
    return float(value)


def _iso(value: Any) -> str:
    if type(value) is not str or len(value) > 64:
        raise TypeError("not a date text")
    return value


def _bytes(value: Any) -> bytes:
    if type(value) is not bytes:
        raise TypeError("not bytes")
    return value


def _small_int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError("not an integer")
    return value


def _complex(decoder: Decoder, wire: _Wire, count: int, depth: int) -> complex:
    real, imag = _fields(decoder, wire, count, 2)
    return complex(_float(real), _float(imag))


def _timedelta(decoder: Decoder, wire: _Wire, count: int, depth: int) -> datetime.timedelta:
    days, seconds, micros = _fields(decoder, wire, count, 3)
    return datetime.timedelta(_small_int(days), _small_int(seconds), _small_int(micros))


def _one(convert: Callable[[Any], Any]) -> Callable[[Decoder, _Wire, int, int], Any]:
    return lambda d, w, count, depth: convert(_fields(d, w, count, 1)[0])


def _reference(tag: int) -> Callable[[Decoder, _Wire, int, int], Any]:
    return lambda d, w, count, depth: d.persistent_value(w, count, tag)


_DECODERS: dict[int, Callable[[Decoder, _Wire, int, int], Any]] = {
    _LIST: lambda d, w, count, depth: d.items(w, count, depth),
    _TUPLE: lambda d, w, count, depth: tuple(d.items(w, count, depth)),
    _DICT: lambda d, w, count, depth: dict(d.pairs(w, count, depth)),
    _SET: lambda d, w, count, depth: set(_members(d, w, count, depth)),
    _FROZENSET: lambda d, w, count, depth: frozenset(_members(d, w, count, depth)),
    _KNOWN: _reference(_KNOWN),
    _OID: _reference(_OID),
    _NEW: _reference(_NEW),
    _COMPLEX: _complex,
    _BYTEARRAY: _one(lambda v: bytearray(_bytes(v))),
    _DATE: _one(lambda v: datetime.date.fromisoformat(_iso(v))),
    _DATETIME: _one(lambda v: datetime.datetime.fromisoformat(_iso(v))),
    _TIME: _one(lambda v: datetime.time.fromisoformat(_iso(v))),
    _TIMEDELTA: _timedelta,
    _COUNTER: lambda d, w, count, depth: Counter(dict(d.pairs(w, count, depth))),
    _ORDERED: lambda d, w, count, depth: OrderedDict(d.pairs(w, count, depth)),
    _DEQUE: _decode_deque,
}
