"""``batos doctor``: checks what BAT OS stands on and says what to fix.

Each check returns ``Check``s (ok, warn or fail, what was found, what to do): the image (it
opens, the storage's own consistency checks pass — ``fstest`` and ``fsrefs`` for a file image,
every record reachable from the root loads for the others), the model file and its pinned
checksums, the persona adapters against their manifests, the configured backends and the
author model (reachable within a short timeout), the heartbeat's job store and lease, and
whether a LangGraph server answers. Nothing here writes to the image or to the model cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from shlex import quote
from typing import Any

from batos import settings
from batos.errors import BatosError
from store.core.image import LivingImage, image_path, shown_uri

OK, WARN, FAIL = "ok", "warn", "fail"
#: Seconds a backend or server probe may take: doctor answers quickly when a host is down.
PROBE_TIMEOUT_S = 2.0
#: Records the reachability walk of a non-file image loads before it stops, reporting so.
WALK_LIMIT = 2_000_000
_CHUNK = 1 << 22


@dataclass(frozen=True)
class Check:
    """One finding: ``status`` is ok, warn or fail; ``fix`` says what to do (empty when ok)."""

    area: str
    status: str
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# -- the image ------------------------------------------------------------------------------


def _file_checks(path: Path) -> list[Check]:
    """ZODB's own checks of a FileStorage file: fstest (structure), fsrefs (references)."""
    from ZODB.scripts import fsrefs, fstest

    try:
        fstest.check(str(path))
    except fstest.FormatError as exc:
        return [
            Check(
                "image",
                FAIL,
                f"fstest: {exc}",
                "run 'batos repair' (the damaged file is kept beside the repaired one)",
            )
        ]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            fsrefs.main(str(path))
    except Exception as exc:  # fsrefs stops on whatever the damaged file raises
        printed.write(f"{type(exc).__name__}: {exc}")
    report = printed.getvalue().strip()
    if report:
        first = report.splitlines()[0]
        return [
            Check(
                "image",
                FAIL,
                f"fsrefs: {first[:300]}",
                "run 'batos repair': it mends cut or broken transactions, and names the "
                "transaction to undo for a record that cannot be read or a reference left "
                "dangling ('batos history', 'batos undo')",
            )
        ]
    return [Check("image", OK, "fstest and fsrefs found no damage")]


def _walk(image: LivingImage) -> Check:
    """Every record reachable from the root loads: the check that applies to any storage."""
    from ZODB.serialize import referencesf
    from ZODB.utils import oid_repr, z64

    storage = image.db.storage
    seen: set[bytes] = set()
    todo = [z64]
    while todo:
        oid = todo.pop()
        if oid in seen:
            continue
        seen.add(oid)
        if len(seen) > WALK_LIMIT:
            return Check("image", WARN, f"walked {WALK_LIMIT:,} records and stopped", "")
        try:
            data, _ = storage.load(oid)
        except Exception as exc:
            return Check(
                "image",
                FAIL,
                f"record {oid_repr(oid)} does not load: {type(exc).__name__}: {exc}",
                "restore the storage from a backup, or undo the transaction that broke it",
            )
        todo.extend(referencesf(data))
    return Check("image", OK, f"{len(seen):,} reachable records load")


def check_image(uri: str) -> list[Check]:
    try:
        path = image_path(uri)
    except BatosError as exc:
        return [Check("image", FAIL, exc.message, exc.hint or "check the image URI")]
    if path is not None and not path.exists():
        return [
            Check("image", FAIL, f"no image at {path}", f"run 'batos --image {quote(uri)} init'")
        ]
    found = _file_checks(path) if path is not None else []
    if any(c.status == FAIL for c in found):
        return found
    try:
        image = LivingImage.open(uri, create=False)
    except BatosError as exc:
        locked = type(exc).__name__ == "ImageLockedError"
        status = WARN if locked else FAIL
        return [*found, Check("image", status, f"{shown_uri(uri)}: {exc.message}", exc.hint or "")]
    with image:
        found.append(_summary(image))
        if path is None:
            found.append(_walk(image))
    return found


def _summary(image: LivingImage) -> Check:
    from batos.shell.runtime import upgrade_steps
    from store.core.schema import applied, pending

    size = image.db.getSize()
    count = len(image.db.storage) if hasattr(image.db.storage, "__len__") else None
    with image.read() as root:
        steps = list(applied(root))
        waiting = [step.name for step in pending(root, upgrade_steps(None))]
    objects = f"{count:,} objects, " if count is not None else ""
    opened = (
        f"{shown_uri(image.uri)} opens: {objects}{size / 2**20:.1f} MiB, "
        f"{len(steps)} layouts applied"
    )
    if waiting:
        return Check(
            "image",
            WARN,
            f"{opened}; not yet applied: {', '.join(waiting)}",
            "run 'batos init' (any command that opens the image applies them)",
        )
    return Check("image", OK, opened)


# -- models and adapters --------------------------------------------------------------------


def check_model() -> list[Check]:
    from store.core import model_files

    which = settings.get_str("model")
    specs = model_files.catalog()
    if which not in specs:
        try:
            path = model_files.model_path(which)
        except BatosError as exc:
            return [Check("model", FAIL, exc.message, exc.hint or "")]
        return [Check("model", OK, f"{path} is a GGUF file (a custom model: no pinned checksum)")]
    spec = specs[which]
    problems = model_files.verify_parts(spec)
    if problems:
        return [Check("model", FAIL, problem.message, problem.hint or "") for problem in problems]
    found = [Check("model", OK, f"{which}: {len(spec.parts)} part(s) match their sha256")]
    cached = Path(settings.get_str("model_cache")) / spec.filename
    if not cached.exists():
        found.append(
            Check("model", OK, f"{which} is not assembled yet (its first use assembles it)")
        )
    elif cached.stat().st_size != spec.size or _sha256(cached) != spec.sha256:
        found.append(
            Check(
                "model",
                FAIL,
                f"the assembled {cached} does not match its pinned sha256",
                f"delete {cached} and its .verified marker: the next use assembles it again",
            )
        )
    else:
        found.append(Check("model", OK, f"{cached} matches its pinned sha256"))
    return found


def check_adapters() -> list[Check]:
    from batos.models.modelfile import adapter_path
    from prototypes.codex import PERSONAS
    from store.core import model_files

    which = settings.get_str("model")
    if which not in model_files.catalog():
        return [Check("adapters", OK, "a custom model runs with system prompts only")]
    folder = adapter_path(which)
    manifest_path = folder / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return [
            Check(
                "adapters",
                WARN,
                f"no readable {manifest_path} ({exc}): adapters cannot be verified",
                "train them: 'batos personas train --model " + which + "'",
            )
        ]
    found: list[Check] = []
    spec = model_files.catalog()[which]
    if manifest.get("base_sha256") not in (None, spec.sha256):
        found.append(
            Check(
                "adapters",
                FAIL,
                f"{manifest_path} was trained on another base (sha256 differs)",
                f"train the adapters again for this base: 'batos personas train --model {which}'",
            )
        )
    personas = manifest.get("personas") or {}
    for persona in PERSONAS:
        name = persona.lower()
        path = adapter_path(which, name)
        entry = personas.get(name) or {}
        if not path.exists():
            found.append(
                Check(
                    "adapters",
                    WARN,
                    f"{name}: no adapter at {path}; the persona runs on its system prompt",
                    f"train it: 'batos personas train --model {which} -p {name}'",
                )
            )
        elif entry.get("adapter_sha256") and _sha256(path) != entry["adapter_sha256"]:
            found.append(
                Check(
                    "adapters",
                    FAIL,
                    f"{name}: {path} does not match the sha256 in {manifest_path.name}",
                    f"restore it from the repository (git checkout -- {path}) or train it again",
                )
            )
        else:
            found.append(Check("adapters", OK, f"{name}: {path.name} matches its manifest"))
    return found


# -- backends and server --------------------------------------------------------------------


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int | None, str]:
    import httpx

    try:
        response = httpx.get(url, timeout=PROBE_TIMEOUT_S, headers=headers or {})
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return response.status_code, ""


def check_backends() -> list[Check]:
    from batos.models.ollama import host_url, server_version

    found: list[Check] = []
    base = settings.get_str("openai_base_url")
    if base:
        key = settings.get_str("openai_api_key")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        status, error = _get(base.rstrip("/") + "/models", headers)
        if status == 200:
            found.append(Check("backends", OK, f"openai: {base} answers"))
        else:
            found.append(
                Check(
                    "backends",
                    FAIL,
                    f"openai: {base} "
                    + (f"answered {status}" if status else f"is out of reach ({error[:200]})"),
                    "start the server, or unset BATOS_OPENAI_BASE_URL to use another backend",
                )
            )
    host = settings.get_str("ollama_host")
    if host:
        version = server_version(host_url(host), timeout=PROBE_TIMEOUT_S)
        if version:
            found.append(Check("backends", OK, f"ollama: {host} answers (version {version})"))
        else:
            found.append(
                Check(
                    "backends",
                    FAIL if not base else WARN,
                    f"ollama: OLLAMA_HOST={host} does not answer",
                    "start Ollama ('ollama serve'), or unset OLLAMA_HOST for the embedded backend",
                )
            )
    if not found:
        found.append(Check("backends", OK, "embedded llama.cpp (no server configured)"))
    return found


def check_author() -> list[Check]:
    """The author model (``BATOS_AUTHOR_MODEL``): its server answers and lists the model."""
    from batos.models import author

    spec = author.configured()
    if spec is None:
        return [Check("author", OK, "each persona's own model writes its methods")]
    if spec.backend == "embedded":
        return [Check("author", OK, f"{spec.label} writes methods, in process")]
    unset = "or unset BATOS_AUTHOR_MODEL so each persona's own model writes"
    if spec.backend == "ollama":
        status, error, listed = _listed(f"{spec.url.rstrip('/')}/api/tags", "models", "name")
        wanted = spec.model if ":" in spec.model else f"{spec.model}:latest"
        down = f"start it ('ollama serve') or set BATOS_AUTHOR_URL, {unset}"
        fix = f"pull it there ('ollama pull {spec.model}'), {unset}"
    else:
        key = settings.get_str("author_api_key") or settings.get_str("openai_api_key")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        status, error, listed = _listed(f"{spec.url.rstrip('/')}/models", "data", "id", headers)
        wanted = spec.model
        down = f"start the server or set BATOS_AUTHOR_URL (and BATOS_AUTHOR_API_KEY), {unset}"
        fix = f"serve {spec.model!r} there, {unset}"
    if status != 200:
        reached = f"answered {status}" if status else f"is out of reach ({error[:200]})"
        return [Check("author", FAIL, f"{spec.label}: {spec.url} {reached}", down)]
    if listed is not None and wanted not in listed:
        return [Check("author", WARN, f"{spec.label}: {spec.url} does not list the model", fix)]
    return [Check("author", OK, f"{spec.label} at {spec.url} writes methods")]


def _listed(
    url: str, field: str, name: str, headers: dict[str, str] | None = None
) -> tuple[int | None, str, set[str] | None]:
    """(status, error, the model names a server lists at ``url`` as ``{field: [{name: …}]}``;
    None where the reply is not such a list)."""
    import httpx

    try:
        response = httpx.get(url, timeout=PROBE_TIMEOUT_S, headers=headers or {})
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}", None
    try:
        names = {str(m.get(name)) for m in response.json().get(field, [])}
    except (ValueError, AttributeError, TypeError):
        names = None
    return response.status_code, "", names


def check_server(port: int) -> list[Check]:
    status, _ = _get(f"http://127.0.0.1:{port}/ok")
    if status == 200:
        return [Check("server", OK, f"a LangGraph server answers on 127.0.0.1:{port}")]
    return [
        Check("server", OK, f"no LangGraph server on 127.0.0.1:{port} ('batos serve' starts one)")
    ]


# -- the heartbeat ----------------------------------------------------------------------------


def check_scheduler(uri: str) -> list[Check]:
    from batos.shell.heartbeat import JOB_FUNCTION
    from store.core.jobstore import ImageJobStore, lease_holder

    try:
        image = LivingImage.open(uri, create=False)
    except BatosError:
        return []  # the image check already said why
    with image:
        store = ImageJobStore(image, functions={JOB_FUNCTION})
        store.start(None, "default")  # reading needs no scheduler
        jobs = store.get_all_jobs()
        lease = lease_holder(image)
    found: list[Check] = []
    for job_id, why in sorted(store.corrupt.items()):
        found.append(
            Check(
                "scheduler",
                FAIL,
                f"job {job_id!r} cannot be restored: {why[:200]}",
                "the heartbeat skips it; 'batos heartbeat --once' records the job again",
            )
        )
    if not jobs and not store.corrupt:
        found.append(
            Check("scheduler", WARN, "no heartbeat jobs in the image", "run 'batos heartbeat'")
        )
    elif jobs:
        found.append(Check("scheduler", OK, f"{len(jobs)} job(s): {', '.join(j.id for j in jobs)}"))
    if lease is None:
        found.append(Check("scheduler", OK, "no heartbeat holds the lease"))
    elif lease["expires"] > time.time():
        until = time.strftime("%H:%M:%S", time.localtime(lease["expires"]))
        found.append(Check("scheduler", OK, f"lease held by {lease['holder']} until {until}"))
    else:
        ago = time.time() - lease["expires"]
        found.append(
            Check(
                "scheduler",
                WARN,
                f"lease of {lease['holder']} expired {ago:,.0f} s ago: that heartbeat stopped",
                "start 'batos heartbeat' (it takes an expired lease over)",
            )
        )
    return found


def check_facets(uri: str) -> list[Check]:
    """The codex's facet methods: written, missing (the heartbeat writes them), or failed
    with their reason and when they are tried again."""
    from graph import facet_writing

    try:
        image = LivingImage.open(uri, create=False)
    except BatosError:
        return []  # the image check already said why
    with image, image.read() as root:
        rows = facet_writing.status(root)
    written = [r for r in rows if r["state"] == "written"]
    found = [
        Check(
            "facets",
            OK if len(written) == len(rows) else WARN,
            f"{len(written)} of {len(rows)} facet methods written",
            ""
            if len(written) == len(rows)
            else "run 'batos init --prepare' (or let the heartbeat write them); until then "
            "their personas answer those parts directly",
        )
    ]
    for row in rows:
        if row["state"] == "pending":
            reason = (row["reason"] or "").splitlines()[0][:200]
            found.append(
                Check(
                    "facets",
                    WARN,
                    f"{row['facet']} was taken out as wrong ({reason})",
                    "the heartbeat writes it again (never with the same code); 'batos methods "
                    f"restore {row['facet'].split('.')[0].lower()} {row['facet'].split('.')[1]}' "
                    "puts the old one back",
                )
            )
        if row["state"] == "failed":
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["next_try"] or 0))
            reason = (row["reason"] or "").splitlines()[0][:200]
            found.append(
                Check(
                    "facets",
                    WARN,
                    f"{row['facet']} could not be written ({row['failures']} tries): {reason}",
                    f"tried again after {when}; or write it by hand: 'batos methods add "
                    f"{row['facet'].split('.')[0].lower()} {row['facet'].split('.')[1]} FILE'",
                )
            )
    return found


CHECKS: tuple[tuple[str, Callable[..., list[Check]]], ...] = (
    ("image", check_image),
    ("model", check_model),
    ("adapters", check_adapters),
    ("backends", check_backends),
    ("author", check_author),
    ("facets", check_facets),
    ("scheduler", check_scheduler),
    ("server", check_server),
)


def diagnose(uri: str, *, server_port: int = 2024) -> Iterator[Check]:
    """Every check, in order; a check that raises is reported as failed, never hidden."""
    arguments: dict[str, tuple[Any, ...]] = {
        "image": (uri,),
        "facets": (uri,),
        "scheduler": (uri,),
        "server": (server_port,),
    }
    for area, check in CHECKS:
        try:
            yield from check(*arguments.get(area, ()))
        except BatosError as exc:
            yield Check(area, FAIL, exc.message, exc.hint or "")
        except Exception as exc:
            yield Check(area, FAIL, f"the check itself failed: {type(exc).__name__}: {exc}", "")
