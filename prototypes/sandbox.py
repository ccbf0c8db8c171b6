"""The sandbox: how method source that BAT OS did not write by hand is compiled and run.

Every method with ``compiler="sandbox"`` goes through ``compile_sandboxed`` — when it is first
installed and again each time it is loaded from the image — and every call of it goes through
``call_limited``. Layers, outermost first:

1. **PersistenceGuardian** (``guardian``): a static audit; the source is refused if it has
   any finding.
2. **RestrictedPython** with BAT OS's policy: attribute reads go through ``_getattr_``, item
   reads through ``_getitem_``, attribute and item writes through ``_write_``, iteration and
   unpacking through guards; ``**``, ``*`` and ``<<`` go through ``_binop_`` which refuses
   results larger than ``MAX_RESULT_ITEMS`` items / ``MAX_INT_BITS`` bits; ``range`` is capped;
   the builtins are a small fixed set; ``import`` reaches only curated, read-only namespaces of
   a few modules (``guardian.ALLOWED_IMPORTS``).
3. **Run-time limits**, per outermost call: a watchdog thread raises a ``BaseException`` the
   code cannot name (so cannot catch) into the calling thread every few milliseconds once
   ``sandbox_seconds`` are up; the address-space limit (``RLIMIT_AS``) is lowered to current
   use + ``sandbox_memory_mb``, so a large allocation fails with ``MemoryError``; every
   ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, …) that leaves
   the code becomes a ``SandboxViolation``.
4. **Checks after each call** (``call_checked``): the persistence covenant on the receiver and
   its ancestors (a slot whose value changed must have been assigned), every slot the call
   wrote must be storable in the image, and the result must be a value, not an iterator,
   generator or function that would run code later, outside every limit.
5. **Process isolation** (``prototypes.isolation``, ``BATOS_SANDBOX_ISOLATION=process``, the
   default): every outermost call runs in a forked child that confines itself
   (``prototypes.confine``) and reports its result and changed states as bounded data
   (``prototypes.report``), which the host checks in full before applying any. A method's
   trial before installation runs the same way and applies nothing.

What it guarantees with process isolation, and what it does not, is written once, in
docs/self-extension.md. With ``BATOS_SANDBOX_ISOLATION=host`` calls run in the host
process (no fork): a single slow C-level operation then cannot be interrupted, the memory limit
is process-wide while a call runs, an interpreter crash takes the host down, a method that
breaks the covenant has already changed the objects in memory when its error is raised, and a
change inside a persistent container reached through a slot is not looked for.
"""

from __future__ import annotations

import ast
import collections.abc
import ctypes
import hashlib
import io
import linecache
import logging
import marshal
import os
import re
import resource
import threading
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from RestrictedPython import compile_restricted_exec
from RestrictedPython.Guards import guarded_iter_unpack_sequence, guarded_unpack_sequence
from RestrictedPython.PrintCollector import PrintCollector
from RestrictedPython.transformer import RestrictingNodeTransformer

from batos import metrics, settings
from batos.errors import (
    AuditRejected,
    GeneratedCodeError,
    SandboxLimitExceeded,
    SandboxViolation,
)
from prototypes import guardian, isolation
from prototypes.bounded import bounded_repr, exception_text
from prototypes.uvm import UvmObject, register_compiler

log = logging.getLogger("batos.sandbox")

#: Longest sequence ``*`` may build, and longest ``range`` a method may ask for.
MAX_RESULT_ITEMS = 1_000_000
#: Largest integer ``*``, ``**``, ``<<`` and ``math.lcm`` may build, in bits.
MAX_INT_BITS = 100_000
#: Most work one ``pow(base, exp, mod)`` may take: bits of ``exp`` × (bits of ``mod``)²,
#: about a fifth of a second on one core (one C call the watchdog cannot interrupt).
MAX_POW_MOD_WORK = 4096**3
#: How often the watchdog re-raises the timeout once the limit is past, in seconds.
WATCHDOG_PERIOD = 0.005
#: Module prefixes whose objects a method must never hold (the database and its machinery).
FORBIDDEN_MODULES = ("ZODB", "ZEO", "transaction", "relstorage", "zodburi", "store", "graph")


class SandboxTimeout(BaseException):
    """Raised into code that ran past its time limit; not reachable by name from the sandbox."""


# -- guards -------------------------------------------------------------------------------------

_state = threading.local()


def _violation(message: str) -> SandboxViolation:
    """Record the violation for this call (so swallowing it does not help) and build it."""
    found = getattr(_state, "violations", None)
    if found is not None:
        found.append(message)
    return SandboxViolation("the sandbox refused an operation", [message])


def _check_value(value: Any) -> Any:
    if isinstance(value, (types.ModuleType, types.FrameType, types.CodeType, types.TracebackType)):
        raise _violation(f"a method may not hold a {type(value).__name__} object")
    module = getattr(type(value), "__module__", "") or ""
    if module.split(".")[0] in FORBIDDEN_MODULES:
        raise _violation(f"a method may not hold a {type(value).__qualname__} object")
    return value


_RAISE = object()


def guarded_getattr(obj: Any, name: str, default: Any = _RAISE) -> Any:
    """``getattr`` as the sandbox sees it: no private names, no internals, no format."""
    if type(name) is not str:
        raise _violation("attribute names must be strings")
    if name.startswith("_") or name in guardian.DENIED_ATTRIBUTES:
        raise _violation(f"attribute {name!r} is not reachable from a method")
    if isinstance(obj, (types.ModuleType, types.FrameType, types.CodeType)):
        raise _violation(f"attributes of {type(obj).__name__} objects are not reachable")
    if isinstance(obj, UvmObject) and _generative_off():
        value = obj._lookup(name)
        if value is None:
            if default is _RAISE:
                raise AttributeError(f"{obj!r} has no slot {name!r}")
            return default
    try:
        value = getattr(obj, name)
    except AttributeError:
        if default is _RAISE:
            raise
        return default
    # In an isolation child: what the method reaches is compared with its record afterwards.
    isolation.touch(obj)
    isolation.touch(value)
    return _check_value(value)


def guarded_hasattr(obj: Any, name: str) -> bool:
    try:
        guarded_getattr(obj, name)
    except AttributeError:
        return False
    return True


def _generative_off() -> bool:
    # Inside a sandboxed call a missing slot never starts a new doesNotUnderstand mission.
    return bool(getattr(_state, "depth", 0))


def in_sandbox() -> bool:
    """Whether this thread is running sandboxed code right now."""
    return _generative_off()


def guarded_getitem(obj: Any, key: Any) -> Any:
    if isinstance(key, str) and key.startswith("__"):
        raise _violation(f"item {key!r} is not reachable from a method")
    value = obj[key]
    isolation.touch(obj)
    isolation.touch(value)
    return _check_value(value)


_WRITABLE = (list, dict, set)


class _SlotWriter:
    """What ``self.x = v`` writes through: records (object, slot) so the trial can check the
    persistence covenant, then assigns the slot the ordinary way."""

    __slots__ = ("_target",)
    _target: UvmObject

    def __init__(self, target: UvmObject) -> None:
        object.__setattr__(self, "_target", target)

    def __setattr__(self, name: str, value: Any) -> None:
        self._not_a_method(name)
        _record_write(self._target, name)
        setattr(self._target, name, value)

    def __delattr__(self, name: str) -> None:
        self._not_a_method(name)
        _record_write(self._target, name)
        delattr(self._target, name)

    def _not_a_method(self, name: str) -> None:
        # Writing a slot named like a method replaces the method (the object model's one
        # namespace): from generated code that would take out any method it can reach, a
        # parent's shared or a hand-written one, with no record and no undo.
        self._target._p_activate()  # a ghost's __dict__ is empty: it would pass unchecked
        if name in (self._target.__dict__.get("_methods") or {}):
            raise _violation(
                f"slot {name!r} is a method: a method may not replace or remove methods "
                "('batos methods reject' takes one out)"
            )


def _record_write(target: UvmObject, name: str) -> None:
    writes = getattr(_state, "writes", None)
    if writes is not None:
        writes.add((id(target), name))


@contextmanager
def watch_writes() -> Iterator[set[tuple[int, str]]]:
    """Collect (id(object), slot) of every slot a method assigns in this thread meanwhile."""
    previous = getattr(_state, "writes", None)
    writes: set[tuple[int, str]] = set()
    _state.writes = writes
    try:
        yield writes
    finally:
        _state.writes = previous


def guarded_write(obj: Any) -> Any:
    """The object an attribute or item write may go to: containers and prototypes only."""
    from persistent.list import PersistentList
    from persistent.mapping import PersistentMapping

    if isinstance(obj, UvmObject):
        return _SlotWriter(obj)
    if isinstance(obj, (PersistentList, PersistentMapping)):
        return _ItemWriter(obj)
    if isinstance(obj, _WRITABLE):
        return obj
    raise _violation(f"a method may not write to a {type(obj).__name__} object")


class _ItemWriter:
    """What a write to a persistent container goes through: its items, never its attributes
    (``stats.data = [1, 2]`` would give a mapping a state no mapping has)."""

    __slots__ = ("_target",)
    _target: Any

    def __init__(self, target: Any) -> None:
        object.__setattr__(self, "_target", target)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._target[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._target[key]

    def __setattr__(self, name: str, value: Any) -> None:
        raise _violation(
            f"a method may not set attributes of a {type(self._target).__name__}, only its items"
        )

    def __delattr__(self, name: str) -> None:
        raise _violation(
            f"a method may not remove attributes of a {type(self._target).__name__}, only its items"
        )


def guarded_iter(obj: Any) -> Any:
    isolation.touch(_check_value(obj))
    return iter(obj)


def _size(value: Any) -> int:
    try:
        return len(value)
    except TypeError:
        return 0


def guarded_binop(op: str, left: Any, right: Any) -> Any:
    """``**``, ``*`` and ``<<`` that refuse to build results too big to be reasonable: an
    integer past ``MAX_INT_BITS`` (each step of a loop that squares a number is held to it,
    not only one huge power), a sequence past ``MAX_RESULT_ITEMS``."""
    if op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            bits = max(abs(left).bit_length(), 1) * right
            if abs(left) > 1 and bits > MAX_INT_BITS:
                raise _violation(
                    f"{left} ** {right} would have about {bits} bits; the limit is {MAX_INT_BITS}"
                )
        return left**right
    if op == "<<":
        if isinstance(right, int) and right > MAX_INT_BITS:
            raise _violation(f"shifting by {right} bits exceeds the limit of {MAX_INT_BITS}")
        if isinstance(left, int) and isinstance(right, int) and left and right > 0:
            _bounded_bits(f"an integer shifted by {right}", left.bit_length() + right)
        return left << right
    if op == "*":
        if isinstance(left, int) and isinstance(right, int):
            _bounded_bits("a product", left.bit_length() + right.bit_length())
            return left * right
        for seq, count in ((left, right), (right, left)):
            if isinstance(count, int) and not isinstance(seq, (int, float, complex, bool)):
                if _size(seq) * count > MAX_RESULT_ITEMS:
                    raise _violation(
                        f"repeating a sequence {count} times exceeds the limit of "
                        f"{MAX_RESULT_ITEMS} items"
                    )
        return left * right
    raise _violation(f"operator {op!r} is not guarded")


_INPLACE = {
    "+=": lambda a, b: a + b,
    "-=": lambda a, b: a - b,
    "/=": lambda a, b: a / b,
    "//=": lambda a, b: a // b,
    "%=": lambda a, b: a % b,
    "|=": lambda a, b: a | b,
    "&=": lambda a, b: a & b,
    "^=": lambda a, b: a ^ b,
    ">>=": lambda a, b: a >> b,
    "@=": lambda a, b: a @ b,
}
_GUARDED_INPLACE = {"*=": "*", "**=": "**", "<<=": "<<"}


def guarded_inplacevar(op: str, left: Any, right: Any) -> Any:
    if op in _GUARDED_INPLACE:
        return guarded_binop(_GUARDED_INPLACE[op], left, right)
    try:
        return _INPLACE[op](left, right)
    except KeyError:
        raise _violation(f"augmented operator {op!r} is not supported") from None


def guarded_range(*args: int) -> range:
    span = range(*args)
    if len(span) > MAX_RESULT_ITEMS * 10:
        raise _violation(f"range of {len(span)} items exceeds the limit of {MAX_RESULT_ITEMS * 10}")
    return span


def guarded_pow(base: Any, exp: Any, mod: Any = None) -> Any:
    if mod is not None:
        if isinstance(exp, int) and isinstance(mod, int):
            work = abs(exp).bit_length() * mod.bit_length() ** 2
            if work > MAX_POW_MOD_WORK:
                raise _violation(
                    f"pow with a {abs(exp).bit_length()}-bit exponent and a "
                    f"{mod.bit_length()}-bit modulus is too much work for one call"
                )
        return pow(base, exp, mod)
    return guarded_binop("**", base, exp)


def guarded_apply(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


class CuratedModule:
    """A read-only namespace standing in for a module: only the allow-listed names."""

    __slots__ = ("_name", "_names")

    def __init__(self, name: str, names: dict[str, Any]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_names", names)

    def __getattr__(self, attr: str) -> Any:
        try:
            return self._names[attr]
        except KeyError:
            raise AttributeError(
                f"{self._name}.{attr} is not available in the sandbox; "
                f"available: {', '.join(sorted(self._names))}"
            ) from None

    def __setattr__(self, attr: str, value: Any) -> None:
        raise _violation(f"{self._name} is read-only")

    def __repr__(self) -> str:
        return f"<sandboxed module {self._name}>"


def _bounded_bits(what: str, bits: float) -> None:
    if bits > MAX_INT_BITS:
        raise _violation(f"{what} would have about {int(bits)} bits; the limit is {MAX_INT_BITS}")


def guarded_factorial(n: int) -> int:
    import math

    if isinstance(n, int) and n > 2:
        _bounded_bits(f"factorial({n})", n * math.log2(n))
    return math.factorial(n)


def guarded_comb(n: int, k: int) -> int:
    import math

    if isinstance(n, int) and n > 0:
        _bounded_bits(f"comb({n}, {k})", n)  # C(n, k) < 2**n
    return math.comb(n, k)


def guarded_perm(n: int, k: int | None = None) -> int:
    import math

    if isinstance(n, int) and n > 2:
        _bounded_bits(f"perm({n}, {k})", (n if k is None else min(k, n)) * math.log2(n))
    return math.perm(n, k)


def guarded_lcm(*numbers: int) -> int:
    import math

    # lcm(a, b, …) ≤ a·b·…, whose bits are at most the sum of theirs.
    _bounded_bits("an lcm", sum(n.bit_length() for n in numbers if isinstance(n, int)))
    return math.lcm(*numbers)


#: Allowed functions whose C implementation could run unbounded: the sandbox's versions.
_GUARDED_FUNCTIONS = {
    "math": {
        "factorial": guarded_factorial,
        "comb": guarded_comb,
        "perm": guarded_perm,
        "lcm": guarded_lcm,
    },
}


def _curated(name: str) -> CuratedModule:
    import importlib

    module = importlib.import_module(name)
    guarded = _GUARDED_FUNCTIONS.get(name, {})
    return CuratedModule(
        name, {n: guarded.get(n) or getattr(module, n) for n in guardian.ALLOWED_IMPORTS[name]}
    )


_CURATED: dict[str, CuratedModule] = {}
#: Modules an allowed module's C code imports for itself through the frame's ``__import__``:
#: ``date.strftime`` and ``timetuple`` call ``time.strftime`` and build ``time.struct_time``.
#: Method source cannot name them (the guardian refuses ``import time``); what the import
#: returns holds only what that C code calls.
_INTERNAL_IMPORTS: dict[str, tuple[str, ...]] = {"time": ("strftime", "struct_time")}


def guarded_import(
    name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
) -> CuratedModule:
    if not level and name in _INTERNAL_IMPORTS and not fromlist:
        if name not in _CURATED:
            module = __import__(name)
            _CURATED[name] = CuratedModule(
                name, {n: getattr(module, n) for n in _INTERNAL_IMPORTS[name]}
            )
        return _CURATED[name]
    if level or name not in guardian.ALLOWED_IMPORTS:
        raise _violation(f"import of {name!r} is not allowed")
    for attr in fromlist or ():
        if attr not in guardian.ALLOWED_IMPORTS[name]:
            raise _violation(f"{name}.{attr} is not available in the sandbox")
    if name not in _CURATED:
        _CURATED[name] = _curated(name)
    return _CURATED[name]


def _builtins() -> dict[str, Any]:
    import builtins

    table = {
        name: getattr(builtins, name)
        for name in guardian.ALLOWED_BUILTINS
        if hasattr(builtins, name)
    }
    table.update(
        getattr=guarded_getattr,
        hasattr=guarded_hasattr,
        range=guarded_range,
        pow=guarded_pow,
        iter=guarded_iter,
        __import__=guarded_import,
    )
    return table


_BUILTINS = _builtins()


def sandbox_globals(selector: str) -> dict[str, Any]:
    """A fresh global namespace for one method, with every guard RestrictedPython calls."""
    return {
        "__builtins__": _BUILTINS,
        "__name__": f"sandbox.{selector}",
        "_getattr_": guarded_getattr,
        "_getitem_": guarded_getitem,
        "_write_": guarded_write,
        "_getiter_": guarded_iter,
        "_iter_unpack_sequence_": guarded_iter_unpack_sequence,
        "_unpack_sequence_": guarded_unpack_sequence,
        "_inplacevar_": guarded_inplacevar,
        "_apply_": guarded_apply,
        "_binop_": guarded_binop,
        "_print_": PrintCollector,
    }


# -- compilation ----------------------------------------------------------------------------------


class BatosPolicy(RestrictingNodeTransformer):
    """RestrictedPython's policy plus guarded big operators and item/attribute ``+=``."""

    _GUARDED_OPS = {ast.Pow: "**", ast.Mult: "*", ast.LShift: "<<"}

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        node = self.node_contents_visit(node)
        symbol = self._GUARDED_OPS.get(type(node.op))
        if symbol is None:
            return node
        call = ast.Call(
            func=ast.Name("_binop_", ast.Load()),
            args=[ast.Constant(symbol), node.left, node.right],
            keywords=[],
        )
        return ast.fix_missing_locations(ast.copy_location(call, node))

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        # ``self.n += 1`` becomes ``self.n = self.n + 1``: the slot is assigned, so the
        # receiver is marked changed (the persistence covenant), and the write is guarded.
        if isinstance(node.target, (ast.Attribute, ast.Subscript)):
            load = _as_load(node.target)
            assign = ast.Assign(
                targets=[node.target],
                value=ast.copy_location(ast.BinOp(left=load, op=node.op, right=node.value), node),
            )
            ast.copy_location(assign, node)
            ast.fix_missing_locations(assign)
            return self.visit(assign)
        return super().visit_AugAssign(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> Any:
        # A bare ``except:`` would catch the watchdog's timeout and keep the code alive:
        # it becomes ``except Exception:``, which the timeout (a BaseException) passes through.
        if node.type is None:
            node.type = ast.copy_location(ast.Name("Exception", ast.Load()), node)
        return super().visit_ExceptHandler(node)


def _as_load(target: ast.expr) -> ast.expr:
    clone = ast.parse(ast.unparse(target), mode="eval").body
    return ast.copy_location(clone, target)


def compile_sandboxed(
    selector: str,
    source: str,
    *,
    audit: bool = True,
    capabilities: dict[str, Callable[..., Any]] | None = None,
) -> Callable[..., Any]:
    """Audit, compile under the policy and define ``selector``; returns its guarded function.

    Raises ``AuditRejected`` (every finding of the guardian and of RestrictedPython) or
    ``SandboxViolation`` if defining the function fails. ``audit=False`` skips the guardian
    (only to test that the run-time layers hold on their own). ``capabilities`` are host
    functions the code may call by name (a tool method's ``request``); each must only build
    plain data, since it runs inside the sandbox's limits with the code's arguments.
    """
    if audit:
        guardian.check(selector, source)
    filename = f"<method {selector}>"
    try:
        tree = ast.parse(source, mode="exec")
        result = compile_restricted_exec(tree, filename=filename, policy=BatosPolicy)
    except SyntaxError as exc:
        raise AuditRejected(f"method {selector!r} does not parse: {exc.msg}") from None
    except (RecursionError, MemoryError):
        raise AuditRejected(
            f"method {selector!r} is nested too deeply to compile",
            ["split very long expressions and deeply nested blocks into shorter statements"],
        ) from None
    # Tracebacks (and the findings fed back to the model) then quote the failing line.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    if result.errors:
        raise AuditRejected(
            f"method {selector!r} does not pass the sandbox's compiler",
            list(result.errors),
            hint="fix every finding listed and submit the method again",
        )
    namespace = sandbox_globals(selector)
    namespace.update(capabilities or {})
    call_limited(exec, result.code, namespace)
    fn = namespace.get(selector)
    if not isinstance(fn, types.FunctionType):
        raise AuditRejected(f"method source does not define a function {selector!r}")
    return _guarded(fn)


def _guarded(fn: types.FunctionType) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if getattr(_state, "depth", 0):  # called by another method: its limits and checks
            return fn(*args, **kwargs)
        if isolation.inside_child() or isolation_mode() == "host":
            return call_checked(fn, args, kwargs)
        _prepare_children()
        return isolation.run(
            lambda *a, **k: call_checked(fn, a, k),
            args,
            kwargs,
            seconds=settings.get_float("sandbox_seconds"),
            memory_mb=settings.get_int("sandbox_memory_mb"),
        )

    guarded.__name__ = fn.__name__
    guarded.__qualname__ = fn.__qualname__
    guarded.__wrapped__ = fn  # type: ignore[attr-defined]
    return guarded


register_compiler("sandbox", compile_sandboxed)


def _prepare_children() -> None:
    """Import every curated module before the first fork: a confined child cannot open the
    files an import reads."""
    if len(_CURATED) < len(guardian.ALLOWED_IMPORTS):
        for name in guardian.ALLOWED_IMPORTS:
            if name not in _CURATED:
                _CURATED[name] = _curated(name)


# -- run-time limits ------------------------------------------------------------------------------


# Our own prototypes of the C call, so other users of ctypes.pythonapi are unaffected; the
# second one passes NULL, which clears a pending asynchronous exception.
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


class _Watchdog:
    """Raises ``SandboxTimeout`` into one thread, again and again, once its time is up."""

    def __init__(self, seconds: float) -> None:
        self.thread_id = threading.get_ident()
        self.seconds = seconds
        self.lock = threading.Lock()
        self.active = True
        self.fired = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sandbox-watchdog", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.done.wait(self.seconds):
            return
        while True:
            with self.lock:
                if not self.active:
                    return
                self.fired = True
                _set_async_exc(self.thread_id, SandboxTimeout)
            if self.done.wait(WATCHDOG_PERIOD):
                return

    def stop(self) -> None:
        with self.lock:
            self.active = False
            # Clear a timeout raised but not yet delivered, so it cannot hit the host.
            _clear_async_exc(self.thread_id, None)
        self.done.set()


class _MemoryWindow:
    """Lowers the process's RLIMIT_AS while at least one sandboxed call runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.saved: tuple[int, int] | None = None

    def enter(self, extra_mb: int) -> None:
        with self.lock:
            self.users += 1
            if self.users > 1:
                return
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            wanted = metrics.address_space() + extra_mb * 1024 * 1024
            if hard != resource.RLIM_INFINITY:
                wanted = min(wanted, hard)
            if soft == resource.RLIM_INFINITY or wanted < soft:
                self.saved = (soft, hard)
                resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0 and self.saved is not None:
                resource.setrlimit(resource.RLIMIT_AS, self.saved)
                self.saved = None


_MEMORY = _MemoryWindow()


class _NoWindow:
    """An isolation child's memory limit is set on the whole process before the call."""

    def enter(self, extra_mb: int) -> None:
        pass

    def leave(self) -> None:
        pass


_NO_WINDOW = _NoWindow()


def _release(action: Callable[[], None]) -> None:
    # A timeout delivered while we release must not skip the release itself.
    while True:
        try:
            action()
            return
        except SandboxTimeout:
            continue


def call_limited(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` under the sandbox's time and memory limits; contain every BaseException.

    Ordinary exceptions the code raises (``ValueError``…) propagate unchanged; policy breaches
    raise ``SandboxViolation`` (also when the code caught the first one), limits
    ``SandboxLimitExceeded``, anything else that is not an ``Exception`` ``SandboxViolation``.
    Nested calls (a method calling another) share the outermost call's limits.
    """
    if getattr(_state, "depth", 0):
        return fn(*args, **kwargs)
    # A child has no environment to read settings from, and its memory is already limited
    # for the whole process.
    in_child = isolation.child_limits()
    seconds, memory_mb = in_child or (
        settings.get_float("sandbox_seconds"),
        settings.get_int("sandbox_memory_mb"),
    )
    window = _NO_WINDOW if in_child else _MEMORY
    _state.depth = 1
    violations: list[str] = []
    _state.violations = violations
    dog = _Watchdog(seconds)
    try:
        try:
            window.enter(memory_mb)
            try:
                result = fn(*args, **kwargs)
            finally:
                _release(dog.stop)
                _release(window.leave)
        except SandboxTimeout:
            raise SandboxLimitExceeded(
                f"the method ran longer than {seconds:g} s and was stopped",
                [f"time limit of {seconds:g} s exceeded: avoid unbounded loops"],
            ) from None
        except MemoryError:
            raise SandboxLimitExceeded(
                f"the method tried to use more than {memory_mb} MiB and was stopped",
                [f"memory limit of {memory_mb} MiB exceeded: build smaller values"],
            ) from None
        except (SandboxViolation, AuditRejected):
            raise
        except (StopIteration, StopAsyncIteration) as exc:
            if violations:
                raise SandboxViolation("the sandbox refused an operation", violations) from None
            raise isolation.stopped_iteration(type(exc).__name__, str(exc)) from None
        except Exception:
            if violations:
                raise SandboxViolation("the sandbox refused an operation", violations) from None
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit…
            raise SandboxViolation(
                f"the method raised {type(exc).__name__}, which the sandbox contains",
                [f"{type(exc).__name__} may not leave a method: raise an Exception subclass"],
            ) from None
        if violations:
            raise SandboxViolation("the sandbox refused an operation", violations)
        return result
    finally:
        _state.depth = 0
        _state.violations = None


# -- checks after each call ----------------------------------------------------------------------


def isolation_mode() -> str:
    mode = settings.get_str("sandbox_isolation")
    if mode == "process" and not hasattr(os, "fork"):
        from batos.errors import ConfigurationError

        raise ConfigurationError(
            "process isolation needs os.fork, which this platform lacks",
            hint="set BATOS_SANDBOX_ISOLATION=host",
        )
    return mode


#: Results that would run code later, in the host, outside every limit.
_DEFERRED = (
    collections.abc.Iterator,
    collections.abc.Generator,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CoroutineType,
)


def call_checked(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """``call_limited`` plus the checks every call of a method gets: the persistence covenant
    on the receiver and its ancestors, storable slots, and a result that is a value."""
    receiver = args[0] if args and isinstance(args[0], UvmObject) else None
    watched = [receiver, *receiver._ancestors()] if receiver is not None else []
    before = [slot_digests(obj) for obj in watched]
    with watch_writes() as writes:
        result = call_limited(fn, *args, **kwargs)
    findings = [
        f
        for obj, digests in zip(watched, before, strict=True)
        for f in covenant_findings(obj, digests, writes, receiver)
    ]
    if isinstance(result, _DEFERRED):
        findings.append(
            f"the method returned a {type(result).__name__}, which would run later "
            "outside the sandbox's limits: return a list or another plain value"
        )
    if findings:
        raise SandboxViolation("the method broke a rule of the image", findings)
    return result


_UNSTORABLE = "unstorable:"


def slot_digests(obj: UvmObject) -> dict[str, str]:
    """A digest of each own data slot of ``obj``, to see which ones a call changed."""
    obj._p_activate()
    digests = {}
    for name, value in obj.__getstate__().items():  # own slots, never borrowed answers
        if name.startswith("_"):
            continue
        try:
            # Plain data (the usual slot) marshals at C speed; version 2 has no
            # back-references, so the bytes do not depend on reference counts.
            raw = b"m" + marshal.dumps(value, 2)
        except ValueError:  # holds other objects: pickle, persistent ones by identity
            buffer = io.BytesIO()
            try:
                isolation.IdentityPickler(buffer, obj).dump(value)
            except Exception as exc:
                digests[name] = f"{_UNSTORABLE}{type(value).__name__} ({type(exc).__name__})"
                continue
            raw = b"p" + buffer.getvalue()
        digests[name] = hashlib.sha256(raw).hexdigest()
    return digests


def covenant_findings(
    obj: UvmObject,
    before: dict[str, str],
    writes: set[tuple[int, str]],
    receiver: UvmObject | None = None,
) -> list[str]:
    """What a call did to ``obj``'s slots that the image would not keep."""
    who = "self" if obj is receiver or receiver is None else repr(obj)
    findings = []
    for name, digest in slot_digests(obj).items():
        written = (id(obj), name) in writes
        if digest.startswith(_UNSTORABLE) and (written or before.get(name) != digest):
            findings.append(
                f"{who}.{name} now holds a {digest[len(_UNSTORABLE) :]}, which the "
                "image cannot store: keep plain data and prototypes in slots"
            )
        elif before.get(name, digest) != digest and not written:
            findings.append(
                f"persistence covenant: {who}.{name} changed in place without "
                f"'{who}.{name} = ...'; the change would be lost on reload — assign "
                "the slot after changing it"
            )
    return findings


# -- isolated trial -------------------------------------------------------------------------------


@dataclass(frozen=True)
class IsolatedOutcome:
    """What a method did in its isolated trial process."""

    ok: bool
    summary: str
    findings: tuple[str, ...] = ()
    #: The result as the host decoded it from the child's bounded report (None on failure).
    value: Any = None


def run_isolated(
    fn: Callable[..., Any],
    *args: Any,
    seconds: float | None = None,
    memory_mb: int | None = None,
    **kwargs: Any,
) -> IsolatedOutcome:
    """Try ``fn(*args, **kwargs)`` in a forked child with OS limits and apply nothing.

    The child reads the image through the host (so it sees what the caller sees) and sends
    its result and changes back; the host checks them as it would for a real call, then drops
    them. Whatever the code does, the host only reads a verdict.
    """
    seconds = float(seconds or settings.get_float("sandbox_seconds"))
    memory_mb = int(memory_mb or settings.get_int("sandbox_memory_mb"))
    _prepare_children()
    try:
        result = isolation.run(fn, args, kwargs, seconds=seconds, memory_mb=memory_mb, apply=False)
    except GeneratedCodeError as exc:
        return IsolatedOutcome(False, exc.reason, tuple(exc.findings) or (exc.reason,))
    except Exception as exc:
        text = exception_text(exc)
        return IsolatedOutcome(False, f"{type(exc).__name__}: {text}", (describe_exception(exc),))
    return IsolatedOutcome(True, _short_repr(result), value=result)


def describe_exception(exc: BaseException) -> str:
    """What a method's exception tells its author: type, message, the line, and for a module
    used without its import, the fix."""
    frames = traceback.extract_tb(exc.__traceback__)
    lines = [f"line {f.lineno}: {f.line}" for f in frames if f.filename.startswith("<method")]
    # A call isolated in a child process carries its line as a note instead of frames.
    where = f" at {lines[-1]}" if lines else "".join(f" {n}" for n in getattr(exc, "__notes__", ()))
    said = exception_text(exc)
    text = f"the method raised {type(exc).__name__}: {said}{where}"
    missing = re.match(r"name '(\w+)' is not defined", said)
    if isinstance(exc, NameError) and missing and missing.group(1) in guardian.ALLOWED_IMPORTS:
        text += f" — add 'import {missing.group(1)}' above the function"
    return text


def _short_repr(value: Any, limit: int = 500) -> str:
    return bounded_repr(value, limit)
