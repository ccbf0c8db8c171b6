"""The generative kernel: a message nobody understands becomes a mission to write the method.

A ``Mission`` holds one such message (receiver, selector, arguments) and the gate every draft
passes: audit (``guardian``) → compile in the sandbox → isolated trial (a forked process with
OS limits) → install on a savepoint of the caller's transaction → invoke → check the
persistence covenant. A draft that fails anywhere is rolled back to the savepoint, so the image
is as it was; its findings are recorded for the next draft. ``run_mission`` is the plain loop;
``graph.jit`` runs the same steps as a LangGraph graph with a chat model writing the drafts.

Where the method goes: to the nearest object (the receiver or an ancestor) whose ``intents``
slot declares the selector — so every object that inherits the intent shares the method — else
to the receiver. It is stored as source with its intent, author persona, audit report and
timestamps, and compiled by the sandbox again whenever it is loaded.

``install_handler`` makes ``obj.unknown(args)`` start a mission: the lookup returns a
``PendingMessage`` whose call carries the arguments into the mission brief. Inside sandboxed code
a missing slot is an ordinary ``AttributeError``: generated code never starts missions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import persistent

from batos.errors import (
    DoesNotUnderstand,
    GeneratedCodeError,
    MissionFailed,
)
from prototypes import guardian, sandbox
from prototypes.bounded import bounded_repr
from prototypes.codex import PERSONAS, load_codex
from prototypes.uvm import Method, UvmObject, restore_state, set_dnu_handler

log = logging.getLogger("batos.kernel")

#: The persona who writes methods for objects that belong to no persona.
DEFAULT_AUTHOR = "BRICK"
#: Characters of a slot value's repr shown in a mission brief.
BRIEF_VALUE_CHARS = 120


# -- the brief --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MissionBrief:
    """What the author of a missing method is told; private names never appear in it."""

    receiver: str
    selector: str
    args: tuple[str, ...]
    kwargs: dict[str, str]
    intent: str
    author: str
    slots: dict[str, str]
    parents: tuple[str, ...]
    inherited: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "receiver": self.receiver,
            "selector": self.selector,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
            "intent": self.intent,
            "author": self.author,
            "slots": dict(self.slots),
            "parents": list(self.parents),
            "inherited": list(self.inherited),
        }


def _short(value: Any, limit: int = BRIEF_VALUE_CHARS) -> str:
    # Bounded by nodes visited too: a slot may hold a small graph that expands without end.
    return bounded_repr(value, limit)


def intent_for(receiver: UvmObject, selector: str) -> tuple[str, UvmObject | None]:
    """The declared intent of ``selector`` and the object declaring it (None: the codex)."""
    for holder in (receiver, *receiver._ancestors()):
        intents = holder._own_slot("intents")
        if isinstance(intents, Mapping) and selector in intents:
            return str(intents[selector]), holder
    for spec in load_codex().personas.values():
        if selector in spec.intents:
            return spec.intents[selector], None
    return "", None


def author_for(receiver: UvmObject) -> str:
    """The persona whose model writes the receiver's methods: its own, else BRICK."""
    for holder in (receiver, *receiver._ancestors()):
        name = holder._own_slot("name")
        if isinstance(name, str) and name.upper() in PERSONAS:
            return name.upper()
    return DEFAULT_AUTHOR


def build_brief(
    receiver: UvmObject, selector: str, args: tuple = (), kwargs: Mapping[str, Any] | None = None
) -> MissionBrief:
    receiver._p_activate()
    intent, _ = intent_for(receiver, selector)
    slots: dict[str, str] = {}
    for name, value in sorted(receiver._slots().items()):
        if name.endswith("*"):
            continue
        if isinstance(value, Method):
            slots[name] = f"method: {value.intent or 'no intent recorded'}"
        else:
            slots[name] = _short(value)
    inherited = sorted(
        {
            name
            for holder in receiver._ancestors()
            for name in holder._slots()
            if not name.endswith("*") and name not in slots
        }
    )
    return MissionBrief(
        receiver=_short(receiver),
        selector=selector,
        args=tuple(_short(a) for a in args),
        kwargs={k: _short(v) for k, v in (kwargs or {}).items()},
        intent=intent,
        author=author_for(receiver),
        slots=slots,
        parents=tuple(_short(p) for p in receiver._parents()),
        inherited=tuple(inherited),
    )


# -- rolling back -----------------------------------------------------------------------------


class _Restore(Protocol):
    def rollback(self) -> None: ...


class _Snapshot:
    """Savepoint stand-in for objects outside any database: their own slots copied back."""

    def __init__(self, objects: list[UvmObject]) -> None:
        import copy

        self.saved = []
        for obj in objects:
            state = obj.__getstate__()  # own slots only: no volatile or borrowed entries
            state = {
                k: v if isinstance(v, persistent.Persistent) else copy.deepcopy(v)
                for k, v in state.items()
            }
            self.saved.append((obj, state))

    def rollback(self) -> None:
        for obj, state in self.saved:
            restore_state(obj, state)


def current_transaction(obj: UvmObject) -> Any | None:
    """The transaction the object's connection is in now (None for unsaved objects)."""
    jar = obj._p_jar
    return None if jar is None else jar.transaction_manager.get()


# -- the mission ------------------------------------------------------------------------------


@dataclass
class AttemptRecord:
    """One draft and what became of it: stage is audit, trial, invoke or installed."""

    number: int
    source: str
    stage: str
    findings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "source": self.source,
            "stage": self.stage,
            "findings": list(self.findings),
        }


class Mission:
    """One message nobody understood, and the gate each draft of its method must pass."""

    def __init__(
        self,
        receiver: UvmObject,
        selector: str,
        args: tuple = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        transaction: Any | None = None,
        acceptance: Callable[[Any], bool] | None = None,
    ) -> None:
        if not selector.isidentifier() or selector.startswith("_"):
            raise DoesNotUnderstand(receiver, selector, hint="only public selectors are written")
        self.receiver = receiver
        self.selector = selector
        self.args = tuple(args)
        self.kwargs = dict(kwargs or {})
        self.intent, holder = intent_for(receiver, selector)
        self.target = holder if holder is not None else receiver
        self.author = author_for(receiver)
        self.transaction = transaction or current_transaction(receiver)
        # An optional check of the first result (a caller's acceptance test): a draft whose
        # result fails it is rolled back like any other failed draft.
        self.acceptance = acceptance
        self.attempts: list[AttemptRecord] = []
        self.started = time.time()
        self._brief: MissionBrief | None = None
        self._pending: tuple[_Restore, Method] | None = None
        self.result: Any = None

    def brief(self) -> MissionBrief:
        if self._brief is None:
            self._brief = build_brief(self.receiver, self.selector, self.args, self.kwargs)
        return self._brief

    def _record(self, source: str, stage: str, findings: list[str]) -> AttemptRecord:
        record = AttemptRecord(len(self.attempts) + 1, source, stage, list(findings))
        self.attempts.append(record)
        return record

    # Each step returns the findings that stop this draft ([] = go on).

    def audit(self, source: str) -> list[str]:
        report = guardian.audit(self.selector, source)
        if report.findings:
            self._record(source, "audit", report.findings)
        return report.findings

    def trial(self, source: str) -> list[str]:
        """Compile in the sandbox, then run once in an isolated process with OS limits."""
        try:
            function = sandbox.compile_sandboxed(self.selector, source)
        except GeneratedCodeError as exc:
            return self._record(source, "trial", exc.findings or [exc.message]).findings
        target, selector = self.target, self.selector

        def installed_for_the_trial(*args: Any, **kwargs: Any) -> Any:
            # In the child only (whose changes are dropped): in its slot, so a method that
            # calls itself, or another object that inherits it, finds it as it will for real.
            trial_method = Method(selector, source, compiler="sandbox")
            trial_method._v_function = function
            target._add_method(trial_method)
            try:
                return function(*args, **kwargs)
            finally:
                delattr(target, selector)

        outcome = sandbox.run_isolated(
            installed_for_the_trial, self.receiver, *self.args, **self.kwargs
        )
        if not outcome.ok:
            findings = list(outcome.findings) or [outcome.summary]
            return self._record(source, "trial", findings).findings
        return []

    def install(self, source: str) -> None:
        """Take a savepoint, then put the method in its slot (undone if ``invoke`` fails)."""
        restore: _Restore
        if self.transaction is not None:
            restore = self.transaction.savepoint()
        else:
            restore = _Snapshot([self.receiver, self.target])
        method = Method(
            self.selector,
            source,
            intent=self.intent,
            author=self.author,
            compiler="sandbox",
            audit={
                **guardian.audit(self.selector, source).as_dict(),
                "attempt": len(self.attempts) + 1,
                "mission_seconds": None,
            },
        )
        self.target._add_method(method)
        self._pending = (restore, method)

    def invoke(self) -> list[str]:
        """Send the message for real; on any failure roll back to before ``install``."""
        assert self._pending is not None, "install() first"
        restore, method = self._pending
        self._pending = None
        try:
            # The sandbox checks the covenant and what the call stored (sandbox.call_checked).
            result = method.bind(self.receiver)(*self.args, **self.kwargs)
            findings = []
            if self.acceptance is not None and not self.acceptance(result):
                # The check may look at the slots as well as the result: show both.
                slots = ", ".join(
                    f"{k}={_short(v, 60)}"
                    for k, v in sorted(self.receiver._slots().items())
                    if not isinstance(v, Method) and not k.endswith("*") and k != "intents"
                )
                findings = [
                    f"called with {_short(self.args)} it returned {_short(result)} and "
                    f"left the slots as {{{slots}}}, which is not what the intent asks "
                    "for: check the result and every slot the intent says to change"
                ]
        except GeneratedCodeError as exc:
            findings = exc.findings or [exc.message]
        except Exception as exc:
            findings = [_describe(exc)]
        if findings:
            restore.rollback()
            self._record(method.source, "invoke", findings)
            return findings
        method.audit["mission_seconds"] = round(time.time() - self.started, 3)
        method.audit["trial_result"] = _short(result)
        self._record(method.source, "installed", [])
        self.result = result
        return []

    def attempt(self, source: str) -> list[str]:
        """The whole gate for one draft; [] when the method is installed and ``result`` set."""
        findings = self.audit(source) or self.trial(source)
        if findings:
            return findings
        self.install(source)
        return self.invoke()

    def failure(self) -> MissionFailed:
        findings = [
            f"attempt {record.number} ({record.stage}): {finding}"
            for record in self.attempts
            for finding in record.findings
        ]
        return MissionFailed(
            f"{self.receiver!r} does not understand {self.selector!r} and no working method "
            f"could be written in {len(self.attempts)} attempt(s); the image is unchanged",
            findings,
            hint="give the selector a clearer intent (an 'intents' slot), allow more attempts "
            "(BATOS_JIT_ATTEMPTS) or add the method by hand with 'batos methods add'",
        )


def _describe(exc: BaseException) -> str:
    return "calling it, " + sandbox.describe_exception(exc)


def run_mission(
    receiver: UvmObject,
    selector: str,
    args: tuple,
    kwargs: Mapping[str, Any] | None,
    draft: Callable[[MissionBrief, list[AttemptRecord]], str],
    attempts: int,
    acceptance: Callable[[Any], bool] | None = None,
) -> Any:
    """Draft, gate and install until one draft works; its result, or ``MissionFailed``."""
    mission = Mission(receiver, selector, args, kwargs, acceptance=acceptance)
    for _ in range(attempts):
        source = draft(mission.brief(), mission.attempts)
        if not mission.attempt(source):
            return mission.result
    raise mission.failure()


# -- hand-written methods ---------------------------------------------------------------------


def add_method(
    target: UvmObject, selector: str, source: str, *, author: str = "human", intent: str = ""
) -> Method:
    """Audit, compile in the sandbox and install a hand-written method (``AuditRejected``)."""
    report = guardian.check(selector, source)
    sandbox.compile_sandboxed(selector, source)
    if not intent:
        intent, _ = intent_for(target, selector)
    method = Method(
        selector, source, intent=intent, author=author, compiler="sandbox", audit=report.as_dict()
    )
    return target._add_method(method)


def generated_methods(obj: UvmObject) -> list[Method]:
    """The receiver's own methods that went through the sandbox gate."""
    return [m for m in obj._slots().values() if isinstance(m, Method) and m.compiler == "sandbox"]


# -- doesNotUnderstand ------------------------------------------------------------------------


class MissionRunner(Protocol):
    def send(self, receiver: UvmObject, selector: str, args: tuple, kwargs: dict) -> Any: ...

    async def asend(self, receiver: UvmObject, selector: str, args: tuple, kwargs: dict) -> Any: ...


class PendingMessage:
    """What ``obj.unknown`` is: calling it with arguments runs the mission for them."""

    __slots__ = ("receiver", "selector", "runner")

    def __init__(self, receiver: UvmObject, selector: str, runner: MissionRunner) -> None:
        self.receiver = receiver
        self.selector = selector
        self.runner = runner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.runner.send(self.receiver, self.selector, args, kwargs)

    async def asend(self, *args: Any, **kwargs: Any) -> Any:
        return await self.runner.asend(self.receiver, self.selector, args, kwargs)

    def __repr__(self) -> str:
        return f"<pending message {self.selector!r} to {self.receiver!r}>"


def install_handler(runner: MissionRunner | None) -> None:
    """Make unknown public messages start missions through ``runner`` (None: raise again)."""
    if runner is None:
        set_dnu_handler(None)
        return

    def handler(receiver: UvmObject, selector: str) -> Any:
        if sandbox.in_sandbox():
            raise DoesNotUnderstand(receiver, selector)
        return PendingMessage(receiver, selector, runner)

    set_dnu_handler(handler)
