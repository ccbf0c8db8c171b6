"""UvmObject: Self/Smalltalk-style prototype objects that persist in the living image.

An object is a set of named *slots*. Data slots live in the object's own ``__dict__``, so
reading a local slot is an ordinary Python attribute read; method slots hold ``Method``
records (source text + metadata) in the ``_methods`` table. Both form one namespace: writing a
name of one kind removes it from the other. Slots whose names end in ``*`` are *parent
slots*: each holds a prototype (another ``UvmObject``); anything else is refused when it is
written, and skipped with a warning when an image written before that rule holds one.

Lookup order (``obj.name``):
  1. the receiver's own data slots, then its own method slots;
  2. its ancestors, breadth-first: first every parent in parent-slot order, then their
     parents, and so on; each object is visited once, so cycles in ``parent*`` slots are
     harmless. The nearest definition wins; among equally near ones, the earlier parent slot.
A method found anywhere runs with ``self`` bound to the *receiver*, not to the holder.

Lookups are cached in the receiver itself: what it found for a name it does not hold (the
value, or the method bound to it) is *borrowed* into its ``__dict__`` under that name, listed in
its volatile ``_v_borrowed``, so a repeated delegated read or send is an ordinary attribute read,
as fast as a local slot. Borrowed names are never stored (``__getstate__`` leaves them out), never
counted as own slots, and never answer another object's lookup. Each is forgotten exactly when
something it depended on changes — the *path* its lookup walked: the receiver, every ancestor
visited before the holder, the holder, and the method record found. Every object on a path knows
(in its volatile ``_v_deps``) which receivers' lookups of which names passed through it, so:
  * writing or removing slot ``n`` of an object forgets the lookups of ``n`` through it;
  * writing or removing a parent slot forgets every lookup through the object (its ancestors,
    and so every descendant's, may now be others);
  * editing a method's source, selector or compiler forgets the lookups that bound it;
  * loading, invalidating (another connection's or process's commit, an abort, a savepoint
    rollback) or ghosting an object forgets every lookup through it, before its state goes.
A write elsewhere leaves a borrowed name alone. A lookup marks its path before it borrows, and
borrows nothing if any change was made while it ran (``_changes``), so a change racing with it in
another thread never leaves a stale answer. Ancestor lists are cached per receiver until a
parent slot may have changed (``_lineage``).

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
import io
import logging
import pickle
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import persistent
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping

from batos import settings
from batos.errors import DoesNotUnderstand, PlainMethodRefused, SlotError

log = logging.getLogger("batos.uvm")
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


def _plain_allowed() -> bool:
    return settings.get_str("image_plain_methods") == "on"


_COMPILERS: dict[str, Callable[[str, str], Callable[..., Any]]] = {"plain": compile_plain}
#: Where a compiler named by stored methods is defined: its module registers it when imported,
#: on the first method that needs it, so opening an image is enough to call every method in it.
_COMPILER_MODULES = {"sandbox": "prototypes.sandbox", "tool": "prototypes.tools"}


#: Called with (method, receiver) after a method is compiled for a send (see ``set_compile_hook``).
_compile_hook: Callable[[Method, UvmObject], None] | None = None


def set_compile_hook(hook: Callable[[Method, UvmObject], None] | None) -> None:
    """Have ``hook(method, receiver)`` called whenever a method is compiled on its way to a
    receiver: after a load, an edit of its source, or a change of runtime. The kernel uses it
    to re-run a method's stored examples."""
    global _compile_hook
    _compile_hook = hook


def register_compiler(name: str, compiler: Callable[[str, str], Callable[..., Any]]) -> None:
    """Make a compiler available to methods whose ``compiler`` field names it."""
    _COMPILERS[name] = compiler


_persistent_setattr = persistent.Persistent.__setattr__
_GHOST = persistent.GHOST
_UPTODATE = persistent.UPTODATE
#: Bumped when the parent structure may have changed — a parent slot written or removed, an
#: object's state replaced or invalidated — so that cached ancestor lists survive the common
#: writes of data slots and the loading of ghosts.
_lineage = 0
#: Moved after every change a lookup could have read (a slot written, a state loaded in
#: place of another, invalidated or dropped, a method edited): a lookup that saw it move while
#: it ran caches nothing, since it may have read the state from before.
_changes = 0
#: Guards borrowing and forgetting: objects of one connection are read from its thread, but a
#: borrowed name must never be written after a change's forget has looked for it.
_cache_lock = threading.Lock()
_IDENTITY_HASH = object.__hash__


def _is_own(state: dict[str, Any], name: str) -> bool:
    """Whether ``name`` is an own slot in the object state ``state`` (not a borrowed answer)."""
    if name not in state:
        return False
    borrowed = state.get("_v_borrowed")
    return not borrowed or name not in borrowed


def _own_items(state: dict[str, Any]) -> list[tuple[str, Any]]:
    """The own (public and private) entries of an object state, borrowed names left out."""
    borrowed = state.get("_v_borrowed") or ()
    return [(k, v) for k, v in state.items() if k not in borrowed]


def restore_state(obj: persistent.Persistent, state: dict[str, Any]) -> None:
    """Replace ``obj``'s ``__dict__`` with ``state`` behind the slot protocol (a rollback of
    objects outside any database), forgetting every lookup that passed through it."""
    _forget_all(obj)
    obj.__dict__.clear()
    obj.__dict__.update(state)
    _changed(lineage=True)


def _drop(name: str, receivers: set[UvmObject]) -> None:
    """Take back what ``receivers`` borrowed for ``name`` (under the lock).

    The marks they left on the other objects of their paths stay: a mark without a borrowed
    name, or on an object a receiver's lookup no longer passes, only ever costs a spare miss,
    and leaving them makes forgetting and re-marking (the path is usually the same) cheap.
    """
    for receiver in receivers:
        state = receiver.__dict__
        borrowed = state.get("_v_borrowed")
        if borrowed and name in borrowed:
            borrowed.discard(name)
            state.pop(name, None)


def _forget(obj: persistent.Persistent, name: str) -> None:
    """Forget the cached lookups of ``name`` that passed through ``obj``.

    Called after the change and ``_changed()``: a lookup marks its path before it checks
    ``_changes``, so either this finds its marks or the lookup caches nothing.
    """
    deps = obj.__dict__.get("_v_deps")
    if deps:
        with _cache_lock:
            receivers = deps.pop(name, None)
            if receivers:
                _drop(name, receivers)


def _forget_all(obj: persistent.Persistent) -> None:
    """Forget every cached lookup that passed through ``obj``, of any name."""
    deps = obj.__dict__.get("_v_deps")
    if deps:
        with _cache_lock:
            while deps:
                name, receivers = deps.popitem()
                _drop(name, receivers)


#: The fields a method's compiled function is built from.
_COMPILED_FROM = frozenset({"selector", "source", "compiler"})


class _Tracked(persistent.Persistent):
    """An object cached lookups can pass through: whatever replaces or drops its state
    forgets those lookups first, while their marks (in its ``__dict__``) still exist."""

    #: Whether the object has parent slots, i.e. whether its state can reshape ancestor lists.
    _has_parents = False

    def __setstate__(self, state: Any) -> None:
        # A ghost being loaded gets back the state it had (an invalidation in between has
        # already moved the lineage); a state replaced in place may hold other parents.
        replaced = bool(self.__dict__)
        _forget_all(self)
        persistent.Persistent.__setstate__(self, state)
        if replaced:
            _changed(lineage=self._has_parents)
            _forget_all(self)

    def _p_invalidate(self) -> None:
        # Persistent's own _p_invalidate goes through _p_deactivate; forgetting here as well
        # keeps that an implementation detail.
        _forget_all(self)
        persistent.Persistent._p_invalidate(self)
        _changed(lineage=self._has_parents)

    def _p_deactivate(self) -> None:
        # Only an unchanged object of a database becomes a ghost; ancestor lists survive it,
        # since a ghost ancestor is the same object, loaded again on use.
        if self._p_jar is not None and self._p_state == _UPTODATE:
            _forget_all(self)
            persistent.Persistent._p_deactivate(self)
            _changed()
        else:
            persistent.Persistent._p_deactivate(self)


def _changed(*, lineage: bool = False) -> None:
    """Note a change (after it is made), and a possible change of parents if ``lineage``."""
    global _changes, _lineage
    # Not under the lock: a lost increment of a racing change still moves the value.
    _changes += 1
    if lineage:
        with _cache_lock:
            _lineage += 1


class Method(_Tracked):
    """A method slot: the source text and what we know of it; never a pickled function.

    The compiled function lives only in the volatile ``_v_function`` and is rebuilt from
    ``source`` after every load, so a method survives any change to Python or BAT OS.
    ``examples`` are the input → output examples a generated method was judged by (plain
    dicts; empty for methods written before examples existed or by hand).
    """

    examples: list[dict[str, Any]] | tuple[()] = ()

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
        # Made by this process's own code (volatile: a method loaded from an image, or a
        # copy of one, never has it): what lets a plain method that was never stored run.
        self._v_made_here = True

    def __setattr__(self, name: str, value: Any) -> None:
        persistent.Persistent.__setattr__(self, name, value)
        if name in _COMPILED_FROM:
            # The compiled function and every bound copy cached for a receiver were built
            # from the old text: drop them so the next send compiles the new one.
            self.__dict__.pop("_v_function", None)
            _changed()
            _forget_all(self)

    def function(self, receiver: UvmObject | None = None) -> Callable[..., Any]:
        """The compiled function, compiled now if it is not yet (after a load or an edit);
        a fresh compile for a ``receiver`` is reported to the compile hook."""
        fn = self.__dict__.get("_v_function")
        if fn is None:
            self._p_activate()
            stored = self._p_oid is not None or not self.__dict__.get("_v_made_here")
            if self.compiler == "plain" and stored and not _plain_allowed():
                # Stored, so anyone who could write the image could have written it: plain
                # Python runs unsandboxed as the user of whichever process sends it.
                raise PlainMethodRefused(self.selector, oid=self._p_oid)
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
            if receiver is not None and _compile_hook is not None:
                _compile_hook(self, receiver)
        return fn

    def bind(self, receiver: UvmObject) -> types.MethodType:
        return types.MethodType(self.function(receiver), receiver)

    def copy(self) -> Method:
        twin = Method(
            self.selector,
            self.source,
            intent=self.intent,
            author=self.author,
            audit=copy.deepcopy(self.audit),
            compiler=self.compiler,
        )
        if self.examples:
            twin.examples = copy.deepcopy(list(self.examples))
        twin.created = self.created
        # a copy of a method from an image is one too (clone() copies every method)
        twin._v_made_here = self._p_oid is None and bool(self.__dict__.get("_v_made_here"))
        return twin

    def __repr__(self) -> str:
        return f"<Method {self.selector} by {self.author}>"


_MISSING = object()


def _resolve(receiver: UvmObject, name: str) -> tuple[Any, tuple[persistent.Persistent, ...]]:
    """``name`` as the (active) receiver sees it, and the path its lookup walked.

    A data slot comes back as its value, a method bound to the receiver; _MISSING if no
    holder has it. The path is the receiver, the ancestors visited before the holder, the
    holder, and for a method its record: what a borrowed answer depends on. Never generative.
    """
    chain = (receiver, *receiver._ancestors())
    for index, holder in enumerate(chain):
        state = holder.__dict__
        if holder is not receiver and name in state:
            # An ancestor's borrowed answer is not its slot: using it would leave this
            # receiver unmarked on the rest of that ancestor's path.
            borrowed = state.get("_v_borrowed")
            if not borrowed or name not in borrowed:
                return state[name], chain[: index + 1]
        method = state["_methods"].get(name)
        if method is not None:
            return types.MethodType(method.function(receiver), receiver), (
                *chain[: index + 1],
                method,
            )
    return _MISSING, ()


def _borrow(
    obj: UvmObject, name: str, found: Any, path: tuple[persistent.Persistent, ...], seen: int
) -> None:
    """Keep what ``obj`` found for ``name`` in its own ``__dict__``, unless something changed
    since ``seen`` (its lookup began).

    Every object on the lookup's ``path`` is marked first, so a change made after the check
    below finds the borrowed name to forget (see ``_forget``). Receivers that do not hash by
    identity (a subclass defining ``__eq__``) cannot be marked, and borrow nothing.
    """
    if type(obj).__hash__ is not _IDENTITY_HASH or name[-1:] == "*":
        return  # a parent slot is never borrowed: the receiver's own parents define its lineage
    for holder in path:
        # A path object turned ghost while the lookup ran (a compiler's code may run
        # anything) has lost its marks: nothing would forget this answer.
        if holder._p_state == _GHOST:
            return
        state = holder.__dict__
        deps = state.get("_v_deps")
        if deps is None:
            state["_v_deps"] = {name: {obj}}
        else:
            marked = deps.get(name)
            if marked is None:
                deps[name] = {obj}
            else:
                marked.add(obj)
    with _cache_lock:
        if seen != _changes:
            return
        state = obj.__dict__
        if name in state:  # an own slot written meanwhile answers from now on
            return
        borrowed = state.get("_v_borrowed")
        if borrowed is None:
            state["_v_borrowed"] = {name}
        else:
            borrowed.add(name)
        state[name] = found


@functools.cache
def _answered_by_class(cls: type) -> frozenset[str]:
    """Public names the class answers itself (``clone``…).

    A slot of such a name could be stored but never reached: the class attribute would be
    found before the parent chain (for methods, before the object's own slot too).
    """
    return frozenset(name for name in dir(cls) if not name.startswith("_"))


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
    # pickle's documented hook for persistent ids is an attribute set on the instance
    unpickler.persistent_load = pickler.shared.__getitem__  # type: ignore[method-assign]
    return unpickler.load()


class UvmObject(_Tracked):
    """A persistent prototype: slots, parent slots and methods in one namespace."""

    # Plain attribute lookup instead of Persistent's: a miss then costs no exception before
    # ``__getattr__`` runs, which makes delegation several times faster. The price is that
    # lookups do not unghostify by themselves — ``__getattr__`` does it — and do not refresh
    # the object's place in the pickle cache's LRU ring.
    __getattribute__ = object.__getattribute__
    _has_parents = True

    def __init__(self, *parents: UvmObject, **slots: Any) -> None:
        self._methods: dict[str, Method] = {}
        for index, parent in enumerate(parents):
            setattr(self, "parent*" if index == 0 else f"parent{index + 1}*", parent)
        for name, value in slots.items():
            setattr(self, name, value)

    # -- lookup ---------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Reached when the receiver's __dict__ lacks ``name``: neither an own slot nor a
        # borrowed answer (or the receiver is a ghost).
        if self._p_state == _GHOST:
            self._p_activate()
            return getattr(self, name)
        if name[:1] == "_":
            raise AttributeError(name)
        seen = _changes
        found, path = _resolve(self, name)
        if found is not _MISSING:
            _borrow(self, name, found, path, seen)
            return found
        return self._does_not_understand(name)

    def _does_not_understand(self, selector: str) -> Any:
        if _DNU_HANDLER is not None:
            return _DNU_HANDLER(self, selector)
        raise DoesNotUnderstand(self, selector)

    def _parents(self) -> tuple[UvmObject, ...]:
        """The prototypes in the receiver's parent slots, in slot order; any other value (an
        image written before parent slots were checked) is skipped with a warning, so that
        one bad slot on a shared ancestor cannot break every lookup through it."""
        if self._p_state == _GHOST:
            self._p_activate()
        parents = [v for k, v in self.__dict__.items() if k[-1:] == "*"]
        if all(isinstance(p, UvmObject) for p in parents):
            return tuple(parents)
        return tuple(self._valid_parents())

    def _valid_parents(self) -> list[UvmObject]:
        valid = []
        for name, value in self.__dict__.items():
            if name[-1:] != "*":
                continue
            if isinstance(value, UvmObject):
                valid.append(value)
            else:
                log.warning(
                    "%r: parent slot %r holds a value of type %s, not a prototype; it is skipped "
                    "(remove it with delattr, or assign a prototype)",
                    self,
                    name,
                    type(value).__name__,
                )
        return valid

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
            state = holder.__dict__
            if _is_own(state, name):
                return holder, state[name]
            method = state["_methods"].get(name)
            if method is not None:
                return holder, method
        return None

    def _responds_to(self, name: str) -> bool:
        return self._lookup(name) is not None

    # -- slot writes ----------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            persistent.Persistent.__setattr__(self, name, value)
            if name == "_methods":  # a whole new method table
                _changed()
                _forget_all(self)
            return
        if name[-1:] == "*" and not isinstance(value, UvmObject):
            raise SlotError(
                f"parent slot {name!r} must hold a prototype, not a value of type "
                f"{type(value).__name__}",
                hint=f"assign a UvmObject of the image; to remove the parent, delete the slot "
                f"(delattr(obj, {name!r})): None does not remove it",
            )
        # classes are hashable; mypy cannot tell, as persistent ships no types for their metaclass
        if name in _answered_by_class(type(self)):  # type: ignore[arg-type]
            raise SlotError(
                f"{type(self).__name__} itself answers {name!r}: a slot of that name would be "
                "stored but its own class attribute would always be found first",
                hint=f"choose another name (these are taken: "
                f"{', '.join(sorted(_answered_by_class(type(self))))})",  # type: ignore[arg-type]
            )
        methods = self._methods  # loads a ghost
        state = self.__dict__
        borrowed = state.get("_v_borrowed")
        if borrowed and name in borrowed:
            with _cache_lock:  # from now on an own slot: the forget below must not take it
                borrowed.discard(name)
        try:
            if isinstance(value, Method):
                if name != value.selector:
                    raise SlotError(
                        f"method {value.selector!r} cannot be stored in slot {name!r}",
                        hint=f"store it as obj.{value.selector} = method",
                    )
                state.pop(name, None)
                methods[name] = value
                self._p_changed = True
                return
            if name in methods:
                del methods[name]
            _persistent_setattr(self, name, value)
        finally:
            if name[-1:] == "*" or "_v_deps" in state:
                self._changed_slot(name)
            else:  # nothing was looked up through this object: only note the change
                _changed()

    def __delattr__(self, name: str) -> None:
        if name.startswith("_"):
            persistent.Persistent.__delattr__(self, name)
            if name in ("_methods", "_p_changed"):  # the table gone, or the state invalidated
                _changed()
                _forget_all(self)
            return
        if name in self._methods:
            del self._methods[name]
            self._p_changed = True
        elif _is_own(self.__dict__, name):
            persistent.Persistent.__delattr__(self, name)
        else:
            raise AttributeError(f"{self!r} has no own slot {name!r} to remove")
        self._changed_slot(name)

    def _changed_slot(self, name: str) -> None:
        """Forget the cached lookups slot ``name`` of this object may have answered or hidden."""
        if name[-1:] == "*":
            # Other parents: every lookup through this object may now walk other ancestors.
            _changed(lineage=True)
            _forget_all(self)
        else:
            _changed()
            _forget(self, name)

    # -- reflection -----------------------------------------------------------------------

    def _slots(self) -> dict[str, Any]:
        """The receiver's own slots (data, parents and methods), without private names."""
        self._p_activate()
        own = {k: v for k, v in _own_items(self.__dict__) if not k.startswith("_")}
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
        raises ``SlotError``. A parent slot that holds no prototype (an old image's) is left
        out, as lookup skips it.
        """
        self._p_activate()
        twin = self.__class__.__new__(self.__class__)
        twin._methods = {name: m.copy() for name, m in self._methods.items()}
        own = {
            k: v
            for k, v in _own_items(self.__dict__)
            if not k.startswith("_") and (k[-1:] != "*" or isinstance(v, UvmObject))
        }
        for name, value in _copied(self, own).items():
            setattr(twin, name, value)
        for name, value in overrides.items():
            setattr(twin, name, value)
        return twin

    def __getstate__(self) -> dict[str, Any]:
        state = persistent.Persistent.__getstate__(self)
        borrowed = self.__dict__.get("_v_borrowed")
        if borrowed:  # answers of other objects' slots: never part of this object's record
            for name in borrowed:
                state.pop(name, None)
        return state

    def _own_slot(self, name: str, default: Any = None) -> Any:
        """The receiver's own slot ``name`` (data or method), never an inherited one."""
        self._p_activate()
        state = self.__dict__
        if _is_own(state, name):
            return state[name]
        return state["_methods"].get(name, default)

    def __repr__(self) -> str:
        self._p_activate()
        name = self.__dict__.get("name") if _is_own(self.__dict__, "name") else None
        oid = self._p_oid
        where = f" oid={int.from_bytes(oid, 'big'):#x}" if oid else ""
        label = f" {name[:60]!r}" if isinstance(name, str) else ""
        return f"<{type(self).__name__}{label}{where}>"
