"""The author model: a stronger model the user names (``BATOS_AUTHOR_MODEL``) to write methods.

Unset, each persona's own model writes its methods. Set to ``BACKEND:MODEL`` — an Ollama model
(``ollama:qwen2.5-coder:32b``), a model on an OpenAI-compatible server (``openai:NAME``), or a
GGUF run in process (``embedded:default``, ``embedded:test``, ``embedded:PATH.gguf``; a bare
``default``, ``test`` or path means the same) — that model writes instead, while the personas
keep their own models, adapters included, for answering. The persona's identity stays in the
prompt (the JIT puts it in the system message) and its Modelfile's sampling PARAMETERs apply;
its LoRA adapter does not, being trained for the personas' base model. The server is
``BATOS_AUTHOR_URL``, else the personas' (``OLLAMA_HOST``, ``BATOS_OPENAI_BASE_URL``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from langchain_core.language_models import BaseChatModel

from batos import settings
from batos.errors import ConfigurationError
from prototypes.codex import PersonaSpec

#: The backends an author can run on (an outside backend serves personas by their names).
BACKENDS = ("embedded", "ollama", "openai")
#: Modelfile PARAMETERs an author on a server takes from the persona: its sampling, not the
#: base model's template-bound ones (``stop``); Ollama also takes the context length, which
#: its own default may make shorter than the JIT's few-shot prompts.
_SERVED_PARAMETERS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "num_predict")
_FORM = (
    "write BACKEND:MODEL with BACKEND one of embedded, ollama, openai (ollama:qwen2.5-coder:32b, "
    "openai:MODEL, embedded:PATH.gguf), or unset BATOS_AUTHOR_MODEL so each persona's own "
    "model writes"
)
_UNSET = "or unset BATOS_AUTHOR_MODEL so each persona's own model writes"


@dataclass(frozen=True)
class AuthorSpec:
    """Which model writes methods: ``backend`` (one of ``BACKENDS``), ``model`` (a name the
    server knows, or a shipped model's name or GGUF path) and the server's ``url``."""

    backend: str
    model: str
    url: str = ""

    @property
    def label(self) -> str:
        return f"{self.backend}:{self.model}"


def parse(text: str) -> AuthorSpec | None:
    """``BACKEND:MODEL`` (or a bare shipped model name or GGUF path) as a spec without its URL;
    None for an empty text. ``ConfigurationError`` says how to write it."""
    from store.core.model_files import catalog

    text = text.strip()
    if not text:
        return None
    shown = text if len(text) <= 80 else text[:79] + "…"
    backend, colon, model = text.partition(":")
    if not (colon and backend in BACKENDS):
        if colon and not Path(text).expanduser().is_file():
            raise ConfigurationError(
                f"BATOS_AUTHOR_MODEL={shown!r}: {backend!r} is not a backend an author runs on",
                hint=f"for a model on Ollama write ollama:{shown}; {_FORM}",
            )
        backend, model = "embedded", text
    model = model.strip()
    if not model:
        raise ConfigurationError(f"BATOS_AUTHOR_MODEL={shown!r} names no model", hint=_FORM)
    if backend == "embedded" and model not in catalog() and not Path(model).expanduser().is_file():
        raise ConfigurationError(
            f"BATOS_AUTHOR_MODEL={shown!r} is neither a shipped model "
            f"({', '.join(catalog())}) nor a GGUF file",
            hint=_FORM,
        )
    return AuthorSpec(backend, model)


def configured() -> AuthorSpec | None:
    """The author the settings name, its server URL resolved; None when none is set."""
    spec = parse(settings.get_str("author_model"))
    if spec is None or spec.backend == "embedded":
        return spec
    given = settings.get_str("author_url")
    if spec.backend == "ollama":
        from batos.models.ollama import host_url

        fallback_env = "OLLAMA_HOST"
        url = given or settings.get_str("ollama_host")
        url = host_url(url) if url else ""
    else:
        fallback_env = "BATOS_OPENAI_BASE_URL"
        url = given or settings.get_str("openai_base_url")
    if not url:
        raise ConfigurationError(
            f"the author model {spec.label!r} has no server to run on",
            hint=f"set BATOS_AUTHOR_URL (or {fallback_env}) to its server's URL, {_UNSET}",
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        shown = url if len(url) <= 80 else url[:79] + "…"
        raise ConfigurationError(
            f"the author's server {shown!r} is not an http(s) URL",
            hint=f"set BATOS_AUTHOR_URL (or {fallback_env}) to http://HOST:PORT, {_UNSET}",
        )
    return AuthorSpec(spec.backend, spec.model, url)


def build(
    spec: AuthorSpec, persona: PersonaSpec, timeout: float, options: dict[str, Any]
) -> BaseChatModel:
    """``spec``'s model writing as ``persona``: its sampling PARAMETERs under ``options``
    (temperature, seed, num_predict, format…), without its adapter."""
    if spec.backend == "embedded":
        from batos.models.embedded import EmbeddedChatModel

        return EmbeddedChatModel(
            persona=persona.name,
            base_model=spec.model,
            use_adapters=False,
            timeout=timeout,
            **options,
        )
    from batos.models.modelfile import persona_model

    parameters = persona_model(persona.name).parameters
    params: dict[str, Any] = {k: parameters[k] for k in _SERVED_PARAMETERS if k in parameters}
    params.update(options)
    if spec.backend == "ollama":
        from batos.models.ollama import OllamaAuthorChat

        if "num_ctx" in parameters:
            params.setdefault("num_ctx", parameters["num_ctx"])
        return OllamaAuthorChat(
            model=spec.model, base_url=spec.url, client_kwargs={"timeout": timeout}, **params
        )
    from batos.models.openai_compat import served

    return served(
        spec.model,
        spec.url,
        settings.get_str("author_api_key") or settings.get_str("openai_api_key"),
        timeout,
        params,
        hint=f"check BATOS_AUTHOR_URL (else BATOS_OPENAI_BASE_URL) and that the server serves "
        f"{spec.model!r}, {_UNSET}",
    )
