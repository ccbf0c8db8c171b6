"""What flows between the mind's nodes: its state, run context and services, and the request.

``MindState`` is the graph's state (``messages`` first, so Studio's chat view works);
``MindContext`` is what a client may send; ``MindServices`` the live objects Python callers may
pass in the context instead of the defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AnyMessage
from typing_extensions import TypedDict

from batos.errors import GraphRequestError
from graph.request import add_checked_messages
from prototypes.bounded import bounded_repr

if TYPE_CHECKING:
    from store.core.image import LivingImage

STATUSES = ("ROUTE", "DECOMPOSING", "DELEGATING", "SYNTHESIZING", "GATE", "COMPLETE", "FAILED")

ModelFactory = Callable[..., BaseChatModel]


@dataclass
class MindServices:
    """The live objects a cycle uses; each left None is the configured default.

    ``models(persona, **options)`` → chat model (default ``batos.models.chat_model``); ``router``
    has ``route(text)`` (default ``graph.router.load_router(image)``); ``embedder`` has
    ``encode(texts)`` → unit float32 rows (default the router's encoder); ``image``, brought up
    to date by ``open_runtime``, is used when the checkpointer is not a ``ZODBSaver`` (whose
    image always wins); ``catalog`` is what
    BABS's facets search (default ``KnowledgeCatalog.open(image)``).
    """

    models: ModelFactory | None = None
    router: Any = None
    embedder: Any = None
    image: LivingImage | None = None
    catalog: Any = None


class MindContext(TypedDict, total=False):
    """Run context a client may send (JSON)."""

    #: Studio shows a choice; lower case is accepted too (the codex's PERSONAS).
    persona: Literal["ROBIN", "BRICK", "BABS", "ALFRED"]
    depth: Literal["auto", "fast", "full"]


def accumulate(left: list | None, right: list | dict | None) -> list:
    """A node's items are appended; ``{"replace": [...]}`` starts the list over (a new cycle).

    A client can write these channels too (``update_state``): anything but a list of objects,
    or ``{"replace": <such a list>}``, is refused with a ``GraphRequestError`` (a string was
    added as its characters, a number failed with a bare TypeError)."""
    items = right.get("replace") if isinstance(right, dict) else right
    if items is None:
        items = []
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise GraphRequestError(
            f"a list channel was written {bounded_repr(right, 80)}, not a list of objects",
            hint='write a list of objects, or {"replace": [...]} to start it over',
        )
    if isinstance(right, dict):
        return list(items)
    return [*(left or []), *items]


class MindInput(TypedDict):
    messages: Annotated[list[AnyMessage], add_checked_messages]


class MindState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_checked_messages]
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
    #: ``{"cycle": id, "verdict": "good" | "bad"}``, set by a client (``update_state``): the
    #: next COMPLETE cycle records it (``graph.learning``) and clears it.
    feedback: dict[str, Any] | None
