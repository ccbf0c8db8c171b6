"""The OpenAI-compatible backend: personas served by vLLM, llama-server or any such endpoint.

Used when the ``openai_base_url`` setting is set. The model name is the persona's Ollama name
(``batos-brick``), so vLLM can serve each persona's LoRA under it; the persona's SYSTEM and
PARAMETERs come from its Modelfile. ``openai`` and ``langchain_openai`` are imported on first
use only: they are heavy and most machines never need them.
"""

from __future__ import annotations

import re
from typing import Any

from langchain_core.language_models import BaseChatModel

from batos import settings
from batos.errors import ModelError, PromptTooLong
from batos.models.base import ExceptionTable, PersonaChatModel
from prototypes.codex import PersonaSpec


def available() -> bool:
    """An endpoint is configured (it is not probed: a set URL is an explicit choice)."""
    return bool(settings.get_str("openai_base_url"))


def build(persona: PersonaSpec, timeout: float, options: dict[str, Any]) -> BaseChatModel:
    """``persona`` on the endpoint at ``openai_base_url``, Modelfile PARAMETERs and ``options``."""
    from batos.models.modelfile import persona_model

    resolved = persona_model(persona.name)
    return served(
        persona.model,
        settings.get_str("openai_base_url"),
        settings.get_str("openai_api_key"),
        timeout,
        {**resolved.parameters, **options},
        system=resolved.system or "",
    )


def served(
    model: str,
    base_url: str,
    api_key: str,
    timeout: float,
    params: dict[str, Any],
    *,
    system: str = "",
    hint: str = "",
) -> BaseChatModel:
    """``model`` at ``base_url`` with Ollama-named ``params`` (``format``: a JSON schema the
    reply must follow); ``hint`` replaces the persona backend's advice when a call fails."""
    params = dict(params)
    schema = params.pop("format", None)
    extra = {k: params[k] for k in ("top_k", "min_p", "repeat_penalty") if k in params}
    # the class is ChatOpenAI's subclass, built on first use; its fields are ChatOpenAI's
    return _chat_class()(  # type: ignore[call-arg]
        model=model,
        base_url=base_url,
        api_key=api_key or "not-needed",
        timeout=timeout,
        temperature=params.get("temperature"),
        top_p=params.get("top_p"),
        max_tokens=params.get("num_predict"),
        seed=params.get("seed"),
        stop=list(params.get("stop", ())) or None,
        extra_body=extra or None,
        stream_usage=True,
        persona_system=system,
        failure_hint=hint,
        model_kwargs=(
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "reply", "schema": schema},
                }
            }
            if schema
            else {}
        ),
    )


_chat: type[BaseChatModel] | None = None


def _chat_class() -> type[BaseChatModel]:
    """The persona chat class over ``ChatOpenAI``, defined on first use."""
    global _chat
    if _chat is None:
        import openai
        from langchain_openai import ChatOpenAI

        class OpenAIPersonaChat(PersonaChatModel, ChatOpenAI):
            """A persona (or the author model) on an OpenAI-compatible server."""

            failure_hint: str = ""

            def exception_table(self) -> ExceptionTable:
                return {openai.OpenAIError: self._failed}

            def _failed(self, exc: BaseException) -> ModelError:
                said = _context_exceeded(exc)
                if said is not None:
                    return PromptTooLong(
                        f"the OpenAI-compatible endpoint {self.openai_api_base} says the "
                        f"prompt does not fit {self.model_name!r}'s context: {said}",
                        hint="shorten the conversation or the texts it quotes, or serve the "
                        "model with a longer context (vLLM's --max-model-len, llama-server's "
                        "--ctx-size)",
                    )
                return ModelError(
                    f"the OpenAI-compatible endpoint {self.openai_api_base} failed: {exc}",
                    hint=self.failure_hint
                    or "check BATOS_OPENAI_BASE_URL and that the server serves "
                    f"{self.model_name!r}, or unset it to use Ollama or the embedded model",
                )

        _chat = OpenAIPersonaChat
    return _chat


#: How OpenAI-compatible servers word a prompt longer than the context: OpenAI and vLLM
#: ("This model's maximum context length is 4096 tokens..."), llama-server ("the request
#: exceeds the available context size"), others ("prompt is too long", "too many tokens").
_TOO_LONG = re.compile(
    r"maximum context length|context (?:length|size|window)|prompt is too long|too many tokens",
    re.IGNORECASE,
)
#: The error codes and types the same servers give it.
_TOO_LONG_CODES = {"context_length_exceeded", "exceed_context_size_error"}


def _context_exceeded(exc: BaseException) -> str | None:
    """The server's words when ``exc`` refused a prompt longer than the model's context (a
    retry fails the same way: ``PromptTooLong`` lets a caller with many prompts skip it)."""
    if getattr(exc, "status_code", None) not in (400, 413):
        return None
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, dict) else None
    fields = error if isinstance(error, dict) else {}
    message = str(fields.get("message") or getattr(exc, "message", "") or exc)[:500]
    kinds = {str(fields.get("code"))[:100], str(fields.get("type"))[:100]}
    if kinds & _TOO_LONG_CODES or _TOO_LONG.search(message):
        return message
    return None
