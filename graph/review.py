"""The reviewer: how likely the author model finds the intent given a draft's code.

Coder-Reviewer reranking (Zhang et al., ICML 2023) scores a program by p(code | intent), how
the author would write it, and by p(intent | code), how a reader of the code would describe
it: a draft that does something else than asked reads back as another intent. Both are read
from the engine's log-probabilities, with nothing sampled; a backend that does not report
them (Ollama, an OpenAI-compatible server, a scripted model) gives no review, and the trust
decision rests on agreement and examples alone.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from batos.errors import BatosError
from prototypes.trust import Review

log = logging.getLogger("batos.review")

_READER = (
    "You read Python methods of prototype objects and say in one or two sentences what a "
    "method does with its arguments and the object's slots."
)
_ASK = "```python\n{code}\n```\nWhat does the method `{selector}` do?"
_SIGNATURE = re.compile(r"^\s*def\s+\w+\s*\(.*?\)\s*(?:->[^:]*)?:", re.MULTILINE | re.DOTALL)


def signature_of(source: str, selector: str) -> str:
    """The method's ``def`` line with its body left out: what the reader knows without it."""
    found = _SIGNATURE.search(source)
    head = found.group(0).strip() if found else f"def {selector}(self, *args):"
    return head + "\n    ..."


def _reader_messages(code: str, selector: str) -> list[BaseMessage]:
    return [SystemMessage(_READER), HumanMessage(_ASK.format(code=code, selector=selector))]


def _mean(model: BaseChatModel, messages: Sequence[BaseMessage], text: str) -> float:
    total, count = model.loglikelihood(list(messages), text)  # type: ignore[attr-defined]
    return total / max(count, 1)


def can_review(model: BaseChatModel) -> bool:
    return callable(getattr(model, "loglikelihood", None))


class Reviewer:
    """Reviews the drafts of one mission; the signature-only baseline is computed once."""

    def __init__(
        self,
        model: BaseChatModel,
        selector: str,
        intent: str,
        draft_messages: Sequence[BaseMessage],
    ) -> None:
        self.model = model
        self.selector = selector
        self.intent = intent.strip()
        self.draft_messages = list(draft_messages)
        self._baseline: dict[str, float] = {}

    def review(self, source: str) -> Review | None:
        """The review of ``source``, or None when the intent is empty or the model cannot
        score (a failure here costs the signal, never the mission)."""
        if not self.intent or not can_review(self.model):
            return None
        try:
            signature = signature_of(source, self.selector)
            if signature not in self._baseline:
                self._baseline[signature] = _mean(
                    self.model, _reader_messages(signature, self.selector), self.intent
                )
            return Review(
                intent_given_code=_mean(
                    self.model, _reader_messages(source.strip(), self.selector), self.intent
                ),
                intent_given_signature=self._baseline[signature],
                code_given_intent=_mean(
                    self.model, self.draft_messages, f"```python\n{source.strip()}\n```"
                ),
            )
        except (BatosError, ValueError, RuntimeError) as exc:
            log.warning("no review of a draft of %r: %s", self.selector, exc)
            return None
