"""The Ollama backend: persona models provisioned from the Modelfiles, served by ChatOllama.

``provision()`` lists the server's models, works out which are missing, pulls the library base
and creates ``batos-base`` and the persona models from ``modelfiles/`` (adapters uploaded as
blobs), persona models concurrently; it is idempotent. ``OllamaPersonaChat`` is langchain-
ollama's ``ChatOllama`` behind the persona seam, its failures mapped by ``exception_table``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from langchain_core.language_models import BaseChatModel
from langchain_ollama import ChatOllama

from batos import settings
from batos.errors import ModelError
from batos.models.base import ExceptionTable, PersonaChatModel, map_exceptions
from batos.models.modelfile import (
    BASE_NAME,
    Modelfile,
    base_modelfile,
    modelfiles_dir,
    persona_model,
)
from prototypes.codex import PersonaSpec, load_codex

log = logging.getLogger("batos.llm.ollama")

PROBE_TIMEOUT_S = 2.0
#: The first Ollama release whose /api/create takes ``from``/``adapters`` instead of a Modelfile.
MIN_VERSION = (0, 5, 5)


def exception_table(host: str, model: str | None = None, *, author: bool = False) -> ExceptionTable:
    """How the Ollama client's failures read as ``ModelError``s naming the server and the fix;
    ``author``: the model is the user's author model (``BATOS_AUTHOR_MODEL``), not a persona's."""
    import ollama

    if author:
        missing = f"pull it there ('ollama pull {model}'), or set BATOS_AUTHOR_MODEL to one it has"
        down = (
            "start it ('ollama serve') or point BATOS_AUTHOR_URL at one that answers; unset "
            "BATOS_AUTHOR_MODEL to have each persona's own model write methods"
        )
    else:
        missing = "run 'batos models build' to create the persona models"
        down = "start it with 'ollama serve', or unset OLLAMA_HOST to use the embedded backend"

    def answered(exc: BaseException) -> ModelError:
        assert isinstance(exc, ollama.ResponseError)
        if exc.status_code == 404 and model:
            return ModelError(f"Ollama at {host} has no model {model!r}", hint=missing)
        return ModelError(
            f"Ollama at {host} answered {exc.status_code}: {exc.error}",
            hint="see the Ollama server's log ('ollama serve')",
        )

    def timed_out(exc: BaseException) -> ModelError:
        return ModelError(
            f"Ollama at {host} did not answer in time",
            hint="raise BATOS_LLM_TIMEOUT, or check the server is not overloaded",
        )

    def lost(exc: BaseException) -> ModelError:
        return ModelError(
            f"lost the connection to Ollama at {host}: {exc or type(exc).__name__}", hint=down
        )

    # ConnectionError is an OSError; httpx's timeouts are HTTPErrors, the more specific wins.
    return {
        ollama.ResponseError: answered,
        httpx.TimeoutException: timed_out,
        httpx.HTTPError: lost,
        OSError: lost,
    }


def host_url(host: str) -> str:
    """``OLLAMA_HOST`` as a URL (Ollama accepts a bare ``host:port``)."""
    return host if "://" in host else f"http://{host}"


def available() -> bool:
    """``OLLAMA_HOST`` is set and answers like Ollama (a warning if it is set but silent)."""
    host = settings.get_str("ollama_host")
    if not host:
        return False
    if server_version(host_url(host)) is not None:
        return True
    log.warning("OLLAMA_HOST=%s does not answer; using the embedded backend", host)
    return False


def build(persona: PersonaSpec, timeout: float, options: dict[str, Any]) -> BaseChatModel:
    """``persona``'s model on the server at ``OLLAMA_HOST``, provisioned on first use."""
    host = host_url(settings.get_str("ollama_host"))
    ensure_provisioned(host)
    return OllamaPersonaChat(
        model=persona.model, base_url=host, client_kwargs={"timeout": timeout}, **options
    )


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
    with map_exceptions(exception_table(host)):
        existing = {_tagged(m.model or "") for m in client.list().models}
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

    with map_exceptions(exception_table(host)):
        if BASE_NAME in missing:
            pull_base()
            create(BASE_NAME)
        personas = [n for n in missing if n != BASE_NAME]
        with ThreadPoolExecutor(max_workers=4) as pool:
            for future in [pool.submit(create, n) for n in personas]:
                future.result()
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


class OllamaPersonaChat(PersonaChatModel, ChatOllama):
    """A persona's model on an Ollama server, which applies the SYSTEM it was created with."""

    def exception_table(self) -> ExceptionTable:
        return exception_table(self.base_url or "http://127.0.0.1:11434", self.model)


class OllamaAuthorChat(OllamaPersonaChat):
    """The user's author model on an Ollama server (``batos.models.author``): a model pulled
    there, not provisioned from the Modelfiles; its failures say which setting to change."""

    def exception_table(self) -> ExceptionTable:
        return exception_table(self.base_url or "", self.model, author=True)
