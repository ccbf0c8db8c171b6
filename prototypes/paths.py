"""Dotted paths into the image: ``robin``, ``robin.intents``, ``robin.parent*.description``.

The first name is a top-level object of the image's registry of named objects; each further name is
a slot of a prototype (its own first, then inherited, never generative), a key of a mapping or
an index of a list or tuple (``robin.router_examples.0``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from batos.errors import ObjectPathError
from prototypes.bounded import bounded_repr
from prototypes.uvm import UvmObject
from store.core import layout


def _names(obj: Any) -> list[str]:
    if isinstance(obj, UvmObject):
        return sorted(obj._slots())
    if isinstance(obj, Mapping):
        return sorted(str(k) for k in obj.keys())
    if _indexable(obj):
        return [f"0 to {len(obj) - 1} (its indexes)"] if len(obj) else []
    return []


def _indexable(obj: Any) -> bool:
    return isinstance(obj, Sequence) and not isinstance(obj, (str, bytes, bytearray))


def resolve(root: Any, path: str) -> Any:
    """The object at ``path``; ``ObjectPathError`` naming the alternatives if there is none."""
    objects = layout.find(root, layout.OBJECTS)
    if objects is None:
        raise ObjectPathError("the image has no objects yet", hint="run 'batos init' first")
    if not path.strip():
        return objects
    names = path.strip().split(".")
    if not all(names):  # 'brick.', '.brick', 'brick..name': shown back as given, they mislead
        raise ObjectPathError(
            f"object path {bounded_repr(path, 80)} has an empty name in it",
            hint="join names with one dot each, e.g. brick.parent*.name",
        )
    current: Any = objects
    walked: list[str] = []
    for name in names:
        found = _step(current, name)
        if found is _MISSING:
            # The path comes from a client: its parts are echoed cut short, never whole.
            where = bounded_repr(".".join(walked), 80)[1:-1] if walked else "the image"
            choices = ", ".join(bounded_repr(n, 40)[1:-1] for n in _names(current)[:30])
            raise ObjectPathError(
                f"no {bounded_repr(name, 80)} in {where}",
                hint=f"{where} has: {choices or 'nothing'}",
            )
        current = found
        walked.append(name)
    return current


_MISSING = object()


def _step(obj: Any, name: str) -> Any:
    if isinstance(obj, UvmObject):
        hit = obj._lookup(name)
        return _MISSING if hit is None else hit[1]
    if isinstance(obj, Mapping):
        return obj.get(name, _MISSING)
    if _indexable(obj) and name.isdigit() and len(name) <= 18 and int(name) < len(obj):
        return obj[int(name)]
    return _MISSING


def prototype(root: Any, path: str) -> UvmObject:
    """The prototype at ``path``; ``ObjectPathError`` if there is none, or it is plain data."""
    if not any(path.strip().split(".")):  # resolve() reads it as the registry itself
        names = ", ".join(_names(layout.find(root, layout.OBJECTS) or {})[:10])
        raise ObjectPathError(
            "no object named: the path is empty",
            hint=f"name a prototype, e.g. {names or 'robin'} ('batos inspect' lists them)",
        )
    target = resolve(root, path)
    if not isinstance(target, UvmObject):
        raise ObjectPathError(
            f"{bounded_repr(path, 80)} is a {type(target).__name__}, not a prototype object",
            hint="methods live on prototypes: try 'batos inspect' to find one",
        )
    return target
