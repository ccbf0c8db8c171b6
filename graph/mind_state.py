"""What flows between the mind's nodes: its state, run context and services, and the request.

``MindState`` is the graph's state (``messages`` first, so Studio's chat view works);
``MindContext`` is what a client may send; ``MindServices`` the live objects Python callers may
pass in the context instead of the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from batos.errors import MindError

if TYPE_CHECKING:
    from store.image import LivingImage

STATUSES = ("ROUTE", "DECOMPOSING", "DELEGATING", "SYNTHESIZING", "GATE", "COMPLETE", "FAILED")

ModelFactory = Callable[..., BaseChatModel]


@dataclass
class MindServices:
    """The live objects a cycle uses; each left None is the configured default.

    ``models(persona, **options)`` → chat model (default ``graph.llm.chat_model``); ``router``
    has ``route(text)`` (default ``graph.router.load_router(image)``); ``embedder`` has
    ``encode(texts)`` → unit float32 rows (default the router's encoder); ``image`` is used when
    the checkpointer is not a ``ZODBSaver`` (whose image always wins); ``catalog`` is what
    BABS's facets search (default ``KnowledgeCatalog.open(image)``).
    """

    models: ModelFactory | None = None
    router: Any = None
    embedder: Any = None
    image: LivingImage | None = None
    catalog: Any = None


class MindContext(TypedDict, total=False):
    """Run context a client may send (JSON)."""

    persona: str
    depth: Literal["auto", "fast", "full"]


def accumulate(left: list | None, right: list | dict | None) -> list:
    """A node's items are appended; ``{"replace": [...]}`` starts the list over (a new cycle)."""
    if isinstance(right, dict):
        return list(right.get("replace") or [])
    return [*(left or []), *(right or [])]


class MindInput(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


class MindState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    status: str
    cycle: dict[str, Any]
    route: dict[str, Any]
    plan: list[dict[str, Any]]
    partials: Annotated[list[dict[str, Any]], accumulate]
    response: str
    failure: dict[str, Any] | None
    effects: Annotated[list[dict[str, Any]], accumulate]
    metrics: Annotated[list[dict[str, Any]], accumulate]
    cem: dict[str, Any]
    commit: dict[str, Any] | None


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
