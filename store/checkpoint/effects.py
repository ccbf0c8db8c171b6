"""Changes a graph run asks the checkpointer to make to the image, in the checkpoint's own commit.

A graph whose state has a ``commit`` channel can end a unit of work by writing
``{"id": str, "note": str, "effects": [{"kind": str, ...}, ...]}`` to it. The ``ZODBSaver``
put that stores the checkpoint holding that new value applies every effect, through the applier
registered for its kind, *in the same ZODB transaction as the checkpoint*: after any crash the
image has both the checkpoint and the changes, or neither. Each commit id is applied once
(``root['applied_commits']`` records it), so a resumed run that stores its final checkpoint
again, or a copy of it, changes nothing twice. A write conflict re-runs the whole put on fresh
state, appliers included, so appliers must compute from what they find (add to a counter, never
store a total computed earlier).

This module knows no graph: graphs register an applier and a schema (a pydantic model) for each
of their kinds (``register``). Effects are data from graph state, which a server client can also
write (``update_state``): ``check`` validates every effect against its kind's schema before
anything is written, and appliers check what a schema cannot (names the image must hold) as
they would any untrusted input.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from BTrees.OOBTree import OOBTree
from pydantic import BaseModel, ValidationError

from batos.errors import CheckpointError

log = logging.getLogger("batos.effects")

#: The state channel a graph writes its commit to.
COMMIT_CHANNEL = "commit"
#: Root key of the record of applied commit ids: id → (time, thread_id, ns, checkpoint_id).
APPLIED_KEY = "applied_commits"
#: Most effects one commit may carry, and the longest id and note.
MAX_EFFECTS = 256
MAX_ID_CHARS = 128
MAX_NOTE_CHARS = 500

#: ``applier(root, effect, commit)``: make one effect's change inside the caller's transaction.
Applier = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], None]

_APPLIERS: dict[str, Applier] = {}
_SCHEMAS: dict[str, type[BaseModel]] = {}
#: Validation errors a refusal lists.
SHOWN_ERRORS = 5


def register(kind: str, applier: Applier, schema: type[BaseModel]) -> None:
    """Make effects of ``kind`` applicable once they fit ``schema``; a graph module registers
    its kinds on import."""
    _APPLIERS[kind] = applier
    _SCHEMAS[kind] = schema


def registered() -> list[str]:
    return sorted(_APPLIERS)


def check(commit: Any) -> dict[str, Any]:
    """The commit in canonical form; ``CheckpointError`` if it is malformed or names a kind
    no applier is registered for (nothing is written then)."""
    if not isinstance(commit, Mapping):
        raise CheckpointError(
            f"the {COMMIT_CHANNEL!r} channel holds a {type(commit).__name__}, not a commit",
            hint='write {"id": ..., "note": ..., "effects": [...]} or leave it empty',
        )
    commit_id, effects = commit.get("id"), commit.get("effects")
    if not isinstance(commit_id, str) or not 0 < len(commit_id) <= MAX_ID_CHARS:
        raise CheckpointError(f"a commit needs an id of 1 to {MAX_ID_CHARS} characters")
    if not isinstance(effects, list) or len(effects) > MAX_EFFECTS:
        raise CheckpointError(f"commit {commit_id!r}: effects must be a list of <= {MAX_EFFECTS}")
    for number, effect in enumerate(effects):
        kind = effect.get("kind") if isinstance(effect, Mapping) else None
        if not isinstance(kind, str) or kind not in _APPLIERS:
            raise CheckpointError(
                f"commit {commit_id!r} holds an effect of kind {str(kind)[:80]!r}, which nothing "
                "applies; nothing was written",
                hint=f"known kinds: {', '.join(registered()) or '(none: import the graph module)'}",
            )
        try:
            _SCHEMAS[kind].model_validate(effect)
        except ValidationError as exc:
            raise CheckpointError(
                f"commit {commit_id!r}: effect {number} ({kind}) is malformed: {problems(exc)}; "
                "nothing was written",
                hint="effects are written by the graphs; do not set the 'commit' channel by hand",
            ) from None
    note = commit.get("note")
    return {
        "id": commit_id,
        "note": str(note)[:MAX_NOTE_CHARS] if note else "",
        "effects": list(effects),
    }


def problems(exc: ValidationError) -> str:
    """What validation found, without the values it found it in (they may be huge); a key
    from the data is cut and its control characters escaped, as it may reach a terminal."""
    found = exc.errors(include_url=False, include_input=False, include_context=False)
    lines = [
        f"{'.'.join(repr(str(part))[1:-1][:40] for part in e['loc']) or '(the whole)'}: "
        f"{e['msg'][:200]}"
        for e in found
    ]
    more = len(lines) - SHOWN_ERRORS
    return "; ".join(lines[:SHOWN_ERRORS]) + (f"; and {more} more" if more > 0 else "")


def applied(root: Any, commit_id: str) -> bool:
    record = root.get(APPLIED_KEY)
    return record is not None and commit_id in record


def apply_commit(root: Any, commit: Mapping[str, Any], where: tuple[str, str, str]) -> bool:
    """Apply a checked commit inside the caller's transaction, unless its id was applied
    before; returns whether it was applied now."""
    record = root.get(APPLIED_KEY)
    if record is None:
        record = root[APPLIED_KEY] = OOBTree()
    if commit["id"] in record:
        log.info("commit %s was applied before; skipped", commit["id"])
        return False
    for effect in commit["effects"]:
        _APPLIERS[effect["kind"]](root, effect, commit)
    record[commit["id"]] = (time.time(), *where)
    return True
