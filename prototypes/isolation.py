"""Process isolation: a generated method runs in a forked child, never in the host process.

Each outermost call of a sandboxed method forks. The child gives up what it inherited
(``confine``: descriptors, environment, limits, never root, a system-call allow list), runs the
method under the in-process guards, and reports back over a pipe: its result and the new
state of every object it changed, as data only (``prototypes.report``). The host decodes the
report with limits, checks every reference and every state in full, and only then applies
the states. Whatever the code does in the child — segfault the interpreter, spin in C,
exhaust memory, ``os._exit``, write any bytes to the pipe — the host sees an error and its
objects are as they were. One deadline covers the whole exchange, and the child is killed on
every way out of it.

The child has no database of its own. When it touches an object the host had not loaded, its
connection asks the host for the object's record over the pipe (``_HostStorage``); the host
answers from its own connection, so the child sees exactly what the caller's transaction sees,
uncommitted changes included. That direction is trusted: it is the host's own data.

Changes that break the persistence covenant are found, not lost: the sandbox's guards note
every persistent object the method reaches (through attributes, items or iteration), and
after the call each one — and each object loaded during it — is compared with its record: one
whose state differs although nobody marked it changed was changed in place. A persistent
container changed that way (a plain list inside a ``PersistentMapping``) is kept — its whole
state is sent and the host marks it changed; a prototype whose slot was changed that way is
refused with a covenant finding.
"""

from __future__ import annotations

import atexit
import faulthandler
import hashlib
import io
import logging
import marshal
import os
import pickle
import select
import signal
import struct
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import persistent
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping

from batos import metrics
from batos.errors import GeneratedCodeError, SandboxLimitExceeded, SandboxViolation
from prototypes import confine, report
from prototypes.bounded import exception_text
from prototypes.uvm import Method, UvmObject

log = logging.getLogger("batos.isolation")

#: Extra seconds a child gets beyond the call's time limit before it is killed.
GRACE_SECONDS = 1.0
#: Objects whose state the host accepts from a child.
WRITABLE = (UvmObject, PersistentList, PersistentMapping)

_in_child = False
_child_limits: tuple[float, int] | None = None


def inside_child() -> bool:
    """Whether this process is an isolation child (nested calls then run in place)."""
    return _in_child


def child_limits() -> tuple[float, int] | None:
    """(seconds, memory MiB) of the call this child runs; None in the host."""
    return _child_limits


# -- framing --------------------------------------------------------------------------------------

_HEADER = struct.Struct(">cI")
#: Largest message of each kind the host reads from a child (L: an oid to load).
_MAX_MESSAGE = {b"L": 8, b"R": report.MAX_REPORT_BYTES, b"E": 1024 * 1024}


class _ChildGone(Exception):
    """The other end of the pipe closed or sent nonsense."""


def _write_all(fd: int, data: bytes, deadline: float | None = None) -> None:
    view = memoryview(data)
    while view:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            _, ready, _ = select.select([], [fd], [], left)
            if not ready:
                continue
        try:
            written = os.write(fd, view[: 1 << 16])
        except BlockingIOError:
            continue
        view = view[written:]


def _send(fd: int, kind: bytes, payload: bytes, deadline: float | None = None) -> None:
    _write_all(fd, _HEADER.pack(kind, len(payload)) + payload, deadline)


def _read_exact(fd: int, size: int, deadline: float | None = None) -> bytearray:
    """``size`` bytes, read into one buffer of that size (the only copy of a message)."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    done = 0
    while done < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
        try:
            # read(2), not readv(2): the confined child reads through this too, and its
            # allow-list names read on the host channel only.
            chunk = os.read(fd, size - done)
        except BlockingIOError:
            continue
        if not chunk:
            raise _ChildGone("pipe closed")
        view[done : done + len(chunk)] = chunk
        done += len(chunk)
    return buffer


def _recv_from_child(fd: int, deadline: float) -> tuple[bytes, bytearray]:
    """One message, every byte of it within the deadline (a child may stall mid-message);
    a size past its kind's limit is refused before anything of it is read."""
    kind, size = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    limit = _MAX_MESSAGE.get(kind)
    if limit is None:
        raise _ChildGone(f"unexpected message {kind!r}")
    if size > limit:
        raise _Oversized(kind, size, limit)
    return kind, _read_exact(fd, size, deadline)


class _Oversized(Exception):
    def __init__(self, kind: bytes, size: int, limit: int) -> None:
        super().__init__(f"a {kind.decode(errors='replace')} message of {size:,} bytes")
        self.size, self.limit = size, limit


def _recv_from_host(fd: int) -> tuple[bytes, bytes]:
    kind, size = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return kind, bytes(_read_exact(fd, size))


# -- the child ------------------------------------------------------------------------------------


#: What the host answers a load of a record the child could not have reached.
UNREACHABLE = b"not reachable from the method's receiver or arguments"


class _HostStorage:
    """The child's storage: each record it needs is asked of the host over the pipe."""

    def __init__(self, to_host: int, from_host: int) -> None:
        self.to_host = to_host
        self.from_host = from_host
        #: oid -> the record as served, to see afterwards what the method changed in place.
        self.served: dict[bytes, bytes] = {}

    def load(self, oid: bytes, version: str = "") -> tuple[bytes, bytes]:
        from ZODB.POSException import POSKeyError

        _send(self.to_host, b"L", bytes(oid))
        kind, payload = _recv_from_host(self.from_host)
        if kind == b"X" and payload == UNREACHABLE:
            raise SandboxViolation(
                "the sandbox refused an operation",
                [
                    "an object the method reached is not reachable from its receiver, arguments "
                    "or their parents, and the host does not serve it"
                ],
            )
        if kind != b"D":
            raise POSKeyError(oid)
        data = payload[8:]
        self.served[bytes(oid)] = data
        return data, payload[:8]

    def __getattr__(self, name: str) -> Any:
        raise SandboxViolation(
            "a method cannot use the database directly",
            [f"storage.{name} is not available inside a method"],
        )


class IdentityPickler(pickle.Pickler):
    """Pickles a value with every persistent object in it but ``own`` as its identity: a
    change inside another persistent object is that object's, not ours. The persistent
    objects met are collected in ``met``."""

    def __init__(self, buffer: Any, own: object) -> None:
        super().__init__(buffer, protocol=5)
        self.own = own
        self.met: list[persistent.Persistent] = []

    def persistent_id(self, obj: Any) -> Any:
        if obj is not self.own and isinstance(obj, persistent.Persistent):
            self.met.append(obj)
            return id(obj)
        return None


def slot_digest(owner: object, value: Any, met: list[Any] | None = None) -> bytes:
    """A digest of one slot value: marshal at C speed for plain data, else a pickle with
    persistent objects as identities (collected into ``met``)."""
    try:
        # Version 2 has no back-references, so the bytes do not depend on reference counts.
        return hashlib.sha256(b"m" + marshal.dumps(value, 2)).digest()
    except ValueError:
        pass
    buffer = io.BytesIO()
    pickler = IdentityPickler(buffer, owner)
    try:
        pickler.dump(value)
    except Exception as exc:
        return f"unstorable {type(exc).__name__}".encode()
    if met is not None:
        met += pickler.met
    return hashlib.sha256(b"p" + buffer.getvalue()).digest()


def state_digests(obj: persistent.Persistent, state: Any = None) -> dict[str, bytes]:
    """A digest of each entry of ``obj``'s state (or of ``state``, e.g. a record's)."""
    if state is None:
        state = obj.__getstate__()
    if not isinstance(state, dict):
        return {"": slot_digest(obj, state)}
    return {name: slot_digest(obj, value) for name, value in state.items()}


#: Persistent objects the method's guards met in this child (id -> object); None in the host.
_touched: dict[int, Any] | None = None
#: Plain containers already searched for persistent objects in this call (kept alive, so an
#: id is never reused while it is here), and how many more members may be searched.
_searched: dict[int, Any] = {}
_search_budget = 0
#: Members searched per call: past it, containers are no longer looked into.
SEARCH_BUDGET = 1_000_000
_CONTAINERS = (list, tuple, set, frozenset, dict)
_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))  # type: ignore[var-annotated]  # dict views of any item types


def touch(value: Any) -> None:
    """Note the persistent objects a value is or holds (called by the sandbox's guards on
    what a method reads and iterates): after the call each is compared with its record.

    Plain containers are searched too, once per call each: what a loop or ``max(...)`` takes
    out of them reaches the method without passing another guard.
    """
    if _touched is None:
        return
    if isinstance(value, persistent.Persistent):
        _touched[id(value)] = value
    elif isinstance(value, (*_CONTAINERS, *_VIEWS)) and id(value) not in _searched:
        _search(value)


def _search(container: Any) -> None:
    global _search_budget
    assert _touched is not None
    todo = [container]
    while todo and _search_budget > 0:
        container = todo.pop()
        if id(container) in _searched:
            continue
        _searched[id(container)] = container
        if isinstance(container, _VIEWS):
            container = container.mapping
        members = container.values() if isinstance(container, dict) else container
        _search_budget -= len(members)
        # At C speed: only containers holding persistent objects or containers are walked.
        kinds = set(map(type, members))
        if not any(issubclass(k, (persistent.Persistent, *_CONTAINERS)) for k in kinds):
            continue
        for member in members:
            if isinstance(member, persistent.Persistent):
                _touched[id(member)] = member
            elif isinstance(member, _CONTAINERS):
                todo.append(member)


def _changed_in_place(
    jar: Any, storage: _HostStorage, skip: set[int], watched: set[int]
) -> tuple[list[Any], list[str]]:
    """Objects the method could have changed whose state differs from their record although
    none was marked changed: persistent containers to keep, and findings for prototypes.

    The candidates are the objects the guards met and those loaded during the call, and then
    everything a persistent container among them holds or held (a container hands out what
    it holds at C speed — ``min(stats.values())``, ``dict(mapping)`` — without a guard), and
    so on down. A prototype is not looked into: its slots are only reached through guarded
    reads. When a search of plain containers ran out of budget, every object in memory is a
    candidate. ``skip`` holds the receiver and its ancestors, whose slots ``call_checked``
    has already compared; ``watched`` the objects compared with their state at the fork.
    """
    kept: list[Any] = []
    findings: list[str] = []
    todo = [o for o in (_touched or {}).values() if o._p_jar is jar]
    todo += [o for o in map(jar._cache.get, storage.served) if o is not None]
    if _search_budget <= 0:
        todo += [o for _, o in jar._cache.lru_items()]
    seen: set[int] = set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj._p_changed is None or isinstance(obj, Method):
            continue  # seen, a ghost (never loaded here, so unchanged), or never written
        seen.add(id(obj))
        container = not isinstance(obj, UvmObject)
        compare = obj._p_changed is False and id(obj) not in skip and id(obj) not in watched
        if not (compare or container):
            continue
        if compare:
            oid = bytes(obj._p_oid)
            data = storage.served.get(oid)
            if data is None:  # loaded before the fork: its record is the host's
                data = storage.load(oid)[0]
            before, held = _digests_and_members(obj, jar._reader.getState(data))
            after, held_after = _digests_and_members(obj, obj.__getstate__())
            held += held_after
            if before != after:
                _in_place(obj, before, after, kept, findings)
        else:  # marked changed, so sent whole: only what it holds is looked at
            held = _members(obj, obj.__getstate__())
        if container:
            todo += [o for o in held if o._p_jar is jar and id(o) not in seen]
    return kept, findings


def _digests_and_members(obj: Any, state: Any) -> tuple[dict[str, bytes], list[Any]]:
    """``state_digests`` of ``obj`` in ``state``, and the persistent objects the state holds."""
    met: list[Any] = []
    if not isinstance(state, dict):
        return {"": slot_digest(obj, state, met)}, met
    return {name: slot_digest(obj, value, met) for name, value in state.items()}, met


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def _members(obj: Any, state: Any) -> list[Any]:
    """The persistent objects ``obj``'s state holds, each shared part visited once."""
    pickler = IdentityPickler(_Discard(), obj)
    try:
        pickler.dump(state)
    except Exception:  # a value the image cannot store: the report refuses it
        pass
    return pickler.met


def _in_place(
    obj: Any, before: dict[str, bytes], after: dict[str, bytes], kept: list, findings: list
) -> None:
    """What becomes of an object changed without being marked: kept, or a finding."""
    if isinstance(obj, (PersistentList, PersistentMapping)):
        kept.append(obj)
    elif isinstance(obj, UvmObject):
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name) and not name.startswith("_"):
                findings.append(
                    f"persistence covenant: {obj!r}.{name} changed in place without "
                    f"being assigned, so the change would be lost; assign the slot after "
                    f"changing it ('obj.{name} = value')"
                )
    else:
        findings.append(f"the method changed a {type(obj).__name__}, which it may not write")


def _child_main(
    to_host: int,
    from_host: int,
    run: Callable[[], Any],
    jar: Any,
    known: dict[int, int],
    watched: list[persistent.Persistent],
    skip: set[int],
    seconds: float,
    memory_mb: int,
    address_space: int,
) -> None:
    global _in_child, _child_limits, _touched, _search_budget
    _in_child = True
    _child_limits = (seconds, memory_mb)
    status = 70
    try:
        # A crash here is an expected outcome, reported by the host: it must not print the
        # host's stack (inherited from the fork) anywhere.
        faulthandler.disable()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        confine.confine(
            to_host, from_host, address_space=address_space, cpu_seconds=int(seconds) + 2
        )
        to_host, from_host = confine.TO_HOST_FD, confine.FROM_HOST_FD
        storage = None
        registered_before = 0
        if jar is not None:
            storage = _HostStorage(to_host, from_host)
            jar._storage = jar._normal_storage = storage
            registered_before = len(jar._registered_objects)
            watched = [*jar._registered_objects, *watched]
        _touched = {}
        _search_budget = SEARCH_BUDGET
        digests = {id(o): state_digests(o) for o in watched}
        try:
            result = run()
            changed = [o for o in watched if state_digests(o) != digests[id(o)]]
            if jar is not None:
                assert storage is not None  # made above whenever there is a jar
                kept, findings = _changed_in_place(jar, storage, skip, {id(o) for o in watched})
                if findings:
                    raise SandboxViolation("the method broke a rule of the image", findings)
                seen = {id(o) for o in changed}
                for obj in [*jar._registered_objects[registered_before:], *kept]:
                    if id(obj) not in seen:
                        seen.add(id(obj))
                        changed.append(obj)
            message = _encode_report(result, changed, known, jar)
        except BaseException as exc:
            _send(to_host, b"E", _error_report(exc))
            status = 0
            return
        _send(to_host, b"R", message)
        status = 0
    except BaseException as exc:
        try:
            _send(to_host, b"E", _error_report(exc))
            status = 0
        except BaseException:
            status = 71
    finally:
        os._exit(status)


def _encode_report(result: Any, changed: list[Any], known: dict[int, int], jar: Any) -> bytes:
    """The child's report (a forged one is what a child that escaped every guard would send)."""
    try:
        return report.Encoder(known, jar).report(result, changed)
    except report.Unsendable as exc:
        text = str(exc)
        too_large = isinstance(exc, report.TooLarge)
        limits = (
            f"at most {report.MAX_NODES:,} items, shared parts counted each time they appear, "
            f"and integers of at most {report.MAX_INT_BITS:,} bits"
        )
        if text.startswith("the method returned"):
            hint = (
                f"return less: a value may hold {limits}"
                if too_large
                else "return plain data (numbers, strings, lists, dicts, sets, tuples) or "
                "prototypes, not iterators, generators or functions"
            )
            raise SandboxViolation(
                "the method's result cannot leave the sandbox", [f"{text}: {hint}"]
            ) from None
        hint = (
            f"store less: a slot may hold {limits}; nothing was stored"
            if too_large
            else "slots may hold plain data (numbers, strings, lists, dicts, sets, tuples) and "
            "prototypes only"
        )
        raise SandboxViolation(
            "the method stored a value the image cannot keep", [f"{text}: {hint}"]
        ) from None


def _error_report(exc: BaseException) -> bytes:
    frames = traceback.extract_tb(exc.__traceback__)
    where = [
        f"line {f.lineno}: {f.line}" if f.line else f"line {f.lineno}"
        for f in frames
        if f.filename.startswith("<method")
    ]
    reason = getattr(exc, "reason", None)
    message = reason if isinstance(reason, str) else exception_text(exc, report.MAX_ERROR_TEXT)
    return report.error_report(
        type(exc).__name__,
        [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"],
        message,
        [str(f) for f in list(getattr(exc, "findings", []) or [])],
        where[-1] if where else "",
    )


# -- the host -------------------------------------------------------------------------------------


def _known_objects(roots: list[Any], jar: Any) -> list[Any]:
    """The objects a child may name by token: the call's prototypes, the caller's pending
    changes (which may not have an oid yet), every unsaved persistent object they reach, and
    the methods of all of them."""
    known: list[Any] = []
    seen: set[int] = set()
    pending = list(jar._registered_objects) + list(jar._added.values()) if jar else []
    todo = [*roots, *pending]
    while todo:
        obj = todo.pop()
        if not isinstance(obj, persistent.Persistent) or id(obj) in seen:
            continue
        seen.add(id(obj))
        known.append(obj)
        if isinstance(obj, UvmObject):
            for method in obj.__dict__.get("_methods", {}).values():
                if id(method) not in seen:
                    seen.add(id(method))
                    known.append(method)
        if obj._p_jar is None and isinstance(obj, WRITABLE):
            # Unsaved objects have no record to compare with: the child watches each one
            # it could reach, so a change inside any of them is sent, not lost.
            met: list[Any] = []
            for name, value in obj.__getstate__().items():
                if name != "_methods":
                    slot_digest(obj, value, met)
            todo += [o for o in met if o._p_jar is None]
    return known


def run(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    *,
    seconds: float,
    memory_mb: int,
    apply: bool = True,
) -> Any:
    """``fn(*args, **kwargs)`` in a forked child; its result, its changes applied if ``apply``.

    Raises what the method raised (ordinary exceptions as their built-in type, with the line),
    ``SandboxViolation`` for a policy breach, a crash or a report the host refuses, and
    ``SandboxLimitExceeded`` when the child ran out of time or memory.
    """
    confine.require_supported()
    receiver = args[0] if args and isinstance(args[0], UvmObject) else None
    roots: list[Any] = []
    if receiver is not None:
        receiver._p_activate()
        roots = [receiver, *receiver._ancestors()]
    roots += _persistent_in((*args[1:], *kwargs.values()))
    jars = {id(o._p_jar): o._p_jar for o in roots if o._p_jar is not None}
    jar = next(iter(jars.values()), None)
    known = _known_objects(roots, jar)
    tokens = {id(o): i for i, o in enumerate(known)}
    watched = [o for o in known if o._p_jar is None and isinstance(o, WRITABLE)]
    to_host_r, to_host_w = os.pipe()
    from_host_r, from_host_w = os.pipe()
    # Measured here: the child's address space is the host's at the fork, and reading it
    # there would cost the child a file and its page faults.
    address_space = metrics.address_space() + memory_mb * 1024 * 1024
    deadline = time.monotonic() + seconds + GRACE_SECONDS
    pid = os.fork()
    if pid == 0:
        os.close(to_host_r)
        os.close(from_host_w)
        _child_main(
            to_host_w,
            from_host_r,
            lambda: fn(*args, **kwargs),
            jar,
            tokens,
            watched,
            {id(o) for o in roots if isinstance(o, UvmObject)},
            seconds,
            memory_mb,
            address_space,
        )
    os.close(to_host_w)
    os.close(from_host_r)
    served: dict[bytes, bytes] = {}
    reaped = False
    _reap_finished()
    try:
        os.set_blocking(to_host_r, False)
        os.set_blocking(from_host_w, False)
        try:
            reach = _Reach(known, jar)
            kind, payload = _serve(to_host_r, from_host_w, jar, served, reach, deadline)
        except TimeoutError:
            raise SandboxLimitExceeded(
                f"the method ran longer than {seconds:g} s and its process was stopped",
                [f"time limit of {seconds:g} s exceeded: avoid unbounded loops and huge work"],
            ) from None
        except _Oversized as exc:
            raise SandboxViolation(
                "the host refused what the method sent back",
                [f"{exc}, over the limit of {exc.limit:,}: return or store less"],
            ) from None
        except (_ChildGone, OSError, struct.error):
            reaped = True
            raise _death(_kill(pid), memory_mb) from None
    finally:
        # Every way out kills the child: one that reported has nothing left to do, and one
        # that lingers (or escaped and stalls) must not outlive the call.
        if not reaped:
            _kill_and_reap_later(pid)
        os.close(to_host_r)
        os.close(from_host_w)
    if kind == b"E":
        raise _rebuild_error(payload)
    outcome = _decode(payload, known, jar, served, deadline)
    for obj, state in outcome.news:  # new objects: nothing else refers to them yet
        obj.__setstate__(state)
    if apply:
        for obj, state in outcome.states:
            if obj._p_jar is not None:
                obj._p_activate()
            if isinstance(obj, UvmObject):  # private slots never travel: the host keeps its own
                state.update(
                    (k, v)
                    for k, v in obj.__dict__.items()
                    if k[:1] == "_" and k != "_methods" and not k.startswith(("_p_", "_v_"))
                )
            obj.__setstate__(state)
            obj._p_changed = True
    return outcome.result


def _serve(
    inbox: int,
    outbox: int,
    jar: Any,
    served: dict[bytes, bytes],
    reach: _Reach,
    deadline: float,
) -> tuple[bytes, bytearray]:
    """Answer the child's loads until it reports; every step within the deadline.

    Only records the child could reach from what it was given are served: a child that
    escaped RestrictedPython could otherwise ask for any oid (the root's among them), and the
    report's decoder accepts references to every record served, so it could rewrite any."""
    while True:
        kind, payload = _recv_from_child(inbox, deadline)
        if kind in (b"R", b"E"):
            return kind, payload
        if jar is None or len(payload) != 8:
            raise _ChildGone("a load request without a database")
        oid = bytes(payload)
        if oid not in reach:
            _send(outbox, b"X", UNREACHABLE, deadline)
            continue
        try:
            data, serial = jar._storage.load(oid)
        except Exception as exc:  # an unknown oid: the child gets a POSKeyError
            _send(outbox, b"X", str(exc).encode()[:200], deadline)
            continue
        served[oid] = data
        reach.walked(data)
        _send(outbox, b"D", bytes(serial) + data, deadline)


class _Reach:
    """The oids a child may load: the objects it was given, the objects their states name,
    and, as records are served, the objects those name (the closure it could walk to).

    The child also starts with every object the host had loaded: one it reaches through
    such an object's state needs no record served on the way. A load outside the cheap set
    widens it by that closure through the host's loaded objects, from what it was given and
    from every record served so far (again only once more records were served)."""

    def __init__(self, known: list[Any], jar: Any) -> None:
        self.known = known
        self.jar = jar
        self.oids = _named_by(known, jar)
        self.walked_oids: set[bytes] = set()
        self.widened_at = -1

    def __contains__(self, oid: bytes) -> bool:
        if oid not in self.oids and self.widened_at != len(self.walked_oids):
            self.widened_at = len(self.walked_oids)
            loaded = [self.jar.get(o) for o in self.walked_oids] if self.jar is not None else []
            self.oids |= _loaded_closure([*self.known, *loaded], self.jar)
        return oid in self.oids

    def walked(self, data: bytes) -> None:
        from ZODB.serialize import referencesf

        named = referencesf(data)
        self.oids.update(named)
        self.walked_oids.update(named)


def _persistent_in(values: tuple[Any, ...]) -> list[Any]:
    """The persistent objects among ``values`` and inside their containers (a list of
    prototypes passed as one argument): each is given to the method as the others are."""
    found = [v for v in values if isinstance(v, persistent.Persistent)]
    plain = tuple(v for v in values if not isinstance(v, persistent.Persistent))
    if plain:
        pickler = IdentityPickler(io.BytesIO(), None)
        try:
            pickler.dump(plain)
        except Exception:  # an argument that does not pickle holds nothing to load
            return found
        found += pickler.met
    return found


def _loaded_closure(known: list[Any], jar: Any) -> set[bytes]:
    """The oids reachable from ``known`` through the states of objects the host has loaded
    (a ghost ends a path: its record, once served, names what lies past it)."""
    oids: set[bytes] = set()
    seen: set[int] = set()
    todo = [o for o in known if isinstance(o, persistent.Persistent)]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if obj._p_oid is not None:
            oids.add(bytes(obj._p_oid))
        if obj._p_jar is not jar or jar is None or obj._p_state == persistent.GHOST:
            continue
        pickler = IdentityPickler(io.BytesIO(), obj)
        try:
            pickler.dump(obj.__getstate__())
        except Exception:  # a state that does not pickle: nothing reached through it
            continue
        todo += pickler.met
    return oids


def _named_by(known: list[Any], jar: Any) -> set[bytes]:
    """The oids of ``known`` objects and of the persistent objects their states hold."""
    named: set[bytes] = set()
    for obj in known:
        if obj._p_oid is not None:
            named.add(bytes(obj._p_oid))
        if isinstance(obj, persistent.Persistent) and obj._p_jar is jar and jar is not None:
            met: list[Any] = []
            state = obj.__getstate__() if obj._p_state != persistent.GHOST else {}
            for value in state.values() if isinstance(state, dict) else ():
                slot_digest(obj, value, met)
            named.update(bytes(o._p_oid) for o in met if o._p_oid is not None)
    return named


def _kill(pid: int) -> int:
    """Kill the child and wait for it: its exit status, to say why it died."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:  # reaped by someone else's wait(): it is gone either way
        return 0


_unreaped: list[int] = []
_unreaped_lock = threading.Lock()


def _kill_and_reap_later(pid: int) -> None:
    """Kill the child without waiting for it: the kernel tearing down a fork of a large host
    takes milliseconds that the caller need not spend. It is reaped on a later call (or at
    exit); until then it is a zombie that holds nothing but its process id."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    with _unreaped_lock:
        _unreaped.append(pid)


def _reap_finished() -> None:
    with _unreaped_lock:
        for pid in list(_unreaped):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                _unreaped.remove(pid)


@atexit.register
def _reap_all() -> None:
    with _unreaped_lock:
        for pid in _unreaped:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        _unreaped.clear()


def _death(status: int, memory_mb: int) -> GeneratedCodeError:
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        if sig == "SIGXCPU":
            return SandboxLimitExceeded(
                "the method used up its CPU time and was stopped",
                ["CPU time limit exceeded: avoid huge computations"],
            )
        return SandboxViolation(
            f"the method's process died of {sig}",
            [
                f"the method crashed its process ({sig}): it built something too deep or too "
                f"large for the interpreter (memory limit {memory_mb} MiB)"
            ],
        )
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return SandboxViolation(
        "the method's process ended without a verdict",
        [f"the method ended its process (exit status {code}) before it could report"],
    )


def _decode(
    payload: bytes | bytearray,
    known: list[Any],
    jar: Any,
    served: dict[bytes, bytes],
    deadline: float | None = None,
) -> report.Report:
    """The report, checked in full (by ``deadline`` if given); ``SandboxViolation`` if any
    part of it is refused."""
    resolver = _OidResolver(known, jar, served)
    try:
        return report.Decoder(known, resolver, deadline).report(payload)
    except report.ReportRefused as exc:
        why = str(exc)
    except (ArithmeticError, LookupError, TypeError, ValueError, RecursionError) as exc:
        # The decoder refuses every report it can name a rule for (the fuzz test holds it to
        # that); anything else it meets is still a refusal, never an error of the host.
        log.warning("an unforeseen report was refused", exc_info=True)
        why = f"it is malformed ({type(exc).__name__})"
    raise SandboxViolation(
        "the host refused what the method sent back", [f"its report could not be used: {why}"]
    )


class _OidResolver:
    """Whether an oid is one the child could have been given: a record the host served, an
    object such a record or a known object's state names, or a known object itself."""

    def __init__(self, known: list[Any], jar: Any, served: dict[bytes, bytes]) -> None:
        self.known = known
        self.jar = jar
        self.served = served
        self.named: set[bytes] | None = None

    def __call__(self, oid: bytes) -> Any:
        if self.jar is None:
            return None
        if oid not in self.served and oid not in self._named():
            return None
        return self.jar.get(oid)

    def _named(self) -> set[bytes]:
        if self.named is None:
            from ZODB.serialize import referencesf

            named = _named_by(self.known, self.jar)
            for data in self.served.values():
                named.update(referencesf(data))
            self.named = named
        return self.named


def stopped_iteration(name: str, message: str) -> RuntimeError:
    """A method's ``StopIteration`` as the caller gets it: a ``RuntimeError``, as PEP 479 does
    for generators. Raised as itself, it would end whatever loop of the host's made the call
    (``map``, ``next``, a generator) as if it were done, without a word."""
    return RuntimeError(f"the method raised {name}" + (f": {message}" if message else ""))


def _rebuild_error(payload: bytes | bytearray) -> BaseException:
    """The child's exception as the host raises it: our errors as themselves, ordinary ones
    as their nearest built-in type, with the line of the method that raised."""
    from batos import errors

    try:
        found = report.decode_error(payload)
    except report.ReportRefused:
        return SandboxViolation("the method's process sent an unreadable error report")
    ours = getattr(errors, found.name, None)
    if isinstance(ours, type) and issubclass(ours, GeneratedCodeError):
        return ours(found.message, found.findings)
    import builtins

    if {found.name, *found.bases} & {"StopIteration", "StopAsyncIteration"}:
        stopped = stopped_iteration(found.name, found.message)
        if found.where:
            stopped.add_note(f"at {found.where}")
        return stopped
    for base in found.bases:
        cls = getattr(builtins, base, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(found.message)
            except Exception:  # a built-in type whose constructor wants other arguments
                continue
            if found.where:
                exc.add_note(f"at {found.where}")
            return exc
    return SandboxViolation(
        f"the method raised {found.name}, which the sandbox contains",
        [f"{found.name} may not leave a method: raise an Exception subclass"],
    )
