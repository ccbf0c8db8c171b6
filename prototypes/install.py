"""The one approve-and-install step: every method that enters the image passes here.

Whatever wrote the source — a mission's draft, a facet approved on another connection, a
cycle's effect read back from graph state, a user's file, a rejected method put back — it is
data until this step has run the PersistenceGuardian on it and compiled it with the compiler
it will run under (the sandbox's, or the tool compiler for a tool proxy's methods). Only then
is the ``Method`` record built and put in its slot; a source either refuses raises
``AuditRejected`` (or ``SandboxViolation``) and nothing is written. The fresh verdict is kept
in the method's audit, over any verdict the caller's record carried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from batos.errors import AuditRejected, SlotError
from prototypes import guardian, tools
from prototypes.uvm import Method, UvmObject

#: Compilers of methods that went through this step: plain sandboxed ones and tool methods.
GATED_COMPILERS = frozenset({"sandbox", tools.TOOL_COMPILER})


def compiler_for(target: UvmObject) -> str:
    """The compiler a method of ``target`` runs under: a tool proxy's builds a request the
    host sends; every other object's runs in the sandbox."""
    return tools.TOOL_COMPILER if tools.is_tool(target) else "sandbox"


def install_method(
    target: UvmObject,
    selector: str,
    source: str,
    *,
    intent: str = "",
    author: str,
    audit: Mapping[str, Any] | None = None,
    compiler: str | None = None,
    examples: Sequence[Mapping[str, Any]] = (),
    created: float | None = None,
) -> Method:
    """Approve ``source`` again and install it as ``target``'s method ``selector``.

    ``compiler`` defaults to ``compiler_for(target)``; only the gated compilers are accepted
    (``AuditRejected``), so no caller, nor data it passes on, can pick Python's own.
    ``examples`` are the input → output records the method was judged by; ``created`` keeps
    the time a method that is put back was first written. Raises ``AuditRejected`` or
    ``SandboxViolation`` with every finding when the source is refused; the image is then
    unchanged.
    """
    held = target._slots().get(selector, None)
    if held is not None and not isinstance(held, Method):
        # A method would replace the data for good: removing it later would not bring it back.
        raise SlotError(
            f"{selector!r} is a data slot of this object, not a method",
            hint=f"give the method another name, or change the slot's value instead of "
            f"replacing it (it holds a {type(held).__name__})",
        )
    compiler = compiler or compiler_for(target)
    if compiler not in GATED_COMPILERS:
        raise AuditRejected(
            f"method {selector!r} names compiler {compiler!r}, which is not a sandboxed one",
            [f"an installed method runs under one of {sorted(GATED_COMPILERS)}"],
        )
    method = _record(
        selector,
        source,
        compiler,
        intent=intent,
        author=author,
        audit={**(audit or {}), **guardian.audit(selector, source).as_dict()},
    )
    # Compiling runs the guardian (its ``check``, counted and raising with every finding)
    # and the compiler's own policy; the function is kept, so the first send does not
    # compile the same source again.
    method.function()
    if examples:
        method.examples = [dict(e) for e in examples]
    if created is not None:
        method.created = created
    return target._add_method(method)


def trial_slot(
    target: UvmObject, selector: str, source: str, function: Callable[..., Any]
) -> Method:
    """Put a draft's already compiled ``function`` in ``target``'s slot for one trial run in
    an isolated child, so a method that calls itself, or an object that inherits it, finds
    it as it will for real. Never committed: the child's copy of the image is thrown away."""
    method = _record(selector, source, "sandbox")
    method._v_function = function
    return target._add_method(method)


def end_trial(target: UvmObject, selector: str, held: Any) -> None:
    """Take a trial's method out of ``target``'s slot, putting back the method it stood in
    for (a checked method's own record): a report that lost it is refused by the host."""
    if isinstance(held, Method):
        target._add_method(held)
    else:
        delattr(target, selector)


def _record(selector: str, source: str, compiler: str, **fields: Any) -> Method:
    # The only place a method record with a compiler is made: a new one reaches its slot
    # through ``install_method``, or for a trial through ``trial_slot``.
    return Method(selector, source, compiler=compiler, **fields)
