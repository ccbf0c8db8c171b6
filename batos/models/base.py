"""The one seam every persona chat model goes through, whatever serves it.

``PersonaChatModel`` is put in front of a backend's LangChain chat model (``ChatOpenAI``,
``ChatOllama``, the embedded llama.cpp model). It owns the two things every backend must do
the same way: the persona's SYSTEM prompt goes first unless the call brings its own system
message (as Ollama does), and the backend's own exceptions leave as ``ModelError``s, translated
at this boundary by one table per backend (``exception_table``, applied by ``map_exceptions`` as
httpx maps its transports' errors). It also stops a streamed call at its next chunk once the
caller's cancel event is set (``batos.models.cancel``), closing the backend's stream (for the
HTTP backends, the response: the server sees the client go). Errors::

    ModelError (BatosError, exit code 5)   what a table entry makes of a backend's exception
    GenerationCancelled (BaseException)    the caller's cancel event was set
    anything the table does not name      propagates unchanged
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import aclosing, closing, contextmanager
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage, SystemMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from batos import metrics
from batos.errors import GenerationCancelled, ModelError
from batos.models.cancel import cancel_event, raise_if_cancelled
from store.core.text import well_formed

#: A backend's exception class → what to make of it. The most specific matching class wins.
ExceptionTable = Mapping[type[BaseException], Callable[[BaseException], ModelError]]


@contextmanager
def map_exceptions(table: ExceptionTable) -> Iterator[None]:
    """Re-raise an exception ``table`` names as its ``ModelError`` (``from`` the original)."""
    try:
        yield
    except Exception as exc:
        chosen: type[BaseException] | None = None
        for kind in table:
            if isinstance(exc, kind) and (chosen is None or issubclass(kind, chosen)):
                chosen = kind
        if chosen is None:
            raise
        raise table[chosen](exc) from exc


def with_system(messages: list[BaseMessage], system: str) -> list[BaseMessage]:
    """``messages`` with ``system`` first, unless it is empty or the call brings its own;
    their text well formed (``encodable``)."""
    messages = encodable(messages)
    if system and not any(isinstance(m, SystemMessage) for m in messages):
        return [SystemMessage(system), *messages]
    return messages


def encodable(messages: list[BaseMessage]) -> list[BaseMessage]:
    """``messages``, each whose text holds a lone surrogate copied with it replaced: no
    backend can send or tokenize one (UTF-8 has none), and a request may carry one from a
    file name that is not UTF-8 (a passage's source) or a client's JSON."""
    out = []
    for message in messages:
        content = message.content
        if isinstance(content, str):
            fixed: Any = well_formed(content)
        else:
            fixed = [
                well_formed(part)
                if isinstance(part, str)
                else {k: well_formed(v) if isinstance(v, str) else v for k, v in part.items()}
                for part in content
            ]
        out.append(message if fixed == content else message.model_copy(update={"content": fixed}))
    return out


class PersonaChatModel(BaseChatModel):
    """A persona's chat model: the backend's class comes after this one in the bases.

    Subclasses say what the persona's SYSTEM prompt is (``system_prompt``; the
    ``persona_system`` field by default, empty where the server applies it itself) and how
    their backend's exceptions read as ``ModelError``s (``exception_table``).
    """

    persona_system: str = ""

    def system_prompt(self) -> str:
        return self.persona_system

    def exception_table(self) -> ExceptionTable:
        return {}

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        with self._measured(), map_exceptions(self.exception_table()):
            raise_if_cancelled(cancel_event())
            messages = with_system(messages, self.system_prompt())
            # a mixin: the backend class after it in the MRO implements _generate
            return super()._generate(messages, *args, **kwargs)  # type: ignore[safe-super]

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        cancel = cancel_event()
        with self._measured() as first, map_exceptions(self.exception_table()):
            raise_if_cancelled(cancel)
            messages = with_system(messages, self.system_prompt())
            if getattr(super()._stream, "__func__", None) is BaseChatModel._stream:
                # A backend that only writes whole replies streams each as one chunk.
                yield first(_one_chunk(super()._generate(messages, *args, **kwargs)))  # type: ignore[safe-super]
                return
            # closing(): a cancelled call ends the backend's stream now, not when collected
            # the backends' _stream are generators, which close (Iterator does not say so)
            with closing(super()._stream(messages, *args, **kwargs)) as chunks:  # type: ignore[type-var]
                for chunk in chunks:
                    raise_if_cancelled(cancel)
                    yield first(chunk)

    async def _agenerate(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> ChatResult:
        with self._measured(), map_exceptions(self.exception_table()):
            raise_if_cancelled(cancel_event())
            messages = with_system(messages, self.system_prompt())
            return await super()._agenerate(messages, *args, **kwargs)

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        cancel = cancel_event()
        with self._measured() as first, map_exceptions(self.exception_table()):
            raise_if_cancelled(cancel)
            messages = with_system(messages, self.system_prompt())
            # the backends' _astream are async generators, which close
            async with aclosing(super()._astream(messages, *args, **kwargs)) as chunks:  # type: ignore[type-var]
                async for chunk in chunks:
                    raise_if_cancelled(cancel)
                    yield first(chunk)

    @contextmanager
    def _measured(self) -> Iterator[Callable[[ChatGenerationChunk], ChatGenerationChunk]]:
        """Counts the call and its seconds (``batos.metrics``); the callable it gives marks
        each streamed chunk, the first of which sets the time to first token."""
        backend = self._llm_type
        started = time.perf_counter()
        seen: list[bool] = []

        def first(chunk: ChatGenerationChunk) -> ChatGenerationChunk:
            if not seen:
                seen.append(True)
                elapsed = time.perf_counter() - started
                metrics.observe("model_first_token_seconds", elapsed, backend=backend)
            return chunk

        outcome = "ok"
        try:
            yield first
        except GeneratorExit:  # the caller stopped reading a stream: a call all the same
            outcome = "closed"
            raise
        except GenerationCancelled:
            outcome = "cancelled"
            raise
        except BaseException:
            outcome = "error"
            raise
        finally:
            metrics.observe("model_seconds", time.perf_counter() - started, backend=backend)
            metrics.count("model_calls", backend=backend, outcome=outcome)


def _one_chunk(result: ChatResult) -> ChatGenerationChunk:
    message = result.generations[0].message
    return ChatGenerationChunk(
        message=AIMessageChunk(
            content=message.content,
            usage_metadata=getattr(message, "usage_metadata", None),
            response_metadata=message.response_metadata,
            chunk_position="last",
        )
    )
