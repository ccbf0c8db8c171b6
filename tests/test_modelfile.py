"""The Modelfile parser, FROM-chain resolution, and the shipped Modelfiles' sync with the codex."""

from __future__ import annotations

from pathlib import Path

import pytest

from batos.models.modelfile import (
    BASE_NAME,
    ModelfileError,
    parse,
    persona_model,
    render,
    render_all,
)
from prototypes.codex import load_codex

SHIPPED = Path(__file__).resolve().parent.parent / "modelfiles"


def test_parses_every_instruction_form() -> None:
    text = '''# a comment
from batos-base
ADAPTER ./adapters/default/robin.gguf
SYSTEM """You are ROBIN.
You listen first."""
TEMPLATE "{{ .Prompt }}"
PARAMETER temperature 0.8
PARAMETER num_ctx 2048
PARAMETER stop "<|im_end|>"
PARAMETER stop <|endoftext|>
MESSAGE user "hello \\"there\\""
MESSAGE assistant hi
LICENSE Apache-2.0
'''
    mf = parse(text, SHIPPED / "robin.Modelfile")
    assert mf.from_ == "batos-base"
    assert mf.system == "You are ROBIN.\nYou listen first."
    assert mf.template == "{{ .Prompt }}"
    assert mf.parameters == {
        "temperature": 0.8,
        "num_ctx": 2048,
        "stop": ("<|im_end|>", "<|endoftext|>"),
    }
    assert mf.messages == (("user", 'hello "there"'), ("assistant", "hi"))
    assert mf.license == ("Apache-2.0",)
    assert mf.adapter_paths() == ((SHIPPED / "adapters/default/robin.gguf").resolve(),)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("FROM x\nPARAMTER temperature 1\n", 2, "unknown instruction"),
        ("FROM x\n\nPARAMETER temprature 1\n", 3, "unknown PARAMETER"),
        ("FROM x\nPARAMETER num_ctx lots\n", 2, "not valid"),
        ('FROM x\nSYSTEM """never closed\nstill open\n', 2, "never closes"),
        ("FROM x\nFROM y\n", 2, "a second FROM"),
        ('FROM x\nMESSAGE narrator "hi"\n', 2, "MESSAGE role"),
        ('FROM x\nTEMPLATE "open\n', 2, "unterminated string"),
        ("FROM x\nPARAMETER stop\n", 2, "needs a value"),
    ],
)
def test_syntax_errors_name_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(ModelfileError, match=rf"bad\.Modelfile:{line}: .*{words}"):
        parse(text, Path("bad.Modelfile"))


def test_a_modelfile_needs_from() -> None:
    with pytest.raises(ModelfileError, match="no FROM"):
        parse("SYSTEM hi\n", Path("x.Modelfile"))


def test_shipped_modelfiles_resolve_for_every_persona() -> None:
    for name in ("ROBIN", "BRICK", "BABS", "ALFRED"):
        model = persona_model(name, SHIPPED)
        assert model.name == load_codex().persona(name).model
        assert model.modelfile.from_ == BASE_NAME
        assert model.parameters["num_ctx"] == model.base.parameters["num_ctx"]
        assert model.adapters[0].name == f"{name.lower()}.gguf"
        assert model.adapters[0].parent.name == "default"


def test_persona_parameters_override_the_base() -> None:
    brick, robin = persona_model("brick", SHIPPED), persona_model("robin", SHIPPED)
    assert brick.parameters["temperature"] < robin.parameters["temperature"]
    assert brick.parameters["top_k"] == brick.base.parameters["top_k"]


def test_shipped_system_prompts_are_the_codex_identities() -> None:
    assert render_all(SHIPPED, write=False) == []
    for spec in load_codex().personas.values():
        assert persona_model(spec.name, SHIPPED).system == spec.identity


def test_render_rewrites_only_the_system_block(tmp_path: Path) -> None:
    spec = load_codex().persona("ALFRED")
    stale = (SHIPPED / "alfred.Modelfile").read_text().replace(spec.identity, "old words")
    (tmp_path / "alfred.Modelfile").write_text(stale)
    assert tmp_path / "alfred.Modelfile" in render_all(tmp_path, write=True)
    fixed = (tmp_path / "alfred.Modelfile").read_text()
    assert fixed == (SHIPPED / "alfred.Modelfile").read_text()
    assert render(spec, fixed) == fixed
    assert render_all(tmp_path, write=False) == []  # the missing ones were created too
    assert parse((tmp_path / "robin.Modelfile").read_text()).from_ == BASE_NAME


def test_missing_persona_modelfile_says_how_to_make_it(tmp_path: Path) -> None:
    (tmp_path / "base.Modelfile").write_text((SHIPPED / "base.Modelfile").read_text())
    with pytest.raises(ModelfileError, match="batos models render"):
        persona_model("ROBIN", tmp_path)


def test_unknown_persona_is_a_clear_error() -> None:
    from batos.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown persona 'JOKER'"):
        persona_model("JOKER", SHIPPED)
