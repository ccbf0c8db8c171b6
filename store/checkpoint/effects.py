"""Changes a graph run asks the checkpointer to make to the image, in the checkpoint's own commit.

A graph whose state has a ``commit`` channel can end a unit of work by writing
``{"id": str, "note": str, "effects": [{"kind": str, ...}, ...]}`` to it. The ``ZODBSaver``
put that stores the checkpoint holding that new value applies every effect, through the applier
of its kind, *in the same ZODB transaction as the checkpoint*: after any crash the
image has both the checkpoint and the changes, or neither. Each commit id is applied once
(the image's applied-commits record keeps it), so a resumed run that stores its final checkpoint
again, or a copy of it, changes nothing twice. A write conflict re-runs the whole put on fresh
state, appliers included, so appliers must compute from what they find (add to a counter, never
store a total computed earlier).

This module knows no graph: a graph declares an ``EffectKind`` (applier and pydantic schema) for
each of its kinds, and whoever assembles the graph with a saver hands the saver those kinds
(``ZODBSaver(image, effect_kinds=...)`` or ``saver.accept(kinds)``); nothing is registered on
import, so the store never depends on which graph modules were imported first. Effects are data from
graph state, which a server client can also write (``update_state``): ``check`` validates every
effect against its kind's schema before anything is written, and appliers check what a schema cannot
(names the image must hold) as they would any untrusted input."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from batos.errors import MalformedCommit
from store.core import layout

log = logging.getLogger("batos.effects")

#: The state channel a graph writes its commit to.
COMMIT_CHANNEL = "commit"
#: Most effects one commit may carry, and the longest id and note.
MAX_EFFECTS = 256
MAX_ID_CHARS = 128
MAX_NOTE_CHARS = 500

#: ``applier(root, effect, commit)``: make one effect's change inside the caller's transaction.
Applier = Callable[[Any, Mapping[str, Any], Mapping[str, Any]], None]

#: Validation errors a refusal lists.
SHOWN_ERRORS = 5


@dataclass(frozen=True)
class EffectKind:
    """How effects of one kind are checked (``schema``) and applied (``apply``)."""

    apply: Applier
    schema: type[BaseModel]


#: The kinds a saver applies: kind name → ``EffectKind``.
EffectKinds = Mapping[str, EffectKind]


def check(commit: Any, kinds: EffectKinds) -> dict[str, Any]:
    """The commit in canonical form; ``CheckpointError`` if it is malformed or names a kind
    not among ``kinds`` (nothing is written then)."""
    if not isinstance(commit, Mapping):
        raise MalformedCommit(
            f"the {COMMIT_CHANNEL!r} channel holds a {type(commit).__name__}, not a commit",
            hint='write {"id": ..., "note": ..., "effects": [...]} or leave it empty',
        )
    commit_id, effects = commit.get("id"), commit.get("effects")
    if not isinstance(commit_id, str) or not 0 < len(commit_id) <= MAX_ID_CHARS:
        raise MalformedCommit(f"a commit needs an id of 1 to {MAX_ID_CHARS} characters")
    if not isinstance(effects, list) or len(effects) > MAX_EFFECTS:
        raise MalformedCommit(f"commit {commit_id!r}: effects must be a list of <= {MAX_EFFECTS}")
    for number, effect in enumerate(effects):
        kind = effect.get("kind") if isinstance(effect, Mapping) else None
        if not isinstance(kind, str) or kind not in kinds:
            known = ", ".join(sorted(kinds)) or "(none: the saver was given no graph's kinds)"
            raise MalformedCommit(
                f"commit {commit_id!r} holds an effect of kind {str(kind)[:80]!r}, which nothing "
                "applies; nothing was written",
                hint=f"known kinds: {known}",
            )
        try:
            kinds[kind].schema.model_validate(effect)
        except ValidationError as exc:
            raise MalformedCommit(
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
    record = layout.find(root, layout.APPLIED_COMMITS)
    return record is not None and commit_id in record


def apply_commit(
    root: Any, commit: Mapping[str, Any], where: tuple[str, str, str], kinds: EffectKinds
) -> bool:
    """Apply a commit ``check`` accepted against ``kinds`` inside the caller's transaction,
    unless its id was applied before; returns whether it was applied now."""
    record = layout.applied_commits(root)
    if commit["id"] in record:
        log.info("commit %s was applied before; skipped", commit["id"])
        return False
    for effect in commit["effects"]:
        kinds[effect["kind"]].apply(root, effect, commit)
    record[commit["id"]] = (time.time(), *where)
    return True
