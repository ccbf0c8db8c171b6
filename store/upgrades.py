"""The store's upgrade steps, in the order an image gets them.

The root's own containers first (``store.core.layout``), then what the checkpointer and the
knowledge engine keep under their keys. The application adds the other layers' steps after
these and applies the whole list once, when it opens the image (``batos.shell.runtime``).
"""

from __future__ import annotations

from store.checkpoint.layout import CHECKPOINT_STEPS
from store.core.layout import ROOT_STEPS, UpgradeStep
from store.knowledge.catalog import CATALOG_STEPS
from store.knowledge.memory_store import MEMORY_STEPS

STORE_STEPS: tuple[UpgradeStep, ...] = (
    *ROOT_STEPS,
    *CHECKPOINT_STEPS,
    *CATALOG_STEPS,
    *MEMORY_STEPS,
)
