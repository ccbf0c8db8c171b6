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

Lookups are cached: what a receiver found for an inherited name (the value, or the method
bound to it) stays in a class-level table until the next change to any object's slots or
state, which empties every table at once, so a repeated delegated read costs one dict lookup
and no answer is ever stale. Ancestor lists are cached per receiver until a parent slot
changes.

Names starting with ``_`` are private: they never delegate and never reach
``doesNotUnderstand`` (a plain ``AttributeError`` is raised). Public names the class itself
answers (``clone``) cannot be slots: they would be stored but never found. A public name
that nothing answers raises ``DoesNotUnderstand`` via ``_does_not_understand`` — a hook the
generative kernel replaces by installing a handler with ``set_dnu_handler``.

The persistence covenant: assigning a slot (``obj.x = v``) marks the object changed. Mutating
a plain container *inside* a slot (``obj.items.append(v)``) does not — either assign the slot
again, call ``obj._p_changed = True``, or store a ``PersistentList``/``PersistentMapping``,
which track their own changes. A change that breaks the covenant is lost at the next reload.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import io
import pickle
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import persistent
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping

from batos.errors import DoesNotUnderstand, SlotError

#: Persistent objects a clone copies like plain containers; any other is shared.
_COPIED_PERSISTENT = (PersistentList, PersistentMapping)
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
#: Where a compiler named by stored methods is defined: its module registers it when imported,
#: on the first method that needs it, so opening an image is enough to call every method in it.
_COMPILER_MODULES = {"sandbox": "prototypes.sandbox"}


def register_compiler(name: str, compiler: Callable[[str, str], Callable[..., Any]]) -> None:
    """Make a compiler available to methods whose ``compiler`` field names it."""
    _COMPILERS[name] = compiler


_GHOST = persistent.GHOST
#: Bumped after any change that could alter what a lookup finds: a public slot written or
#: removed, a UvmObject or Method loaded, invalidated or turned into a ghost, a method's
#: source edited. Every delegation cache is emptied with it (see ``_Delegation``).
_epoch = 0
#: Bumped only when the parent structure may have changed — a parent slot written or removed,
#: an object's state loaded or invalidated — so that cached ancestor lists survive the
#: common writes of data slots.
_lineage = 0
#: Guards the epochs and ``_filled``: caches are filled and emptied from every thread that has
#: a ZODB connection, and a value looked up before a bump must never enter a cache after it.
_cache_lock = threading.Lock()
#: The delegation caches holding entries, so that a bump empties only those.
_filled: list[_Delegation] = []
_IDENTITY_HASH = object.__hash__


def _bump_epoch(*, lineage: bool = True) -> None:
    """Forget cached lookups, and unless ``lineage`` is False, cached ancestor lists too."""
    global _epoch, _lineage
    with _cache_lock:
        _epoch += 1
        if lineage:
            _lineage += 1
        if _filled:
            for delegation in _filled:
                delegation.cache.clear()
            _filled.clear()


#: The fields a method's compiled function is built from.
_COMPILED_FROM = frozenset({"selector", "source", "compiler"})


class _EpochTracked(persistent.Persistent):
    """Loading or invalidating changes state that cached lookups may have seen; the epoch
    moves *after* the change, so a lookup racing with it cannot cache what it read before."""

    def __setstate__(self, state: Any) -> None:
        persistent.Persistent.__setstate__(self, state)
        _bump_epoch()

    def _p_invalidate(self) -> None:
        persistent.Persistent._p_invalidate(self)
        _bump_epoch()


class Method(_EpochTracked):
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

    def __setattr__(self, name: str, value: Any) -> None:
        persistent.Persistent.__setattr__(self, name, value)
        if name in _COMPILED_FROM:
            # The compiled function and every bound copy cached for a receiver were built
            # from the old text: drop them so the next send compiles the new one.
            self.__dict__.pop("_v_function", None)
            _bump_epoch(lineage=False)

    def function(self) -> Callable[..., Any]:
        fn = self.__dict__.get("_v_function")
        if fn is None:
            self._p_activate()
            if self.compiler not in _COMPILERS and self.compiler in _COMPILER_MODULES:
                importlib.import_module(_COMPILER_MODULES[self.compiler])
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


_MISSING = object()


def _resolve(receiver: UvmObject, name: str) -> Any:
    """``name`` as the (active) receiver sees it, from its own methods or its ancestors.

    A data slot comes back as its value, a method bound to the receiver; _MISSING if no
    holder has it. Never generative.
    """
    for holder in (receiver, *receiver._ancestors()):
        state = holder.__dict__
        if holder is not receiver and name in state:
            return state[name]
        method = state["_methods"].get(name)
        if method is not None:
            return types.MethodType(method.function(), receiver)
    return _MISSING


class _Delegation:
    """The class-level descriptor for a public name some object inherited, and its cache.

    It is a non-data descriptor, so an own data slot still wins (the instance ``__dict__``
    comes before it) and local reads stay plain attribute reads. Its ``cache`` maps each
    receiver that read the name since the last epoch bump to what it saw — the slot value, or
    the method bound to it — so a repeated delegated read or send is one dict lookup in
    ``__get__``, about the least Python can run there (a plain dict in a slot: a dict subclass
    would cost a fifth more). ``_bump_epoch`` empties every filled cache, so no entry outlives
    a change that could make it wrong, and a receiver is referenced only until the next bump.
    Keys are the receivers themselves: UvmObjects hash by identity (a subclass that does not
    is simply never cached). Never persisted: only the shared class holds it.
    """

    __slots__ = ("name", "cache")

    def __init__(self, name: str) -> None:
        self.name = name
        self.cache: dict[UvmObject, Any] = {}

    def __get__(self, obj: UvmObject | None, owner: type | None = None) -> Any:
        try:
            return self.cache[obj]
        except (KeyError, TypeError):  # not cached (TypeError: an unhashable subclass)
            return self._miss(obj)

    def _miss(self, obj: UvmObject | None) -> Any:
        if obj is None:
            return self
        name = self.name
        state = obj.__dict__
        if not state:  # a ghost: load it, then its own slot may answer
            obj._p_activate()
            state = obj.__dict__
            if name in state:
                return state[name]
        epoch = _epoch
        found = _resolve(obj, name)
        if found is _MISSING:
            raise AttributeError(name)  # __getattr__ takes over: doesNotUnderstand
        self.remember(obj, found, epoch)
        return found

    def remember(self, obj: UvmObject, found: Any, epoch: int) -> None:
        """Cache what ``obj`` saw, unless something changed since ``epoch`` (its lookup began)."""
        if type(obj).__hash__ is not _IDENTITY_HASH:
            return
        with _cache_lock:
            if epoch == _epoch:
                if not self.cache:
                    _filled.append(self)
                self.cache[obj] = found


def _install_delegation(name: str) -> _Delegation | None:
    """The delegation descriptor for ``name`` (created on first use); None if the class owns it."""
    existing = UvmObject.__dict__.get(name)
    if existing is None and not hasattr(UvmObject, name):
        existing = _Delegation(name)
        setattr(UvmObject, name, existing)
    return existing if isinstance(existing, _Delegation) else None


@functools.cache
def _answered_by_class(cls: type) -> frozenset[str]:
    """Public names the class answers itself (``clone``…), never delegation descriptors.

    A slot of such a name could be stored but never reached: the class attribute would be
    found before the parent chain (for methods, before the object's own slot too).
    """
    return frozenset(
        name
        for name in dir(cls)
        if not name.startswith("_")
        and not isinstance(inspect.getattr_static(cls, name), _Delegation)
    )


class _ClonePickler(pickle.Pickler):
    """Pickles slot values for a clone, keeping shared persistent objects as references."""

    def __init__(self, buffer: io.BytesIO) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.shared: list[Any] = []

    def persistent_id(self, obj: Any) -> int | None:
        if isinstance(obj, persistent.Persistent) and not isinstance(obj, _COPIED_PERSISTENT):
            self.shared.append(obj)
            return len(self.shared) - 1
        return None


def _copied(owner: UvmObject, slots: dict[str, Any]) -> dict[str, Any]:
    """``slots`` copied by the rule of ``clone``.

    A pickle round trip in which shared objects travel as references: it copies what the
    object's own database record would hold, keeps aliasing and cycles inside the slots, and
    needs no list of container types.
    """
    buffer = io.BytesIO()
    pickler = _ClonePickler(buffer)
    try:
        pickler.dump(slots)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise SlotError(
            f"cannot clone {owner!r}: a slot holds a value that can be neither copied nor "
            f"stored in the image ({exc})",
            hint="keep only data, containers and persistent objects in slots",
        ) from exc
    unpickler = pickle.Unpickler(io.BytesIO(buffer.getvalue()))
    unpickler.persistent_load = pickler.shared.__getitem__
    return unpickler.load()


class UvmObject(_EpochTracked):
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
        epoch = _epoch
        found = _resolve(self, name)
        if found is not _MISSING:
            delegation = _install_delegation(name)
            if delegation is not None:
                delegation.remember(self, found, epoch)
            return found
        return self._does_not_understand(name)

    def _does_not_understand(self, selector: str) -> Any:
        if _DNU_HANDLER is not None:
            return _DNU_HANDLER(self, selector)
        raise DoesNotUnderstand(self, selector)

    def _p_deactivate(self) -> None:
        # Ancestor lists survive: a ghost ancestor is the same object, loaded again on use.
        persistent.Persistent._p_deactivate(self)
        _bump_epoch(lineage=False)

    def _parents(self) -> tuple[UvmObject, ...]:
        """The objects in the receiver's parent slots, in slot order."""
        if self._p_state == _GHOST:
            self._p_activate()
        return tuple([v for k, v in self.__dict__.items() if k[-1:] == "*"])

    def _ancestors(self) -> tuple[UvmObject, ...]:
        """Every ancestor once, nearest first (breadth-first), the receiver excluded.

        Each ancestor returned is active (not a ghost), so its ``__dict__`` can be read.
        """
        cached = self.__dict__.get("_v_ancestors")
        if cached is not None and cached[0] == _lineage:
            ancestors = cached[1]
            for obj in ancestors:
                if obj._p_state == _GHOST:
                    obj._p_activate()
            return ancestors
        lineage = _lineage
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
        self.__dict__["_v_ancestors"] = (lineage, ancestors)
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
        if name in _answered_by_class(type(self)):
            raise SlotError(
                f"{type(self).__name__} itself answers {name!r}: a slot of that name would be "
                "stored but its own class attribute would always be found first",
                hint=f"choose another name (these are taken: "
                f"{', '.join(sorted(_answered_by_class(type(self))))})",
            )
        methods = self._methods
        try:
            if isinstance(value, Method):
                if name != value.selector:
                    raise SlotError(
                        f"method {value.selector!r} cannot be stored in slot {name!r}",
                        hint=f"store it as obj.{value.selector} = method",
                    )
                self.__dict__.pop(name, None)
                methods[name] = value
                self._p_changed = True
                return
            if name in methods:
                del methods[name]
            persistent.Persistent.__setattr__(self, name, value)
        finally:
            _bump_epoch(lineage=name[-1:] == "*")

    def __delattr__(self, name: str) -> None:
        if name.startswith("_"):
            persistent.Persistent.__delattr__(self, name)
            return
        if name in self._methods:
            del self._methods[name]
            self._p_changed = True
        elif name in self.__dict__:
            persistent.Persistent.__delattr__(self, name)
        else:
            raise AttributeError(f"{self!r} has no own slot {name!r} to remove")
        _bump_epoch(lineage=name[-1:] == "*")

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

        Containers — list, dict, set, tuple, frozenset, PersistentList, PersistentMapping and
        any nesting of them — are copied all the way down (as is any other value the object's
        own record would hold), so changing the clone's never changes the original's. Every
        other persistent object (prototypes, BTrees, methods stored as data) is shared by
        reference wherever it sits, as parents are. The receiver's own method records are
        copied so the two can evolve apart. A value that cannot be copied (a lambda, a lock)
        raises ``SlotError``.
        """
        self._p_activate()
        twin = self.__class__.__new__(self.__class__)
        twin._methods = {name: m.copy() for name, m in self._methods.items()}
        own = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        for name, value in _copied(self, own).items():
            setattr(twin, name, value)
        for name, value in overrides.items():
            setattr(twin, name, value)
        return twin

    def __repr__(self) -> str:
        self._p_activate()
        name = self.__dict__.get("name")
        oid = self._p_oid
        where = f" oid={int.from_bytes(oid, 'big'):#x}" if oid else ""
        label = f" {name[:60]!r}" if isinstance(name, str) else ""
        return f"<{type(self).__name__}{label}{where}>"
