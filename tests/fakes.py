"""Fakes for tests: a scripted chat model that answers from a queue and records every prompt."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field


class ScriptedChatModel(BaseChatModel):
    """A chat model whose replies are queued with ``enqueue``; ``history`` holds each prompt.

    A queued reply is a string, an ``AIMessage``, an exception (raised when its turn comes) or
    a callable taking the prompt's messages and returning one of those. Running out of
    replies is an error, so a test sees exactly how many calls the code under test made.
    """

    replies: list[Any] = Field(default_factory=list)
    history: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def enqueue(
        self, *replies: str | AIMessage | BaseException | Callable[..., Any]
    ) -> ScriptedChatModel:
        self.replies.extend(replies)
        return self

    @property
    def calls(self) -> int:
        return len(self.history)

    def _generate(
        self,
        messages: Sequence[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.history.append(list(messages))
        if not self.replies:
            raise AssertionError(
                f"ScriptedChatModel has no reply queued for call {len(self.history)}"
            )
        reply = self.replies.pop(0)
        if callable(reply) and not isinstance(reply, BaseException):
            reply = reply(list(messages))
        if isinstance(reply, BaseException):
            raise reply
        message = reply if isinstance(reply, AIMessage) else AIMessage(str(reply))
        return ChatResult(generations=[ChatGeneration(message=message)])


def image_digest(db: Any) -> str:
    """A digest of every object record reachable from the root: equal digests, equal images."""
    import hashlib

    from ZODB.serialize import referencesf
    from ZODB.utils import z64

    digest = hashlib.sha256()
    seen: set[bytes] = set()
    todo = [z64]
    while todo:
        oid = todo.pop()
        if oid in seen:
            continue
        seen.add(oid)
        data, _ = db.storage.load(oid)
        digest.update(oid + data)
        todo.extend(sorted(referencesf(data), reverse=True))
    return digest.hexdigest()
