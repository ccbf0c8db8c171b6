"""Schema evolution: named upgrade steps, each applied once and recorded in the image.

Every layer that keeps data in the image declares its layout as ``UpgradeStep``s. ``upgrade``
applies the ones an image has not seen, each in its own transaction, in the order given, and
records name, description and time under ``root['schema']`` — so an old image opened by new
code is brought forward, and ``batos schema`` shows what was done when.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping

from store.core.image import LivingImage

SCHEMA_KEY = "schema"
OBJECTS_KEY = "objects"


@dataclass(frozen=True)
class UpgradeStep:
    """One change to the image's layout; ``apply(root)`` must be safe on any earlier layout."""

    name: str
    description: str
    apply: Callable[[Any], object]  # what it returns is not used


def applied(root: Any) -> dict[str, dict[str, Any]]:
    """{step name: {'description', 'applied_at'}} for the steps this image has seen."""
    record = root.get(SCHEMA_KEY)
    return {name: dict(info) for name, info in record.items()} if record is not None else {}


def pending(root: Any, steps: Sequence[UpgradeStep]) -> list[UpgradeStep]:
    done = root.get(SCHEMA_KEY, {})
    return [step for step in steps if step.name not in done]


def upgrade(image: LivingImage, steps: Sequence[UpgradeStep]) -> list[str]:
    """Apply the steps the image lacks, one transaction each; returns their names."""
    names = [step.name for step in steps]
    if len(set(names)) != len(names):
        raise ValueError(f"upgrade step names must be unique: {names}")
    with image.read() as root:
        todo = pending(root, steps)
    done: list[str] = []
    for step in todo:

        def run(root: Any, step: UpgradeStep = step) -> bool:
            record = root.get(SCHEMA_KEY)
            if record is None:
                record = root[SCHEMA_KEY] = PersistentMapping()
            if step.name in record:  # another process applied it meanwhile
                return False
            step.apply(root)
            record[step.name] = PersistentMapping(
                description=step.description, applied_at=time.time()
            )
            return True

        if image.transact(run, note=f"upgrade: {step.name}"):
            done.append(step.name)
    return done


def _root_layout_1(root: Any) -> None:
    if OBJECTS_KEY not in root:
        root[OBJECTS_KEY] = OOBTree()


ROOT_STEPS: tuple[UpgradeStep, ...] = (
    UpgradeStep(
        "root-1",
        "registry of named top-level objects (root['objects'], an OOBTree)",
        _root_layout_1,
    ),
)
