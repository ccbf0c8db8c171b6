"""The mind graph on a scripted fast model, for the load benchmark's LangGraph server.

The chat model comes through the backend registry: a ``scripted`` backend is registered first,
so the mind's default model factory picks it, as it would an endpoint. The router and the
embedder are the tests' fakes: the benchmark measures the server, the checkpointer and the
image under concurrent runs, not CPU inference. Every transaction retry (a write conflict
between concurrent cycles) is appended to the file ``BATOS_LOAD_RETRIES`` names, so the
benchmark can count them.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from fakes import FakeEmbedder, FakeModels, FakeRouter  # noqa: E402

from batos.models import register_backend  # noqa: E402
from batos.shell.runtime import served_image  # noqa: E402
from bench.crash import _respond  # noqa: E402
from graph.mind import MindServices, build_graph  # noqa: E402

_models = FakeModels(_respond)


def _scripted(persona: Any, timeout: float, options: dict[str, Any]) -> Any:
    return _models(persona.name, **options)


register_backend("scripted", _scripted, lambda: True, before="openai")


class _RetryLog(logging.Handler):
    """One line per retried transaction, in the file the benchmark reads."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.INFO)
        self.path = path
        self.guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            with self.guard, open(self.path, "a", encoding="utf-8") as out:
                out.write(record.getMessage().replace("\n", " ") + "\n")


if os.environ.get("BATOS_LOAD_RETRIES"):
    _retries = logging.getLogger("batos.transactions")
    _retries.setLevel(logging.INFO)
    _retries.addHandler(_RetryLog(os.environ["BATOS_LOAD_RETRIES"]))

graph = build_graph(
    MindServices(router=FakeRouter(("BRICK",)), embedder=FakeEmbedder()), served_image=served_image
)
