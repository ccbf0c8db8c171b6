"""The image's record of rejected methods: each generated method taken out as wrong is kept
whole, with who took it out, when and why, so that it can be put back — and so that the same
code is never installed on the same object again as it was.

Records live in the image's ``layout.REJECTED_METHODS`` container (an ``OOBTree``: record number →
plain dict, assigned again on every change), beside its objects: like the objects themselves they
belong to the object model. A record holds the ``Method`` itself (source, examples, audit) and the
object that held it, by reference; its ``digest`` is ``code_digest`` of the source, which
``refusal`` compares every new draft for that object and selector with while the record's status is
``rejected`` (``restored`` once a user put it back)."""

from __future__ import annotations

import ast
import hashlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from prototypes.uvm import Method, UvmObject
from store.core import layout

#: Characters of a reason kept in a record, and shown in a refusal.
MAX_REASON_CHARS = 2000
REFUSAL_REASON_CHARS = 300
#: A record's status while its code is refused, and once a user put it back.
REJECTED, RESTORED = "rejected", "restored"
#: Failing methods noted per process before the oldest notes are dropped.
MAX_NOTED = 100
#: (holder oid, selector) of generated methods whose examples failed when they were compiled:
#: taken out later, by ``graph.rejection``, never inside the transaction that compiled them.
_noted: dict[tuple[bytes, str], None] = {}
_noted_lock = threading.Lock()


def code_digest(source: str) -> str:
    """A digest of the code, not of its spelling: the same code with other comments, blank
    lines or spacing has the same digest (the source as text, when it does not parse)."""
    try:
        text = ast.dump(ast.parse(source))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        text = source
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def records(root: Any) -> Any | None:
    """The record container, or None in an image that was never laid out for it."""
    return layout.find(root, layout.REJECTED_METHODS)


def add(
    root: Any,
    holder: UvmObject,
    method: Method,
    *,
    path: str,
    reason: str,
    cause: str,
    by: str,
    declared_intent: bool = False,
) -> int:
    """Record ``method``, just taken out of ``holder``; the record's number."""
    found = layout.rejected_methods(root)
    number = found.maxKey() + 1 if len(found) else 1
    found[number] = {
        "id": number,
        "holder": holder,
        "path": path,
        "selector": method.selector,
        "method": method,
        "digest": code_digest(method.source),
        "reason": reason[:MAX_REASON_CHARS],
        "cause": cause,
        "by": by,
        "at": time.time(),
        "status": REJECTED,
        "declared_intent": declared_intent,
    }
    return number


def entries(root: Any) -> Iterator[dict[str, Any]]:
    """Every record, newest first, as a plain copy."""
    found = records(root)
    if found is None:
        return
    for number in reversed(list(found.keys())):
        yield dict(found[number])


def drop_held_by(root: Any, holder: UvmObject) -> int:
    """Delete the records of methods ``holder`` held (the object itself is being removed);
    how many. No path reaches ``holder`` afterwards, so nothing could put them back, and a
    record would keep the removed object in the image."""
    found = records(root)
    if found is None:
        return 0
    numbers = [number for number, record in found.items() if record["holder"] is holder]
    for number in numbers:
        del found[number]
    return len(numbers)


def newest(root: Any, holders: tuple[UvmObject, ...], selector: str) -> dict[str, Any] | None:
    """The newest record still rejected of ``selector`` held by one of ``holders``."""
    for record in entries(root):
        if (
            record["status"] == REJECTED
            and record["selector"] == selector
            and any(record["holder"] is h for h in holders)
        ):
            return record
    return None


def mark_restored(root: Any, number: int, by: str) -> None:
    found = layout.rejected_methods(root)
    found[number] = {
        **found[number],
        "status": RESTORED,
        "restored_by": by,
        "restored_at": time.time(),
    }


def refusal(holder: UvmObject, selector: str, source: str) -> str | None:
    """Why ``source`` may not become ``holder``'s method ``selector`` (its code was rejected
    there), in words for the author of the draft; None when it may, or ``holder`` is in no
    image."""
    jar = holder._p_jar
    root = None if jar is None else jar.root()
    if root is None or records(root) is None:
        return None
    digest = None
    for record in entries(root):
        if record["status"] != REJECTED or record["selector"] != selector:
            continue
        if record["holder"] is not holder:
            continue
        digest = digest or code_digest(source)
        if record["digest"] == digest:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record["at"]))
            why = (record["reason"] or "marked wrong")[:REFUSAL_REASON_CHARS]
            return (
                f"this code was rejected as {selector} on {when} ({why}): it will not be "
                "installed again; write a method that behaves differently"
            )
    return None


def note_failing(method: Method, receiver: UvmObject) -> None:
    """Note that ``method`` failed its stored examples when it was compiled for ``receiver``
    (inside whatever transaction loaded it: the removal waits for ``take_failing``)."""
    found = receiver._lookup(method.selector)
    oid = found[0]._p_oid if found is not None and found[1] is method else None
    if oid is None:  # on an object not saved yet: the heartbeat's check finds it later
        return
    with _noted_lock:
        _noted[(oid, method.selector)] = None
        while len(_noted) > MAX_NOTED:
            del _noted[next(iter(_noted))]


def take_failing() -> list[tuple[bytes, str]]:
    """(holder oid, selector) of the methods noted failing in this process since the last
    call, oldest first; the notes are cleared."""
    with _noted_lock:
        noted = list(_noted)
        _noted.clear()
    return noted
