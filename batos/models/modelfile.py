"""Ollama Modelfiles: a strict parser, FROM-chain resolution, and rendering from the codex.

``modelfiles/*.Modelfile`` are the single source of truth for each persona's model. Ollama
builds them with ``create``; the embedded backend reads the same files through this module, so
both apply the same system prompt, parameters and adapter. No maintained Python parser for the
format exists on PyPI (only linters), so this one follows Ollama's own grammar: one instruction
per line (case-insensitive), ``#`` comments, values raw, ``"quoted"`` or ``\"\"\"multi-line\"\"\"``.
Every error names the file and line. ``adapter_path`` is the one rule for where persona adapters
live (``adapters/<model>/<persona>.gguf``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batos import settings
from batos.errors import ModelError
from prototypes.codex import Codex, PersonaSpec, load_codex
from store.core.files import write_text

log = logging.getLogger("batos.llm.modelfile")

BASE_NAME = "batos-base"
BASE_FILE = "base.Modelfile"
INSTRUCTIONS = (
    "FROM",
    "ADAPTER",
    "SYSTEM",
    "TEMPLATE",
    "PARAMETER",
    "MESSAGE",
    "LICENSE",
    "REQUIRES",
)
MESSAGE_ROLES = ("system", "user", "assistant", "tool")


def _bool(text: str) -> bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    raise ValueError("expected true or false")


#: Ollama's runtime parameters and their types (api/types.go ``Options``); ``stop`` repeats.
PARAMETER_TYPES: dict[str, Callable[[str], object]] = {
    "num_ctx": int,
    "num_batch": int,
    "num_gpu": int,
    "main_gpu": int,
    "num_thread": int,
    "num_keep": int,
    "num_predict": int,
    "seed": int,
    "top_k": int,
    "repeat_last_n": int,
    "mirostat": int,
    "temperature": float,
    "top_p": float,
    "min_p": float,
    "typical_p": float,
    "repeat_penalty": float,
    "presence_penalty": float,
    "frequency_penalty": float,
    "mirostat_tau": float,
    "mirostat_eta": float,
    "use_mmap": _bool,
    "stop": str,
}


class ModelfileError(ModelError):
    """A Modelfile is missing, malformed, or names something that does not exist."""


@dataclass(frozen=True)
class Modelfile:
    """One parsed Modelfile; ``parameters['stop']`` is a tuple, every other value a scalar."""

    from_: str
    path: Path | None = None
    adapters: tuple[str, ...] = ()
    system: str | None = None
    template: str | None = None
    parameters: dict[str, object] = field(default_factory=dict)
    messages: tuple[tuple[str, str], ...] = ()
    license: tuple[str, ...] = ()

    def adapter_paths(self) -> tuple[Path, ...]:
        """ADAPTER values as paths; relative ones are relative to the Modelfile's folder."""
        folder = self.path.parent if self.path else Path.cwd()
        return tuple(
            (folder / a).resolve() if not Path(a).is_absolute() else Path(a) for a in self.adapters
        )


def _unquote(value: str, where: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        body = value[1:-1]
        return re.sub(r'\\(["\\])', r"\1", body)
    if value.startswith('"'):
        raise ModelfileError(
            f"{where}: unterminated string {value!r}",
            hint='close the value with " or use """…""" for several lines',
        )
    return value


def parse(text: str, path: Path | None = None) -> Modelfile:
    """Parse Modelfile ``text``; ``path`` names it in errors and anchors relative ADAPTERs."""
    name = str(path) if path else "<modelfile>"
    lines = text.splitlines()
    fields: dict[str, Any] = {"adapters": [], "parameters": {}, "messages": [], "license": []}
    from_: str | None = None
    i = 0
    while i < len(lines):
        lineno, raw = i + 1, lines[i].strip()
        i += 1
        if not raw or raw.startswith("#"):
            continue
        where = f"{name}:{lineno}"
        word, _, rest = raw.partition(" ")
        instruction, rest = word.upper(), rest.strip()
        if instruction not in INSTRUCTIONS:
            raise ModelfileError(
                f"{where}: unknown instruction {word!r}",
                hint=f"use one of {', '.join(INSTRUCTIONS)}",
            )
        if rest.startswith('"""'):
            body, rest_of_line = rest[3:], ""
            while '"""' not in body:
                if i >= len(lines):
                    raise ModelfileError(
                        f'{where}: {instruction} opens """ but never closes it',
                        hint='end the value with """',
                    )
                body += "\n" + lines[i]
                i += 1
            value, _, rest_of_line = body.partition('"""')
            if rest_of_line.strip():
                raise ModelfileError(f'{where}: text after the closing """: {rest_of_line!r}')
        else:
            value = rest
        if not value and instruction != "SYSTEM":
            raise ModelfileError(f"{where}: {instruction} needs a value")
        if instruction == "FROM":
            if from_ is not None:
                raise ModelfileError(f"{where}: a second FROM", hint="a Modelfile has one FROM")
            from_ = _unquote(value, where)
        elif instruction == "ADAPTER":
            fields["adapters"].append(_unquote(value, where))
        elif instruction in ("SYSTEM", "TEMPLATE"):
            fields[instruction.lower()] = (
                value if rest.startswith('"""') else _unquote(value, where)
            )
        elif instruction == "LICENSE":
            fields["license"].append(value)
        elif instruction == "PARAMETER":
            _parameter(fields["parameters"], value, where)
        elif instruction == "MESSAGE":
            role, _, content = value.partition(" ")
            if role.lower() not in MESSAGE_ROLES:
                raise ModelfileError(
                    f"{where}: MESSAGE role {role!r} is not one of {', '.join(MESSAGE_ROLES)}"
                )
            fields["messages"].append((role.lower(), _unquote(content.strip(), where)))
    if from_ is None:
        raise ModelfileError(
            f"{name}: no FROM instruction", hint="start the Modelfile with FROM <model or file>"
        )
    return Modelfile(
        from_=from_,
        path=path,
        adapters=tuple(fields["adapters"]),
        system=fields.get("system"),
        template=fields.get("template"),
        parameters=fields["parameters"],
        messages=tuple(fields["messages"]),
        license=tuple(fields["license"]),
    )


def _parameter(parameters: dict[str, object], value: str, where: str) -> None:
    key, _, raw = value.partition(" ")
    key, raw = key.lower(), raw.strip()
    if key not in PARAMETER_TYPES:
        raise ModelfileError(
            f"{where}: unknown PARAMETER {key!r}",
            hint=f"known parameters: {', '.join(sorted(PARAMETER_TYPES))}",
        )
    if not raw:
        raise ModelfileError(f"{where}: PARAMETER {key} needs a value")
    try:
        parsed = PARAMETER_TYPES[key](_unquote(raw, where))
    except ValueError as exc:
        raise ModelfileError(f"{where}: PARAMETER {key} {raw!r} is not valid: {exc}") from None
    if key == "stop":
        parameters["stop"] = (*parameters.get("stop", ()), parsed)  # type: ignore[misc]
    else:
        parameters[key] = parsed


def load(path: Path) -> Modelfile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelfileError(
            f"cannot read Modelfile {path}: {exc.strerror}",
            hint="run 'batos models render' to write the persona Modelfiles",
        ) from None
    return parse(text, path)


# --- the project's Modelfiles -------------------------------------------------------------


def modelfiles_dir() -> Path:
    return Path(settings.get_str("modelfiles"))


def persona_file(persona: str) -> str:
    return f"{persona.lower()}.Modelfile"


def adapter_path(model: str, persona: str | None = None, folder: Path | None = None) -> Path:
    """Where persona LoRA adapters live: ``adapters/<model>/<persona>.gguf``.

    The one statement of that rule: base ``model``'s adapter folder under the Modelfiles
    ``folder`` (default: the ``modelfiles`` setting), or ``persona``'s adapter file in it.
    """
    adapters = (folder or modelfiles_dir()) / "adapters" / model
    return adapters / f"{persona.lower()}.gguf" if persona else adapters


@dataclass(frozen=True)
class PersonaModel:
    """A persona's Modelfile with its FROM chain folded in: what a backend needs to serve it."""

    persona: str
    name: str  # the Ollama model name, from the codex
    modelfile: Modelfile
    base: Modelfile
    system: str | None
    parameters: dict[str, object]

    @property
    def adapters(self) -> tuple[Path, ...]:
        return self.modelfile.adapter_paths()


def persona_model(
    persona: str, folder: Path | None = None, codex: Codex | None = None
) -> PersonaModel:
    """Resolve ``persona``'s Modelfile against the base Modelfile its FROM names."""
    spec = (codex or load_codex()).persona(persona)
    folder = folder or modelfiles_dir()
    own = load(folder / persona_file(spec.name))
    base = base_modelfile(folder)
    if own.from_ != BASE_NAME:
        raise ModelfileError(
            f"{own.path}: FROM {own.from_!r}, expected FROM {BASE_NAME}",
            hint="persona models share one base; run 'batos models render'",
        )
    return PersonaModel(
        persona=spec.name,
        name=spec.model,
        modelfile=own,
        base=base,
        system=own.system if own.system is not None else base.system,
        parameters={**base.parameters, **own.parameters},
    )


def base_modelfile(folder: Path | None = None) -> Modelfile:
    return load((folder or modelfiles_dir()) / BASE_FILE)


# --- rendering from the codex -------------------------------------------------------------

_HEADER = (
    "# {persona}'s model. SYSTEM is generated from prototypes/codex.toml by "
    "'batos models render';\n# edit the codex, not the SYSTEM block. The rest of this "
    "file is maintained by hand.\n"
)
_SYSTEM_BLOCK = re.compile(r'^SYSTEM[ \t]+"""(?:.|\n)*?"""[ \t]*$', re.MULTILINE | re.IGNORECASE)


def render(spec: PersonaSpec, current: str | None) -> str:
    """``current`` with its SYSTEM block replaced by the codex identity (a new file if None)."""
    block = f'SYSTEM """{spec.identity}"""'
    if current is None:
        adapter = adapter_path("default", spec.name, Path(".")).as_posix()
        return (
            _HEADER.format(persona=spec.name)
            + f"FROM {BASE_NAME}\nADAPTER ./{adapter}\n"
            + block
            + "\n"
        )
    if _SYSTEM_BLOCK.search(current):
        return _SYSTEM_BLOCK.sub(lambda _: block, current, count=1)
    return current.rstrip("\n") + "\n" + block + "\n"


def render_all(folder: Path | None = None, *, write: bool) -> list[Path]:
    """Bring every persona Modelfile's SYSTEM in line with the codex; the files that differ(ed)."""
    folder = folder or modelfiles_dir()
    stale = []
    for spec in load_codex().personas.values():
        path = folder / persona_file(spec.name)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        wanted = render(spec, current)
        if wanted != current:
            stale.append(path)
            if write:
                parse(wanted, path)  # never write a file we could not read back
                write_text(path, wanted)
                log.info("rendered %s", path)
    return stale
