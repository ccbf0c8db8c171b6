"""The Composite Entropy Metric (CEM): four numbers in [0, 1] over a window of mind cycles.

Pure functions over cycle records (``graph.cycle``: each COMPLETE cycle records the personas
that answered, the facets called as ``PERSONA.facet_x``, the methods written, and the request
and response embeddings). A window is the ``n`` newest records, oldest first. A component
that the window cannot define (no vectors, no facets) is ``None``, never a made-up number.

H_rel — relevance. For every cycle with both embeddings, ``max(0, cos(request, response))``;
    H_rel is their mean. An answer on the question scores near 1, one beside it near 0.

H_cog — cognitive diversity. ``p_i`` is persona i's share of the persona uses in the window
    (a cycle answered by ROBIN and ALFRED counts one use each). Persona entropy
    ``E_p = -Σ p_i ln p_i / ln 4`` (the four personas). Facet entropy ``E_f`` likewise over
    facet calls, normalised by ``ln K`` with K the facets the image declares (at least 2).
    H_cog is the mean of ``E_p`` and ``E_f``, or ``E_p`` alone when no facet was called.
    ROBIN's and ALFRED's protocols (perspective, balance) feed H_cog: each persona's term
    ``-p_i ln p_i / ln 4`` is reported in ``by_persona``.

H_sol — solution novelty. For each response after the first in the window,
    ``novelty = 1 - max(0, max_j cos(response, earlier response j))``; H_sol is their mean.
    Repeating an earlier answer scores 0, an answer unlike any before scores 1. BRICK's and
    BABS's protocols (invention, research) feed H_sol: each persona's mean novelty over the
    cycles it answered is reported in ``by_persona``.

H_struc — structural complexity. ``coverage`` = distinct facets called / facets declared;
    ``grown`` = share of facet calls served by a generated method (installed before the
    window's end, including those written in it). H_struc = (coverage + grown) / 2: the
    structure the image has grown, weighted by how much of it is used.

CEM = Σ w_c H_c / Σ w_c over the components that are defined. ``None`` when no component
is defined. The weights start as the ``cem_weights`` setting (default equal) and are then
learnt by the audits (``step_weights``).

Comparing two readings (``comparable``, ``changes``, ``change``): like for like. The CEM of
each is taken over the components both define, with the same weights, so that a component
entering or leaving the mean (H_struc with the first facet call) is not read as a move; and
when H_cog held the facet entropy in one reading only, both readings' H_cog are compared on
their persona entropy, the part they share.

Meta-optimisation (``step_weights``): each judged self-improvement mission m has an outcome
``s_m`` (+1 kept, -1 undone) and the change ``Δ_c^m`` of every component between the reading
it started from and the one that judged it. A component that moved with the outcome (rose
under a kept mission, fell under an undone one) predicted success; its gradient is
``g_c = Σ_m s_m Δ_c^m``. The step is exponentiated gradient — ``w'_c ∝ w_c exp(η g_c)``, η
the ``cem_weight_rate`` setting — which stays on the simplex; the move ``w' - w`` is then
scaled down (never changing its direction) until no weight moves by more than
``cem_weight_step`` and none goes below ``MIN_WEIGHT``. A point between two points of that
face of the simplex is on it, so the weights always sum to 1 and stay ≥ ``MIN_WEIGHT``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from batos import settings
from prototypes.codex import INTENTS_SLOT, PERSONAS

COMPONENTS = ("H_rel", "H_cog", "H_sol", "H_struc")
#: The persona protocols the seeds tie to each component.
TIES = {"BRICK": "H_sol", "BABS": "H_sol", "ROBIN": "H_cog", "ALFRED": "H_cog"}
DEFAULT_WEIGHTS = {c: 0.25 for c in COMPONENTS}
#: No learnt weight goes below this: every component keeps a say in the CEM.
MIN_WEIGHT = 0.05


@dataclass
class Metrics:
    """One CEM reading: the components, the weighted sum and what they were computed from."""

    H_rel: float | None
    H_cog: float | None
    H_sol: float | None
    H_struc: float | None
    cem: float | None
    cycles: int
    weights: dict[str, float]
    by_persona: dict[str, dict[str, float | None]] = field(default_factory=dict)
    #: H_cog's two parts, so that a reading is compared with another on one definition of it
    #: (``comparable``): the persona entropy, and the facet entropy (None: no facet called,
    #: H_cog is the persona entropy alone).
    H_cog_personas: float | None = None
    H_cog_facets: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _unit(vector: Any) -> np.ndarray | None:
    if vector is None:
        return None
    v = np.asarray(vector, dtype=np.float64).ravel()
    norm = float(np.linalg.norm(v))
    if not v.size or not math.isfinite(norm) or norm == 0.0:
        return None
    return v / norm


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(min(1.0, max(0.0, value)), 6)


def relevance(records: Sequence[Mapping[str, Any]]) -> float | None:
    scores = []
    for r in records:
        q, a = _unit(r.get("request_vector")), _unit(r.get("response_vector"))
        if q is not None and a is not None:
            scores.append(max(0.0, float(q @ a)))
    return _rounded(sum(scores) / len(scores)) if scores else None


def _entropy(counts: Iterable[int], size: int) -> float:
    counts = [c for c in counts if c > 0]
    total = sum(counts)
    if total == 0 or size < 2:
        return 0.0
    return -sum(c / total * math.log(c / total) for c in counts) / math.log(size)


def persona_uses(records: Sequence[Mapping[str, Any]]) -> Counter[str]:
    return Counter(p for r in records for p in (r.get("personas") or []) if p in PERSONAS)


def facet_uses(records: Sequence[Mapping[str, Any]]) -> Counter[str]:
    return Counter(str(f) for r in records for f in (r.get("facets") or []))


def _diversity_parts(
    records: Sequence[Mapping[str, Any]], facet_space: int = 0
) -> tuple[float | None, float | None]:
    """(persona entropy, facet entropy) of H_cog, unrounded; the first None without persona
    uses, the second None when no facet was called."""
    uses = persona_uses(records)
    if not uses:
        return None, None
    e_p = _entropy(uses.values(), len(PERSONAS))
    facets = facet_uses(records)
    if not facets:
        return e_p, None
    return e_p, _entropy(facets.values(), max(2, facet_space, len(facets)))


def diversity(records: Sequence[Mapping[str, Any]], facet_space: int = 0) -> float | None:
    e_p, e_f = _diversity_parts(records, facet_space)
    if e_p is None or e_f is None:
        return _rounded(e_p)
    return _rounded((e_p + e_f) / 2)


def _novelties(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, float]]:
    """(index in records, novelty) for every response that has an earlier one to compare."""
    seen: list[np.ndarray] = []
    found = []
    for index, r in enumerate(records):
        a = _unit(r.get("response_vector"))
        if a is None:
            continue
        if seen:
            nearest = max(float(a @ b) for b in seen)
            found.append((index, 1.0 - max(0.0, nearest)))
        seen.append(a)
    return found


def novelty(records: Sequence[Mapping[str, Any]]) -> float | None:
    found = _novelties(records)
    return _rounded(sum(n for _, n in found) / len(found)) if found else None


def structure(
    records: Sequence[Mapping[str, Any]], facet_space: int, methods: Iterable[str] = ()
) -> float | None:
    """``methods``: ``PERSONA.facet_x`` of the generated methods installed in the image."""
    facets = facet_uses(records)
    if facet_space <= 0 or not facets:
        return None
    grown = set(methods) | {m for r in records for m in (r.get("methods_written") or [])}
    coverage = min(1.0, len(facets) / facet_space)
    served = sum(count for name, count in facets.items() if name in grown)
    return _rounded((coverage + served / sum(facets.values())) / 2)


def _by_persona(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    uses = persona_uses(records)
    total = sum(uses.values())
    novel = _novelties(records)
    out: dict[str, dict[str, float | None]] = {}
    for persona in PERSONAS:
        share = uses[persona] / total if total else 0.0
        term = -share * math.log(share) / math.log(len(PERSONAS)) if share else 0.0
        mine = [n for i, n in novel if persona in (records[i].get("personas") or [])]
        out[persona] = {
            "share": round(share, 6),
            "H_cog_term": round(term, 6),
            "H_sol_mean": round(sum(mine) / len(mine), 6) if mine else None,
        }
    return out


def weighted(values: Mapping[str, float | None], weights: Mapping[str, float]) -> float | None:
    defined = [(v, weights.get(c, 0.0)) for c in COMPONENTS if (v := values.get(c)) is not None]
    total = sum(w for _, w in defined)
    if not defined or total <= 0:
        return None
    return _rounded(sum(v * w for v, w in defined) / total)


#: Half a unit in the sixth place, twice over: how far a sum of rounded terms may stray.
_ROUNDING = 1e-5


def cog_parts(reading: Mapping[str, Any]) -> tuple[float, bool] | None:
    """H_cog's persona entropy in ``reading`` and whether its H_cog also holds the facet
    entropy; None when H_cog is n/a or that cannot be told.

    Readings from before they kept the parts (``H_cog_personas``) still have each persona's
    term of the persona entropy (``by_persona``): their sum is the persona entropy, and an
    H_cog that differs from it held the facet entropy too.
    """
    if reading.get("H_cog") is None:
        return None
    if reading.get("H_cog_personas") is not None:
        return float(reading["H_cog_personas"]), reading.get("H_cog_facets") is not None
    terms = reading.get("by_persona") or {}
    if not terms:
        return None
    e_p = sum(float((t or {}).get("H_cog_term") or 0.0) for t in terms.values())
    return e_p, abs(float(reading["H_cog"]) - e_p) > _ROUNDING


def comparable(
    before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[dict[str, float], dict[str, float]]:
    """Two readings' components, like for like: only those both define, so that a component
    coming or going is not read as the CEM moving; and H_cog as the persona entropy alone in
    both when only one of them had facet calls (its definition changes with them). Where that
    cannot be told (a reading that kept neither the parts nor the persona terms) H_cog is
    taken as it is."""
    a: dict[str, float] = {}
    b: dict[str, float] = {}
    for c in COMPONENTS:
        x, y = before.get(c), after.get(c)
        if x is None or y is None:
            continue
        if c == "H_cog" and cog_redefined(before, after):
            x, y = cog_parts(before)[0], cog_parts(after)[0]  # type: ignore[index]
        a[c], b[c] = float(x), float(y)
    return a, b


def cog_redefined(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether H_cog held the facet entropy in one reading and not in the other (both
    known): then only its persona entropy compares."""
    first, second = cog_parts(before), cog_parts(after)
    return first is not None and second is not None and first[1] != second[1]


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float | None]:
    """Each component's change from ``before`` to ``after``, like for like (``comparable``);
    None where it cannot be compared."""
    a, b = comparable(before, after)
    return {c: round(b[c] - a[c], 6) if c in a else None for c in COMPONENTS}


def change(
    before: Mapping[str, Any], after: Mapping[str, Any], weights: Mapping[str, float]
) -> float | None:
    """How far the CEM moved from ``before`` to ``after``: both readings weighted with
    ``weights`` over the same components, compared like for like (``comparable``); None when
    they have none in common."""
    a, b = comparable(before, after)
    first, second = weighted(a, weights), weighted(b, weights)
    return None if first is None or second is None else round(second - first, 6)


def compute(
    records: Sequence[Mapping[str, Any]],
    *,
    facet_space: int = 0,
    methods: Iterable[str] = (),
    weights: Mapping[str, float] | None = None,
) -> Metrics:
    """The CEM of ``records`` (oldest first), with the formulas of this module's docstring."""
    weights = dict(weights or DEFAULT_WEIGHTS)
    e_p, e_f = _diversity_parts(records, facet_space)
    values = {
        "H_rel": relevance(records),
        "H_cog": diversity(records, facet_space),
        "H_sol": novelty(records),
        "H_struc": structure(records, facet_space, methods),
    }
    return Metrics(
        **values,
        cem=weighted(values, weights),
        cycles=len(records),
        weights=weights,
        by_persona=_by_persona(records),
        H_cog_personas=_rounded(e_p),
        H_cog_facets=_rounded(e_f),
    )


def parse_weights(text: str) -> dict[str, float]:
    """``"w_rel,w_cog,w_sol,w_struc"`` → weights; four non-negative numbers, not all zero."""
    return dict(zip(COMPONENTS, settings.cem_weights(text), strict=True))


def normalised(weights: Mapping[str, float]) -> dict[str, float]:
    """``weights`` scaled to sum to 1, each at least ``MIN_WEIGHT`` (mixed with the uniform
    weights just enough for that)."""
    values = np.array([max(0.0, float(weights.get(c, 0.0))) for c in COMPONENTS])
    if np.isfinite(values).all() and values.max() > 0:
        # scaled by the largest first: the sum of weights near the float maximum would
        # overflow to infinity, and every weight divided by it to 0
        values = values / values.max()
        values = values / values.sum()
    else:
        values = np.full(len(COMPONENTS), 0.25)
    uniform = 1.0 / len(COMPONENTS)
    low = float(values.min())
    if low < MIN_WEIGHT:
        mix = (MIN_WEIGHT - low) / (uniform - low)
        values = (1 - mix) * values + mix * uniform
    return {c: float(v) for c, v in zip(COMPONENTS, values, strict=True)}


def step_weights(
    weights: Mapping[str, float],
    evidence: Sequence[tuple[float, Mapping[str, float | None]]],
    *,
    rate: float,
    max_step: float,
) -> dict[str, float]:
    """One bounded exponentiated-gradient step of the weights (module docstring).

    ``weights`` on the simplex with each ≥ ``MIN_WEIGHT``; ``evidence`` one (outcome,
    component changes) pair per judged mission, outcome +1 kept or -1 undone, a change None
    where the component was undefined. No evidence, no move.
    """
    old = np.array([float(weights[c]) for c in COMPONENTS])
    gradient = np.zeros(len(COMPONENTS))
    for outcome, changes in evidence:
        for i, c in enumerate(COMPONENTS):
            change = changes.get(c)
            if change is not None and math.isfinite(change):
                gradient[i] += outcome * max(-1.0, min(1.0, change))
    if not gradient.any() or rate <= 0 or max_step <= 0:
        return dict(zip(COMPONENTS, old.tolist(), strict=True))
    proposed = old * np.exp(rate * (gradient - gradient.max()))  # shifted: no overflow
    proposed /= proposed.sum()
    move = proposed - old
    scale = 1.0
    biggest = float(np.abs(move).max())
    if biggest > max_step:
        scale = max_step / biggest
    for i in np.flatnonzero(move < 0).tolist():
        room = max(0.0, old[i] - MIN_WEIGHT)
        scale = min(scale, room / -move[i])
    new = old + scale * move
    return {c: float(v) for c, v in zip(COMPONENTS, new, strict=True)}


# -- reading the image ------------------------------------------------------------------------


def window(root: Any, size: int) -> list[dict[str, Any]]:
    """The ``size`` newest cycle records of the image, oldest first, with their embeddings;
    malformed ones are left out (``graph.cycle.stored``)."""
    from graph.cycle import stored
    from store.knowledge.embeddings import from_bytes

    found = []
    for key, record in stored(root, size):  # a malformed record is skipped, with a warning
        for name in ("request_vector", "response_vector"):
            raw = record.get(name)
            record[name] = from_bytes(raw)[0] if raw else None
        record["id"] = key
        found.append(record)
    return found


def image_structure(root: Any) -> tuple[int, set[str]]:
    """The facets the image's personas declare, and the ``PERSONA.facet_x`` with a method."""
    from prototypes.codex import FACET_PREFIX
    from prototypes.incarnation import personas
    from prototypes.uvm import Method

    declared, methods = 0, set()
    for name, persona in personas(root).items():
        for selector in persona._slots().get(INTENTS_SLOT) or {}:
            if not selector.startswith(FACET_PREFIX):
                continue
            declared += 1
            found = persona._lookup(selector)
            if found is not None and isinstance(found[1], Method):
                methods.add(f"{name}.{selector}")
    return declared, methods


def measure(root: Any, size: int, weights: Mapping[str, float] | None = None) -> Metrics:
    """The CEM of the image's ``size`` newest cycles."""
    declared, methods = image_structure(root)
    return compute(window(root, size), facet_space=declared, methods=methods, weights=weights)
