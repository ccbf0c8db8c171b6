"""Writing the codex's facet methods ahead of use, off the user's clock.

``batos init --prepare`` writes every facet the image lacks, with progress; the heartbeat's
``facets`` job writes the ones that are due. Each facet is drafted by the model that writes
its persona's methods (``batos.models.author_model``) through the JIT's mission
(``facets.writer``: guardian, sandbox, trial on neutral sample questions) on a connection that
is aborted, then installed in a short transaction of its own by ``prototypes.install``, which
runs the guardian and the sandbox compiler again. A facet that cannot be written
is recorded with its reason and tried again later, the wait doubling with each failure
(``store.core.method_queue``); ``batos doctor`` shows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from batos import settings
from batos.errors import BatosError
from graph import facets
from prototypes.codex import load_codex
from prototypes.incarnation import personas
from prototypes.install import install_method
from prototypes.uvm import Method
from store.core import method_queue
from store.core.image import LivingImage

log = logging.getLogger("batos.facets")

#: Facets one heartbeat run writes at most: each takes its model about half a minute to a few
#: minutes on two cores, and the heartbeat's other jobs wait behind it.
PER_RUN = 2


@dataclass(frozen=True)
class Written:
    """How writing one facet went."""

    key: str
    ok: bool
    seconds: float
    reason: str = ""
    next_try: float | None = None


def codex_facets() -> list[tuple[str, str]]:
    """(persona, selector) of every facet the codex declares, in codex order."""
    codex = load_codex()
    return [(name, selector) for name, spec in codex.personas.items() for selector in spec.facets]


def missing(root: Any) -> list[tuple[str, str]]:
    """The codex's facets the image's personas do not have as methods."""
    found = personas(root)
    out = []
    for persona, selector in codex_facets():
        receiver = found.get(persona)
        method = receiver._lookup(selector) if receiver is not None else None
        if method is None or not isinstance(method[1], Method):
            out.append((persona, selector))
    return out


def install(root: Any, written: facets.WrittenMethod) -> bool:
    """Install an approved facet method (``prototypes.install``: the guardian and the sandbox
    compiler pass it again); False when the persona has the method already (another writer
    got there)."""
    receiver = personas(root)[written.persona]
    found = receiver._lookup(written.selector)
    if found is not None and isinstance(found[1], Method):
        return False
    install_method(
        receiver,
        written.selector,
        written.source,
        intent=written.intent,
        author=written.author,
        audit={**written.audit, "written": "ahead of use"},
    )
    return True


def write_one(
    image: LivingImage, persona: str, selector: str, models: Callable[..., Any] | None
) -> Written:
    """Write and install one facet, or record why it could not be written."""
    if models is None:
        from batos.models import author_model

        models = author_model
    key = facets.facet_key(persona, selector)
    started = time.monotonic()
    try:
        with image.connection() as conn:  # the mission's trial installs here: never committed
            written = facets.write_facet(
                conn.root(), persona, selector, models, settings.get_int("facet_attempts")
            )
    except Exception as exc:  # the model or the image failed: recorded, tried again later
        reason = exc.message if isinstance(exc, BatosError) else f"{type(exc).__name__}: {exc}"
        next_try = image.transact(
            lambda root: method_queue.record_failure(root, key, reason),
            note=f"facet {key}: could not be written",
        )
        log.warning("facet %s could not be written: %s", key, reason.splitlines()[0])
        return Written(key, False, time.monotonic() - started, reason, next_try)

    def put(root: Any) -> None:
        install(root, written)
        method_queue.record_success(root, key)

    image.transact(put, note=f"facet {key}: written ahead of use")
    log.info("facet %s written in %.1f s", key, time.monotonic() - started)
    return Written(key, True, time.monotonic() - started)


def due(image: LivingImage, *, now: float | None = None) -> list[tuple[str, str]]:
    """The missing facets whose wait after a failed try (if any) is over."""
    with image.read() as root:
        return [
            (p, s) for p, s in missing(root) if method_queue.due(root, facets.facet_key(p, s), now)
        ]


def write_all(
    image: LivingImage,
    models: Callable[..., Any] | None,
    todo: Iterable[tuple[str, str]],
    on_done: Callable[[Written], None] | None = None,
) -> list[Written]:
    """Write each of ``todo`` in turn; ``on_done`` hears of each as it ends."""
    results = []
    for persona, selector in todo:
        result = write_one(image, persona, selector, models)
        results.append(result)
        if on_done is not None:
            on_done(result)
    return results


def status(root: Any) -> list[dict[str, Any]]:
    """Every codex facet: written, missing, failed (waiting to be tried again) or pending
    (taken out as wrong, to be written again), and the record of tries to write it."""
    lacking = set(missing(root))
    tries = method_queue.entries(root)
    rows = []
    for persona, selector in codex_facets():
        key = facets.facet_key(persona, selector)
        entry = tries.get(key) or {}
        state = "missing" if (persona, selector) in lacking else "written"
        if state == "missing" and entry.get("state") in ("failed", "pending"):
            state = entry["state"]  # pending: taken out as wrong (graph.rejection)
        rows.append(
            {
                "facet": key,
                "state": state,
                **{k: entry.get(k) for k in ("failures", "reason", "next_try", "tried")},
            }
        )
    return rows
