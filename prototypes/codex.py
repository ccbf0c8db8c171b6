"""The persona codex: ``codex.toml`` loaded and checked into plain, immutable records."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from batos.errors import ConfigurationError

PERSONAS = ("ROBIN", "BRICK", "BABS", "ALFRED")
#: Intents whose selector starts with this are facets: methods the mind calls to turn a
#: sub-query into the instruction (and sampling options) for the persona's model.
FACET_PREFIX = "facet_"
#: The slot where an object declares the intents of the selectors it may be sent.
INTENTS_SLOT = "intents"


@dataclass(frozen=True)
class PersonaSpec:
    name: str
    role: str
    inspirations: tuple[str, ...]
    activation: str
    model: str
    identity: str
    intents: dict[str, str]
    router_examples: tuple[str, ...]

    @property
    def facets(self) -> dict[str, str]:
        """The persona's facet intents (selector → intent), in codex order."""
        return {s: i for s, i in self.intents.items() if s.startswith(FACET_PREFIX)}


@dataclass(frozen=True)
class Codex:
    version: int
    traits_description: str
    personas: dict[str, PersonaSpec]

    def persona(self, name: str) -> PersonaSpec:
        try:
            return self.personas[name.upper()]
        except KeyError:
            raise ConfigurationError(
                f"unknown persona {name!r}", hint=f"choose one of {', '.join(self.personas)}"
            ) from None


def load_codex(text: str | None = None) -> Codex:
    """Parse the codex (the packaged ``codex.toml`` unless ``text`` is given)."""
    if text is None:
        text = resources.files("prototypes").joinpath("codex.toml").read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
        personas = {
            name: PersonaSpec(
                name=name,
                role=spec["role"],
                inspirations=tuple(spec["inspirations"]),
                activation=spec["activation"],
                model=spec["model"],
                identity=spec["identity"],
                intents=dict(spec["intents"]),
                router_examples=tuple(spec["router"]["examples"]),
            )
            for name, spec in data["personas"].items()
        }
        codex = Codex(int(data["version"]), data["traits"]["description"], personas)
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"the persona codex is malformed: {type(exc).__name__}: {exc}",
            hint="compare it with prototypes/codex.toml as shipped",
        ) from exc
    missing = set(PERSONAS) - set(personas)
    if missing:
        raise ConfigurationError(f"the codex lacks personas {sorted(missing)}")
    for spec in personas.values():
        private = [s for s in spec.intents if s.startswith("_") or not s.isidentifier()]
        if private:
            raise ConfigurationError(
                f"{spec.name}: intent selectors must be public identifiers, not {private}"
            )
    return codex
