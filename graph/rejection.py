"""Wrong methods do not stay: a generated method that a user marks wrong, or whose stored
examples start failing, is taken out in a transaction of its own and kept in the image's record
of rejected methods (``prototypes.rejected``), and its intent is pending again.

**Taking out** (``reject``, what ``batos methods reject`` runs, and ``check_methods``). One
transaction removes the method from the object that holds it; records it whole (source,
examples, audit) with who, when and why; declares its intent on that object when nothing else
declares it, so the method written next has the same intent; and, for a codex facet, marks it
pending in ``store.core.method_queue``, where the heartbeat's ``facets`` job writes it again (any
other method is written again by doesNotUnderstand on its next send). The same code is refused
if it is drafted again for that object (``kernel.Mission.audit``). Every error is found before
anything is written, and a process killed on the way leaves all of it or none of it.

**Examples that start failing.** A method's agreed examples run again when it is compiled after
a change of its source or of the runtime (``kernel._recheck_on_compile``). That happens inside
whatever transaction loaded the method — a user's send, a mind cycle — which is not ours to
commit, so a failure there is only noted (``rejected.note_failing``). ``check_methods`` runs
every generated method's agreed examples on a connection that is never committed, then takes
out each that failed in a transaction of its own, running its examples once more in it (the
state may have moved on meanwhile). The heartbeat's ``methods`` job checks every method;
``remove_noted`` checks the ones this process noted, and ``batos send`` calls it once its own
transaction is over. The examples run on the object that holds the method (which receiver a
mission wrote it for is not recorded): an example that relied on a slot only that receiver had
fails there, and the method is taken out; ``restore`` puts it back with that example disputed.

**Putting back** (``restore``, ``batos methods restore``): the newest record still rejected of
the selector on the object or one of its ancestors. The method is installed again through the
PersistenceGuardian and the sandbox compiler, its agreed examples run again (those it fails are
kept as *disputed*: the user's word outweighs them, and the method is no longer held to them),
and the record says ``restored``. ``batos undo TID`` of the rejection's transaction reverts it
all at once as well, while no later transaction has changed the same objects.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from persistent.mapping import PersistentMapping
from ZODB.POSException import POSKeyError

from batos.errors import BatosError, ObjectPathError
from graph.facets import facet_key
from prototypes import kernel, rejected
from prototypes.codex import FACET_PREFIX, INTENTS_SLOT
from prototypes.incarnation import personas
from prototypes.install import install_method
from prototypes.paths import prototype
from prototypes.uvm import Method, UvmObject
from store.core import layout, method_queue
from store.core.image import LivingImage, actor
from store.core.transactions import Unchanged

log = logging.getLogger("batos.rejection")

#: Why a method was taken out: a user said it is wrong, or its stored examples fail.
BY_USER, BY_EXAMPLES = "user", "examples"
#: Failing examples quoted in the reason of a method taken out for them.
QUOTED_FAILURES = 3
#: Characters of a path or selector echoed in a message (they come from the command line).
ECHO_CHARS = 80


class RejectionError(BatosError):
    """A method that cannot be rejected or restored as asked; the image is unchanged."""


@dataclass(frozen=True)
class Rejection:
    """A method taken out: its record's number, where it was, why, and what writes it again."""

    number: int
    path: str
    selector: str
    cause: str
    reason: str
    rewritten_by: str


@dataclass(frozen=True)
class Restored:
    """A method put back, and the stored examples it fails (now disputed)."""

    number: int
    path: str
    selector: str
    disputed: tuple[str, ...] = ()


@dataclass
class CheckReport:
    """What ``check_methods`` did: methods checked, taken out, and those it could not check."""

    checked: int = 0
    removed: list[Rejection] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


def walk(root: Any) -> Iterator[tuple[str, UvmObject]]:
    """(path, object) for every prototype reachable from the top-level ones through slots
    (parent slots included), each once, nearest path first."""
    seen: set[int] = set()
    objects = layout.find(root, layout.OBJECTS) or {}
    frontier = [(str(name), objects[name]) for name in objects.keys()]
    while frontier:
        following = []
        for where, obj in frontier:
            if not isinstance(obj, UvmObject) or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield where, obj
            following += [
                (f"{where}.{slot}", value)
                for slot, value in sorted(obj._slots().items())
                if isinstance(value, UvmObject)
            ]
        frontier = following


def _echo(text: str) -> str:
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 1] + "…"


def _path_of(root: Any, obj: UvmObject, default: str) -> str:
    return next((where for where, found in walk(root) if found is obj), default)


def _facet(root: Any, holder: UvmObject, selector: str) -> str | None:
    """The method queue's key of a codex facet held by its persona; None for any other."""
    if not selector.startswith(FACET_PREFIX):
        return None
    return next((facet_key(n, selector) for n, p in personas(root).items() if p is holder), None)


def _rewritten_by(root: Any, holder: UvmObject, selector: str) -> str:
    if _facet(root, holder, selector) is not None:
        return "the heartbeat's facets job"
    return "doesNotUnderstand, on its next send"


# -- taking out -------------------------------------------------------------------------------


def _generated(root: Any, path: str, selector: str) -> tuple[UvmObject, Method, str]:
    """The generated method ``path`` answers ``selector`` with: (holder, method, the holder's
    path); a clear error for anything else."""
    receiver = prototype(root, path)
    name = f"{_echo(path)}.{_echo(selector)}"
    found = receiver._lookup(selector)
    if found is None:
        generated = sorted(
            {
                m.selector
                for holder in (receiver, *receiver._ancestors())
                for m in kernel.generated_methods(holder)
                if kernel.is_generated(m)
            }
        )
        earlier = rejected.newest(root, (receiver, *receiver._ancestors()), selector)
        hint = f"its generated methods: {', '.join(generated) or 'none'}"
        if earlier is not None:
            hint = f"it was rejected already (record {earlier['id']}: 'batos methods --rejected')"
        raise ObjectPathError(f"{name} is not a method", hint=hint)
    holder, method = found
    if not isinstance(method, Method):
        raise RejectionError(
            f"{name} is a data slot, not a method",
            hint=f"only generated methods are rejected; 'batos inspect {_echo(path)}' shows it",
        )
    where = _path_of(root, holder, path)
    if not kernel.is_generated(method):
        raise RejectionError(
            f"{name} was written by hand, not generated: nothing would write it again",
            hint=f"remove it with 'batos methods remove {_echo(where)} {_echo(selector)}'",
        )
    return holder, method, where


def _declare_intent(holder: UvmObject, selector: str, text: str) -> bool:
    """Declare ``selector``'s intent on ``holder`` when nothing declares one; whether it did."""
    if not text or kernel.intent_for(holder, selector)[0]:
        return False
    intents = holder._own_slot(INTENTS_SLOT)
    if isinstance(intents, PersistentMapping):
        intents[selector] = text
    elif intents is None or isinstance(intents, Mapping):
        setattr(holder, INTENTS_SLOT, PersistentMapping({**(intents or {}), selector: text}))
    else:  # a slot of that name holding something else: left as it is
        return False
    return True


def _take_out(
    root: Any, holder: UvmObject, method: Method, *, path: str, reason: str, cause: str
) -> Rejection:
    """Remove ``method`` from ``holder``, record it and make its intent pending again, in the
    caller's transaction (the image's upgrade steps made the containers)."""
    selector = method.selector
    delattr(holder, selector)
    declared = _declare_intent(holder, selector, method.intent)
    number = rejected.add(
        root,
        holder,
        method,
        path=path,
        reason=reason,
        cause=cause,
        by=actor(),
        declared_intent=declared,
    )
    key = _facet(root, holder, selector)
    if key is not None:
        method_queue.record_pending(root, key, f"rejected: {reason or 'marked wrong'}")
    log.info("took out %s.%s (record %d): %s", path, selector, number, reason or cause)
    return Rejection(number, path, selector, cause, reason, _rewritten_by(root, holder, selector))


def reject(image: LivingImage, path: str, selector: str, *, reason: str = "") -> Rejection:
    """Take out the generated method ``path`` answers ``selector`` with (its own or an
    ancestor's), in a transaction of its own; what was done.

    ``ObjectPathError`` for an unknown object or selector, ``RejectionError`` for a data slot
    or a method written by hand; either way nothing was written.
    """
    with image.read() as root:  # every error before anything is written
        _generated(root, path, selector)

    def take(root: Any) -> Rejection:
        holder, method, where = _generated(root, path, selector)
        return _take_out(root, holder, method, path=where, reason=reason.strip(), cause=BY_USER)

    return image.transact(take, note=f"methods reject {_echo(path)}.{_echo(selector)}")


# -- examples that start failing ----------------------------------------------------------------


def _has_agreed(method: Method) -> bool:
    return any(isinstance(e, Mapping) and e.get("status") == "agreed" for e in method.examples)


def check_methods(
    image: LivingImage, only: Iterable[tuple[bytes, str]] | None = None
) -> CheckReport:
    """Run the agreed examples of every generated method (of those ``only`` names: holder oid,
    selector), and take out each that fails, in a transaction of its own (module docstring)."""
    wanted = None if only is None else set(only)
    report = CheckReport()
    if wanted is not None and not wanted:
        return report
    failing = []
    with image.connection() as conn:  # the checks only read; this is never committed
        conn.transaction_manager.begin()
        for where, holder in walk(conn.root()):
            for method in kernel.generated_methods(holder):
                key = (holder._p_oid, method.selector)
                if not kernel.is_generated(method) or not _has_agreed(method):
                    continue
                if wanted is not None and key not in wanted:
                    continue
                report.checked += 1
                try:
                    _, failures = kernel.example_failures(method, holder)
                except BatosError as exc:
                    report.unchecked.append(f"{where}.{method.selector}: {exc.message}")
                    log.warning("%s.%s not checked: %s", where, method.selector, exc.message)
                    continue
                if failures:
                    failing.append((where, key, kernel.source_digest(method.source)))
    for where, (oid, selector), digest in failing:

        def take(root: Any, where=where, oid=oid, selector=selector, digest=digest) -> Any:
            return _take_out_failing(root, where, oid, selector, digest)

        done = image.transact(take, note=f"methods reject {where}.{selector}: its examples fail")
        if done is not None:
            report.removed.append(done)
    return report


def _take_out_failing(
    root: Any, where: str, oid: bytes | None, selector: str, digest: str
) -> Rejection:
    """Take the method out if it is the one checked and its examples still fail here."""
    try:
        holder = root._p_jar.get(oid)
    except (POSKeyError, KeyError, TypeError):
        raise Unchanged() from None
    method = holder._own_slot(selector) if isinstance(holder, UvmObject) else None
    if (
        not isinstance(method, Method)
        or not kernel.is_generated(method)
        or kernel.source_digest(method.source) != digest
    ):
        raise Unchanged()  # changed meanwhile: the next check looks at it again
    check = kernel.check_examples(method, holder)
    if not check["failed"]:
        raise Unchanged()
    method.audit = {**method.audit, "examples_check": check}
    failed = check["failed"]
    reason = f"{len(failed)} stored example(s) fail: " + "; ".join(failed[:QUOTED_FAILURES])
    return _take_out(root, holder, method, path=where, reason=reason, cause=BY_EXAMPLES)


def remove_noted(image: LivingImage) -> CheckReport:
    """``check_methods`` for the methods this process saw fail their examples when it compiled
    them (``rejected.take_failing``); call it once the transaction that compiled them is over."""
    return check_methods(image, rejected.take_failing())


# -- putting back -----------------------------------------------------------------------------


def _restorable(root: Any, path: str, selector: str) -> tuple[dict[str, Any], UvmObject]:
    receiver = prototype(root, path)
    record = rejected.newest(root, (receiver, *receiver._ancestors()), selector)
    if record is None:
        raise RejectionError(
            f"no rejected method {_echo(selector)!r} on {_echo(path)} or its parents",
            hint="'batos methods --rejected' lists the rejected methods and where they were",
        )
    holder = record["holder"]
    now = holder._own_slot(selector)
    if isinstance(now, Method):
        raise RejectionError(
            f"{record['path']}.{selector} has a method again, written since it was rejected",
            hint=f"take that one out first ('batos methods reject {record['path']} {selector}'), "
            "then restore",
        )
    if now is not None:
        raise RejectionError(
            f"{record['path']}.{selector} is a data slot now",
            hint=f"remove the slot first ('batos inspect {record['path']}' shows it)",
        )
    return record, holder


def _dispute_failing(method: Method, holder: UvmObject) -> list[str]:
    """Run the method's agreed examples; mark those it fails disputed. Their failures."""
    if not method.examples:
        return []
    passed, failures = kernel.example_failures(method, holder)
    bad = {index for index, _ in failures}
    if bad:
        method.examples = [
            {**dict(e), "status": "disputed"} if i in bad else e
            for i, e in enumerate(method.examples)
        ]
    method.audit = {**method.audit, "examples_check": kernel.check_record(method, passed, [])}
    return [text for _, text in failures]


def restore(image: LivingImage, path: str, selector: str) -> Restored:
    """Put back the newest rejected method ``selector`` of ``path`` (or an ancestor), through
    ``prototypes.install`` (the guardian and the sandbox compiler), in a transaction of its own.

    ``RejectionError`` when there is none or the slot is taken again; ``AuditRejected`` when
    the guardian refuses the code now; either way nothing was written.
    """
    with image.read() as root:
        _restorable(root, path, selector)

    def put(root: Any) -> Restored:
        record, holder = _restorable(root, path, selector)
        kept = record["method"]
        by = actor()
        method = install_method(
            holder,
            selector,
            kept.source,
            intent=kept.intent,
            author=kept.author,
            audit={
                **copy.deepcopy(dict(kept.audit)),
                "restored": {"record": record["id"], "by": by, "at": time.time()},
            },
            compiler=kept.compiler,
            examples=copy.deepcopy(list(kept.examples)),
            created=kept.created,
        )
        disputed = _dispute_failing(method, holder)
        rejected.mark_restored(root, record["id"], by)
        key = _facet(root, holder, selector)
        if key is not None:
            method_queue.record_success(root, key)
        return Restored(record["id"], record["path"], selector, tuple(disputed))

    return image.transact(put, note=f"methods restore {_echo(path)}.{_echo(selector)}")


# -- the record, for reading ------------------------------------------------------------------


def rejected_rows(root: Any) -> list[dict[str, Any]]:
    """Every rejected method, newest first: where, why, by whom, when, its status now
    (``pending``: nothing written since; ``written again``; ``restored``), and the method."""
    rows = []
    for record in rejected.entries(root):
        method, holder, selector = record["method"], record["holder"], record["selector"]
        status = record["status"]
        if status == rejected.REJECTED:
            again = isinstance(holder._own_slot(selector), Method)
            status = "written again" if again else "pending"
        rows.append(
            {
                "id": record["id"],
                "path": record["path"],
                "selector": selector,
                "cause": record["cause"],
                "reason": record["reason"],
                "by": record["by"],
                "at": record["at"],
                "status": status,
                "rewritten_by": _rewritten_by(root, holder, selector),
                "restored_by": record.get("restored_by"),
                "restored_at": record.get("restored_at"),
                "intent": method.intent,
                "author": method.author,
                "source": method.source,
                "examples": list(method.examples),
                "examples_check": method.audit.get("examples_check"),
            }
        )
    return rows
