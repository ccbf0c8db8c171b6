"""Fakes for tests: a scripted chat model that answers from a queue and records every prompt;
a paced one that streams word by word; a model factory answering by rule; a router and an
embedder that need no model."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import Field

from batos.models.base import PersonaChatModel


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


class PacedChatModel(BaseChatModel):
    """Streams ``reply(messages)`` word by word, waiting ``pace`` seconds before each word: a
    model slow enough for a test to stop it mid-answer."""

    reply: Callable[[list[BaseMessage]], str]
    pace: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "paced"

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for i, word in enumerate(self.reply(list(messages)).split(" ")):
            time.sleep(self.pace)
            yield ChatGenerationChunk(
                message=AIMessageChunk(content=word if i == 0 else f" {word}")
            )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        text = "".join(str(c.message.content) for c in self._stream(messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])


class PacedPersonaModel(PersonaChatModel, PacedChatModel):
    """The paced model behind the seam every backend's model goes through, which stops a call
    whose caller cancels it (``batos.models.cancel``)."""


def image_digest(db: Any, exclude: Sequence[str] = ()) -> str:
    """A digest of every object record reachable from the root: equal digests, equal images.

    ``exclude`` names root keys whose objects are left out (e.g. "checkpoints", which every
    graph run writes to).
    """
    from ZODB.serialize import referencesf
    from ZODB.utils import z64

    digest = hashlib.sha256()
    seen: set[bytes] = set()
    if exclude:
        conn = db.open()
        try:
            root = conn.root()
            seen = {root[key]._p_oid for key in exclude if key in root}
        finally:
            conn.close()
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


# -- the mind's collaborators -----------------------------------------------------------------

DIMS = 384


class FakeEmbedder:
    """Bag-of-words vectors (hashed words, unit length): texts sharing words are similar."""

    dims = DIMS

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), DIMS), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z0-9]+", text.lower()):
                slot = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest())
                out[row, slot % DIMS] += 1.0
            norm = np.linalg.norm(out[row])
            if norm:
                out[row] /= norm
        return out

    def encode_one(self, text: str) -> np.ndarray:
        return self.encode([text])[0]

    def count_tokens(self, text: str) -> int:
        return len(text.split())


@dataclass(frozen=True)
class Route:
    """The router's answer, as ``graph.router.Route`` has it."""

    text: str
    ranked: tuple[tuple[str, float], ...]
    chosen: tuple[str, ...]
    vector: np.ndarray | None


class FakeRouter:
    """Routes by rule: ``rule(text)`` → the personas that answer, best first."""

    codex_version = 0

    def __init__(self, rule: Callable[[str], Sequence[str]] | Sequence[str] = ("ROBIN",)):
        self.rule = rule if callable(rule) else (lambda text, fixed=tuple(rule): fixed)
        self.embedder = FakeEmbedder()
        self.routed: list[str] = []

    def route(self, text: str) -> Route:
        self.routed.append(text)
        chosen = tuple(self.rule(text))
        others = [p for p in ("ROBIN", "BRICK", "BABS", "ALFRED") if p not in chosen]
        weights = [0.9 / len(chosen)] * len(chosen) + [0.1 / len(others)] * len(others)
        return Route(
            text,
            tuple(zip((*chosen, *others), weights, strict=True)),
            chosen,
            self.embedder.encode_one(text),
        )


@dataclass(frozen=True)
class ModelCall:
    """One call a ``FakeModels`` model answered: who, with what options, on what prompt."""

    persona: str
    options: dict[str, Any]
    messages: list[BaseMessage]

    @property
    def text(self) -> str:
        content = self.messages[-1].content
        return content if isinstance(content, str) else str(content)


class FakeModels:
    """A model factory (``models(persona, **options)``) whose models answer by rule.

    ``respond(call)`` returns the reply (or an exception to raise) for a ``ModelCall``; every
    call is recorded in ``calls``, in the order the calls were made (branches run in parallel,
    so rules look at the prompt, never at the order).
    """

    def __init__(self, respond: Callable[[ModelCall], Any]) -> None:
        self.respond = respond
        self.calls: list[ModelCall] = []
        self.made: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __call__(self, persona: str, **options: Any) -> ScriptedChatModel:
        with self._lock:
            self.made.append((persona, dict(options)))

        def reply(messages: list[BaseMessage]) -> Any:
            call = ModelCall(persona, dict(options), list(messages))
            with self._lock:
                self.calls.append(call)
            return self.respond(call)

        # A node may call one model more than once (a plan's retry): answer each call.
        return ScriptedChatModel().enqueue(*[reply] * 4)

    def of(self, kind: str) -> list[ModelCall]:
        """Calls by what they were for: 'plan', 'draft', 'program', 'facet' or 'answer'."""
        return [c for c in self.calls if call_kind(c) == kind]


def call_kind(call: ModelCall) -> str:
    if "format" in call.options:
        # the JSON a computation's figures are copied in (a difference's two, a total's
        # terms), else a plan
        copying = ("compares two figures", "asks for a total of figures")
        return "figures" if any(c in call.text for c in copying) else "plan"
    if "Write the method" in call.text:
        return "draft"
    if call.messages and "def solve(self)" in str(call.messages[0].content):
        return "program"
    if "(This is one part of answering:" in call.text:
        return "facet"
    return "answer"


def a_dead_pid() -> int:
    """The pid of a process that has ended (a child run and waited for)."""
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(ended.stdout)
