"""Persona chat models: persona name → a LangChain chat model on the best backend at hand.

Backends come from a registry (``batos.models.backends``), tried in order: an OpenAI-compatible
endpoint when ``openai_base_url`` is set (vLLM, llama-server: the scale-out engine), else Ollama
when ``OLLAMA_HOST`` answers (persona models are provisioned on first use), else the embedded
llama.cpp backend. Each applies the persona's Modelfile — SYSTEM (unless the messages bring
their own), PARAMETERs, the adapter where the backend can — behind one base class
(``batos.models.base.PersonaChatModel``). Another backend is added with ``register_backend``.
``author_model`` is the model that writes methods: a stronger one the user names
(``batos.models.author``), else the persona's own.

May import ``prototypes``, ``store`` and the shared ``batos`` modules; never the graphs,
training or the shell.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel

from batos import settings
from batos.errors import ConfigurationError
from batos.models.backends import Backend, backend, backends, register_backend, unregister_backend
from prototypes.codex import load_codex

__all__ = [
    "SAMPLING_OPTIONS",
    "Backend",
    "author_model",
    "backends",
    "chat_model",
    "register_backend",
    "select_backend",
    "unregister_backend",
]

#: Options every backend understands (Ollama PARAMETER names), besides backend and timeout.
SAMPLING_OPTIONS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "num_predict",
    "seed",
)

# The built-in backends, registered as an outside one would be, most preferred first.
register_backend(
    "openai", "batos.models.openai_compat:build", "batos.models.openai_compat:available"
)
register_backend("ollama", "batos.models.ollama:build", "batos.models.ollama:available")
register_backend("embedded", "batos.models.embedded:build", "batos.models.embedded:available")


def select_backend(name: str | None = None) -> str:
    """Which backend ``chat_model`` would use now: the first available, or ``name`` if given."""
    if name is not None:
        return backend(name).name
    for candidate in backends():
        if candidate.available():
            return candidate.name
    raise ConfigurationError(
        "no chat-model backend is available",
        hint="register one with batos.models.register_backend, or set OLLAMA_HOST",
    )


def chat_model(persona: str, **options: Any) -> BaseChatModel:
    """A chat model that speaks as ``persona`` (ROBIN, BRICK, BABS or ALFRED).

    Options: ``backend`` (a registered name — 'openai' | 'ollama' | 'embedded' built in —
    default: the first available), ``timeout`` (seconds; default the ``llm_timeout`` setting),
    and Modelfile PARAMETER overrides: temperature, top_k, top_p, min_p, repeat_penalty,
    num_predict, seed. ``max_tokens`` is accepted as another name for num_predict. ``format``
    (a JSON schema) constrains the reply to it: a grammar on the embedded backend, ``format``
    on Ollama, ``response_format`` on an OpenAI-compatible server.
    """
    spec = load_codex().persona(persona)
    options = dict(options)
    chosen = backend(select_backend(options.pop("backend", None)))
    timeout, options = _call_options(options)
    return chosen.build(spec, timeout, options)


def author_model(persona: str, **options: Any) -> BaseChatModel:
    """The model that writes ``persona``'s methods: the ``author_model`` setting's model
    (``batos.models.author``) when one is set, else ``chat_model(persona, **options)`` — on
    the embedded backend without the persona's adapter unless ``author_adapters`` is 'on'.

    Options as ``chat_model`` takes them; ``backend`` only where no author is set (an
    author's backend is part of its setting).
    """
    from batos.models import author

    chosen = author.configured()
    if chosen is None:
        if settings.get_str("author_adapters") == "on":
            return chat_model(persona, **options)
        options = dict(options)
        name = select_backend(options.pop("backend", None))
        if name != "embedded":  # a server's persona model has its adapter built in
            return chat_model(persona, backend=name, **options)
        from batos.models.embedded import EmbeddedChatModel

        # The adapters are trained on the personas' replies, for their voice: writing code
        # through one, BABS's drafts put a cited report where a method's body belongs.
        timeout, options = _call_options(options)
        return EmbeddedChatModel(
            persona=load_codex().persona(persona).name,
            use_adapters=False,
            timeout=timeout,
            **options,
        )
    spec = load_codex().persona(persona)
    options = dict(options)
    if options.pop("backend", None) is not None:
        raise ConfigurationError(
            f"the author model {chosen.label!r} runs where BATOS_AUTHOR_MODEL says",
            hint="leave out backend=, or unset BATOS_AUTHOR_MODEL",
        )
    timeout, options = _call_options(options)
    return author.build(chosen, spec, timeout, options)


def _call_options(options: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(timeout, the PARAMETER overrides and ``format``) of a call's options, checked."""
    timeout = float(options.pop("timeout", None) or settings.get_int("llm_timeout"))
    if "max_tokens" in options:
        options["num_predict"] = options.pop("max_tokens")
    schema = options.pop("format", None)
    unknown = sorted(set(options) - set(SAMPLING_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"chat_model() does not take {', '.join(unknown)}",
            hint=f"options: backend, timeout, format, {', '.join(SAMPLING_OPTIONS)}",
        )
    if schema is not None:
        options["format"] = schema
    return timeout, options
