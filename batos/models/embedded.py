"""The embedded backend: a persona's Modelfile served in process by llama.cpp.

``EmbeddedChatModel`` reads the persona's Modelfile on every call (so a new adapter or an
edited parameter applies without a restart), asks the process-wide ``Engine`` for the base
model named by the ``model`` setting, and streams through it with the persona's adapter active.
``LlamaCppChat`` is the engine as a LangChain chat model; the persona seam
(``PersonaChatModel``) puts the Modelfile's SYSTEM in front of it, as for every backend.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from batos import settings
from batos.models.base import PersonaChatModel
from batos.models.cancel import cancel_event
from batos.models.engine import DEFAULT_N_CTX, Engine, Sampling, Usage, engine
from batos.models.modelfile import PersonaModel, adapter_path, modelfiles_dir, persona_model
from prototypes.codex import PersonaSpec

log = logging.getLogger("batos.llm.embedded")

_ROLES = {
    "system": "system",
    "human": "user",
    "ai": "assistant",
    "tool": "tool",
    "chat": "user",
    "function": "tool",
}
_warned: set[tuple[str, str]] = set()


def message_dicts(messages: Sequence[BaseMessage], system: str | None) -> list[dict[str, str]]:
    """LangChain messages as chat-template dicts; the Modelfile SYSTEM unless one is given.

    A system message in ``messages`` replaces the Modelfile's SYSTEM, as it does in Ollama.
    """
    out = [{"role": _ROLES.get(m.type, "user"), "content": _text(m.content)} for m in messages]
    if system and not any(m["role"] == "system" for m in out):
        out.insert(0, {"role": "system", "content": system})
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part if isinstance(part, str) else str(part.get("text", "")) for part in content)


def available() -> bool:
    """Always: the base model ships as a package, so the embedded backend is the fallback."""
    return True


def build(persona: PersonaSpec, timeout: float, options: dict[str, Any]) -> BaseChatModel:
    return EmbeddedChatModel(persona=persona.name, timeout=timeout, **options)


def adapter_paths(model: PersonaModel, which: str) -> tuple[Path, ...]:
    """The persona's adapter for base model ``which``, unless it is not trained yet.

    A Modelfile with an ADAPTER line (they name the 'default' model's file) is served with the
    persona's adapter for the base in use, ``adapter_path(which, persona)``. A custom GGUF path
    has no trained adapters, so it runs on the system prompt alone, as every persona does
    while the ``adapters`` setting is 'off'.
    """
    from store.core.model_files import catalog

    if settings.get_str("adapters") == "off":
        return ()
    if which not in catalog():
        _warn_once(
            model.persona,
            which,
            f"{model.persona}: base {which} is a custom GGUF; "
            "persona adapters are trained per named model, so only SYSTEM applies",
        )
        return ()
    if not model.adapters:
        return ()
    folder = model.modelfile.path.parent if model.modelfile.path else modelfiles_dir()
    path = adapter_path(which, model.persona, folder)
    if path.is_file():
        return (path,)
    _warn_once(
        model.persona,
        which,
        f"{model.persona} has no adapter for model "
        f"{which!r} yet ({path} is missing); serving it with its system prompt",
    )
    return ()


def _warn_once(persona: str, which: str, text: str) -> None:
    if (persona, which) not in _warned:
        _warned.add((persona, which))
        log.warning(text)


def sampling_for(parameters: dict[str, Any], overrides: dict[str, Any]) -> Sampling:
    merged = {**parameters, **{k: v for k, v in overrides.items() if v is not None}}
    base = Sampling()
    return Sampling(
        temperature=float(merged.get("temperature", base.temperature)),
        top_k=int(merged.get("top_k", base.top_k)),
        top_p=float(merged.get("top_p", base.top_p)),
        min_p=float(merged.get("min_p", base.min_p)),
        repeat_penalty=float(merged.get("repeat_penalty", base.repeat_penalty)),
        num_predict=int(merged.get("num_predict", base.num_predict)),
        seed=merged.get("seed"),
        stop=tuple(merged.get("stop", ())),
    )


class LlamaCppChat(BaseChatModel):
    """The engine as a chat model: ``persona``'s adapter and PARAMETERs over the base GGUF.

    It sends the messages as they are; ``EmbeddedChatModel`` adds the persona's SYSTEM.
    """

    persona: str
    base_model: str | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    num_predict: int | None = None
    seed: int | None = None
    timeout: float | None = None
    modelfiles: str | None = None
    #: False for the author model (``batos.models.author``): adapters are trained on the
    #: personas' base model and are for answering, not for writing methods.
    use_adapters: bool = True
    #: A JSON schema the reply must follow (constrained decoding), as Ollama's ``format``.
    format: dict[str, Any] | None = None

    @property
    def _llm_type(self) -> str:
        return "batos-embedded"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"persona": self.persona, "base_model": self._which()}

    def _which(self) -> str:
        return self.base_model or settings.get_str("model")

    def persona_model(self) -> PersonaModel:
        """The persona's Modelfile as it is on disk now, FROM chain folded in."""
        folder = Path(self.modelfiles) if self.modelfiles else modelfiles_dir()
        return persona_model(self.persona, folder)

    def resolve(self) -> tuple[PersonaModel, Engine, tuple[Path, ...]]:
        """The persona's resolved Modelfile, the engine serving it and its adapter files."""
        from store.core.model_files import model_path

        model = self.persona_model()
        which = self._which()
        n_ctx = int(model.parameters.get("num_ctx", DEFAULT_N_CTX))  # type: ignore[call-overload]
        adapters = adapter_paths(model, which) if self.use_adapters else ()
        return model, engine(model_path(which), n_ctx), adapters

    def _pieces(self, messages: list[BaseMessage], stop: list[str] | None) -> Iterator[str | Usage]:
        model, eng, adapters = self.resolve()
        from batos.models import SAMPLING_OPTIONS

        overrides = {name: getattr(self, name) for name in SAMPLING_OPTIONS}
        sampling = sampling_for(model.parameters, overrides)
        if stop:
            sampling = Sampling(**{**sampling.__dict__, "stop": (*sampling.stop, *stop)})
        if self.format is not None:
            schema = json.dumps(self.format, sort_keys=True)
            sampling = Sampling(**{**sampling.__dict__, "json_schema": schema})
        return eng.generate(
            message_dicts(messages, None),
            adapters=adapters,
            sampling=sampling,
            timeout=self.timeout,
            cancel=cancel_event(),
        )

    def loglikelihood(self, messages: list[BaseMessage], continuation: str) -> tuple[float, int]:
        """(summed log-probability, tokens) of ``continuation`` as the reply to ``messages``,
        under the persona's adapter: what the model thinks of a text it did not write."""
        _, eng, adapters = self.resolve()
        system = self.system_prompt() if isinstance(self, PersonaChatModel) else None
        return eng.loglikelihood(
            message_dicts(messages, system), continuation, adapters=adapters, timeout=self.timeout
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for piece in self._pieces(messages, stop):
            if isinstance(piece, Usage):
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content="",
                        usage_metadata=_usage_metadata(piece),
                        response_metadata=self._metadata(piece),
                        chunk_position="last",
                    )
                )
                return
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
            if run_manager:
                run_manager.on_llm_new_token(piece, chunk=chunk)
            yield chunk

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        text: list[str] = []
        usage = Usage()
        for piece in self._pieces(messages, stop):
            if isinstance(piece, Usage):
                usage = piece
            else:
                text.append(piece)
        message = AIMessage(
            content="".join(text),
            usage_metadata=_usage_metadata(usage),
            response_metadata=self._metadata(usage),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _metadata(self, usage: Usage) -> dict[str, Any]:
        return {
            "model_name": f"{self.persona.lower()}@{self._which()}",
            "finish_reason": usage.finish_reason,
            "adapters": list(usage.adapters),
            "time_to_first_token_s": usage.first_token_s,
            "total_s": usage.total_s,
        }


def _usage_metadata(usage: Usage) -> Any:
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "input_token_details": {"cache_read": usage.cached_tokens},
    }


class EmbeddedChatModel(PersonaChatModel, LlamaCppChat):
    """A persona served in process by llama.cpp, exactly as its Modelfile describes."""

    def system_prompt(self) -> str:
        return self.persona_model().system or ""
