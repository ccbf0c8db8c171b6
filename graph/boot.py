"""Wiring: open the living image with every layer's layout applied and the personas incarnated."""

from __future__ import annotations

from batos.errors import ImageNotFoundError
from prototypes.codex import Codex, load_codex
from prototypes.incarnation import OBJECTS_KEY, incarnate
from prototypes.tools import TOOLBOX, make_toolbox
from store.core.image import LivingImage, creating_in_force, default_uri
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


def open_image(
    uri: str | None = None, *, create: bool | None = None, codex: Codex | None = None
) -> LivingImage:
    """The living image at ``uri`` (default: the ``image`` setting), brought up to date.

    A file image that does not exist is created only when ``create`` is true; left out, only
    where the command line allows it (``batos init``, ``run``, ``ingest``, ``zeo``). Otherwise
    ``ImageNotFoundError`` says to run ``batos init`` or pass ``create=True``.
    """
    in_force = creating_in_force()
    if create is None:
        create = bool(in_force)
    try:
        image = LivingImage.open(uri, create=create)
    except ImageNotFoundError as exc:
        if in_force is not None:  # the command line's own message
            raise
        raise ImageNotFoundError(
            exc.message,
            hint=f"run 'batos --image {uri or default_uri()} init', or pass create=True",
        ) from None
    try:
        upgrade(image, upgrade_steps(codex))
    except BaseException:
        image.close()
        raise
    return image
