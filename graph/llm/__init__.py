"""The chat-model factory: persona name → a LangChain chat model on the best backend at hand.

Order: an OpenAI-compatible endpoint when ``openai_base_url`` is set (vLLM, llama-server: the
scale-out engine), else Ollama when ``OLLAMA_HOST`` answers (persona models are provisioned on
first use), else the embedded llama.cpp backend. Each applies the persona's Modelfile: SYSTEM
(unless the messages bring their own), PARAMETERs, and the adapter where the backend can.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, SystemMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from batos import settings
from batos.errors import ConfigurationError, ModelError
from prototypes.codex import load_codex

log = logging.getLogger("batos.llm")

BACKENDS = ("openai", "ollama", "embedded")
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


def select_backend(backend: str | None = None) -> str:
    """Which backend ``chat_model`` would use now (``backend`` forces one)."""
    if backend is not None:
        if backend not in BACKENDS:
            raise ConfigurationError(
                f"unknown backend {backend!r}", hint=f"choose one of {', '.join(BACKENDS)}"
            )
        return backend
    if settings.get_str("openai_base_url"):
        return "openai"
    host = settings.get_str("ollama_host")
    if host:
        from graph.llm.ollama import server_version

        if server_version(_host_url(host)) is not None:
            return "ollama"
        log.warning("OLLAMA_HOST=%s does not answer; using the embedded backend", host)
    return "embedded"


def _host_url(host: str) -> str:
    return host if "://" in host else f"http://{host}"


def chat_model(persona: str, **options: Any) -> BaseChatModel:
    """A chat model that speaks as ``persona`` (ROBIN, BRICK, BABS or ALFRED).

    Options: ``backend`` ('openai' | 'ollama' | 'embedded', default: the first available),
    ``timeout`` (seconds; default the ``llm_timeout`` setting), and Modelfile PARAMETER
    overrides: temperature, top_k, top_p, min_p, repeat_penalty, num_predict, seed.
    ``max_tokens`` is accepted as another name for num_predict. ``format`` (a JSON schema)
    constrains the reply to it: a grammar on the embedded backend, ``format`` on Ollama,
    ``response_format`` on an OpenAI-compatible server.
    """
    spec = load_codex().persona(persona)
    options = dict(options)
    backend = select_backend(options.pop("backend", None))
    timeout = float(options.pop("timeout", None) or settings.get_int("llm_timeout"))
    if "max_tokens" in options:
        options["num_predict"] = options.pop("max_tokens")
    schema = options.pop("format", None)
    unknown = sorted(set(options) - set(SAMPLING_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"chat_model() does not take {', '.join(unknown)}",
            hint=f"options: backend, timeout, {', '.join(SAMPLING_OPTIONS)}",
        )
    if backend == "openai":
        return _openai(spec.name, spec.model, timeout, options, schema)
    if backend == "ollama":
        return _ollama(spec.model, timeout, {**options, **({"format": schema} if schema else {})})
    from graph.llm.embedded import EmbeddedChatModel

    return EmbeddedChatModel(persona=spec.name, timeout=timeout, format=schema, **options)


def _ollama(model: str, timeout: float, options: dict[str, Any]) -> BaseChatModel:
    from graph.llm.ollama import OllamaPersonaChat, ensure_provisioned

    host = _host_url(settings.get_str("ollama_host"))
    ensure_provisioned(host)
    return OllamaPersonaChat(
        model=model, base_url=host, client_kwargs={"timeout": timeout}, **options
    )


def _openai(
    persona: str,
    model: str,
    timeout: float,
    options: dict[str, Any],
    schema: dict[str, Any] | None = None,
) -> BaseChatModel:
    from graph.llm.modelfile import persona_model

    resolved = persona_model(persona)
    params = {**resolved.parameters, **options}
    extra = {k: params[k] for k in ("top_k", "min_p", "repeat_penalty") if k in params}
    return _openai_class()(
        model=model,
        base_url=settings.get_str("openai_base_url"),
        api_key=settings.get_str("openai_api_key") or "not-needed",
        timeout=timeout,
        temperature=params.get("temperature"),
        top_p=params.get("top_p"),
        max_tokens=params.get("num_predict"),
        seed=params.get("seed"),
        stop=list(params.get("stop", ())) or None,
        extra_body=extra or None,
        stream_usage=True,
        persona_system=resolved.system or "",
        model_kwargs=(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "reply", "schema": schema},
                }
            }
            if schema is not None
            else {}
        ),
    )


def _with_system(messages: list[BaseMessage], system: str) -> list[BaseMessage]:
    if system and not any(isinstance(m, SystemMessage) for m in messages):
        return [SystemMessage(system), *messages]
    return messages


def _openai_class() -> type[BaseChatModel]:
    """``ChatOpenAI`` that prepends the persona's SYSTEM, built lazily (openai is heavy)."""
    global _OpenAIPersonaChat
    if _OpenAIPersonaChat is not None:
        return _OpenAIPersonaChat
    import openai
    from langchain_openai import ChatOpenAI

    def fail(self: Any, exc: BaseException) -> ModelError:
        return ModelError(
            f"the OpenAI-compatible endpoint {self.openai_api_base} failed: {exc}",
            hint="check BATOS_OPENAI_BASE_URL and that the server serves "
            f"{self.model_name!r}, or unset it to use Ollama or the embedded model",
        )

    class OpenAIPersonaChat(ChatOpenAI):
        """A persona on an OpenAI-compatible server (vLLM names the LoRA by the model name)."""

        persona_system: str = ""

        def _generate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
            try:
                return super()._generate(_with_system(messages, self.persona_system), *a, **k)
            except openai.OpenAIError as exc:
                raise fail(self, exc) from exc

        def _stream(
            self, messages: list[BaseMessage], *a: Any, **k: Any
        ) -> Iterator[ChatGenerationChunk]:
            try:
                yield from super()._stream(_with_system(messages, self.persona_system), *a, **k)
            except openai.OpenAIError as exc:
                raise fail(self, exc) from exc

        async def _agenerate(self, messages: list[BaseMessage], *a: Any, **k: Any) -> ChatResult:
            try:
                return await super()._agenerate(
                    _with_system(messages, self.persona_system), *a, **k
                )
            except openai.OpenAIError as exc:
                raise fail(self, exc) from exc

        async def _astream(
            self, messages: list[BaseMessage], *a: Any, **k: Any
        ) -> AsyncIterator[ChatGenerationChunk]:
            try:
                async for chunk in super()._astream(
                    _with_system(messages, self.persona_system), *a, **k
                ):
                    yield chunk
            except openai.OpenAIError as exc:
                raise fail(self, exc) from exc

    _OpenAIPersonaChat = OpenAIPersonaChat
    return OpenAIPersonaChat


_OpenAIPersonaChat: type[BaseChatModel] | None = None
