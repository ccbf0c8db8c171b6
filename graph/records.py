"""The shapes of what the mind writes into the image and what reporting commands read back: one
pydantic model per effect kind and per stored record kind, used by writers and readers alike.

Effects are data from graph state, which a LangGraph server client can write too: a commit whose
effect does not fit its kind's model is refused whole (``store.checkpoint.effects.check``).
Records are checked again as they are read (``readable``): one with a field of the wrong type —
edited by hand, or written around these checks — is skipped with a warning naming it, so that
``batos cycles``, an audit or a report never fails on it. A cycle record written by an older version
may lack fields that came later: readers take it, and read its fields with defaults. Records
accept keys they do not know (a newer writer's fields), bounded by the record's size; a field
gets its type here, in one place.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prototypes.bounded import bounded_repr
from store.checkpoint.effects import problems
from store.knowledge.embeddings import DIMS

log = logging.getLogger("batos.records")

#: Bounds on what one effect or record may carry.
MAX_SOURCE_CHARS = 20_000
MAX_RECORD_BYTES = 256 * 1024
MAX_COUNT = 1_000
MAX_NAMESPACE_PARTS = 4
MAX_VECTORS = 4
MAX_RESPONSE_CHARS = 8000

Name = Annotated[str, Field(min_length=1, max_length=128)]
#: The most characters of a thread id the mind answers on (``graph.request.check_thread_id``):
#: every effect that names the thread takes one this long.
MAX_THREAD_ID_CHARS = 128
ThreadId = Annotated[str, Field(min_length=1, max_length=MAX_THREAD_ID_CHARS)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
#: Ids, totals and counts: every one a reader can print (no integer past JSON's exact range).
Natural = Annotated[int, Field(ge=0, le=2**53)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
#: Seconds since the epoch that ``datetime.fromtimestamp`` can show.
Timestamp = Annotated[float, Field(ge=0, le=1e10)]
Vector = Annotated[list[Finite], Field(min_length=DIMS, max_length=DIMS)]


class _Closed(BaseModel):
    """An effect: exactly these fields, of exactly these types (no coercion)."""

    model_config = ConfigDict(strict=True, extra="forbid")


class _Open(BaseModel):
    """A record: these fields typed, other keys kept as they are (bounded by the record size)."""

    model_config = ConfigDict(strict=True, extra="allow")


# -- effects (``graph.cycle`` applies them) ---------------------------------------------------


class InstallMethodEffect(_Closed):
    kind: Literal["install_method"]
    persona: Name
    selector: Name
    source: Annotated[str, Field(max_length=MAX_SOURCE_CHARS)]
    intent: Annotated[str, Field(max_length=4_000)] = ""
    author: Annotated[str, Field(max_length=128)] | None = None
    audit: dict[str, Any] = {}
    attempts: Count = 0


class PersonaStatsEffect(_Closed):
    kind: Literal["persona_stats"]
    persona: Name
    model_calls: Count = 0
    facets: Annotated[dict[Name, Count], Field(max_length=64)] = {}


class MemoryEffect(_Closed):
    kind: Literal["memory"]
    namespace: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]],
        Field(min_length=1, max_length=MAX_NAMESPACE_PARTS),
    ]
    key: Name
    value: dict[str, Any]
    vectors: Annotated[list[Vector], Field(max_length=MAX_VECTORS)] = []


class CatalogRetrievedEffect(_Closed):
    kind: Literal["catalog_retrieved"]
    chunks: Annotated[list[int], Field(max_length=MAX_COUNT)]


class Depth(_Open):
    mode: str
    rule: str


class Tokens(_Open):
    input: Natural
    output: Natural


class Degradation(_Closed):
    """A part of a cycle that did not serve as planned (the answer went on without it)."""

    where: Annotated[str, Field(max_length=32)]
    what: Annotated[str, Field(max_length=200)]
    reason: Annotated[str, Field(max_length=500)]
    #: How many times the same part failed for the same reason in the cycle (absent: once).
    times: Annotated[int, Field(ge=2, le=64)] | None = None


class Grounding(_Open):
    about_catalog: bool = False
    best: Finite | None = None
    threshold: Finite | None = None


class PlanCounts(_Closed):
    steps: Natural
    duplicates: Natural
    off_request: Natural


class PlanQuality(_Closed):
    raw: PlanCounts
    final: PlanCounts
    kept: Natural
    parsed: Natural


class _CycleFields(_Open):
    """What every cycle record holds, as written and as stored (records written before a
    field existed read it as its default)."""

    status: str
    thread_id: str
    request: str
    response: Annotated[str, Field(max_length=MAX_RESPONSE_CHARS)]
    depth: Depth
    route: dict[str, Any]
    plan: list[dict[str, Any]]
    personas: list[str]
    facets: list[str]
    methods_written: list[str]
    started: Timestamp
    seconds: Finite
    model_seconds: Finite
    tokens: Tokens
    metrics: list[dict[str, Any]]
    relevance: Finite | None = None
    synthesis_attempts: Natural = 0
    degraded: Annotated[list[Degradation], Field(max_length=64)] = []
    truncated: bool = False
    grounding: Grounding = Grounding()
    cited: Annotated[list[Annotated[str, Field(max_length=2000)]], Field(max_length=16)] = []
    plan_quality: PlanQuality | dict[str, Any] = {}


class CycleRecordIn(_CycleFields):
    """A cycle record as the ``cycle_record`` effect carries it: embeddings as lists."""

    request_vector: Vector | None = None
    response_vector: Vector | None = None


class CycleRecordEffect(_Closed):
    kind: Literal["cycle_record"]
    record: CycleRecordIn


#: The model of each effect kind ``graph.cycle`` registers.
EFFECTS: dict[str, type[BaseModel]] = {
    "install_method": InstallMethodEffect,
    "persona_stats": PersonaStatsEffect,
    "memory": MemoryEffect,
    "catalog_retrieved": CatalogRetrievedEffect,
    "cycle_record": CycleRecordEffect,
}

# -- stored records -----------------------------------------------------------------------------

Embedding = Annotated[bytes, Field(min_length=DIMS * 4, max_length=DIMS * 4)]


class CycleRecord(_CycleFields):
    """A committed cycle record (``layout.CYCLES``): embeddings as float32 bytes."""

    request_vector: Embedding | None = None
    response_vector: Embedding | None = None
    committed: Timestamp


class Failure(_Open):
    """Why a cycle FAILED, as its thread's last checkpoint keeps it."""

    node: str | None = None
    reason: str
    hint: str | None = None


class PersonaTerms(_Open):
    share: Finite
    H_cog_term: Finite
    H_sol_mean: Finite | None


class CemReading(_Open):
    H_rel: Finite | None
    H_cog: Finite | None
    H_sol: Finite | None
    H_struc: Finite | None
    cem: Finite | None
    cycles: Natural
    weights: dict[str, Finite]
    by_persona: dict[str, PersonaTerms] = {}


class AuditReport(_Open):
    """An audit report (``layout.AUDIT_REPORTS``)."""

    id: Natural
    time: Timestamp
    metrics: CemReading
    deltas: dict[str, Finite | None]
    verdict: str
    narrative: str
    previous: Natural | None = None
    weights_next: dict[str, Finite]
    judged: dict[Natural, str] = {}
    mission: Natural | None = None
    #: What the audit had seen (absent in reports written before they recorded it).
    cycles_total: Natural | None = None
    newest_cycle: str | None = None
    #: Why an idle audit measured nothing new.
    reason: str | None = None


class Hypothesis(_Open):
    component: str
    baseline: Finite | None
    gain: Finite
    cycles: Natural
    text: str = ""


class Judged(_Open):
    why: str | None = None
    error: str | None = None


class Mission(_Open):
    """A self-improvement mission (``layout.MISSIONS``)."""

    id: Natural
    started: Timestamp
    report: Natural
    kind: str
    target: str
    persona: str
    reason: str = ""
    selector: str | None = None
    query: str | None = None
    status: str
    hypothesis: Hypothesis
    baseline: dict[str, Finite | None]
    cycles_at_start: Natural = 0
    tids: list[str | None] = []
    error: str | None = None
    judged: Judged | None = None
    prior_before: Finite | None = None
    prior_after: Finite | None = None


# -- checking -----------------------------------------------------------------------------------


def json_size(value: Any) -> int:
    """Characters of ``value`` as JSON; ``ValueError`` if it is not plain JSON data."""
    try:
        return len(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not plain JSON data ({type(exc).__name__})") from None


def readable(
    model: type[BaseModel], what: str, key: Any, value: Any, *, partial: bool = False
) -> dict[str, Any] | None:
    """``value`` as a plain dict when it fits ``model`` (``partial``: fields may be missing,
    never of the wrong type); else None, with one warning naming ``what`` and ``key``: a
    reader skips the record and goes on."""
    try:
        model.model_validate(dict(value) if isinstance(value, Mapping) else value)
    except ValidationError as exc:
        if partial and all(e["type"] == "missing" for e in exc.errors()):
            return dict(value)
        log.warning(
            "%s %s is malformed and was skipped: %s", what, bounded_repr(key, 80), problems(exc)
        )
        return None
    return dict(value)
