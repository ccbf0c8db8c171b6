"""The registry of chat-model backends: name → factory and availability probe, in preference order.

The built-in backends are registered through ``register_backend`` exactly as an outside one
would be. Factories and probes may be given as ``"module:attribute"`` so that a backend's heavy
libraries (openai, ollama, llama.cpp) are imported only when it is probed or used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from langchain_core.language_models import BaseChatModel

from batos.errors import ConfigurationError
from prototypes.codex import PersonaSpec


class Factory(Protocol):
    def __call__(
        self, persona: PersonaSpec, timeout: float, options: dict[str, Any]
    ) -> BaseChatModel: ...


@dataclass(frozen=True)
class Backend:
    """One way to serve personas: ``build`` makes the chat model, ``available`` says if it can."""

    name: str
    factory: Factory | str
    probe: Callable[[], bool] | str

    def build(self, persona: PersonaSpec, timeout: float, options: dict[str, Any]) -> BaseChatModel:
        return _resolve(self.factory)(persona, timeout, options)

    def available(self) -> bool:
        return bool(_resolve(self.probe)())


_REGISTRY: dict[str, Backend] = {}


def _resolve(target: Any) -> Any:
    if not isinstance(target, str):
        return target
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def register_backend(
    name: str,
    factory: Factory | str,
    probe: Callable[[], bool] | str,
    *,
    before: str | None = None,
) -> Backend:
    """Add (or replace) backend ``name``; it is tried last, or just before backend ``before``."""
    backend = Backend(name, factory, probe)
    entries = [b for b in _REGISTRY.values() if b.name != name]
    names = [b.name for b in entries]
    if before is not None and before not in names:
        raise ConfigurationError(f"no backend {before!r} to register {name!r} before")
    entries.insert(names.index(before) if before is not None else len(entries), backend)
    _REGISTRY.clear()
    _REGISTRY.update((b.name, b) for b in entries)
    return backend


def unregister_backend(name: str) -> None:
    """Remove backend ``name`` (a no-op if it is not registered)."""
    _REGISTRY.pop(name, None)


def backends() -> list[Backend]:
    """Every registered backend, in the order ``select_backend`` tries them."""
    return list(_REGISTRY.values())


def backend(name: str) -> Backend:
    """The backend registered as ``name`` (``ConfigurationError`` naming the others if none)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown backend {name!r}", hint=f"choose one of {', '.join(_REGISTRY)}"
        ) from None
