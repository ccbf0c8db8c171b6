"""What langgraph.json names: the checkpointer, the store and the mind and audit graphs that
``langgraph dev`` and ``batos serve`` run, all on the server's one runtime per image URI.

The server enters ``checkpointer`` and ``store`` at start; both hold the runtime of the image
the ``image`` setting names (``batos.shell.runtime.served``), which is opened and upgraded once.
The served ``mind`` finds the same runtime's image when its first run needs it, and leaves its
commits to that runtime's checkpointer, the one the server hands it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from langgraph.pregel import Pregel
from langgraph_sdk.runtime import ServerRuntime

from batos.shell import runtime
from graph import audit as audit_graph
from graph.mind import build_graph, refuse_if_busy
from store.checkpoint.saver import EXPECT_KEY, ZODBSaver
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


#: The mind graph the factory below hands the server.
MIND = build_graph(served_image=runtime.served_image)


async def mind(config: RunnableConfig, server: ServerRuntime) -> Pregel:
    """The mind graph (langgraph.json's ``graphs.mind``), built for each use by the server.

    For a run, the thread is checked first as every other entry point checks it
    (``refuse_if_busy``): a run sent while another process's run is mid-cycle on the thread
    would go on from its half-done state and make that run fail, so it is refused
    (``ThreadBusy``, the run's error) before it stores anything. State reads, updates,
    and schemas get the graph as it is.
    """
    configurable = config.get("configurable") or {}
    if server.execution_runtime is None or "thread_id" not in configurable:
        return MIND
    seen = await asyncio.to_thread(_check_thread, config)
    if seen is None:  # a run from a checkpoint named by id: never held to the thread's latest
        return MIND
    # What the check saw goes with the run: another process's run started since is caught at
    # this run's first step.
    expecting = merge_configs(MIND.config, {"configurable": {EXPECT_KEY: seen}})
    return MIND.copy(update={"config": expecting})


def _check_thread(config: RunnableConfig) -> str | None:
    """What ``refuse_if_busy`` saw of ``config``'s thread through the server's checkpointer
    (the server hands the graph that saver wrapped in an adapter of its own)."""
    checking = MIND.copy(update={"checkpointer": runtime.served_runtime().saver})
    # The server retries the runs a stopped server left running, under their ids: a retry
    # meets its own first attempt's last step, which is no other request.
    run_id = (config.get("configurable") or {}).get("run_id")
    checked = refuse_if_busy(checking, config, run_id=str(run_id) if run_id else None)
    seen: str | None = checked["configurable"].get(EXPECT_KEY)
    return seen


def audit() -> Any:
    """The audit graph (langgraph.json's ``graphs.audit``), over the runtime's image."""
    return audit_graph.build_graph(runtime.served_image())
