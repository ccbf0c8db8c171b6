"""The image on PostgreSQL through RelStorage: pack in database terms, clear errors, sharing.

The other store tests run on PostgreSQL too (the ``*_image_uri`` fixtures); these cover what
only a database server has.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from persistent.mapping import PersistentMapping
from pgcluster import PostgresCluster

from batos.errors import ImageError, ImageNotFoundError
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


def test_a_role_that_may_not_lay_out_or_read_the_image_is_told_what_to_grant(
    postgres_cluster: PostgresCluster,
) -> None:
    """A role that does not own the database (PostgreSQL 15 grants it no CREATE on the
    public schema) got "check the server's log"."""
    import uuid

    role, empty = f"reader_{uuid.uuid4().hex[:8]}", f"empty_{uuid.uuid4().hex[:8]}"
    postgres_cluster._sql(f"CREATE ROLE {role} LOGIN")
    postgres_cluster._sql(f'CREATE DATABASE "{empty}"')
    laid_out = postgres_cluster.create_database()
    base = f"postgres://{role}@127.0.0.1:{postgres_cluster.port}"
    for database in (empty, laid_out):
        with pytest.raises(ImageError, match=f"does not let role '{role}' use") as info:
            LivingImage.open(f"{base}/{database}", create=True)
        assert "permission denied" in info.value.message
        assert (
            f"createdb -O {role}" in info.value.hint and f"{database} OWNER TO" in info.value.hint
        )
    # what the hint says works: the role owning the new database and its schema lays it out
    postgres_cluster._sql(f'ALTER DATABASE "{empty}" OWNER TO {role}')
    import psycopg2

    conn = psycopg2.connect(postgres_cluster.dsn(empty))
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"ALTER SCHEMA public OWNER TO {role}")
    finally:
        conn.close()
    LivingImage.open(f"{base}/{empty}", create=True).close()


def test_a_port_where_no_postgresql_listens_is_said_to_be_the_wrong_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Something else on the port (here a server that greets as SSH does and hangs up) was
    reported as PostgreSQL refusing the login, with a hint to check the password."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def greet() -> None:
        while True:
            try:
                peer, _ = listener.accept()
            except OSError:
                return
            with peer:
                peer.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    threading.Thread(target=greet, daemon=True).start()
    try:
        uri = f"postgresql://batos:secret@127.0.0.1:{port}/batos?connect_timeout=5"
        with pytest.raises(ImageError, match="not a PostgreSQL server") as info:
            LivingImage.open(uri)  # libpq's scheme is read as RelStorage's postgres://
        assert "check the port" in info.value.hint and "password" not in info.value.hint
        assert "secret" not in str(info.value)
        assert batos(["--image", uri, "inspect"]) == ImageError.exit_code
        assert "not a PostgreSQL server" in " ".join(capsys.readouterr().err.split())
    finally:
        listener.close()


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


@pytest.fixture(scope="module")
def stoppable_cluster() -> Iterator[PostgresCluster]:
    """A server of its own, which a test may stop and start again without harming others."""
    with PostgresCluster() as cluster:
        yield cluster


def test_a_server_that_goes_away_is_an_image_error_and_committed_work_stays(
    stoppable_cluster: PostgresCluster,
) -> None:
    image = LivingImage.open(stoppable_cluster.uri())
    image.transact(lambda root: root.__setitem__("kept", 1))
    stoppable_cluster.halt()
    try:
        for _ in range(2):  # every later use says the same, not only the first
            with pytest.raises(ImageError, match="went away or cannot be reached") as info:
                image.transact(lambda root: root.__setitem__("lost", 2))
            assert "retry once the server is back" in (info.value.hint or "")
            with pytest.raises(ImageError, match="went away"), image.read() as root:
                root["kept"]

        def stops_midway(root: Any) -> None:
            root["lost"] = 2
            stoppable_cluster.halt()

        stoppable_cluster.resume()
        with pytest.raises(ImageError, match="went away"):
            image.transact(stops_midway)
    finally:
        stoppable_cluster.resume()
    image.transact(lambda root: root.__setitem__("after", 3))  # it reconnects by itself
    with image.read() as root:
        assert (root["kept"], root["after"], "lost" in root) == (1, 3, False)
    image.close()  # every connection goes back to its pool: no KeyError from ZODB


#: Runs ``batos ingest`` with PostgreSQL stopping (as 'pg_ctl -m fast stop' does: SIGINT to
#: the postmaster) right after the ingest's third commit.
_INGEST_THEN_STOP = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from batos.shell.cli import main
    from store.knowledge import ingest

    pid_file, uri, folder = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    write_batch, commits = ingest.write_batch, []

    def write_then_stop(*args, **kwargs):
        result = write_batch(*args, **kwargs)
        commits.append(result)
        if len(commits) == 3:
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
            while pid_file.exists():
                time.sleep(0.05)
        return result

    ingest.write_batch = write_then_stop
    sys.exit(main(["--image", uri, "ingest", folder]))
    """
)


def test_a_server_that_goes_away_mid_command_ends_it_with_an_error_not_a_traceback(
    stoppable_cluster: PostgresCluster, tmp_path: Path, batos_home: Path
) -> None:
    uri = stoppable_cluster.uri()
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(20):
        (folder / f"note{i:02}.txt").write_text(f"note {i} is about topic number {i}. " * 10)
    env = {
        **os.environ,
        "BATOS_HOME": str(batos_home),
        "BATOS_CATALOG_COMMIT_CHUNKS": "1",  # one commit per file
    }
    pid_file = stoppable_cluster.data / "postmaster.pid"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _INGEST_THEN_STOP, str(pid_file), uri, str(folder)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        stoppable_cluster.resume()
    assert done.returncode == ImageError.exit_code, done.stderr
    assert "went away or cannot be reached" in done.stderr
    assert "Traceback" not in done.stderr and "KeyError" not in done.stderr, done.stderr
    again = subprocess.run(
        [sys.executable, "-m", "batos.shell.cli", "--image", uri, "ingest", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    assert "unchanged 3," in again.stdout  # the three commits before the stop were kept


def test_no_command_shows_the_database_password(
    postgres_cluster: PostgresCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = postgres_cluster.uri().replace(
        f"//{postgres_cluster.user}@", f"//{postgres_cluster.user}:pw-s3cret@"
    )
    shown = []
    for command in (
        ["init"],
        ["threads"],
        ["heartbeat", "--list"],
        ["history"],
        ["pack"],
        ["doctor"],
    ):
        code = batos(["--image", uri, *command])
        out, err = capsys.readouterr()
        assert "pw-s3cret" not in out + err, command
        shown.append(out + err)
        assert code in (0, 1) if command == ["doctor"] else code == 0, (command, err)
    assert all(":***@" in text for text in shown[1:5]), shown


def _tables(cluster: PostgresCluster, database: str) -> set[str]:
    import psycopg2

    conn = psycopg2.connect(cluster.dsn(database))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            return {name for (name,) in cur.fetchall()}
    finally:
        conn.close()


def test_only_init_installs_an_image_in_a_database_that_holds_none(
    postgres_cluster: PostgresCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg2

    database = f"appdb_{os.getpid()}"
    postgres_cluster._sql(f'CREATE DATABASE "{database}" TEMPLATE template0')
    conn = psycopg2.connect(postgres_cluster.dsn(database))
    with conn, conn.cursor() as cur:  # an application's own table, nothing of RelStorage's
        cur.execute("CREATE TABLE users (id serial PRIMARY KEY, name text)")
    conn.close()
    uri = f"postgres://{postgres_cluster.user}@127.0.0.1:{postgres_cluster.port}/{database}"

    for command in (["threads"], ["inspect", "robin"], ["history"]):
        assert batos(["--image", uri, *command]) == ImageError.exit_code, command
        err = capsys.readouterr().err
        assert f"no image in the PostgreSQL database '{database}'" in err, err
        assert "init" in err
    assert _tables(postgres_cluster, database) == {"users"}
    with pytest.raises(ImageNotFoundError):
        LivingImage.open(uri, create=False)

    assert batos(["--image", uri, "init"]) == 0
    assert batos(["--image", uri, "threads"]) == 0
    assert "users" in _tables(postgres_cluster, database)
