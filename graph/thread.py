"""Whether a request is answered by its own thread: what the user said earlier on it.

"What did I just say?", "What was my first question about?", "How much do I owe Priya?" after
"I owe Priya 25 pounds": the answer is in the conversation, not in the knowledge catalog and
not in the persona's imagination. Such a request is *about the thread* when it speaks of the
conversation itself (``speaks_of_conversation``: a participant's saying, asking or telling in
the past, "my first message", "this conversation", "repeat that") or when what an earlier
message of the user states (``statements``: its questions and requests answer nothing) is
nearer to it than the catalog's best passage, and near enough (``mind_thread_bar``), by the
same encoder the catalog and the router use.

The mind then answers it in one call from the thread (no passages, no plan for a short
question) and decodes greedily: sampled at a persona's temperature, a reply quotes the
conversation or drifts from it by chance ("Oh, that was your question. It felt so light and
simple." for "what did I just say?" after "hello").
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.messages import BaseMessage, HumanMessage

from graph import prompts as prompt_files
from graph.request import content_text

#: Earlier messages of the user weighed against a request: the ones the answer sees
#: (graph.answer.HISTORY_TURNS), each cut as it is there.
THREAD_TURNS = 12
TURN_CHARS = 600
#: Longest a message is listed before a question about the conversation: each listed word is
#: prompt the model reads again (about 90 tokens a second on two cores), and the whole
#: message is in the thread the answer sees anyway.
LISTED_CHARS = 240
#: Statements' vectors kept between cycles, per encoder: a thread's earlier messages are the
#: same from one cycle to the next, and encoding a dozen of them again each time is most of
#: what weighing them costs.
VECTOR_CACHE = 512
_vectors: OrderedDict[tuple[Any, str], np.ndarray] = OrderedDict()
_vectors_lock = threading.Lock()

_ADVERB = r"(?:just|first|last|earlier|already|previously|originally|once)\s+"
_SAYING_PAST = (
    r"said|told|asked|mentioned|wrote|typed|talked|called|gave|shared|sent|meant|named|"
    r"described|suggested|recommended|answered|replied|discussed"
)
_SAYING = (
    r"say|tell|ask|mention|write|type|talk|call|give|share|send|mean|name|describe|suggest|"
    r"recommend|answer|reply|discuss"
)
#: How English speaks of the conversation itself: a question about a participant's saying,
#: asking or telling ("did you say", "what have I told you", "the code I gave you", "which
#: one I mentioned earlier"; not "how do I tell…" or "I told my boss…"), a message by its
#: place ("my first question", "your last answer"), the conversation named ("this chat"), and
#: asking for it again ("repeat that", "say that again", "do you remember").
_PARTY = r"(?:i|you|we)\s+"
_TO_US = (
    r"(?:to\s+)?(?:you|me|us|earlier|before|above|just\s+now|at\s+(?:the\s+)?(?:start|beginning))"
)
CONVERSATION = re.compile(
    r"\b(?:"
    rf"(?:did|have|had)\s+{_PARTY}(?:{_ADVERB})?(?:{_SAYING}|{_SAYING_PAST})"
    rf"|{_PARTY}(?:{_ADVERB})?(?:{_SAYING_PAST})\s+{_TO_US}"
    rf"|{_PARTY}just\s+(?:{_SAYING_PAST})"
    rf"|(?:what|which|where|when|who|how\s+(?:much|many|long|old))\b[^.?!]{{0,40}}?\b{_PARTY}"
    rf"(?:{_ADVERB})?(?:{_SAYING_PAST})\b"
    r"|(?:my|your|our)\s+(?:very\s+)?(?:first|last|previous|earlier|latest|original|other)\s+"
    r"(?:message|question|word|request|reply|answer|point|topic|sentence)s?"
    r"|(?:this|our|the)\s+(?:conversation|chat|thread|discussion)"
    r"|(?:repeat|remind\s+me\s+(?:of|what))\s+(?:what|that|it|back|the|my|your|me)"
    r"|say\s+(?:that|it)\s+again"
    r"|(?:were|are|have)\s+we\s+(?:just\s+|been\s+|already\s+)?"
    r"(?:talking|discussing|chatting|saying|talked|discussed|covered|said)"
    r"|you\s+remember"
    r")\b",
    re.IGNORECASE,
)


_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")
#: How a sentence that asks rather than states begins: a question word or an inverted verb
#: ("Can you…", "Is it…"), or a request ("Tell me…", "Please explain…"; "Please keep in mind
#: that…" states).
_ASKING = re.compile(
    r"^\W*(?:and\s+|so\s+|but\s+|ok(?:ay)?\W+|thanks\W+|also\s+)*(?:"
    r"how|what|what's|whats|why|when|where|which|who|whom|whose|"
    r"can|could|would|will|should|shall|is|are|was|were|do|does|did|have|has|may|might|"
    r"let's|lets|(?:please\s+)?(?:tell|explain|give|show|list|describe|summari[sz]e|compare|"
    r"find|help|write|recommend|suggest)"
    r")\b",
    re.IGNORECASE,
)


def statements(text: str) -> str:
    """The sentences of ``text`` that state something ("My locker code is 4471."), joined;
    questions and requests are left out ("What should I pack?", "Tell me about fees.")."""
    kept = [
        sentence.strip()
        for sentence in _SENTENCE_BREAK.split(text)
        if not sentence.rstrip().endswith("?")
        and not _ASKING.match(sentence)
        and re.search(r"\w", sentence)
    ]
    return " ".join(kept)


def speaks_of_conversation(request: str) -> bool:
    """Whether ``request`` speaks of the conversation it is part of (``CONVERSATION``)."""
    return CONVERSATION.search(request) is not None


def earlier_turns(messages: Sequence[BaseMessage]) -> list[str]:
    """The user's messages before the request (the last message), the latest
    ``THREAD_TURNS``, each cut to ``TURN_CHARS``; empty ones left out."""
    said = [
        content_text(m.content)[:TURN_CHARS].strip()
        for m in messages[:-1]
        if isinstance(m, HumanMessage)
    ]
    return [text for text in said if text][-THREAD_TURNS:]


@dataclass(frozen=True)
class ThreadSource:
    """Why a request is, or is not, answered from its thread; kept in the cycle's record."""

    about_thread: bool
    #: "conversation" (it speaks of it), "nearest" (what an earlier message states is nearer
    #: than the catalog and at least ``bar``), or "" (not about the thread).
    why: str
    #: The cosine similarity to the request of what the nearest earlier message stated, and
    #: that message's index among the earlier messages (None: none weighed).
    best: float | None
    turn: int | None
    bar: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "about_thread": self.about_thread,
            "why": self.why,
            "best": None if self.best is None else round(self.best, 4),
            "turn": self.turn,
            "bar": self.bar,
        }


def probe(
    request: str,
    turns: Sequence[str],
    request_vector: Any,
    encode: Callable[[list[str]], Any],
    catalog_best: float | None,
    bar: float,
) -> ThreadSource:
    """Whether ``request`` is answered by the earlier ``turns`` of its thread.

    ``catalog_best`` is the similarity of the catalog's nearest passage (None: no catalog or
    none searched): the thread wins only over a farther catalog, so a question about a
    document the user also mentioned keeps its passages. Only what the user stated is
    weighed (``statements``): an earlier question or request answers nothing, and a follow-up
    ("And for students?" after "What does the report say about fees?") resembles it most.
    """
    if not turns:
        return ThreadSource(False, "", None, None, bar)
    best, turn = None, None
    told = [(i, stated) for i, text in enumerate(turns) if (stated := statements(text))]
    if request_vector is not None and told:
        vectors = _encoded([text for _, text in told], encode)
        query = np.asarray(request_vector, dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1) * max(float(np.linalg.norm(query)), 1e-12)
        scores = vectors @ query / np.maximum(norms, 1e-12)
        nearest = int(np.argmax(scores))
        turn, best = told[nearest][0], float(scores[nearest])
    if speaks_of_conversation(request):
        return ThreadSource(True, "conversation", best, turn, bar)
    if best is not None and best >= bar and (catalog_best is None or best >= catalog_best):
        return ThreadSource(True, "nearest", best, turn, bar)
    return ThreadSource(False, "", best, turn, bar)


def _encoded(texts: list[str], encode: Callable[[list[str]], Any]) -> np.ndarray:
    """``texts``' vectors, one row each: those encoded before by the same encoder (``encode``
    itself: bound methods of one object compare equal) are read back, and the rest are
    encoded in one batch and kept, the least recently used dropped past ``VECTOR_CACHE``."""
    owner = encode
    with _vectors_lock:
        known = {t: _vectors[(owner, t)] for t in texts if (owner, t) in _vectors}
    missing = list(dict.fromkeys(t for t in texts if t not in known))
    if missing:
        fresh = np.asarray(encode(missing), dtype=np.float32)
        if fresh.shape[0] != len(missing):
            raise ValueError(f"the encoder gave {fresh.shape[0]} vectors for {len(missing)} texts")
        known.update(zip(missing, fresh, strict=True))
    with _vectors_lock:
        for text in texts:
            _vectors[(owner, text)] = known[text]
            _vectors.move_to_end((owner, text))
        while len(_vectors) > VECTOR_CACHE:
            _vectors.popitem(last=False)
    return np.stack([known[t] for t in texts])


def said_prompt(request: str, turns: Sequence[str]) -> str:
    """``request`` after the user's earlier messages, numbered oldest first, each quoted and
    cut to ``LISTED_CHARS``."""
    listed = "\n".join(
        f'{n}. "{text if len(text) <= LISTED_CHARS else text[:LISTED_CHARS] + "…"}"'
        for n, text in enumerate(turns, start=1)
    )
    return prompt_files.load("mind")["thread_said"].format(turns=listed, request=request)
