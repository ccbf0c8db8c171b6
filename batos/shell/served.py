"""What langgraph.json names: the checkpointer, the store and the mind and audit graphs that
``langgraph dev`` and ``batos serve`` run, all on the server's one runtime per image URI.

The server enters ``checkpointer`` and ``store`` at start; both hold the runtime of the image
the ``image`` setting names (``batos.shell.runtime.served``), which is opened and upgraded once.
The served ``mind`` finds the same runtime's image when its first run needs it, and leaves its
commits to that runtime's checkpointer, the one the server hands it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from batos.shell import runtime
from graph import audit as audit_graph
from graph.mind import build_graph
from store.checkpoint.saver import ZODBSaver
from store.knowledge.memory_store import ImageStore


@asynccontextmanager
async def checkpointer(uri: str | None = None) -> AsyncIterator[ZODBSaver]:
    """The runtime's ``ZODBSaver`` (langgraph.json's ``checkpointer.path``)."""
    async with runtime.served(uri) as served:
        yield served.saver


@asynccontextmanager
async def store(uri: str | None = None) -> AsyncIterator[ImageStore]:
    """The runtime's ``ImageStore`` (langgraph.json's ``store.path``)."""
    async with runtime.served(uri) as served:
        yield served.store


#: The mind graph as the server runs it (langgraph.json's ``graphs.mind``).
mind = build_graph(served_image=runtime.served_image)


def audit() -> Any:
    """The audit graph (langgraph.json's ``graphs.audit``), over the runtime's image."""
    return audit_graph.build_graph(runtime.served_image())
