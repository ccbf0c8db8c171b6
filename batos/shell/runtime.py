"""The one assembly point: open the image, bring it up to date once, hand out what runs on it.

``open_runtime(uri)`` opens the living image, applies every layer's upgrade steps (the
store's, then the object model's: the toolbox and the codex's incarnation) once, and returns a
``Runtime`` holding the image, its ``ZODBSaver`` (checkpointer), its ``ImageStore`` (LangGraph's
long-term memory) and the mind's services. The CLI, the bridge, the heartbeat, the Python API
(``ask``) and the LangGraph server (``batos.shell.served``, through ``served``) all assemble
through it, so they run the same wiring; nothing below finds its image through LangGraph's
internals. ::

    from batos.shell.runtime import open_runtime

    with open_runtime("file:///tmp/demo.fs") as runtime:
        mind = runtime.mind()                # the mind graph on the runtime's checkpointer
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base.id import uuid6

from batos.errors import GraphRequestError, ImageNotFoundError
from graph import cycle
from graph.mind import (
    CLIENT_WRITE_CHECKS,
    MindServices,
    build_graph,
    refuse_if_busy,
    run_config,
)
from prototypes.codex import Codex
from prototypes.incarnation import incarnation_step
from prototypes.tools import TOOLS_STEP
from store.checkpoint.saver import ZODBSaver
from store.core.image import (
    LivingImage,
    acquire_shared,
    creating_in_force,
    default_uri,
    release_shared,
    shown_uri,
)
from store.core.layout import UpgradeStep
from store.core.schema import upgrade
from store.knowledge.memory_store import ImageStore
from store.upgrades import STORE_STEPS

log = logging.getLogger("batos.runtime")


def upgrade_steps(codex: Codex | None = None) -> tuple[UpgradeStep, ...]:
    """Every layer's steps in the order an image gets them: the store's layout, the toolbox,
    then the incarnation of ``codex`` (default: the shipped one) at its version."""
    return (*STORE_STEPS, TOOLS_STEP, incarnation_step(codex))


class Runtime:
    """An open image brought up to date, with the checkpointer, memory store and services
    every entry point uses. The checkpointer and the store are made on first use, once."""

    def __init__(
        self,
        image: LivingImage,
        *,
        models: Callable[..., Any] | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.image = image
        self.services = MindServices(models=models, image=image)
        self._release = release or image.close
        self._lock = threading.Lock()
        self._saver: ZODBSaver | None = None
        self._store: ImageStore | None = None

    @classmethod
    def of(cls, image: LivingImage, *, models: Callable[..., Any] | None = None) -> Runtime:
        """A runtime on an image the caller opened and keeps: brought up to date (nothing to
        do once done), and left open when the runtime closes."""
        upgrade(image, upgrade_steps())
        return cls(image, models=models, release=lambda: None)

    @property
    def saver(self) -> ZODBSaver:
        """The image's checkpointer; it applies the mind's commits with their checkpoints."""
        with self._lock:
            if self._saver is None:
                self._saver = ZODBSaver(
                    self.image, effect_kinds=cycle.EFFECT_KINDS, write_checks=CLIENT_WRITE_CHECKS
                )
            return self._saver

    @property
    def store(self) -> ImageStore:
        """LangGraph's long-term memory store on the image."""
        with self._lock:
            if self._store is None:
                self._store = ImageStore(self.image)
            return self._store

    def mind(self, services: MindServices | None = None) -> Any:
        """The mind graph on this runtime's checkpointer; ``services`` (default the runtime's)
        may stand in test doubles or another model factory."""
        return build_graph(services or self.services, checkpointer=self.saver)

    def close(self) -> None:
        """Close the checkpointer, then let the image go (closed, or released when shared)."""
        with self._lock:
            saver, self._saver, self._store = self._saver, None, None
        try:
            if saver is not None:
                saver.close()
        finally:
            self._release()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _brought_up_to_date(image: LivingImage, codex: Codex | None) -> LivingImage:
    try:
        done = upgrade(image, upgrade_steps(codex))
    except BaseException:
        image.close()
        raise
    if done:
        log.info("upgraded %s: %s", shown_uri(image.uri), ", ".join(done))
    _serve_recorded_adapters(image)
    return image


def _serve_recorded_adapters(image: LivingImage) -> None:
    """Serve the adapter versions the image records. A process killed between a retraining's
    swap commit and the copy of its file, or an undo by hand, leaves the Modelfiles folder
    serving another version than the image says; every opening puts that right, before a
    model is loaded (a file's sha256 per recorded persona: milliseconds)."""
    from graph import learning

    changed = learning.reconcile(image)
    if changed:
        log.warning(
            "serving the adapter versions %s records: %s",
            shown_uri(image.uri),
            ", ".join(changed),
        )


def _open(uri: str | None, create: bool | None) -> LivingImage:
    in_force = creating_in_force()
    if create is None:
        create = bool(in_force)
    try:
        return LivingImage.open(uri, create=create)
    except ImageNotFoundError as exc:
        if in_force is not None:  # the command line's own message
            raise
        raise ImageNotFoundError(
            exc.message,
            hint=f"run 'batos --image {shown_uri(uri or default_uri())} init', or pass create=True",
        ) from None


def open_runtime(
    uri: str | None = None,
    *,
    create: bool | None = None,
    codex: Codex | None = None,
    models: Callable[..., Any] | None = None,
) -> Runtime:
    """The runtime of the image at ``uri`` (default: the ``image`` setting), upgraded once.

    A file image that does not exist is created only when ``create`` is true; left out, only
    where the command line allows it (``batos init``, ``run``, ``ingest``, ``zeo``). Otherwise
    ``ImageNotFoundError`` says to run ``batos init`` or pass ``create=True``. ``codex``
    replaces the shipped persona codex and ``models`` the chat-model factory of the mind's
    services. Close the runtime (or use it as a context manager) to close the image.
    """
    return Runtime(_brought_up_to_date(_open(uri, create), codex), models=models)


def open_image(
    uri: str | None = None, *, create: bool | None = None, codex: Codex | None = None
) -> LivingImage:
    """The image at ``uri`` brought up to date, as ``open_runtime`` opens it, for a caller
    that needs only the image; the caller closes it."""
    return _brought_up_to_date(_open(uri, create), codex)


# -- the server's runtime: one per image URI, shared by its factories and graphs --------------


class _Served:
    """One ``Runtime`` per URI in this process, reference-counted.

    The LangGraph server enters the checkpointer and store factories once per event-loop
    thread and its graphs need the same image: a file:// image can be opened only once per
    process, so they all share one runtime, upgraded when it is first opened. The registry
    lives here, in a module imported under one name, because the server loads the factories'
    file as a module of its own name.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # keep() acquires within it
        self._open: dict[str, tuple[Runtime, int]] = {}
        #: URIs whose runtime the served graphs hold, once each, for the process's life.
        self._kept: set[str] = set()

    def keep(self, uri: str) -> Runtime:
        """The runtime at ``uri``, held once for the served graphs however often they ask."""
        with self._lock:
            if uri not in self._kept:
                self.acquire(uri)
                self._kept.add(uri)
            return self._open[uri][0]

    def acquire(self, uri: str) -> Runtime:
        with self._lock:
            runtime, count = self._open.get(uri, (None, 0))
            if runtime is None:
                image = acquire_shared(uri)
                try:
                    upgrade(image, upgrade_steps())
                    _serve_recorded_adapters(image)
                except BaseException:
                    release_shared(uri)
                    raise
                runtime = Runtime(image, release=lambda: release_shared(uri))
            self._open[uri] = (runtime, count + 1)
            return runtime

    def release(self, uri: str) -> None:
        with self._lock:
            runtime, count = self._open[uri]
            if count > 1:
                self._open[uri] = (runtime, count - 1)
                return
            del self._open[uri]
            self._kept.discard(uri)
        runtime.close()


_SERVED = _Served()


@asynccontextmanager
async def served(uri: str | None = None) -> AsyncIterator[Runtime]:
    """The server process's runtime of the image at ``uri`` (default: the ``image`` setting):
    the first user opens and upgrades it, the last one leaving closes it. Opening and closing
    run in the event loop's executor, since both can block."""
    uri = uri or default_uri()
    loop = asyncio.get_running_loop()
    runtime = await loop.run_in_executor(None, _SERVED.acquire, uri)
    try:
        yield runtime
    finally:
        await loop.run_in_executor(None, _SERVED.release, uri)


def served_runtime() -> Runtime:
    """The server's runtime at the ``image`` setting, for a served graph: the same one the
    checkpointer factory opened. The served graphs hold it once, for the process's life."""
    return _SERVED.keep(default_uri())


def served_image() -> LivingImage:
    """The image of ``served_runtime()``."""
    return served_runtime().image


# -- the Python API ---------------------------------------------------------------------------


def ask(
    text: str,
    *,
    thread_id: str | None = None,
    image: LivingImage | str | None = None,
    persona: str | None = None,
    depth: str | None = None,
    services: MindServices | None = None,
) -> dict[str, Any]:
    """Answer one request in one cycle on the image (a URI, an open image, or the ``image``
    setting) and return the cycle's final state (``status`` is 'COMPLETE' or 'FAILED')."""
    if not isinstance(text, str):  # else pydantic's two-part error about message content
        raise GraphRequestError(
            f"the request must be text, not {type(text).__name__}",
            hint="pass it as a string: ask('how do I plan a vegetable garden?')",
        )
    if image is not None and not isinstance(image, LivingImage | str):
        raise GraphRequestError(
            f"image must be an open image or its URI, not {type(image).__name__}",
            hint="pass image='file:///path/live_image.fs', an open LivingImage, or leave it "
            "out for the 'image' setting (BATOS_IMAGE)",
        )
    if services is not None and not isinstance(services, MindServices):
        raise GraphRequestError(
            f"services must be MindServices, not {type(services).__name__}",
            hint="leave it out for the image's own models, router and catalog",
        )
    if isinstance(image, LivingImage):
        runtime = Runtime.of(image)
    else:
        runtime = open_runtime(image)
    with runtime:
        context: dict[str, Any] = {}
        if persona:
            context["persona"] = persona
        if depth:
            context["depth"] = depth
        mind = runtime.mind(services)
        config = run_config(f"ask-{uuid6()}" if thread_id is None else thread_id)
        config = refuse_if_busy(mind, config)
        return mind.invoke({"messages": [HumanMessage(text)]}, config, context=context)
