"""Wiring: open the living image with every layer's layout applied and the personas incarnated."""

from __future__ import annotations

from prototypes.codex import Codex, load_codex
from prototypes.incarnation import OBJECTS_KEY, incarnate
from prototypes.tools import TOOLBOX, make_toolbox
from store.core.image import LivingImage
from store.core.schema import ROOT_STEPS, UpgradeStep, upgrade


def _toolbox(root: object) -> None:
    objects = root[OBJECTS_KEY]  # type: ignore[index]
    if TOOLBOX not in objects:
        objects[TOOLBOX] = make_toolbox()


def upgrade_steps(codex: Codex | None = None) -> tuple[UpgradeStep, ...]:
    """The root layout steps, the toolbox, then one step per codex version (incarnation at
    that version)."""
    codex = codex or load_codex()
    return (
        *ROOT_STEPS,
        UpgradeStep(
            "tools-1",
            "the 'tools' object whose slots are tool proxies (prototypes.tools)",
            _toolbox,
        ),
        UpgradeStep(
            f"codex-{codex.version}",
            f"incarnate the personas of codex version {codex.version}",
            lambda root: incarnate(root, codex),
        ),
    )


def open_image(uri: str | None = None, *, codex: Codex | None = None) -> LivingImage:
    """The living image at ``uri`` (default: the ``image`` setting), brought up to date."""
    image = LivingImage.open(uri)
    try:
        upgrade(image, upgrade_steps(codex))
    except BaseException:
        image.close()
        raise
    return image
