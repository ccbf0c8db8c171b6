"""A throw-away PostgreSQL cluster on loopback for tests and benchmarks: initdb, pg_ctl, gone.

``initdb`` and ``pg_ctl`` refuse to run as root, so as root the cluster runs as a dedicated
unprivileged user (created when missing) that owns the data folder. Durability is switched off
(``fsync``, ``synchronous_commit``): a crash of the test machine loses a test cluster, nothing
else, and commits are many times faster on a slow disk.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

#: The unprivileged account the cluster (and the sandbox probe) runs as when the tests run as root.
CLUSTER_USER = "batos-pg"
#: Where Debian and other distributions put the server programs, newest first.
_BIN_GLOBS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin")
START_TIMEOUT = 60.0


class PostgresUnavailable(RuntimeError):
    """PostgreSQL's server programs are not installed here (the reason says what is missing)."""


def server_bin() -> Path:
    """The folder holding initdb and pg_ctl, or ``PostgresUnavailable``."""
    import glob

    for pattern in _BIN_GLOBS:
        for folder in sorted(glob.glob(pattern), reverse=True):
            if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
                return Path(folder)
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent
    raise PostgresUnavailable(
        "PostgreSQL's initdb/pg_ctl are not installed (Debian: apt-get install postgresql-15)"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unprivileged_account() -> pwd.struct_passwd:
    """The account to run what must not run as root: this one, or (as root) the dedicated
    unprivileged one, created when missing."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    try:
        return pwd.getpwnam(CLUSTER_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                CLUSTER_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(CLUSTER_USER)


class PostgresCluster:
    """One PostgreSQL server in a temporary folder; ``uri(name)`` gives a fresh database."""

    def __init__(self) -> None:
        self.bin = server_bin()
        self.account = unprivileged_account()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="batos-pg-"))
        self.data = self.root / "data"
        self._databases = 0
        self._templates: set[str] = set()

    @property
    def user(self) -> str:
        return self.account.pw_name

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        as_other = os.geteuid() != self.account.pw_uid
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            user=self.account.pw_uid if as_other else None,
            group=self.account.pw_gid if as_other else None,
            extra_groups=[] if as_other else None,
            cwd=self.root,
            env={**os.environ, "LC_ALL": "C", "HOME": str(self.root)},
            capture_output=True,
            text=True,
            check=check,
        )

    def start(self) -> PostgresCluster:
        os.chown(self.root, self.account.pw_uid, self.account.pw_gid)
        self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "-E", "UTF8")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
            "max_prepared_transactions": "50",
        }
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        log = self.root / "server.log"
        done = self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-w", "start", check=False)
        if done.returncode:
            text = log.read_text(errors="replace") if log.exists() else ""
            self.stop()
            raise RuntimeError(f"PostgreSQL did not start: {done.stderr}\n{text[-2000:]}")
        deadline = time.monotonic() + START_TIMEOUT
        while not self._answers():
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"PostgreSQL did not answer within {START_TIMEOUT:.0f} s")
            time.sleep(0.05)
        return self

    def halt(self) -> None:
        """Stop the server as 'pg_ctl -m fast stop' does (its clients see it go away); its data
        stays, for ``resume``."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def resume(self) -> None:
        """Start the server again after it was stopped, on the same port and data."""
        log = self.root / "server.log"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(log), "-w", "start")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={dbname}"

    def _sql(self, statement: str) -> None:
        import psycopg2

        conn = psycopg2.connect(self.dsn())
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
            with conn.cursor() as cur:
                cur.execute(statement)
        finally:
            conn.close()

    def create_database(self, name: str | None = None, *, keep_history: bool = True) -> str:
        """Create a database holding RelStorage's empty schema; return its name.

        Installing the schema takes a second or more; copying a database that already holds
        it (``CREATE DATABASE … TEMPLATE``) takes a fraction of that, so each history mode's
        schema is installed once, in a template, and copied for every new database.
        """
        template = self._template(keep_history)
        if name is None:
            self._databases += 1
            name = f"image_{os.getpid()}_{self._databases}"
        self._sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return name

    def _template(self, keep_history: bool) -> str:
        name = "relstorage_history" if keep_history else "relstorage_history_free"
        if name in self._templates:
            return name
        import ZODB
        from relstorage.zodburi_resolver import postgresql_resolver

        self._sql(f'CREATE DATABASE "{name}" TEMPLATE template0')
        factory, _ = postgresql_resolver(self._bare_uri(name, keep_history=keep_history))
        ZODB.DB(factory()).close()  # the schema and the root object
        self._templates.add(name)
        return name

    def _bare_uri(self, dbname: str, **query: object) -> str:
        params = "&".join(f"{k}={str(v).lower()}" for k, v in query.items())
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{dbname}" + (
            f"?{params}" if params else ""
        )

    def uri(self, name: str | None = None, *, keep_history: bool = True) -> str:
        """A ``postgres://`` image URI on a fresh database (RelStorage's zodburi form).

        ``keep_history=False`` gives a history-free database (no undo, packs without history).
        """
        dbname = self.create_database(name, keep_history=keep_history)
        return self._bare_uri(dbname, **({} if keep_history else {"keep_history": False}))

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
