"""Stopping model calls in progress: a caller's cancel event, checked by every backend per token.

A caller runs its model calls inside ``cancellable()``; setting the event it yields makes each
call started in that context stop at its next token (or while it waits for the embedded
model's turn) with ``GenerationCancelled``. The event travels in a context variable, so it
reaches the threads LangGraph runs nodes in (they run in a copy of the caller's context) without
a change to any chat model's call signature::

    with cancellable() as stop:
        threading.Timer(5, stop.set).start()
        graph.invoke(...)          # the model call running after 5 s raises GenerationCancelled
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from batos.errors import GenerationCancelled

__all__ = ["GenerationCancelled", "cancel_event", "cancellable", "raise_if_cancelled"]

_EVENT: ContextVar[threading.Event | None] = ContextVar("batos_generation_cancel", default=None)


@contextmanager
def cancellable(event: threading.Event | None = None) -> Iterator[threading.Event]:
    """Model calls made inside stop once the yielded event (``event``, or a new one) is set."""
    event = event if event is not None else threading.Event()
    token = _EVENT.set(event)
    try:
        yield event
    finally:
        _EVENT.reset(token)


def cancel_event() -> threading.Event | None:
    """The event that cancels model calls made here now, if a caller gave one."""
    return _EVENT.get()


def raise_if_cancelled(event: threading.Event | None) -> None:
    """``GenerationCancelled`` if ``event`` is set."""
    if event is not None and event.is_set():
        raise GenerationCancelled("the model call was stopped by its caller")
