"""UvmObject: Self/Smalltalk-style prototype objects that persist in the living image.

An object is a set of named *slots*. Data slots live in the object's own ``__dict__``, so
reading a local slot is an ordinary Python attribute read; method slots hold ``Method``
records (source text + metadata) in the ``_methods`` table. Both form one namespace: writing a
name of one kind removes it from the other. Slots whose names end in ``*`` are *parent
slots*.

Lookup order (``obj.name``):
  1. the receiver's own data slots, then its own method slots;
  2. its ancestors, breadth-first: first every parent in parent-slot order, then their
     parents, and so on; each object is visited once, so cycles in ``parent*`` slots are
     harmless. The nearest definition wins; among equally near ones, the earlier parent slot.
A method found anywhere runs with ``self`` bound to the *receiver*, not to the holder.

Names starting with ``_`` are private: they never delegate and never reach
``doesNotUnderstand`` (a plain ``AttributeError`` is raised). A public name that nothing
answers raises ``DoesNotUnderstand`` via ``_does_not_understand`` — a hook the generative
kernel replaces by installing a handler with ``set_dnu_handler``.

The persistence covenant: assigning a slot (``obj.x = v``) marks the object changed. Mutating
a plain container *inside* a slot (``obj.items.append(v)``) does not — either assign the slot
again, call ``obj._p_changed = True``, or store a ``PersistentList``/``PersistentMapping``,
which track their own changes. A change that breaks the covenant is lost at the next reload.
"""

from __future__ import annotations

import copy
import time
import types
from collections.abc import Callable
from typing import Any

import persistent
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping

from batos.errors import DoesNotUnderstand

_PLAIN_CONTAINERS = (list, dict, set, bytearray)
_DNU_HANDLER: Callable[[UvmObject, str], Any] | None = None


def set_dnu_handler(handler: Callable[[UvmObject, str], Any] | None) -> None:
    """Install the process-wide answer to messages nothing understands (None restores raising)."""
    global _DNU_HANDLER
    _DNU_HANDLER = handler


class MethodCompileError(Exception):
    """A method's source text does not compile into a function named after its selector."""


def compile_plain(selector: str, source: str) -> Callable[..., Any]:
    """Compile trusted, hand-written method source with Python's own compiler."""
    namespace: dict[str, Any] = {"__builtins__": __builtins__, "__name__": f"uvm.{selector}"}
    try:
        exec(compile(source, f"<method {selector}>", "exec"), namespace)
    except SyntaxError as exc:
        raise MethodCompileError(f"method {selector!r} does not compile: {exc}") from exc
    fn = namespace.get(selector)
    if not isinstance(fn, types.FunctionType):
        raise MethodCompileError(
            f"method source must define a function named {selector!r}, e.g. "
            f"'def {selector}(self, ...):'"
        )
    return fn


_COMPILERS: dict[str, Callable[[str, str], Callable[..., Any]]] = {"plain": compile_plain}


def register_compiler(name: str, compiler: Callable[[str, str], Callable[..., Any]]) -> None:
    """Make a compiler available to methods whose ``compiler`` field names it."""
    _COMPILERS[name] = compiler


class Method(persistent.Persistent):
    """A method slot: the source text and what we know of it; never a pickled function.

    The compiled function lives only in the volatile ``_v_function`` and is rebuilt from
    ``source`` after every load, so a method survives any change to Python or BAT OS.
    """

    def __init__(
        self,
        selector: str,
        source: str,
        *,
        intent: str = "",
        author: str = "human",
        audit: dict[str, Any] | None = None,
        compiler: str = "plain",
    ) -> None:
        self.selector = selector
        self.source = source
        self.intent = intent
        self.author = author
        self.audit = dict(audit or {})
        self.compiler = compiler
        self.created = self.updated = time.time()

    def function(self) -> Callable[..., Any]:
        fn = self.__dict__.get("_v_function")
        if fn is None:
            self._p_activate()
            try:
                compiler = _COMPILERS[self.compiler]
            except KeyError:
                raise MethodCompileError(
                    f"method {self.selector!r} needs compiler {self.compiler!r}, which is not "
                    "loaded; import the module that registers it"
                ) from None
            fn = self._v_function = compiler(self.selector, self.source)
        return fn

    def bind(self, receiver: UvmObject) -> types.MethodType:
        return types.MethodType(self.function(), receiver)

    def copy(self) -> Method:
        twin = Method(
            self.selector,
            self.source,
            intent=self.intent,
            author=self.author,
            audit=copy.deepcopy(self.audit),
            compiler=self.compiler,
        )
        twin.created = self.created
        return twin

    def __repr__(self) -> str:
        return f"<Method {self.selector} by {self.author}>"


def _is_parent_slot(name: str) -> bool:
    return name.endswith("*")


_GHOST = persistent.GHOST
#: Bumped whenever any public slot of any UvmObject is written or removed, or any UvmObject's
#: state is (re)loaded or invalidated; cached ancestor lists and lookup hits older than it are
#: recomputed. An integer bump is cheap; steady-state reads see it unchanged.
_epoch = 0


def _bump_epoch() -> None:
    global _epoch
    _epoch += 1


_MISSING = object()


def _resolve(receiver: UvmObject, name: str) -> Any:
    """``name`` as the receiver sees it, from its own methods or its ancestors; or _MISSING.

    Where it was found is remembered in the receiver's volatile ``_v_hits`` until the epoch
    moves, so a repeated delegated read is a couple of dict lookups instead of a walk.
    """
    hits = receiver.__dict__.get("_v_hits")
    if hits is not None and hits[0] == _epoch:
        entry = hits[1].get(name)
        if entry is not None:
            state, function = entry
            if function is not None:
                if state:  # an emptied state means the holder was ghostified: walk again
                    return types.MethodType(function, receiver)
            elif name in state:
                return state[name]
    epoch = _epoch
    found: Any = _MISSING
    for holder in (receiver, *receiver._ancestors()):
        state = holder.__dict__
        if holder is not receiver and name in state:
            found, entry = state[name], (state, None)
            break
        method = state["_methods"].get(name)
        if method is not None:
            function = method.function()
            found, entry = types.MethodType(function, receiver), (state, function)
            break
    if found is not _MISSING:
        if hits is None or hits[0] != epoch:
            hits = receiver.__dict__["_v_hits"] = (epoch, {})
        hits[1][name] = entry
    return found


class _Delegation:
    """A non-data descriptor on ``UvmObject`` for a public name some object inherited.

    An own data slot still wins (the instance ``__dict__`` comes before a non-data
    descriptor), so local reads stay plain attribute reads. A miss now lands here instead of
    raising an ``AttributeError`` that Python 3.11 builds in full before ``__getattr__`` runs,
    which is most of the cost of a delegated read. The descriptor holds no state of any
    object and is never persisted; only the shared class gains it.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: UvmObject | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        # The hit-cache check of _resolve, inlined: this is the hot path of every
        # delegated read, and a Python call costs as much as the lookup itself.
        hits = obj.__dict__.get("_v_hits")
        if hits is not None and hits[0] == _epoch:
            entry = hits[1].get(self.name)
            if entry is not None:
                state, function = entry
                if function is None:
                    if self.name in state:
                        return state[self.name]
                elif state:
                    return types.MethodType(function, obj)
        if not obj.__dict__:  # a ghost: load it, then its own slot may answer
            obj._p_activate()
            state = obj.__dict__
            if self.name in state:
                return state[self.name]
        found = _resolve(obj, self.name)
        if found is _MISSING:
            raise AttributeError(self.name)  # __getattr__ takes over: doesNotUnderstand
        return found


def _install_delegation(name: str) -> None:
    if not hasattr(UvmObject, name):
        setattr(UvmObject, name, _Delegation(name))


class UvmObject(persistent.Persistent):
    """A persistent prototype: slots, parent slots and methods in one namespace."""

    # Plain attribute lookup instead of Persistent's: a miss then costs no exception before
    # ``__getattr__`` runs, which makes delegation several times faster. The price is that
    # lookups do not unghostify by themselves — ``__getattr__`` does it — and do not refresh
    # the object's place in the pickle cache's LRU ring.
    __getattribute__ = object.__getattribute__

    def __init__(self, *parents: UvmObject, **slots: Any) -> None:
        self._methods = {}
        for index, parent in enumerate(parents):
            setattr(self, "parent*" if index == 0 else f"parent{index + 1}*", parent)
        for name, value in slots.items():
            setattr(self, name, value)

    # -- lookup ---------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Reached when the receiver's __dict__ lacks ``name`` (or is a ghost's) and no
        # delegating descriptor for ``name`` exists yet, or that descriptor found nothing.
        if self._p_state == _GHOST:
            self._p_activate()
            return getattr(self, name)
        if name[:1] == "_":
            raise AttributeError(name)
        found = _resolve(self, name)
        if found is not _MISSING:
            _install_delegation(name)
            return found
        return self._does_not_understand(name)

    def _does_not_understand(self, selector: str) -> Any:
        if _DNU_HANDLER is not None:
            return _DNU_HANDLER(self, selector)
        raise DoesNotUnderstand(self, selector)

    def __setstate__(self, state: Any) -> None:
        persistent.Persistent.__setstate__(self, state)
        _bump_epoch()

    def _p_invalidate(self) -> None:
        persistent.Persistent._p_invalidate(self)
        _bump_epoch()

    def _parents(self) -> tuple[UvmObject, ...]:
        """The objects in the receiver's parent slots, in slot order."""
        self._p_activate()
        return tuple(v for k, v in self.__dict__.items() if _is_parent_slot(k))

    def _ancestors(self) -> tuple[UvmObject, ...]:
        """Every ancestor once, nearest first (breadth-first), the receiver excluded.

        Each ancestor returned is active (not a ghost), so its ``__dict__`` can be read.
        """
        cached = self.__dict__.get("_v_ancestors")
        if cached is not None and cached[0] == _epoch:
            ancestors = cached[1]
            for obj in ancestors:
                if obj._p_state == _GHOST:
                    obj._p_activate()
            return ancestors
        epoch = _epoch
        seen = {id(self)}
        order: list[UvmObject] = []
        frontier = list(self._parents())
        while frontier:
            following: list[UvmObject] = []
            for obj in frontier:
                if id(obj) in seen:
                    continue
                seen.add(id(obj))
                order.append(obj)
                following.extend(obj._parents())
            frontier = following
        ancestors = tuple(order)
        self.__dict__["_v_ancestors"] = (epoch, ancestors)
        return ancestors

    def _lookup(self, name: str) -> tuple[UvmObject, Any] | None:
        """(holder, raw slot value) for ``name``, or None; never generative."""
        if name.startswith("_"):
            return None
        self._p_activate()
        for holder in (self, *self._ancestors()):
            if name in holder.__dict__:
                return holder, holder.__dict__[name]
            method = holder.__dict__["_methods"].get(name)
            if method is not None:
                return holder, method
        return None

    def _responds_to(self, name: str) -> bool:
        return self._lookup(name) is not None

    # -- slot writes ----------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            persistent.Persistent.__setattr__(self, name, value)
            return
        _bump_epoch()
        methods = self._methods
        if isinstance(value, Method):
            if name != value.selector:
                raise ValueError(f"method {value.selector!r} cannot be stored in slot {name!r}")
            self.__dict__.pop(name, None)
            methods[name] = value
            self._p_changed = True
            return
        if name in methods:
            del methods[name]
        persistent.Persistent.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name.startswith("_"):
            persistent.Persistent.__delattr__(self, name)
            return
        _bump_epoch()
        if name in self._methods:
            del self._methods[name]
            self._p_changed = True
            return
        if name not in self.__dict__:
            raise AttributeError(f"{self!r} has no own slot {name!r} to remove")
        persistent.Persistent.__delattr__(self, name)

    # -- reflection -----------------------------------------------------------------------

    def _slots(self) -> dict[str, Any]:
        """The receiver's own slots (data, parents and methods), without private names."""
        self._p_activate()
        own = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        own.update(self._methods)
        return own

    def _add_method(self, method: Method) -> Method:
        setattr(self, method.selector, method)
        return method

    def clone(self, **overrides: Any) -> UvmObject:
        """A new object with copies of the receiver's own slots and the same parents.

        Plain containers are deep-copied so the clone is independent; persistent objects held
        in slots (other prototypes, persistent containers) are shared by reference, as parents
        are; method records are copied so the two can evolve apart.
        """
        self._p_activate()
        twin = self.__class__.__new__(self.__class__)
        twin._methods = {name: m.copy() for name, m in self._methods.items()}
        for name, value in self.__dict__.items():
            if name.startswith("_"):
                continue
            if isinstance(value, _PLAIN_CONTAINERS) and not isinstance(
                value, (PersistentList, PersistentMapping)
            ):
                value = copy.deepcopy(value)
            setattr(twin, name, value)
        for name, value in overrides.items():
            setattr(twin, name, value)
        return twin

    def __repr__(self) -> str:
        self._p_activate()
        name = self.__dict__.get("name")
        oid = self._p_oid
        where = f" oid={int.from_bytes(oid, 'big'):#x}" if oid else ""
        label = f" {name!r}" if isinstance(name, str) else ""
        return f"<{type(self).__name__}{label}{where}>"
