"""Old module names of moved code, still importable: an image written before the move names
its classes by the old paths (ZODB pickles, LangGraph's serialized values, the heartbeat's job
references), and unpickling imports them by name. Each old name resolves to the module that
now holds the code — the same module object, so a class loaded through either name is the
same class, and everything written from now on names the new path.

Only names: nothing here imports a room at import time (the layer contracts stay true), and a
module is imported only when something asks for its old name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

_STORE = {
    **{
        f"store.{name}": f"store.core.{name}"
        for name in (
            "image image_file zeo transactions schema packing files stats jobstore "
            "method_queue model_files"
        ).split()
    },
    **{
        f"store.{name}": f"store.knowledge.{name}"
        for name in (
            "catalog ingest chunking lexical vectors embeddings encoder_onnx curator memory_store"
        ).split()
    },
    "store.checkpointer": "store.checkpoint.saver",
    "store.checkpoint_layout": "store.checkpoint.layout",
    "store.checkpoint_parking": "store.checkpoint.parking",
    "store.effects": "store.checkpoint.effects",
}

#: Old module name → where its code lives now (packages: the old name's submodules follow).
MOVED: dict[str, str] = {
    **_STORE,
    "graph.llm": "batos.models",
    "graph.training": "batos.training",
    "graph.cli": "batos.shell.cli",
    "graph.bridge": "batos.shell.bridge",
    "graph.heartbeat": "batos.shell.heartbeat",
    "graph.doctor": "batos.shell.doctor",
}


def current_name(name: str) -> str | None:
    """Where the module once called ``name`` lives now, or None when it never moved."""
    head = name
    while head:
        if head in MOVED:
            return MOVED[head] + name[len(head) :]
        head = head.rpartition(".")[0]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        # The module was executed under its current name; the old name only points at it.
        pass


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        current = current_name(fullname)
        if current is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(current))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once). First, because a submodule of a moved
    package (``graph.llm.engine``) would otherwise be found by path in the package it points
    at and executed a second time, as a module of its own with classes of its own; the old
    names have no files left, so nothing real is shadowed."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
