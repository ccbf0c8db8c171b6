"""What a client may send the mind, checked at the door: messages, run context, thread ids.

The LangGraph server hands a client's input and context to the graph as they came; these
checks turn whatever is malformed into a ``GraphRequestError`` or ``MindError`` with a hint,
cutting every echoed value short.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, convert_to_messages
from langgraph.graph.message import add_messages

from batos import settings
from batos.errors import ConfigurationError, GraphRequestError, MindError
from graph.records import MAX_THREAD_ID_CHARS
from prototypes.bounded import bounded_repr
from prototypes.codex import PERSONAS

#: What a caller may ask of the depth: the rule's choice, or one path forced.
DEPTHS = ("auto", "fast", "full")
_CONTEXT_HINT = (
    'send context {"persona": "robin", "depth": "auto"}: persona one of '
    + ", ".join(PERSONAS)
    + "; depth auto, fast or full (both optional)"
)


def check_context(context: Any) -> dict[str, Any]:
    """The run context, refused when a client sent something the schema does not allow
    (the server passes a client's context on without checking it against the schema)."""
    if context is not None and not isinstance(context, dict):
        raise MindError(
            f"the run context is a {type(context).__name__}, not a JSON object",
            hint=_CONTEXT_HINT,
        )
    context = context or {}
    depth = context.get("depth")
    if depth is not None and depth not in DEPTHS:
        raise MindError(f"unknown depth {bounded_repr(depth, 80)}", hint=_CONTEXT_HINT)
    return context


#: The longest message the thread takes at all (or ``mind_max_request_chars``, if larger). A
#: request over that setting but under this ends its cycle FAILED with the limit in its
#: reason; one over this is no request a person wrote, and is refused before the thread's
#: messages hold it (every checkpoint after would carry another copy of it).
MAX_MESSAGE_CHARS = 1_000_000
#: What a message may hold beside its content (its id, name, tool calls, additional_kwargs,
#: response_metadata), in characters as JSON, and how many messages one request may send:
#: every checkpoint after it carries them again, as it does the content.
MAX_MESSAGE_EXTRA_CHARS = 64_000
MAX_REQUEST_MESSAGES = 1_000


def _request_limit() -> int:
    """The request limit as set; a setting that cannot be read is the route's to report,
    with the cycle's own failure, not the message store's."""
    try:
        return settings.get_int("mind_max_request_chars")
    except ConfigurationError:
        return 0


def _extra_chars(message: BaseMessage) -> int:
    """Characters of what ``message`` holds beside its content, as JSON."""
    fields = message.model_dump(exclude={"content"})
    return len(json.dumps(fields, default=str, ensure_ascii=False))


def add_checked_messages(left: Any, right: Any) -> Any:
    """``add_messages``, refusing a client's malformed messages with a ``GraphRequestError``
    (a ValueError, whose message the server shows) instead of LangChain's coercion errors,
    some of which (``NotImplementedError``) the server reports as an internal failure; and
    refusing a message over ``MAX_MESSAGE_CHARS`` the same way."""
    try:
        sent = right if isinstance(right, list) else [right]
        if len(sent) > MAX_REQUEST_MESSAGES:
            raise GraphRequestError(
                f"{len(sent):,} messages at once are more than the thread takes "
                f"({MAX_REQUEST_MESSAGES:,})",
                hint="send the new message only: the thread keeps the earlier ones",
            )
        incoming: list[Any] = convert_to_messages(sent)
        most = max(MAX_MESSAGE_CHARS, _request_limit())
        for message in incoming:
            content = message.content  # every part counts, an image's data as much as text
            size = len(content) if isinstance(content, str) else len(str(content))
            if size > most:
                raise GraphRequestError(
                    f"a message of {size:,} characters is more than the thread takes ({most:,})",
                    hint="send shorter messages; ingest long material with 'batos ingest' "
                    "and ask about it",
                )
            extra = _extra_chars(message)
            if extra > MAX_MESSAGE_EXTRA_CHARS:
                raise GraphRequestError(
                    f"a message carries {extra:,} characters beside its content (id, name, "
                    f"tool calls, additional_kwargs, response_metadata); the thread takes "
                    f"{MAX_MESSAGE_EXTRA_CHARS:,}",
                    hint='send {"role": "user", "content": "your request"} and little else',
                )
        return add_messages(left, incoming)
    except GraphRequestError:
        raise
    except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
        errors = getattr(exc, "errors", None)  # pydantic: the first field that failed
        if callable(errors) and errors():
            first = errors()[0]
            reason = f"{'.'.join(map(str, first.get('loc', ())))}: {first.get('msg', '')}"
        elif isinstance(exc, KeyError):
            reason = f"a message lacks its {exc.args[0]!r} field"
        else:
            reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        raise GraphRequestError(
            f"the messages are malformed: {bounded_repr(reason, 200)[1:-1]}",
            hint='send {"messages": [{"role": "user", "content": "your request"}]}',
        ) from None


def _check_input(value: Any) -> Any:
    """A run's input, its messages checked as the thread's reducer will check them."""
    if isinstance(value, dict) and "messages" in value:
        add_checked_messages([], value["messages"])
    return value


def admit_checked_input(compiled: Any) -> Any:
    """``compiled`` (a state graph whose ``messages`` use ``add_checked_messages``), its input
    checked inside the start task, before the task's writes exist.

    The reducer alone refuses malformed messages only when LangGraph applies the start
    task's writes, after it has stored them with the thread's input checkpoint; every read of
    the thread's state applied them again and raised, until its next run. Checked as the
    task's own step, a refusal is the task's error: the run still ends in
    ``GraphRequestError``, and the stored thread reads as it was, that error on its pending
    start task, which the next run discards.
    """
    from langgraph._internal._runnable import RunnableCallable
    from langgraph.constants import START

    start = compiled.nodes[START]
    compiled.nodes[START] = start.copy(
        {"bound": RunnableCallable(_check_input, name="check_input", trace=False)}
    )
    return compiled


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        part if isinstance(part, str) else str(part.get("text", ""))
        for part in content or []
        if isinstance(part, str) or part.get("type") == "text"
    )


def request_text(messages: Sequence[BaseMessage], limit: int) -> str:
    """The request: the last message, a human one, text only; ``MindError`` otherwise."""
    if not messages:
        raise MindError(
            "the request has no message",
            hint='send {"messages": [{"role": "user", "content": "..."}]}',
        )
    last = messages[-1]
    if not isinstance(last, HumanMessage):
        raise MindError(
            f"the last message is a {last.type} message, not the user's",
            hint="end the messages with the user's request",
        )
    content = last.content
    if isinstance(content, list):
        kinds = sorted({p.get("type", "?") if isinstance(p, dict) else "text" for p in content})
        if kinds != ["text"]:
            raise MindError(
                f"the request holds non-text content ({', '.join(kinds)})",
                hint="the mind reads text only; send the request as plain text",
            )
    text = content_text(content).strip()
    if not text:
        raise MindError("the request is empty", hint="send some text")
    if len(text) > limit:
        raise MindError(
            f"the request is {len(text):,} characters; the mind accepts {limit:,}",
            hint="shorten it, ingest long material with 'batos ingest' and ask about it, "
            "or raise BATOS_MIND_MAX_REQUEST_CHARS",
        )
    return text


#: Used with ``fullmatch``: a pattern ending in ``$`` also matches before a final newline, and
#: "kitchen\n" would be a thread of its own beside "kitchen".
_THREAD_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:@-]{{0,{MAX_THREAD_ID_CHARS - 1}}}")


def check_thread_id(thread_id: str) -> str:
    """``thread_id`` if the mind answers on it, else ``MindError``: 1 to
    ``MAX_THREAD_ID_CHARS`` letters, digits and ``. _ : @ -``, what every effect naming the
    thread takes, so that an id accepted here never makes a commit fail."""
    if not isinstance(thread_id, str) or not _THREAD_ID.fullmatch(thread_id):
        long = isinstance(thread_id, str) and len(thread_id) > MAX_THREAD_ID_CHARS
        raise MindError(
            f"thread id {bounded_repr(thread_id, 80)} is "
            + (f"{len(thread_id):,} characters long" if long else "malformed"),
            hint=f"use 1 to {MAX_THREAD_ID_CHARS} letters, digits and . _ : @ - (starting with "
            "a letter or digit)",
        )
    return thread_id
