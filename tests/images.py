"""Images as the store's own steps leave them, for tests of the store's parts on their own.

The application opens images through ``batos.shell.runtime.open_runtime``, which applies every
layer's steps; the checkpointer, the catalog and the memory store refuse an image without
their layout, so tests that build them on a bare image lay it out first.
"""

from __future__ import annotations

from typing import Any

from store.core.image import LivingImage
from store.core.schema import upgrade
from store.upgrades import STORE_STEPS


def laid_out(image: LivingImage) -> LivingImage:
    """``image`` with the store's steps applied (closed if they fail)."""
    try:
        upgrade(image, STORE_STEPS)
    except BaseException:
        image.close()
        raise
    return image


def open_laid_out(uri: str, **options: Any) -> LivingImage:
    """``LivingImage.open(uri, **options)`` with the store's steps applied."""
    return laid_out(LivingImage.open(uri, **options))
