"""Shared fixtures: every test gets its own BAT OS home, so nothing touches the user's image."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.image import LivingImage


@pytest.fixture(autouse=True)
def batos_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "batos-home"
    monkeypatch.setenv("BATOS_HOME", str(home))
    monkeypatch.delenv("BATOS_IMAGE", raising=False)
    monkeypatch.setenv("BATOS_MODEL", os.environ.get("BATOS_TEST_MODEL", "test"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


@pytest.fixture
def memory_image() -> Iterator[LivingImage]:
    image = LivingImage.open("memory://")
    yield image
    image.close()


@pytest.fixture
def file_uri(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'image' / 'live_image.fs'}"
