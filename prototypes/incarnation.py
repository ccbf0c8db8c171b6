"""Incarnation: building the persona prototypes in the image from the codex, idempotently.

The codex becomes objects in the image's registry of named objects: ``traits`` (every persona's
parent), ``models`` (persona → model name) and one prototype per persona. Incarnating again with the
same codex changes nothing; a new codex version rewrites the codex-derived slots, drops the intents
it no longer declares, and keeps what the image grew by itself (methods the personas wrote,
statistics, extra slots, intents added by hand). An older codex never overwrites what a newer one
incarnated."""

from __future__ import annotations

from typing import Any

from persistent.mapping import PersistentMapping

from batos.errors import ImageError
from prototypes.codex import Codex, load_codex
from prototypes.uvm import UvmObject
from store.core import layout
from store.core.layout import UpgradeStep

#: Slots incarnation owns on a persona; everything else on the object is the image's own.
CODEX_SLOTS = ("name", "role", "inspirations", "activation", "model", "identity", "router_examples")
#: Private slot of each persona: the intents (selector → text) the codex last declared, so a
#: later codex can drop the ones it no longer has without touching intents added by hand.
CODEX_INTENTS = "_codex_intents"


_MISSING = object()


def _set_if_changed(obj: UvmObject, name: str, value: Any) -> bool:
    if obj._slots().get(name, _MISSING) == value:
        return False
    setattr(obj, name, value)
    return True


def incarnate(root: Any, codex: Codex | None = None) -> list[str]:
    """Bring the personas in ``root`` in line with ``codex``; returns what changed."""
    codex = codex or load_codex()
    objects = layout.objects(root)
    changes: list[str] = []

    traits = objects.get("traits")
    recorded = traits._slots().get("codex_version") if traits is not None else None
    if isinstance(recorded, int) and recorded > codex.version:
        raise ImageError(
            f"the personas in this image come from codex version {recorded}, newer than this "
            f"BAT OS's codex (version {codex.version}); nothing was changed",
            hint="open the image with the BAT OS version that wrote it, or upgrade this one",
        )
    if traits is None:
        traits = objects["traits"] = UvmObject(name="traits")
        changes.append("created traits")
    if _set_if_changed(traits, "description", codex.traits_description):
        changes.append("traits.description")

    models = objects.get("models")
    if models is None:
        models = objects["models"] = UvmObject(traits, name="models")
        changes.append("created models")

    for spec in codex.personas.values():
        key = spec.name.lower()
        persona = objects.get(key)
        if persona is None:
            persona = objects[key] = UvmObject(traits)
            persona.intents = PersistentMapping()
            persona.stats = PersistentMapping(invocations=0)
            changes.append(f"created {key}")
        for slot in CODEX_SLOTS:
            if _set_if_changed(persona, slot, getattr(spec, slot)):
                changes.append(f"{key}.{slot}")
        changes.extend(_update_intents(persona, key, spec.intents))
        if _set_if_changed(models, key, spec.model):
            changes.append(f"models.{key}")
    if _set_if_changed(traits, "codex_version", codex.version):
        changes.append("traits.codex_version")
    return changes


def incarnation_step(codex: Codex | None = None) -> UpgradeStep:
    """The object model's step for ``codex`` (default: the shipped one): one per codex
    version, so a new version is incarnated once on every image that opens."""
    codex = codex or load_codex()
    return UpgradeStep(
        f"codex-{codex.version}",
        f"incarnate the personas of codex version {codex.version}",
        lambda root: incarnate(root, codex),
    )


def _update_intents(persona: UvmObject, key: str, declared: dict[str, str]) -> list[str]:
    changes = []
    intents = persona.intents
    owned = getattr(persona, CODEX_INTENTS, None)
    if owned is None:
        # Incarnated before the record was kept: only incarnation ever filled the mapping.
        owned = dict(intents)
    for selector, text in owned.items():
        if selector not in declared and intents.get(selector) == text:
            del intents[selector]
            changes.append(f"{key}.intents.{selector} dropped")
    for selector, intent in declared.items():
        if intents.get(selector) != intent:
            intents[selector] = intent
            changes.append(f"{key}.intents.{selector}")
    if getattr(persona, CODEX_INTENTS, None) != declared:
        setattr(persona, CODEX_INTENTS, dict(declared))
    return changes


def personas(root: Any) -> dict[str, UvmObject]:
    """The incarnated persona prototypes by upper-case name."""
    objects = layout.find(root, layout.OBJECTS) or {}
    return {
        name.upper(): objects[name.lower()]
        for name in ("ROBIN", "BRICK", "BABS", "ALFRED")
        if name.lower() in objects
    }
