"""Memory curation's model side: BABS summarises the chunks the curator folds together."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.messages import HumanMessage, SystemMessage

from graph import prompts
from store.knowledge.chunking import clipped


def babs_summarizer(
    model_factory: Callable[..., Any] | None = None, **options: object
) -> Callable[[list[str]], str]:
    """``summarize(texts) -> str`` backed by BABS's chat model and graph/prompts/curator.toml.

    ``model_factory(persona)`` replaces the configured backends (a scripted model in tests).
    """
    if model_factory is not None:
        model = model_factory("BABS")
    else:
        from batos.models import chat_model

        model = chat_model("BABS", **options)
    prompt = prompts.load("curator")

    def summarize(texts: list[str]) -> str:
        # A chunk stored before chunks were bounded in characters can be a whole file.
        passages = "\n\n".join(f"[{n}] {clipped(t)}" for n, t in enumerate(texts, start=1))
        reply = model.invoke(
            [
                SystemMessage(prompt["system"]),
                HumanMessage(prompt["user"].format(passages=passages)),
            ]
        )
        return str(reply.content)

    return summarize
