"""The Ollama backend: persona models provisioned from the Modelfiles, served by ChatOllama.

``provision()`` lists the server's models, works out which are missing, pulls the library base
and creates ``batos-base`` and the persona models from ``modelfiles/`` (adapters uploaded as
blobs), persona models concurrently; it is idempotent. ``OllamaPersonaChat`` is langchain-
ollama's ``ChatOllama`` with transport failures turned into ``ModelError``s that say what to do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_ollama import ChatOllama

from batos.errors import ModelError
from graph.llm.modelfile import BASE_NAME, Modelfile, base_modelfile, modelfiles_dir, persona_model
from prototypes.codex import load_codex

log = logging.getLogger("batos.llm.ollama")

PROBE_TIMEOUT_S = 2.0
#: The first Ollama release whose /api/create takes ``from``/``adapters`` instead of a Modelfile.
MIN_VERSION = (0, 5, 5)


def _error(host: str, exc: BaseException, model: str | None = None) -> ModelError:
    """A transport or server failure as a ModelError with the fix in its hint."""
    import ollama

    if isinstance(exc, ollama.ResponseError):
        if exc.status_code == 404 and model:
            return ModelError(
                f"Ollama at {host} has no model {model!r}",
                hint="run 'batos models build' to create the persona models",
            )
        return ModelError(
            f"Ollama at {host} answered {exc.status_code}: {exc.error}",
            hint="see the Ollama server's log ('ollama serve')",
        )
    if isinstance(exc, httpx.TimeoutException):
        return ModelError(
            f"Ollama at {host} did not answer in time",
            hint="raise BATOS_LLM_TIMEOUT, or check the server is not overloaded",
        )
    return ModelError(
        f"lost the connection to Ollama at {host}: {exc or type(exc).__name__}",
        hint="start it with 'ollama serve', or unset OLLAMA_HOST to use the embedded backend",
    )


_TRANSPORT = (httpx.HTTPError, ConnectionError, OSError)


def server_version(host: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """The server's version if ``host`` answers like Ollama, else None."""
    if not host:
        return None
    try:
        reply = httpx.get(f"{host.rstrip('/')}/api/version", timeout=timeout)
        reply.raise_for_status()
        return str(reply.json().get("version", ""))
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def _tagged(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("-")[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


@dataclass
class ProvisionReport:
    """What ``provision`` found and did."""

    present: list[str] = field(default_factory=list)
    pulled: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    without_adapter: list[str] = field(default_factory=list)


def wanted_models(folder: Path | None = None) -> dict[str, Modelfile]:
    """Ollama model name → Modelfile, for the base and every persona."""
    folder = folder or modelfiles_dir()
    wanted = {BASE_NAME: base_modelfile(folder)}
    for name in load_codex().personas:
        model = persona_model(name, folder)
        wanted[model.name] = model.modelfile
    return wanted


def provision(
    host: str,
    *,
    folder: Path | None = None,
    force: bool = False,
    timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
) -> ProvisionReport:
    """Make ``host`` serve every persona model; only what is missing is built (all if force)."""
    import ollama

    say = progress or (lambda text: log.info("%s", text))
    client = ollama.Client(host=host, timeout=timeout)
    version = server_version(host)
    if version is None:
        raise ModelError(
            f"no Ollama server answers at {host}",
            hint="start it with 'ollama serve', or unset OLLAMA_HOST",
        )
    if version and _version_tuple(version) < MIN_VERSION:
        raise ModelError(
            f"Ollama {version} at {host} is too old to create models from blobs",
            hint="upgrade Ollama to 0.5.5 or newer",
        )
    wanted = wanted_models(folder)
    base = wanted[BASE_NAME]
    try:
        existing = {_tagged(m.model or "") for m in client.list().models}
    except (ollama.ResponseError, *_TRANSPORT) as exc:
        raise _error(host, exc) from exc
    report = ProvisionReport(present=sorted(n for n in wanted if _tagged(n) in existing))
    missing = [n for n in wanted if force or _tagged(n) not in existing]
    if not missing:
        return report
    lock = threading.Lock()

    def pull_base() -> None:
        if _tagged(base.from_) in existing:
            return
        say(f"pulling {base.from_}")
        client.pull(base.from_)
        with lock:
            report.pulled.append(base.from_)

    def create(name: str) -> None:
        modelfile = wanted[name]
        adapters = {}
        for path in modelfile.adapter_paths():
            if path.is_file():
                adapters[path.name] = client.create_blob(path)
            else:
                say(f"{name}: no adapter yet ({path.name}); its SYSTEM and PARAMETERs apply")
                with lock:
                    report.without_adapter.append(name)
        say(f"creating {name}")
        client.create(
            model=name,
            from_=modelfile.from_,
            adapters=adapters or None,
            system=modelfile.system,
            template=modelfile.template,
            parameters=dict(modelfile.parameters) or None,
            messages=[{"role": r, "content": c} for r, c in modelfile.messages] or None,
            license=list(modelfile.license) or None,
        )
        with lock:
            report.created.append(name)

    try:
        if BASE_NAME in missing:
            pull_base()
            create(BASE_NAME)
        personas = [n for n in missing if n != BASE_NAME]
        with ThreadPoolExecutor(max_workers=4) as pool:
            for future in [pool.submit(create, n) for n in personas]:
                future.result()
    except (ollama.ResponseError, *_TRANSPORT) as exc:
        raise _error(host, exc) from exc
    return report


_provisioned: set[str] = set()
_provision_lock = threading.Lock()


def ensure_provisioned(host: str) -> None:
    """``provision`` once per host and process; later calls return at once."""
    with _provision_lock:
        if host in _provisioned:
            return
        provision(host)
        _provisioned.add(host)


class OllamaPersonaChat(ChatOllama):
    """``ChatOllama`` whose failures are ``ModelError``s naming the server and the fix."""

    def _fail(self, exc: BaseException) -> ModelError:
        return _error(self.base_url or "http://127.0.0.1:11434", exc, self.model)

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        import ollama

        try:
            return super()._generate(*args, **kwargs)
        except (ollama.ResponseError, *_TRANSPORT) as exc:
            raise self._fail(exc) from exc

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        import ollama

        try:
            yield from super()._stream(*args, **kwargs)
        except (ollama.ResponseError, *_TRANSPORT) as exc:
            raise self._fail(exc) from exc

    async def _agenerate(self, *args: Any, **kwargs: Any) -> ChatResult:
        import ollama

        try:
            return await super()._agenerate(*args, **kwargs)
        except (ollama.ResponseError, *_TRANSPORT) as exc:
            raise self._fail(exc) from exc

    async def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        import ollama

        try:
            async for chunk in super()._astream(*args, **kwargs):
                yield chunk
        except (ollama.ResponseError, *_TRANSPORT) as exc:
            raise self._fail(exc) from exc
