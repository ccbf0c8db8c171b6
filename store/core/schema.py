"""Schema evolution: named upgrade steps, each applied once and recorded in the image.

Every layer that keeps data in the image declares its layout as ``UpgradeStep``s. ``upgrade``
applies the ones an image has not seen, each in its own transaction, in the order given, and
records name, description and time under ``root['schema']`` — so an old image opened by new
code is brought forward, and ``batos schema`` shows what was done when.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from persistent.mapping import PersistentMapping

from batos.errors import ImageError
from store.core.image import LivingImage
from store.core.layout import SCHEMA as SCHEMA_KEY
from store.core.layout import UpgradeStep

__all__ = ["SCHEMA_KEY", "UpgradeStep", "applied", "pending", "require", "upgrade"]


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


def require(image: LivingImage, steps: Sequence[UpgradeStep], what: str) -> None:
    """``ImageError`` unless the image has every one of ``steps``: a component built on an
    image that was not brought up to date refuses it rather than lay out the image itself."""
    with image.read() as root:
        missing = [step.name for step in pending(root, steps)]
    if missing:
        raise ImageError(
            f"{what} needs upgrade steps this image has not had: {', '.join(missing)}; "
            "nothing was changed",
            hint="open the image with batos.shell.runtime.open_runtime() (it applies every "
            "step once), or run 'batos init'",
        )
