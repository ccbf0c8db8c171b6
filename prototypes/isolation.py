"""Process isolation: a generated method runs in a forked child, never in the host process.

Each outermost call of a sandboxed method forks. The child holds a copy-on-write copy of every
object, runs the method under OS limits (``RLIMIT_AS``, ``RLIMIT_CPU``, a wall-clock kill) and
the in-process guards, then reports back over a pipe: the result and the new state of every
object the method changed. The host applies that state only after checking it, so whatever the
code does in the child — segfault the interpreter, spin in C, exhaust memory, ``os._exit`` —
the host sees an error and its objects are as they were.

The child has no database of its own. When it touches an object the host had not loaded, its
connection asks the host for the object's record over the pipe (``_HostStorage``); the host
answers from its own connection, so the child sees exactly what the caller's transaction sees,
uncommitted changes included.

The report is a pickle, and the host does not trust it: a child that escaped every in-process
guard could write any bytes. ``_ReportUnpickler`` builds only plain data types and prototypes
(no functions, no ``Method``), resolves references only to objects the child could have
reached, and the states it returns are checked before any is applied.
"""

from __future__ import annotations

import faulthandler
import hashlib
import io
import json
import os
import pickle
import resource
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import persistent
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping

from batos.errors import GeneratedCodeError, SandboxLimitExceeded, SandboxViolation
from prototypes.uvm import Method, UvmObject

#: Extra seconds a child gets beyond the call's time limit before it is killed.
GRACE_SECONDS = 1.0
#: Largest report (result + changed state) a child may send back.
MAX_REPORT_BYTES = 64 * 1024 * 1024

#: Classes that may cross from a child to the host by value: plain data and prototypes.
SAFE_CLASSES: dict[tuple[str, str], type] = {
    (cls.__module__, cls.__qualname__): cls
    for cls in (
        set,
        frozenset,
        complex,
        slice,
        range,
        bytearray,
        PersistentList,
        PersistentMapping,
        UvmObject,
        __import__("collections").OrderedDict,
        __import__("collections").Counter,
        __import__("collections").defaultdict,
        __import__("collections").deque,
        __import__("datetime").date,
        __import__("datetime").datetime,
        __import__("datetime").timedelta,
        __import__("datetime").timezone,
        __import__("datetime").time,
    )
}
#: Objects whose state the host accepts from a child.
WRITABLE = (UvmObject, PersistentList, PersistentMapping)

_in_child = False


def inside_child() -> bool:
    """Whether this process is an isolation child (nested calls then run in place)."""
    return _in_child


# -- framing --------------------------------------------------------------------------------------

_HEADER = struct.Struct(">cI")


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


def _read_exact(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise _ChildGone("pipe closed")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _recv(fd: int) -> tuple[bytes, bytes]:
    kind, size = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if size > MAX_REPORT_BYTES:
        raise _ChildGone(f"a message of {size} bytes exceeds {MAX_REPORT_BYTES}")
    return kind, _read_exact(fd, size)


# -- the child ------------------------------------------------------------------------------------


class _HostStorage:
    """The child's storage: each record it needs is asked of the host over the pipe."""

    def __init__(self, to_host: int, from_host: int) -> None:
        self.to_host = to_host
        self.from_host = from_host

    def load(self, oid: bytes, version: str = "") -> tuple[bytes, bytes]:
        from ZODB.POSException import POSKeyError

        _send(self.to_host, b"L", bytes(oid))
        kind, payload = _recv(self.from_host)
        if kind != b"D":
            raise POSKeyError(oid)
        return payload[8:], payload[:8]

    def __getattr__(self, name: str) -> Any:
        raise SandboxViolation(
            "a method cannot use the database directly",
            [f"storage.{name} is not available inside a method"],
        )


def _state_digest(obj: persistent.Persistent) -> bytes:
    buffer = io.BytesIO()
    try:
        IdentityPickler(buffer, obj).dump(obj.__getstate__())
    except Exception as exc:
        return f"unstorable {type(exc).__name__}".encode()
    return hashlib.sha256(buffer.getvalue()).digest()


class IdentityPickler(pickle.Pickler):
    """Pickles a value with every persistent object in it but ``own`` as its identity: a
    change inside another persistent object is that object's, not ours."""

    def __init__(self, buffer: io.BytesIO, own: object) -> None:
        super().__init__(buffer, protocol=5)
        self.own = own

    def persistent_id(self, obj: Any) -> Any:
        if obj is not self.own and isinstance(obj, persistent.Persistent):
            return id(obj)
        return None


class _ReportPickler(pickle.Pickler):
    """What the child sends: references to objects the host has, everything new by value."""

    def __init__(self, buffer: io.BytesIO, known: dict[int, Any], jar: Any) -> None:
        super().__init__(buffer, protocol=5)
        self.known = known
        self.jar = jar

    def persistent_id(self, obj: Any) -> Any:
        if id(obj) in self.known:
            return ("known", id(obj))
        if isinstance(obj, persistent.Persistent) and obj._p_oid is not None:
            if obj._p_jar is not self.jar:
                raise _Unsendable(f"a {type(obj).__name__} of another database connection")
            return ("oid", bytes(obj._p_oid))
        return None

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if isinstance(obj, type) or not _safe_class(cls):
            raise _Unsendable(f"a {cls.__module__}.{cls.__qualname__} object")
        return NotImplemented


class _Unsendable(Exception):
    pass


def _safe_class(cls: type) -> bool:
    if (cls.__module__, cls.__qualname__) in SAFE_CLASSES:
        return True
    if issubclass(cls, UvmObject):
        return cls.__module__.split(".")[0] == "prototypes"
    return issubclass(cls, Exception) and cls.__module__ == "builtins"


def _child_main(
    to_host: int,
    from_host: int,
    run: Callable[[], Any],
    jar: Any,
    known: dict[int, Any],
    seconds: float,
    memory_mb: int,
) -> None:
    global _in_child
    _in_child = True
    status = 70
    try:
        # A crash here is an expected outcome, reported by the host: it must not print the
        # host's stack (inherited from the fork) to the shared stderr.
        faulthandler.disable()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        extra = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (_address_space() + extra,) * 2)
        cpu = int(seconds) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        registered_before = 0
        watched: list[persistent.Persistent] = []
        if jar is not None:
            jar._storage = jar._normal_storage = _HostStorage(to_host, from_host)
            registered_before = len(jar._registered_objects)
            watched = list(jar._registered_objects)
        watched += [
            o
            for o in known.values()
            if isinstance(o, WRITABLE) and getattr(o, "_p_jar", None) is None
        ]
        digests = {id(o): _state_digest(o) for o in watched}
        try:
            result = run()
        except BaseException as exc:
            _send(to_host, b"E", _error_report(exc))
            status = 0
            return
        changed = [o for o in watched if _state_digest(o) != digests[id(o)]]
        if jar is not None:
            seen = {id(o) for o in changed}
            for obj in jar._registered_objects[registered_before:]:
                if id(obj) not in seen:
                    seen.add(id(obj))
                    changed.append(obj)
        _send(to_host, b"R", _report(result, changed, known, jar))
        status = 0
    except BaseException as exc:
        try:
            _send(to_host, b"E", _error_report(exc))
            status = 0
        except BaseException:
            status = 71
    finally:
        os._exit(status)


def _report(result: Any, changed: list[Any], known: dict[int, Any], jar: Any) -> bytes:
    """One pickle stream: the result, then [(reference, state)] of every changed object.

    One pickler for both keeps identity: a list the result shares with a slot is one list
    in the host too.
    """
    buffer = io.BytesIO()
    pickler = _ReportPickler(buffer, known, jar)
    try:
        pickler.dump(result)
    except (_Unsendable, pickle.PicklingError, TypeError, AttributeError) as exc:
        raise SandboxViolation(
            "the method's result cannot leave the sandbox",
            [
                f"the method returned {_describe_unsendable(exc)}: return plain data (numbers, "
                "strings, lists, dicts, sets, tuples) or prototypes, not iterators, generators "
                "or functions"
            ],
        ) from None
    # New objects (no reference) travel by value inside whatever refers to them.
    states = [
        (obj, obj.__getstate__()) for obj in changed if pickler.persistent_id(obj) is not None
    ]
    try:
        pickler.dump(states)
    except (_Unsendable, pickle.PicklingError, TypeError, AttributeError):
        for obj in changed:
            try:
                _ReportPickler(io.BytesIO(), known, jar).dump(obj.__getstate__())
            except (_Unsendable, pickle.PicklingError, TypeError, AttributeError) as exc:
                raise SandboxViolation(
                    "the method stored a value the image cannot keep",
                    [
                        f"a slot of {_safe_repr(obj)} now holds {_describe_unsendable(exc)}: "
                        "slots may hold plain data (numbers, strings, lists, dicts, sets, "
                        "tuples) and prototypes only"
                    ],
                ) from None
        raise
    return buffer.getvalue()


def _describe_unsendable(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, _Unsendable):
        return text
    return f"something that cannot be stored ({type(exc).__name__}: {text})"


def _safe_repr(obj: Any) -> str:
    try:
        return repr(obj)
    except Exception:
        return f"<{type(obj).__name__}>"


def _error_report(exc: BaseException) -> bytes:
    frames = traceback.extract_tb(exc.__traceback__)
    where = [
        f"line {f.lineno}: {f.line}" if f.line else f"line {f.lineno}"
        for f in frames
        if f.filename.startswith("<method")
    ]
    report = {
        "class": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"],
        "message": getattr(exc, "reason", None) or str(exc),
        "findings": list(getattr(exc, "findings", []) or []),
        "where": where[-1] if where else "",
    }
    return json.dumps(report).encode()[:MAX_REPORT_BYTES]


def _address_space() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


# -- the host -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a child reported: the result and the states to apply (already checked)."""

    result: Any
    states: list[tuple[Any, dict[str, Any]]]


class _ReportUnpickler(pickle.Unpickler):
    """Builds only safe classes, and resolves only references the child could hold."""

    def __init__(self, data: bytes, known: dict[int, Any], jar: Any, served: set[bytes]) -> None:
        super().__init__(io.BytesIO(data))
        self.known = known
        self.jar = jar
        self.served = served

    def find_class(self, module: str, name: str) -> Any:
        cls = SAFE_CLASSES.get((module, name))
        if cls is not None:
            return cls
        if module == "builtins":
            found = getattr(__import__("builtins"), name, None)
            if isinstance(found, type) and issubclass(found, Exception):
                return found
        if module.split(".")[0] == "prototypes" and module in sys.modules:
            found = getattr(sys.modules[module], name, None)
            if isinstance(found, type) and issubclass(found, UvmObject):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} may not leave the sandbox")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 2):
            raise pickle.UnpicklingError("malformed reference")
        kind, value = pid
        if kind == "known" and isinstance(value, int) and value in self.known:
            return self.known[value]
        if kind == "oid" and isinstance(value, bytes) and self.jar is not None:
            reachable = (
                value in self.served
                or self.jar._cache.get(value) is not None
                or value in self.jar._added
            )
            if reachable:
                return self.jar.get(value)
        raise pickle.UnpicklingError(f"reference {kind}:{value!r} was never given to the method")


def _check_state(obj: Any, state: Any) -> None:
    if not isinstance(obj, WRITABLE):
        raise SandboxViolation(
            "the method changed an object it may not write",
            [f"a {type(obj).__name__} cannot be changed by a method"],
        )
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise SandboxViolation(
            "the method sent a malformed object state",
            ["an object's state must be a mapping of slot names"],
        )
    if any(k.startswith(("_p_", "_v_")) for k in state):
        raise SandboxViolation(
            "the method sent a malformed object state",
            ["private persistence attributes cannot be set by a method"],
        )
    if isinstance(obj, UvmObject):
        # A Method cannot be built from a report (it is not a safe class), so every one
        # here is an existing method the child kept, moved or left out.
        methods = state.get("_methods")
        if not isinstance(methods, dict) or not all(
            isinstance(m, Method) and m.selector == name for name, m in methods.items()
        ):
            raise SandboxViolation(
                "the method sent a malformed object state",
                ["methods can only be kept or removed by a method"],
            )
    elif set(state) - {"data"}:
        raise SandboxViolation(
            "the method sent a malformed object state",
            ["a persistent container's state holds only its data"],
        )


def _known_objects(roots: list[Any], jar: Any) -> dict[int, Any]:
    """The objects a child may name by identity: the call's prototypes, the caller's pending
    changes (which may not have an oid yet), and the methods either of them holds."""
    known: dict[int, Any] = {}
    pending = list(jar._registered_objects) + list(jar._added.values()) if jar else []
    for obj in [*roots, *pending]:
        if isinstance(obj, persistent.Persistent) and id(obj) not in known:
            known[id(obj)] = obj
            if isinstance(obj, UvmObject):
                for method in obj.__dict__.get("_methods", {}).values():
                    known[id(method)] = method
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
    receiver = args[0] if args and isinstance(args[0], UvmObject) else None
    roots: list[Any] = []
    if receiver is not None:
        receiver._p_activate()
        roots = [receiver, *receiver._ancestors()]
    roots += [a for a in (*args[1:], *kwargs.values()) if isinstance(a, persistent.Persistent)]
    jars = {id(o._p_jar): o._p_jar for o in roots if o._p_jar is not None}
    jar = next(iter(jars.values()), None)
    known = _known_objects(roots, jar)
    to_host_r, to_host_w = os.pipe()
    from_host_r, from_host_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(to_host_r)
        os.close(from_host_w)
        _child_main(
            to_host_w, from_host_r, lambda: fn(*args, **kwargs), jar, known, seconds, memory_mb
        )
    os.close(to_host_w)
    os.close(from_host_r)
    os.set_blocking(from_host_w, False)
    served: set[bytes] = set()
    try:
        kind, payload = _serve(
            pid, to_host_r, from_host_w, jar, served, seconds + GRACE_SECONDS, memory_mb
        )
    finally:
        os.close(to_host_r)
        os.close(from_host_w)
    if kind == b"E":
        raise _rebuild_error(payload)
    outcome = _unpack(payload, known, jar, served)
    if apply:
        for obj, state in outcome.states:
            if obj._p_jar is not None:
                obj._p_activate()
            obj.__setstate__(state)
            obj._p_changed = True
    return outcome.result


def _serve(
    pid: int, inbox: int, outbox: int, jar: Any, served: set[bytes], timeout: float, memory_mb: int
) -> tuple[bytes, bytes]:
    """Answer the child's loads until it reports; kill it at the deadline."""
    deadline = time.monotonic() + timeout
    verdict: tuple[bytes, bytes] | None = None
    try:
        while verdict is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([inbox], [], [], left)
            if not ready:
                continue
            kind, payload = _recv(inbox)
            if kind == b"L" and jar is not None and len(payload) == 8:
                try:
                    data, serial = jar._storage.load(payload)
                except Exception as exc:  # an unknown oid: the child gets a POSKeyError
                    _send(outbox, b"X", str(exc).encode()[:200], deadline)
                    continue
                served.add(payload)
                _send(outbox, b"D", bytes(serial) + data, deadline)
            elif kind in (b"R", b"E"):
                verdict = (kind, payload)
            else:
                raise _ChildGone(f"unexpected message {kind!r}")
    except TimeoutError:
        _kill(pid)
        raise SandboxLimitExceeded(
            f"the method ran longer than {timeout - GRACE_SECONDS:g} s and its process was stopped",
            [
                f"time limit of {timeout - GRACE_SECONDS:g} s exceeded: avoid unbounded loops "
                "and huge computations"
            ],
        ) from None
    except (_ChildGone, OSError, struct.error):
        status = _kill(pid)
        raise _death(status, memory_mb) from None
    except BaseException:  # the host was interrupted (Ctrl-C…): the child must not linger
        _kill(pid)
        raise
    os.waitpid(pid, 0)
    return verdict


def _kill(pid: int) -> int:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return os.waitpid(pid, 0)[1]


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


def _unpack(payload: bytes, known: dict[int, Any], jar: Any, served: set[bytes]) -> Outcome:
    unpickler = _ReportUnpickler(payload, known, jar, served)
    try:
        result = unpickler.load()
        states = unpickler.load()
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        KeyError,
        IndexError,
    ) as exc:
        raise SandboxViolation(
            "the host refused what the method sent back",
            [f"its report could not be read safely: {exc}"],
        ) from None
    if not isinstance(states, list):
        raise SandboxViolation(
            "the host refused what the method sent back", ["its report is malformed"]
        )
    for entry in states:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise SandboxViolation(
                "the host refused what the method sent back", ["its report is malformed"]
            )
        _check_state(*entry)
    return Outcome(result, states)


def _rebuild_error(payload: bytes) -> BaseException:
    """The child's exception as the host raises it: our errors as themselves, ordinary ones
    as their nearest built-in type, with the line of the method that raised."""
    from batos import errors

    try:
        report = json.loads(payload)
        name, message = str(report["class"]), str(report["message"])
        findings = [str(f) for f in report.get("findings", [])]
        mro = [str(n) for n in report.get("mro", [])]
        where = str(report.get("where", ""))
    except (ValueError, KeyError, TypeError):
        return SandboxViolation("the method's process sent an unreadable error report")
    ours = getattr(errors, name, None)
    if isinstance(ours, type) and issubclass(ours, GeneratedCodeError):
        return ours(message, findings)
    import builtins

    for base in mro:
        cls = getattr(builtins, base, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            exc = cls(message)
            if where:
                exc.add_note(f"at {where}")
            return exc
    return SandboxViolation(
        f"the method raised {name}, which the sandbox contains",
        [f"{name} may not leave a method: raise an Exception subclass"],
    )
