"""The report a sandboxed call's process sends its host: data only, bounded, checked in full.

The child encodes its result and the new state of every object it changed as msgpack, whose
decoder builds only strings, numbers, bytes, lists and booleans — nothing of the report can
name a class or run code. Every other value is a small tagged list (``[TAG, …]``) that the
host rebuilds itself from a fixed table: tuples, dicts, sets, frozensets, complex numbers,
dates and times, ``Counter``, ``OrderedDict``, ``deque``; integers past 64 bits travel as
bytes. A persistent object is never sent by value unless it is new: an object the host
handed out is an opaque token (its index in the host's list of the call's objects, or an oid
the host served to the child), checked against what the host gave.

Limits, on both ends: ``MAX_REPORT_BYTES`` of message, ``MAX_NODES`` values in all (counted
as the tree expands, so shared structure counts every time it is reached and a graph with
cycles never ends up in a report), ``MAX_DEPTH`` levels of nesting, integers of
``MAX_INT_BITS``, and at most ``MAX_COLLISIONS`` distinct dict keys or set members with one
hash (a dict of keys that all collide would take the host quadratic time to build).

Values cross as copies: a list the result shares with a slot arrives as two equal lists, as
two persistent objects sharing a plain list would come back from the database. Identity is
kept only for persistent objects (tokens), which is where the image keeps it too.
"""

from __future__ import annotations

import datetime
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
#: Largest integer in a report, in bits.
MAX_INT_BITS = 1 << 20
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
_NEW_KINDS: dict[str, type] = {
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
            if name == "_methods" and isinstance(obj, UvmObject):
                methods: list[Any] = [_DICT]
                for selector, method in value.items():
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

    def _envelope(self, result: Any, changed: list[persistent.Persistent]) -> list[Any]:
        try:
            wire_result = self.value(result)
        except Unsendable as exc:
            raise type(exc)(f"the method returned {exc}") from None
        states = [[self.reference(obj), self.state(obj)] for obj in changed]
        news = []
        index = 0
        while index < len(self.news):  # new objects found while encoding queue more
            obj = self.news[index]
            news.append([type(obj).__name__, self.state(obj)])
            index += 1
        return ["R", wire_result, states, news]


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


def unpack(data: bytes, max_bytes: int = MAX_REPORT_BYTES) -> Any:
    """msgpack with every limit set: lists and scalars only, no maps, no unknown extensions."""
    if len(data) > max_bytes:
        raise ReportRefused(f"a report of {len(data):,} bytes exceeds {max_bytes:,}")
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=MAX_NODES + 2,
            max_map_len=0,
            max_ext_len=MAX_INT_BITS // 8 + 1,
        )
    except Exception as exc:  # anything the C decoder refuses: malformed, too deep, truncated
        raise ReportRefused(f"it is not a well-formed report ({type(exc).__name__})") from None


def decode_error(data: bytes) -> ErrorReport:
    wire = unpack(data, 1024 * 1024)
    if not (isinstance(wire, list) and len(wire) == 6 and wire[0] == "E"):
        raise ReportRefused("its error report is malformed")
    _, name, mro, message, findings, where = wire
    if not (isinstance(mro, list) and isinstance(findings, list)):
        raise ReportRefused("its error report is malformed")
    return ErrorReport(
        _text(name, 200),
        [_text(n, 200) for n in mro[:50]],
        _text(message, MAX_ERROR_TEXT),
        [_text(f, MAX_ERROR_TEXT) for f in findings[:MAX_FINDINGS]],
        _text(where, MAX_ERROR_TEXT),
    )


def _text(value: Any, limit: int) -> str:
    if not isinstance(value, str):
        raise ReportRefused("its error report is malformed")
    return value[:limit]


class Decoder:
    """Rebuilds a report in the host: every token checked, every state validated, none applied.

    ``known`` is the list of objects the host handed out (a ``_KNOWN`` token is an index in
    it); ``resolve_oid`` returns the object of an oid the child could have been given, or
    None.
    """

    def __init__(self, known: list[Any], resolve_oid: Callable[[bytes], Any]) -> None:
        self.known = known
        self.resolve_oid = resolve_oid
        self.nodes = 0
        self.news: list[persistent.Persistent] = []

    def report(self, data: bytes) -> Report:
        wire = unpack(data)
        if not (isinstance(wire, list) and len(wire) == 4 and wire[0] == "R"):
            raise ReportRefused("its envelope is malformed")
        _, wire_result, wire_states, wire_news = wire
        if not (isinstance(wire_states, list) and isinstance(wire_news, list)):
            raise ReportRefused("its envelope is malformed")
        for entry in wire_news:  # first every placeholder, so any value may refer to any
            if not (type(entry) is list and len(entry) == 2 and type(entry[0]) is str):
                raise ReportRefused("a new object's entry is malformed")
            if entry[0] not in _NEW_KINDS:
                raise ReportRefused("a new object of a kind a method cannot create")
            cls = _NEW_KINDS[entry[0]]
            self.news.append(cls.__new__(cls))
        result = self.value(wire_result, 0)
        states = []
        seen: set[int] = set()
        for entry in wire_states:
            if not (isinstance(entry, list) and len(entry) == 2):
                raise ReportRefused("a changed object's entry is malformed")
            obj = self.reference(entry[0])
            if id(obj) in seen or any(obj is new for new in self.news):
                raise ReportRefused("an object's state is sent twice")
            seen.add(id(obj))
            states.append((obj, self.state(obj, entry[1])))
        news = [
            (obj, self.state(obj, entry[1]))
            for obj, entry in zip(self.news, wire_news, strict=True)
        ]
        return Report(result, states, news)

    # -- values ----------------------------------------------------------------------------

    def value(self, wire: Any, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ReportRefused(f"it holds more than {MAX_NODES:,} values")
        kind = type(wire)
        if kind in _SCALARS or kind is int:
            return wire
        if kind is msgpack.ExtType:
            if wire.code != _BIGINT:
                raise ReportRefused(f"unknown extension {wire.code}")
            return int.from_bytes(wire.data, "big", signed=True)
        if kind is not list or not wire or type(wire[0]) is not int:
            raise ReportRefused("a value is malformed")
        if depth >= MAX_DEPTH + 1:
            raise ReportRefused(f"a value is nested deeper than {MAX_DEPTH} levels")
        tag = wire[0]
        build = _DECODERS.get(tag)
        if build is None:
            raise ReportRefused(f"unknown value tag {tag}")
        try:
            return build(self, wire, depth + 1)
        except (TypeError, ValueError, OverflowError, IndexError) as exc:
            why = type(exc).__name__
            raise ReportRefused(f"a value of tag {tag} is malformed ({why})") from None

    def items(self, wire: list[Any], depth: int, start: int = 1) -> list[Any]:
        if _SCALAR_TYPES.issuperset(map(type, wire)):  # only scalars: copied at C speed
            self.nodes += len(wire) - start
            if self.nodes > MAX_NODES:
                raise ReportRefused(f"it holds more than {MAX_NODES:,} values")
            return wire[start:]
        out = []
        append = out.append
        for index in range(start, len(wire)):
            item = wire[index]
            kind = type(item)
            if kind in _SCALARS or kind is int:
                self.nodes += 1
                append(item)
            else:
                append(self.value(item, depth))
        if self.nodes > MAX_NODES:
            raise ReportRefused(f"it holds more than {MAX_NODES:,} values")
        return out

    def pairs(self, wire: list[Any], depth: int) -> list[tuple[Any, Any]]:
        if len(wire) % 2 != 1:
            raise ReportRefused("a mapping has a key without a value")
        flat = self.items(wire, depth)
        keys = flat[0::2]
        _check_hashes(keys)
        return list(zip(keys, flat[1::2], strict=True))

    def reference(self, wire: Any) -> Any:
        if not (type(wire) is list and len(wire) == 2):
            raise ReportRefused("a reference is malformed")
        tag, token = wire
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

    def persistent_value(self, wire: list[Any], depth: int) -> Any:
        obj = self.reference(wire)
        if isinstance(obj, Method):
            raise ReportRefused("a method can only be referred to from a method slot")
        return obj

    # -- states ----------------------------------------------------------------------------

    def state(self, obj: Any, wire: Any) -> dict[str, Any]:
        """The validated state of ``obj``: only what the host would accept for its class."""
        if not isinstance(obj, (UvmObject, PersistentList, PersistentMapping)):
            raise ReportRefused(f"a {type(obj).__name__} cannot be changed by a method")
        if not (isinstance(wire, list) and len(wire) % 2 == 0):
            raise ReportRefused("an object's state is malformed")
        names = wire[0::2]
        if not all(type(n) is str for n in names) or len(set(names)) != len(names):
            raise ReportRefused("an object's state must name each slot once")
        state: dict[str, Any] = {}
        for name, value in zip(names, wire[1::2], strict=True):
            if isinstance(obj, UvmObject) and name == "_methods":
                state[name] = self.methods(value)
            elif name.startswith("_") or not name:
                raise ReportRefused(f"slot {name[:40]!r} cannot be set by a method (private)")
            else:
                state[name] = self.value(value, 0)
        if isinstance(obj, UvmObject):
            if "_methods" not in state:
                raise ReportRefused("a prototype's state must keep its method table")
            taken = set(state) & _NOT_SLOTS
            if taken:
                raise ReportRefused(f"slot {sorted(taken)[0]!r} is a name the class answers")
        else:
            expected = list if isinstance(obj, PersistentList) else dict
            if set(state) != {"data"} or type(state["data"]) is not expected:
                raise ReportRefused(
                    f"a {type(obj).__name__}'s state holds only its data, a {expected.__name__}"
                )
        return state

    def methods(self, wire: Any) -> dict[str, Method]:
        if not (type(wire) is list and wire and wire[0] == _DICT and len(wire) % 2 == 1):
            raise ReportRefused("a method table is malformed")
        methods: dict[str, Method] = {}
        for index in range(1, len(wire), 2):
            selector = wire[index]
            method = self.reference(wire[index + 1])
            if not (
                type(selector) is str and isinstance(method, Method) and method.selector == selector
            ):
                raise ReportRefused("methods can only be kept or removed by a method")
            methods[selector] = method
        return methods


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


def _members(decoder: Decoder, wire: list[Any], depth: int) -> list[Any]:
    members = decoder.items(wire, depth)
    _check_hashes(members)
    return members


def _decode_deque(decoder: Decoder, wire: list[Any], depth: int) -> deque:
    maxlen = wire[1] if len(wire) > 1 else None
    if not (maxlen is None or (type(maxlen) is int and 0 <= maxlen <= MAX_NODES)):
        raise ReportRefused("a deque's length limit is malformed")
    return deque(decoder.items(wire, depth, 2), maxlen)


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


_DECODERS: dict[int, Callable[[Decoder, list[Any], int], Any]] = {
    _LIST: lambda d, w, depth: d.items(w, depth),
    _TUPLE: lambda d, w, depth: tuple(d.items(w, depth)),
    _DICT: lambda d, w, depth: dict(d.pairs(w, depth)),
    _SET: lambda d, w, depth: set(_members(d, w, depth)),
    _FROZENSET: lambda d, w, depth: frozenset(_members(d, w, depth)),
    _KNOWN: Decoder.persistent_value,
    _OID: Decoder.persistent_value,
    _NEW: Decoder.persistent_value,
    _COMPLEX: lambda d, w, depth: complex(_float(w[1]), _float(w[2])),
    _BYTEARRAY: lambda d, w, depth: bytearray(_bytes(w[1])),
    _DATE: lambda d, w, depth: datetime.date.fromisoformat(_iso(w[1])),
    _DATETIME: lambda d, w, depth: datetime.datetime.fromisoformat(_iso(w[1])),
    _TIME: lambda d, w, depth: datetime.time.fromisoformat(_iso(w[1])),
    _TIMEDELTA: lambda d, w, depth: datetime.timedelta(
        _small_int(w[1]), _small_int(w[2]), _small_int(w[3])
    ),
    _COUNTER: lambda d, w, depth: Counter(dict(d.pairs(w, depth))),
    _ORDERED: lambda d, w, depth: OrderedDict(d.pairs(w, depth)),
    _DEQUE: _decode_deque,
}
