"""The image on PostgreSQL through RelStorage: pack in database terms, clear errors, sharing.

The other store tests run on PostgreSQL too (the ``*_image_uri`` fixtures); these cover what
only a database server has.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
from persistent.mapping import PersistentMapping
from pgcluster import PostgresCluster

from batos.errors import ImageError
from batos.shell.cli import main as batos
from store.core import packing
from store.core.image import LivingImage


def _rows(cluster: PostgresCluster, uri: str) -> tuple[int, int]:
    """Object-state rows and their bytes, counted by PostgreSQL itself."""
    import psycopg2

    conn = psycopg2.connect(cluster.dsn(uri.rsplit("/", 1)[1].split("?")[0]))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*), coalesce(sum(state_size), 0) FROM object_state")
            rows, size = cur.fetchone()
    finally:
        conn.close()
    return int(rows), int(size)


def _churn(image: LivingImage, versions: int) -> None:
    """One object rewritten ``versions`` times, and one object made unreachable."""
    image.transact(lambda root: root.__setitem__("doomed", PersistentMapping(x="y" * 5000)))
    image.transact(lambda root: root.__delitem__("doomed"))
    image.transact(lambda root: root.__setitem__("note", PersistentMapping(text="")))
    for i in range(versions):
        image.transact(lambda root, i=i: root["note"].__setitem__("text", f"v{i} " * 200))


def test_pack_on_history_preserving_postgres_reports_rows_from_the_database(
    postgres_cluster: PostgresCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = postgres_cluster.uri()
    with LivingImage.open(uri) as image:
        _churn(image, versions=12)
        assert packing.footprint(image).revisions == _rows(postgres_cluster, uri)[0]
    rows_before, bytes_before = _rows(postgres_cluster, uri)

    assert batos(["--image", uri, "pack"]) == 0
    out = capsys.readouterr().out
    rows_after, bytes_after = _rows(postgres_cluster, uri)
    # 12 old revisions of the note, the doomed object and the root's old revisions are gone.
    assert rows_after <= rows_before - 13 and bytes_after < bytes_before
    said = re.search(r"object revisions ([\d,]+) → ([\d,]+)", out)
    assert said, out
    assert [int(n.replace(",", "")) for n in said.groups()] == [rows_before, rows_after]
    assert "history-preserving" in out and "VACUUM FULL" in out
    with LivingImage.open(uri) as image, image.read() as root:
        assert root["note"]["text"].startswith("v11 ") and "doomed" not in root


def test_pack_on_history_free_postgres_collects_unreachable_objects(
    postgres_cluster: PostgresCluster,
) -> None:
    uri = postgres_cluster.uri(keep_history=False)
    with LivingImage.open(uri) as image:
        _churn(image, versions=5)
        with pytest.raises(ImageError, match="no undo history"):
            image.history()
        kept = packing.pack(image, days=3)  # everything here was written after the pack time
        assert kept.storage == "RelStorage (history-free)"
        assert kept.after.revisions == kept.before.revisions
        report = packing.pack(image)
        # One revision per object: only the unreachable object can go.
        assert report.after.revisions == report.before.revisions - 1
        with image.read() as root:
            assert root["note"]["text"].startswith("v4 ")


def test_a_server_that_is_down_gets_a_hint(
    postgres_cluster: PostgresCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from store.core.zeo import free_port

    uri = f"postgres://{postgres_cluster.user}@127.0.0.1:{free_port()}/nothing?connect_timeout=2"
    with pytest.raises(ImageError, match="no PostgreSQL server answers") as info:
        LivingImage.open(uri)
    assert "start PostgreSQL" in info.value.hint
    assert batos(["--image", uri, "inspect"]) == ImageError.exit_code
    err = capsys.readouterr().err
    assert "start PostgreSQL" in err and "OperationalError" not in err


def test_a_missing_database_or_a_wrong_password_is_named(
    postgres_cluster: PostgresCluster,
) -> None:
    base = f"127.0.0.1:{postgres_cluster.port}"
    with pytest.raises(ImageError, match="no database 'absent'") as info:
        LivingImage.open(f"postgres://{postgres_cluster.user}@{base}/absent")
    assert "createdb absent" in info.value.hint
    with pytest.raises(ImageError, match="refused the login|no database") as info:
        LivingImage.open(f"postgres://nobody:secret@{base}/postgres")
    assert "secret" not in str(info.value)


def test_two_processes_share_one_postgres_image(postgres_cluster: PostgresCluster) -> None:
    uri = postgres_cluster.uri()
    script = textwrap.dedent(
        """
        import sys
        from store.core.image import LivingImage
        with LivingImage.open(sys.argv[1]) as image:
            image.transact(lambda root: root.__setitem__("from_child", 42), note="child")
        """
    )
    with LivingImage.open(uri) as image:  # open here while the child writes
        image.transact(lambda root: root.__setitem__("from_parent", 1))
        subprocess.run([sys.executable, "-c", script, uri], check=True, timeout=120)
        with image.read() as root:
            assert root["from_child"] == 42 and root["from_parent"] == 1
        assert image.history(1)[0].description == "child"
