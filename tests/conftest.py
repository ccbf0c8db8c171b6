"""Shared fixtures: every test gets its own BAT OS home, so nothing touches the user's image.

Images of every kind the product opens: ``memory://``, ``file://``, a real ZEO server and
PostgreSQL through RelStorage (a throw-away cluster on loopback, started once per session).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from images import open_laid_out
from pgcluster import PostgresCluster, PostgresUnavailable

from store.core.image import LivingImage
from store.core.zeo import ZeoServer

# Property-based tests: the same examples on every run (a failure in CI replays anywhere),
# and no example database written into the tree. `pytest --hypothesis-profile=deep` explores
# many more, at random.
settings.register_profile(
    "batos",
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,  # a loaded machine slows examples down; the test timeout still applies
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "deep", settings.get_profile("batos"), max_examples=5000, derandomize=False
)
settings.load_profile("batos")

#: Every kind of image, and those that outlive the process that wrote them.
IMAGE_KINDS = ("memory", "file", "zeo", "postgres")
LASTING_KINDS = ("file", "zeo", "postgres")
#: The kinds several processes can open at once.
SHARED_KINDS = ("zeo", "postgres")


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
    """A memory:// image with the store's layout (``images.laid_out``)."""
    image = open_laid_out("memory://")
    yield image
    image.close()


@pytest.fixture
def file_uri(tmp_path: Path) -> str:
    return f"file://{tmp_path / 'image' / 'live_image.fs'}"


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL server of its own for this test session, stopped and deleted at the end."""
    try:
        cluster = PostgresCluster()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL is not installed: {exc}")
    with cluster:
        yield cluster


@pytest.fixture
def postgres_uri(postgres_cluster: PostgresCluster) -> str:
    """A ``postgres://`` image URI on a database of its own (history-preserving)."""
    return postgres_cluster.uri()


def _uri_of_kind(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if kind == "memory":
        yield "memory://"
    elif kind == "file":
        yield f"file://{tmp_path / 'image' / 'live_image.fs'}"
    elif kind == "zeo":
        with ZeoServer(tmp_path / "zeo" / "live_image.fs") as server:
            yield server.uri
    elif kind == "postgres":
        yield request.getfixturevalue("postgres_cluster").uri()
    else:
        raise AssertionError(f"no image kind {kind!r}")


@pytest.fixture(params=IMAGE_KINDS)
def any_image_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URI of a new image of each kind in turn (memory:// opens a new one each time)."""
    yield from _uri_of_kind(request.param, request, tmp_path)


@pytest.fixture(params=LASTING_KINDS)
def lasting_image_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URI of a new image that reopens with what was committed: file, ZEO, PostgreSQL."""
    yield from _uri_of_kind(request.param, request, tmp_path)


@pytest.fixture(params=SHARED_KINDS)
def shared_image_uri(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URI of a new image several processes can open at once: ZEO, PostgreSQL."""
    yield from _uri_of_kind(request.param, request, tmp_path)


@pytest.fixture
def any_image(any_image_uri: str) -> Iterator[LivingImage]:
    """An open image of each kind in turn, with the store's layout."""
    with open_laid_out(any_image_uri) as image:
        yield image
