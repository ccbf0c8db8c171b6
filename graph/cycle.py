"""A mind cycle's changes to the image, applied in the transaction of its COMPLETE checkpoint.

The mind's nodes never commit. They return *effects* — plain data in graph state — and the
node that reaches COMPLETE gathers them into a commit (``store.checkpoint.effects``): the
``ZODBSaver`` applies it in the same transaction as the checkpoint that records COMPLETE, once
per cycle id. A FAILED cycle writes no commit, so the image is as it was. The kinds registered here:

    install_method     a facet method written and trial-approved during the cycle
    persona_stats      per-persona counters: cycles, model calls, facet calls
    memory             the exchange, in LangGraph's long-term memory
                       (``store.knowledge.memory_store``)
    catalog_retrieved  retrieval times of the catalog chunks BABS's facets cited
    cycle_record       what ``batos cycles`` (and later the CEM) reads: route, plan, timings,
                       tokens, the request and response embeddings
    lesson, feedback   the exchange as a training example, a user's mark on an earlier cycle
                       (declared by ``graph.learning``)

Every effect is checked in full before anything is written (a server client can write state
too): its kind's schema in ``graph.records`` (types and bounds), then the applier's checks of
what the image must hold; facet methods pass the PersistenceGuardian and the sandbox compiler
again (``prototypes.install``). Counters only ever add, so a put retried after a write conflict
re-applies them to the fresh state and no concurrent cycle's update is lost. The readers below
check each stored record against ``records.CycleRecord`` and skip, with a warning, one that does
not fit.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from persistent.mapping import PersistentMapping

from batos.errors import CheckpointError
from graph import learning, records
from prototypes.codex import FACET_PREFIX, INTENTS_SLOT, PERSONAS
from prototypes.incarnation import personas
from prototypes.install import install_method
from prototypes.uvm import Method
from store.checkpoint import effects
from store.core import layout
from store.knowledge.embeddings import DIMS, from_bytes, to_bytes

log = logging.getLogger("batos.mind")

#: Bounds on what one effect may carry (the schemas in ``graph.records`` hold them).
MAX_RECORD_BYTES = records.MAX_RECORD_BYTES
MAX_COUNT = records.MAX_COUNT
#: Where each exchange goes in LangGraph's long-term memory (``store.knowledge.memory_store``).
MEMORY_NAMESPACE = ["mind", "exchanges"]
#: Characters of the answer a cycle record keeps.
MAX_RESPONSE_CHARS = records.MAX_RESPONSE_CHARS


def _bad(effect: Mapping[str, Any], why: str) -> CheckpointError:
    return CheckpointError(
        f"effect {effect.get('kind')!r} of a mind commit is malformed: {why}; nothing was written",
        hint="effects are written by graph.mind; do not set the 'commit' channel by hand",
    )


def _json_size(effect: Mapping[str, Any], value: Any) -> int:
    try:
        return records.json_size(value)
    except ValueError as exc:
        raise _bad(effect, str(exc)) from None


def _persona(root: Any, effect: Mapping[str, Any]) -> Any:
    name = effect.get("persona")
    if name not in PERSONAS:
        raise _bad(effect, f"unknown persona {name!r}")
    found = personas(root).get(name)
    if found is None:
        raise _bad(effect, f"the image has no persona {name}")
    return found


def _install_method(root: Any, effect: Mapping[str, Any], commit: Mapping[str, Any]) -> None:
    persona = _persona(root, effect)
    selector, source = effect.get("selector"), effect.get("source")
    intents = persona._slots().get(INTENTS_SLOT) or {}
    if not isinstance(selector, str) or not selector.startswith(FACET_PREFIX):
        raise _bad(effect, f"{selector!r} is not a facet selector")
    if not isinstance(source, str):
        raise _bad(effect, "the method's source is not text")
    if selector not in intents:
        raise _bad(effect, f"{effect['persona']} declares no facet {selector!r}")
    found = persona._lookup(selector)
    if found is not None and isinstance(found[1], Method):
        log.info("facet %s.%s was installed meanwhile; kept", effect["persona"], selector)
        return
    audit = {**(effect.get("audit") or {}), "cycle": commit["id"]}
    if _json_size(effect, audit) > MAX_RECORD_BYTES:
        raise _bad(effect, "the audit record is too large")
    # The same gate a hand-written method passes: what arrives here is data from state.
    install_method(
        persona,
        selector,
        source,
        intent=str(intents[selector]),
        author=str(effect.get("author") or effect["persona"])[:40],
        audit=audit,
        compiler="sandbox",
    )


def _persona_stats(root: Any, effect: Mapping[str, Any], commit: Mapping[str, Any]) -> None:
    persona = _persona(root, effect)
    calls = effect.get("model_calls", 0)
    facet_calls = effect.get("facets") or {}
    stats = persona._slots().get("stats")
    if not isinstance(stats, PersistentMapping):
        stats = PersistentMapping(invocations=0)
        persona.stats = stats
    stats["invocations"] = int(stats.get("invocations", 0)) + calls
    stats["cycles"] = int(stats.get("cycles", 0)) + 1
    used = dict(stats.get("facets") or {})
    for selector, count in facet_calls.items():
        if not selector.startswith(FACET_PREFIX):
            raise _bad(effect, f"{selector!r} is not a facet selector")
        used[selector] = int(used.get(selector, 0)) + count
    stats["facets"] = used  # a plain dict in a slot: assigned again, never changed in place
    stats["last_cycle"] = commit["id"]


def _vectors(effect: Mapping[str, Any], rows: list[list[float]]) -> list[np.ndarray]:
    out = []
    for row in rows:
        vector = np.asarray(row, dtype=np.float32)
        # The schema checked finite float64 values; some overflow float32.
        if vector.shape != (DIMS,) or not np.isfinite(vector).all():
            raise _bad(effect, f"each vector must hold {DIMS} numbers finite as float32")
        out.append(vector)
    return out


def _memory(root: Any, effect: Mapping[str, Any], commit: Mapping[str, Any]) -> None:
    from store.knowledge.memory_store import put_item

    namespace, key, value = effect["namespace"], effect["key"], effect["value"]
    if _json_size(effect, value) > MAX_RECORD_BYTES:
        raise _bad(effect, f"the value is over {MAX_RECORD_BYTES:,} characters as JSON")
    put_item(root, namespace, key, value, _vectors(effect, effect.get("vectors") or []))


def _catalog_retrieved(root: Any, effect: Mapping[str, Any], commit: Mapping[str, Any]) -> None:
    chunks = effect["chunks"]
    cat = layout.find(root, layout.CATALOG)
    if cat is None:
        return
    now = int(time.time())
    retrieved = cat["retrieved"]
    for chunk_id in chunks:
        if chunk_id in cat["chunks"] and retrieved.get(chunk_id, 0) < now:
            retrieved[chunk_id] = now


def _cycle_record(root: Any, effect: Mapping[str, Any], commit: Mapping[str, Any]) -> None:
    record = effect["record"]
    # The fields the schema knows are typed; the others, a newer writer's, are bounded here.
    if _json_size(effect, record) > MAX_RECORD_BYTES:
        raise _bad(effect, f"the record is over {MAX_RECORD_BYTES:,} characters as JSON")
    stored = dict(record)
    for name in ("request_vector", "response_vector"):
        if stored.get(name) is not None:
            stored[name] = to_bytes(_vectors(effect, [stored[name]])[0])
    stored["committed"] = time.time()
    # Cycle records: cycle id (uuid6, so in time order) → record dict.
    layout.cycles(root)[commit["id"]] = stored
    _log_outcome(root, commit, record)


def _log_outcome(root: Any, commit: Mapping[str, Any], record: Mapping[str, Any]) -> None:
    """One JSON line once the transaction commits (or aborts), not before."""
    jar = getattr(root, "_p_jar", None)
    if jar is None:
        return

    def report(committed: bool) -> None:
        log.info(
            json.dumps(
                {
                    "event": "commit" if committed else "abort",
                    "cycle": commit["id"],
                    "thread": record.get("thread_id"),
                    "status": "COMPLETE" if committed else "commit failed",
                    "effects": len(commit["effects"]),
                    "seconds": record.get("seconds"),
                    "tokens": record.get("tokens"),
                }
            )
        )

    jar.transaction_manager.get().addAfterCommitHook(report)


#: The effects a mind cycle's commit carries; whoever assembles the mind with a ``ZODBSaver``
#: hands them to it (``build_graph`` does), so the saver applies them with the checkpoint.
EFFECT_KINDS: dict[str, effects.EffectKind] = {
    kind: effects.EffectKind(applier, records.EFFECTS[kind])
    for kind, applier in {
        "install_method": _install_method,
        "persona_stats": _persona_stats,
        "memory": _memory,
        "catalog_retrieved": _catalog_retrieved,
        "cycle_record": _cycle_record,
    }.items()
} | learning.EFFECT_KINDS


def commit_for(state: Mapping[str, Any], cycle_state: Mapping[str, Any]) -> dict[str, Any]:
    """The commit of a cycle that reached COMPLETE: the effects its nodes returned, then the
    persona statistics, the exchange in memory and the cycle record, computed from its state."""
    metrics = state.get("metrics") or []
    partials = state.get("partials") or []
    written = [e for e in state.get("effects") or [] if e["kind"] == "install_method"]
    personas = sorted({m["persona"] for m in metrics if m.get("persona")})
    found: list[dict[str, Any]] = list(state.get("effects") or [])
    for persona in personas:
        counts: dict[str, int] = {}
        for x in partials:
            if x["persona"] == persona and x["facet"].startswith(FACET_PREFIX):
                counts[x["facet"]] = counts.get(x["facet"], 0) + 1
        found.append(
            {
                "kind": "persona_stats",
                "persona": persona,
                "model_calls": sum(1 for m in metrics if m.get("persona") == persona),
                "facets": counts,
            }
        )
    cem = state.get("cem") or {}
    vectors = [v for v in (cem.get("request_vector"), cem.get("response_vector")) if v]
    seconds = round(time.time() - cycle_state["started"], 4)
    tokens = {
        "input": sum(m["input_tokens"] for m in metrics),
        "output": sum(m["output_tokens"] for m in metrics),
    }
    model_seconds = round(sum(m["seconds"] for m in metrics if m["node"] != "facet"), 4)
    # Facets overlap in time: count the slowest branch of the delegation step only.
    model_seconds += max((m["seconds"] for m in metrics if m["node"] == "facet"), default=0)
    response = state["response"]
    found.append(
        {
            "kind": "memory",
            "namespace": MEMORY_NAMESPACE,
            "key": cycle_state["id"],
            "value": {
                "request": cycle_state["request"],
                "response": response,
                "personas": personas,
                "thread_id": cycle_state["thread_id"],
            },
            "vectors": vectors,
        }
    )
    found.append(
        {
            "kind": "cycle_record",
            "record": {
                "status": "COMPLETE",
                "thread_id": cycle_state["thread_id"],
                "request": cycle_state["request"],
                "response": response[:MAX_RESPONSE_CHARS],
                "depth": cycle_state["depth"],
                "route": state["route"],
                "plan": state.get("plan") or [],
                "personas": personas,
                "facets": [f"{x['persona']}.{x['facet']}" for x in partials],
                "methods_written": [f"{e['persona']}.{e['selector']}" for e in written],
                "started": cycle_state["started"],
                "seconds": seconds,
                "model_seconds": round(model_seconds, 4),
                "tokens": tokens,
                "metrics": metrics,
                "relevance": cem.get("relevance"),
                "synthesis_attempts": cycle_state["synthesis_attempts"],
                "degraded": list(cycle_state.get("degraded") or []),
                "truncated": bool(cycle_state.get("truncated")),
                "grounding": cycle_state.get("grounding") or {},
                "cited": list(cycle_state.get("cited") or []),
                "evidence": dict(cycle_state.get("evidence") or {}),
                "recited": dict(cycle_state.get("recited") or {}),
                "plan_quality": cycle_state.get("plan_quality") or {},
                "request_vector": cem.get("request_vector"),
                "response_vector": cem.get("response_vector"),
            },
        }
    )
    found.extend(learning.effects_for(state, cycle_state))
    note = (
        f"mind cycle {cycle_state['id']}: COMPLETE ({', '.join(personas)}; "
        f"{len(partials)} facets, {len(written)} methods written)"
    )
    return {"id": cycle_state["id"], "note": note, "effects": found}


# -- reading ----------------------------------------------------------------------------------


def stored(root: Any, newest: int) -> list[tuple[str, dict[str, Any]]]:
    """(cycle id, record) of the ``newest`` committed cycles, oldest first, embeddings as
    stored; a record with a field of the wrong type for ``records.CycleRecord`` is skipped
    with a warning (one lacking fields, from an older version, is kept)."""
    cycles = layout.find(root, layout.CYCLES)
    if cycles is None or newest <= 0:
        return []
    keys = cycles.keys()
    found = []
    for position in range(max(0, len(keys) - newest), len(keys)):
        key = keys[position]
        record = records.readable(
            records.CycleRecord, "cycle record", key, cycles[key], partial=True
        )
        if record is not None:
            found.append((key, record))
    return found


def recent(root: Any, limit: int = 20) -> list[dict[str, Any]]:
    """The newest committed cycle records, newest first (vectors left out); malformed ones
    are skipped with a warning."""
    return [_readable(key, record) for key, record in reversed(stored(root, limit))]


def get(root: Any, cycle_id: str) -> dict[str, Any] | None:
    """One committed cycle's record; None when there is none, or it is malformed (warned)."""
    record = _checked(root, cycle_id)
    return _readable(cycle_id, record) if record is not None else None


def vectors(root: Any, cycle_id: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The request and response embeddings a committed cycle recorded."""
    record = _checked(root, cycle_id)
    if record is None:
        return None, None
    return tuple(  # type: ignore[return-value]
        from_bytes(record[name])[0] if record.get(name) else None
        for name in ("request_vector", "response_vector")
    )


def _checked(root: Any, cycle_id: str) -> dict[str, Any] | None:
    cycles = layout.find(root, layout.CYCLES)
    record = cycles.get(cycle_id) if cycles is not None else None
    if record is None:
        return None
    return records.readable(records.CycleRecord, "cycle record", cycle_id, record, partial=True)


def _readable(cycle_id: str, record: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in record.items() if not k.endswith("_vector")}
    out["id"] = cycle_id
    return out


def finite(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None
