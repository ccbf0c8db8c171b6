"""The living image: one ZODB database opened from one URI, and the ways to change it.

``LivingImage.open(uri)`` resolves ``file://``, ``zeo://``, ``memory://`` and RelStorage's
``postgres://`` through zodburi, turns blobs on for file images and ZEO clients, and translates
the storages' own failures (lock held, truncated file, server not answering) into
``ImageError``s that say what to do. ``transact`` runs a function in one transaction and retries
it on conflicts (``store.core.transactions``); ``read`` gives a view that can never commit;
``history``/``undo`` expose the transaction log; ``shared_image`` is the one open image of a
server process.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import getpass
import logging
import os
import shlex
import shutil
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import transaction
import ZODB
import zodburi
from ZODB.Connection import Connection
from ZODB.FileStorage.format import CorruptedError
from ZODB.POSException import ConflictError, POSKeyError, ReadOnlyError, StateLoadError, UndoError

from batos import metrics, settings
from batos.errors import (
    ConfigurationError,
    ImageCorruptError,
    ImageError,
    ImageLockedError,
    ImageNotFoundError,
    ImageURIError,
)
from store.core import stats  # noqa: F401  (installs the side file that keeps the counters)
from store.core.files import write_text
from store.core.image_globals import ImageDB, in_force
from store.core.transactions import retry, run_in_transaction

log = logging.getLogger("batos.image")

T = TypeVar("T")

#: Seconds a ZEO client or a PostgreSQL connection waits for its server before a clear error.
ZEO_CONNECT_TIMEOUT = 10
#: What ZODB raises when an object record is damaged or missing: damage in the image itself.
LOAD_ERRORS: tuple[type[Exception], ...] = (POSKeyError, StateLoadError, CorruptedError)


@dataclass(frozen=True)
class TransactionRecord:
    """One entry of the image's transaction log, newest first in ``history``."""

    tid: str
    time: float
    user: str
    description: str


#: Whether opening a file image that does not exist creates it, where the caller does not say;
#: None where no ``creating`` block is in force (``LivingImage.open`` then creates it).
_CREATING: contextvars.ContextVar[bool | None] = contextvars.ContextVar("creating", default=None)


@contextmanager
def creating(allowed: bool) -> Iterator[None]:
    """Within the block, opening a missing file image creates it only if ``allowed``.

    The command line sets it once per command, so a command that only reads (inspect,
    history, search…) on a mistyped path fails clearly instead of making a new image there.
    """
    token = _CREATING.set(allowed)
    try:
        yield
    finally:
        _CREATING.reset(token)


def creating_in_force() -> bool | None:
    """What the innermost ``creating`` block allows, or None outside any."""
    return _CREATING.get()


#: The command changing the image, as the command line names it ("batos init").
_COMMAND: contextvars.ContextVar[str | None] = contextvars.ContextVar("command", default=None)


@contextmanager
def acting_for(command: str) -> Iterator[None]:
    """Within the block, transactions record ``command`` as what changed the image."""
    token = _COMMAND.set(command)
    try:
        yield
    finally:
        _COMMAND.reset(token)


def actor() -> str:
    """Who changes the image, as each transaction records it: 'OS user (command)'."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name for this uid (e.g. in a bare container)
        user = f"uid {os.getuid()}"
    command = _COMMAND.get() or Path(sys.argv[0]).name or "python"
    return f"{user} ({command})"


def default_uri() -> str:
    return settings.get_str("image")


def _with_default_blobs(uri: str) -> str:
    """Give file://, zeo:// and postgres:// URIs a blob directory unless the URI names one."""
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    path = image_path(uri)
    if path is not None:
        query.setdefault("blobstorage_dir", f"{path}.blobs")
        # zodburi reads a file URI's path as written, up to a '?': the decoded path goes to it
        return f"file://{path}?{urlencode(query)}"
    if parts.scheme == "zeo":
        if "blob_dir" not in query:
            label = (parts.netloc or Path(parts.path).name).replace(":", "_")
            query["blob_dir"] = str(Path(settings.get_str("home")) / "zeo-blob-cache" / label)
        query.setdefault("wait_timeout", str(ZEO_CONNECT_TIMEOUT))
    elif parts.scheme == "postgres":
        if "blob_dir" not in query:
            # Blobs live in the database (shared_blob_dir false), so every host sees them;
            # this folder is only this host's cache of them.
            label = f"{parts.hostname or 'localhost'}_{parts.port or 5432}_{parts.path[1:]}"
            query["blob_dir"] = str(Path(settings.get_str("home")) / "pg-blob-cache" / label)
            query.setdefault("shared_blob_dir", "false")
        query.setdefault("connect_timeout", str(ZEO_CONNECT_TIMEOUT))
    else:
        return uri
    return parts._replace(query=urlencode(query)).geturl()


def _cut(text: str, limit: int = 200) -> str:
    """A path or URI from the user, cut short for a message: errors never echo it whole."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _open_db(uri: str, *, create: bool) -> ZODB.DB:
    scheme = urlsplit(uri).scheme if ":" in uri else ""  # a scheme is read in any case
    in_force()  # the allow-list: a malformed BATOS_IMAGE_GLOBALS fails before anything opens
    resolved = _with_default_blobs(uri)
    try:
        factory, dbkw = zodburi.resolve_uri(resolved)
    except zodburi.NoResolverForScheme:
        raise ImageURIError(
            f"no storage for URI scheme {scheme!r} in {shown_uri(uri)!r}",
            hint="use file:///path/live_image.fs, zeo://host:port, memory:// or postgres://…",
        ) from None
    except (KeyError, ValueError) as exc:
        raise ImageURIError(
            f"image URI {_cut(repr(shown_uri(uri)))} is malformed: {exc}",
            hint="e.g. file:///path/live_image.fs, zeo://127.0.0.1:8100, memory://",
        ) from exc
    if scheme == "zeo":
        _prepare_blob_cache(Path(dict(parse_qsl(urlsplit(resolved).query))["blob_dir"]))
    if scheme == "postgres" and not create:
        _require_postgres_image(uri, resolved)
    if scheme != "file":
        return _connect(uri, factory, dbkw)
    path = image_path(uri)
    assert path is not None  # a file:// URI
    unusable = "give the path of a live_image.fs file in a folder you can write"
    try:
        exists = path.exists()
        if path.is_dir():
            raise ImageURIError(
                f"the image path {_cut(str(path))} is a folder",
                hint=f"name the image file inside it, e.g. {(path / 'live_image.fs').as_uri()}",
            )
        # An empty file is what a failed copy or 'touch' leaves: no image a command may write
        # its first transaction into, unless it is asked to create one.
        empty = exists and path.stat().st_size == 0
    except OSError as exc:  # a name too long, a component that is a file…
        raise ImageURIError(
            f"the image path {_cut(str(path))} cannot be used: {exc.strerror}", hint=unusable
        ) from None
    if exists and not empty:
        _check_file(uri, path)
    elif not create:
        raise ImageNotFoundError(
            f"no image at {_cut(str(path))}" + (" (the file there is empty)" if empty else ""),
            hint=f"run 'batos --image {shlex.quote(uri)} init' to create one, or check the path",
        )
    from store.core.image_file import set_aside_unsafe_index

    set_aside_unsafe_index(path)  # ZODB reads the index as it opens, new file or not
    try:
        added = _FilesAdded(path)
    except OSError as exc:  # a folder on the way is a file, or cannot be written
        raise ImageURIError(
            f"the image path {_cut(str(path))} cannot be used: {exc.strerror or exc}",
            hint=unusable,
        ) from None
    try:
        return _connect(uri, factory, dbkw)
    except ImageLockedError:
        raise  # the files are the other process's
    except BaseException:
        added.remove()
        raise


def _connect(uri: str, factory: Callable[[], Any], dbkw: dict[str, Any]) -> ZODB.DB:
    """Open the storage and the database on it, translating failures into ImageErrors.

    On a brand-new shared image another process may commit the root object first: the
    conflict is retried like any transaction's, and opening again finds the root.
    """

    def attempt() -> ZODB.DB:
        try:
            storage = factory()
        except Exception as exc:
            raise _translate_open_error(uri, exc) from exc
        try:
            return ImageDB(storage, **dbkw)
        except ConflictError:
            storage.close()
            raise
        except Exception as exc:
            storage.close()
            raise _translate_open_error(uri, exc) from exc

    return retry(
        attempt,
        what=f"creating the root of {shown_uri(uri)}",
        hint="retry; if it persists, check what else writes to the image",
    )


def _require_postgres_image(uri: str, resolved: str) -> None:
    """Refuse, as a missing file image is refused, a database that holds no image.

    RelStorage installs its tables in whatever database it opens: a command that only reads,
    pointed at an application's database or an empty one, would leave them there, and the
    runtime would then lay out a whole image beside the application's tables.
    """
    import psycopg2

    where = urlsplit(resolved)
    query = dict(parse_qsl(where.query))
    database = where.path[1:]
    try:
        # The same connection parameters RelStorage's resolver reads from the URI.
        conn = psycopg2.connect(
            dbname=database,
            user=where.username,
            password=where.password,
            host=where.hostname,
            port=where.port,
            connect_timeout=query.get("connect_timeout", ZEO_CONNECT_TIMEOUT),
            **({"sslmode": query["ssl_mode"]} if "ssl_mode" in query else {}),
        )
    except psycopg2.Error as exc:
        raise _postgres_error(uri, exc) from exc
    try:
        with conn.cursor() as cursor:
            # object_state holds every object record RelStorage writes, in both history modes.
            cursor.execute("SELECT to_regclass('object_state') IS NOT NULL")
            row = cursor.fetchone()
    except psycopg2.Error as exc:
        raise _postgres_error(uri, exc) from exc
    finally:
        conn.close()
    if not (row and row[0]):
        shown = shown_uri(uri)
        raise ImageNotFoundError(
            f"no image in the PostgreSQL database {database!r} ({shown})",
            hint=f"run 'batos --image {shlex.quote(shown)} init' to create one there, "
            "or check the database name",
        )


class _FilesAdded:
    """Makes the folders a file image needs, noting first what did not exist beside it.

    FileStorage adds the data file, its lock, temporary and index files, and BlobStorage the
    blob folder: when opening fails, ``remove`` takes away exactly what this open added.
    """

    def __init__(self, path: Path) -> None:
        blobs = Path(f"{path}.blobs")
        beside = [path, blobs, *(Path(f"{path}{s}") for s in _STORAGE_SUFFIXES)]
        self.files = [p for p in beside if not p.exists()]
        self.folders = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        blobs.mkdir(exist_ok=True)

    def remove(self) -> None:
        for added in self.files:
            if added.is_dir():
                shutil.rmtree(added, ignore_errors=True)
            else:
                added.unlink(missing_ok=True)
        for folder in self.folders:  # the deepest first; only while empty
            try:
                folder.rmdir()
            except OSError:
                break


#: Files FileStorage keeps beside its data file.
_STORAGE_SUFFIXES = (".lock", ".tmp", ".index", ".index.index_tmp")


def _prepare_blob_cache(blob_dir: Path) -> None:
    """Lay out a ZEO client's blob cache before ZEO does.

    ZODB creates the folders and then writes the layout marker, each after checking that it
    is missing: two clients starting at once collide on a folder, or one reads the marker
    while the other has only just created it, empty. Here the marker appears whole, in one
    rename.
    """
    from ZODB.blob import LAYOUT_MARKER

    (blob_dir / "tmp").mkdir(parents=True, exist_ok=True)
    marker = blob_dir / LAYOUT_MARKER
    if not marker.exists():
        write_text(marker, "zeocache")


def _check_file(uri: str, path: Path) -> None:
    """Refuse a damaged FileStorage before ZODB opens it, which would cut the damage off."""
    from store.core.image_file import check

    found = check(path)
    if found.sound:
        return
    if _locked_elsewhere(path):
        # Another process is writing: a commit in progress can look cut short to a reader.
        raise _locked_error(uri)
    if found.damage is not None:
        raise ImageCorruptError(
            f"the image {shown_uri(uri)} is damaged: {found.damage}; the {found.transactions:,} "
            "transactions before it are sound. Nothing was changed",
            hint=repair_hint(uri),
        )
    if found.uncommitted_tail:
        log.warning(
            "the image %s ends with a transaction that never committed (a process stopped "
            "mid-commit); it is dropped, its %d bytes kept in %s.trN",
            uri,
            found.size - found.end,
            path,
        )


def _locked_elsewhere(path: Path) -> bool:
    """Whether another process holds the FileStorage lock of ``path``; takes it only briefly."""
    import zc.lockfile

    lock_path = Path(f"{path}.lock")
    was_there = lock_path.exists()
    try:
        zc.lockfile.LockFile(str(lock_path)).close()
    except zc.lockfile.LockError:
        return True
    if not was_there:
        lock_path.unlink(missing_ok=True)
    return False


def _locked_error(uri: str) -> ImageLockedError:
    return ImageLockedError(
        f"the image {shown_uri(uri)} is in use by another process",
        hint="a file:// image allows one process; to share it, serve it with "
        "'batos zeo start' and point every process at BATOS_IMAGE=zeo://HOST:PORT",
    )


def repair_hint(uri: str) -> str:
    return (
        f"run 'batos --image {shown_uri(uri)} repair' to replace it by what ZODB can recover "
        "(the damaged file is kept beside it), or restore a backup"
    )


def load_error(uri: str, exc: Exception) -> ImageCorruptError:
    """The error to show for one of ``LOAD_ERRORS``: an object the image cannot give back."""
    if isinstance(exc, POSKeyError):
        what = f"object {exc} is missing"
    else:
        cause = exc.__cause__ or exc
        what = f"a stored object cannot be read ({type(cause).__name__}: {cause})"
    return ImageCorruptError(
        f"the image {shown_uri(uri)} is damaged: {what}", hint=repair_hint(uri)
    )


def _translate_open_error(uri: str, exc: Exception) -> ImageError:
    import zc.lockfile
    from ZODB.FileStorage.FileStorage import CorruptedFileStorageError, FileStorageFormatError

    name = type(exc).__name__
    if isinstance(exc, zc.lockfile.LockError):
        return _locked_error(uri)
    if isinstance(exc, (CorruptedError, CorruptedFileStorageError, FileStorageFormatError)):
        return ImageCorruptError(
            f"the image {shown_uri(uri)} is damaged or not a ZODB FileStorage: {exc}",
            hint=repair_hint(uri),
        )
    if name == "ClientDisconnected" or isinstance(exc, (ConnectionError, TimeoutError)):
        return ImageError(
            f"no ZEO server answers at {shown_uri(uri)}: {exc}",
            hint="start one with 'batos zeo start' (or check the host and port)",
        )
    if uri.startswith("postgres") and _is_database_error(exc):
        return _postgres_error(uri, exc)
    return ImageError(f"cannot open the image {shown_uri(uri)}: {name}: {exc}")


def _is_database_error(exc: Exception) -> bool:
    # psycopg2's errors, without importing psycopg2 where no postgres:// image is used.
    return any(c.__module__.startswith("psycopg2") for c in type(exc).__mro__)


def canonical_uri(uri: str) -> str:
    """``uri`` with libpq's ``postgresql://`` scheme written ``postgres://``, the name RelStorage
    registers with zodburi: both name the same server, and people copy the first from
    PostgreSQL's own documentation and tools."""
    if uri[:13].lower() == "postgresql://":
        return "postgres://" + uri[13:]
    return uri


def shown_uri(uri: str) -> str:
    """``uri`` as a person may see it: its password, if any, as ``***``.

    Every message, log line and table that names an image shows it through this: they end up
    in terminals, logs and bug reports, and a postgres:// URI carries the database password.
    """
    where = urlsplit(uri)
    if not where.password:
        return uri
    return where._replace(netloc=where.netloc.replace(f":{where.password}@", ":***@")).geturl()


#: What psycopg2 says, in its connection errors, when the server stopped or cannot be reached:
#: those errors carry no SQLSTATE to tell them from others.
_SERVER_GONE = (
    "server closed the connection",
    "connection refused",
    "could not connect",
    "terminating connection",
    "connection already closed",
    "no connection to the server",
    "could not receive data",
    "could not send data",
    "ssl connection has been closed",
    "timeout expired",
)


def database_error(uri: str, exc: BaseException) -> ImageError | None:
    """The ``ImageError`` for a database driver's error met while using the image at ``uri``,
    or None when ``exc`` is not one (only a postgres:// image raises them).

    A server that stops or restarts in the middle of a command leaves RelStorage's connections
    dead: each later use fails until the server answers again, when they reconnect by
    themselves. What was committed before is in the database; the transaction in progress, if
    any, was not committed unless PostgreSQL had finished committing it.
    """
    if not isinstance(exc, Exception) or not _is_database_error(exc):
        return None
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    lowered = text.lower()
    if type(exc).__name__ not in ("OperationalError", "InterfaceError") or not any(
        gone in lowered for gone in _SERVER_GONE
    ):
        return ImageError(
            f"the image {shown_uri(uri)} failed: PostgreSQL said: {first}",
            hint="check the server's log; retry the command if the cause was passing",
        )
    where = urlsplit(uri)
    server = f"{where.hostname or 'localhost'}:{where.port or 5432}"
    return ImageError(
        f"the PostgreSQL server at {server} went away or cannot be reached "
        f"(image {shown_uri(uri)}): {first}",
        hint="retry once the server is back (start it, e.g. 'pg_ctlcluster 15 main start' or "
        "your service manager): everything committed before is kept; a change in progress when "
        "it went away was not saved unless the server had finished committing it",
    )


@contextmanager
def _server_errors(uri: str) -> Iterator[None]:
    """Turns a database driver's error inside the block into ``database_error``'s."""
    try:
        yield
    except Exception as exc:
        translated = database_error(uri, exc)
        if translated is None:
            raise
        raise translated from exc


#: What libpq says when what answers on the port does not speak PostgreSQL's protocol (each
#: of its tries, with SSL and without, adds a line; the wording varies with what answered).
_NOT_POSTGRES = (
    "closed the connection unexpectedly",
    "SSL SYSCALL error",
    "expected authentication request from server",
    "received invalid response",
)


def _postgres_error(uri: str, exc: Exception) -> ImageError:
    """What a PostgreSQL image that cannot be opened needs: server, login or database."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    where = urlsplit(uri)
    uri = shown_uri(uri)
    server = f"{where.hostname or 'localhost'}:{where.port or 5432}"
    if "Connection refused" in text or "could not connect" in text or "timeout" in text:
        hint = (
            f"start PostgreSQL on {server} (e.g. 'pg_ctlcluster 15 main start' or your "
            "service manager), or check the host and port in the image URI"
        )
        return ImageError(f"no PostgreSQL server answers at {server} for {uri}: {first}", hint=hint)
    if "does not exist" in text and "database" in text:
        database = where.path.lstrip("/")
        hint = f"create it with 'createdb {database}' (RelStorage then adds its tables)"
        return ImageError(f"PostgreSQL at {server} has no database {database!r}", hint=hint)
    if any(said in text for said in _NOT_POSTGRES):
        # What libpq says of something on the port that is not PostgreSQL (an SSH or HTTP
        # server): it answered the connection, then not as a database server would.
        hint = (
            f"check the port in the image URI: PostgreSQL listens on 5432 unless configured "
            f"otherwise ('pg_lsclusters' lists the local ones); if {server} is PostgreSQL, its "
            "log says why it closed the connection"
        )
        return ImageError(
            f"what answers at {server} is not a PostgreSQL server that takes the login, "
            f"or it ended the connection at once: {first}",
            hint=hint,
        )
    if "permission denied" in text:
        # PostgreSQL 15 and later grant no CREATE on the public schema to a role that does
        # not own the database: a new image cannot lay out RelStorage's tables there, and a
        # role other than the owner of existing ones may not read them.
        role = where.username or "USER"
        database = where.path.lstrip("/") or "DB"
        hint = (
            f"open the image as the role that owns database {database!r} and its tables, or "
            f"give {role!r} its own database ('createdb -O {role} DB'); on a new database, "
            f"'ALTER DATABASE {database} OWNER TO {role}' and 'ALTER SCHEMA public OWNER TO "
            f"{role}' (in {database}) let it lay out the image"
        )
        return ImageError(
            f"PostgreSQL at {server} does not let role {role!r} use database {database!r} "
            f"for an image: {first}",
            hint=hint,
        )
    if "authentication" in text or "password" in text or "role" in text:
        hint = "check the user and password in the URI (postgres://USER:PASSWORD@HOST/DB)"
        return ImageError(f"PostgreSQL at {server} refused the login: {first}", hint=hint)
    return ImageError(
        f"cannot open the image {uri}: PostgreSQL said: {first}",
        hint="check the server's log; the image URI is postgres://USER:PASSWORD@HOST:PORT/DB",
    )


class LivingImage:
    """A ZODB database opened from a URI; the one way BAT OS reaches its image."""

    def __init__(self, db: ZODB.DB, uri: str) -> None:
        self.db = db
        self.uri = uri
        self.closed = False

    @classmethod
    def open(cls, uri: str | None = None, *, create: bool | None = None) -> LivingImage:
        """Open the image at ``uri`` (default: the ``image`` setting).

        A file:// image that does not exist is created only when ``create`` is true; left
        out, ``create`` follows ``creating()`` (true outside any ``creating`` block).
        """
        uri = canonical_uri(uri or default_uri())
        if create is None:
            create = _CREATING.get() is not False
        db = _open_db(uri, create=create)
        log.info("opened image %s", shown_uri(uri))
        return cls(db, uri)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.db.close()

    def _live_db(self) -> ZODB.DB:
        """The database, or a clear error once the image is closed (ZODB's own is an
        AttributeError from deep inside)."""
        if self.closed:
            raise ImageError(
                f"the image {shown_uri(self.uri)} is closed",
                hint="open it again (LivingImage.open or batos.shell.runtime.open_image)",
            )
        return self.db

    def __enter__(self) -> LivingImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections ----------------------------------------------------------------------

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection with its own explicit transaction manager, closed on exit.

        ZODB connections are not thread-safe: use one per thread (this call gives a fresh one).
        The caller decides when to commit or abort; anything left open is aborted.
        """
        tm = transaction.TransactionManager()
        with _server_errors(self.uri):
            conn = self._live_db().open(transaction_manager=tm)
            try:
                yield conn
            finally:
                tm.abort()
                conn.close()

    def transact(
        self,
        fn: Callable[[Any], T],
        *,
        note: str = "",
        user: str | None = None,
        retry_seconds: float | None = None,
    ) -> T:
        """Run ``fn(root)`` in one transaction, committing on success.

        A conflict (any ``TransientError``) aborts and runs ``fn`` again on fresh state, with
        jittered back-off, for up to ``retry_seconds`` (setting ``tx_retry_seconds``); ``fn``
        must therefore be safe to repeat. Past that, ``TransactionFailed``. Any other exception
        aborts — nothing of a failed call is ever committed — and propagates. The transaction
        records ``user`` (default: ``actor()``, the OS user and the command) and ``note``,
        which ``history`` lists.
        """
        with self.connection() as conn:
            return run_in_transaction(
                conn.transaction_manager,
                lambda: fn(conn.root()),
                note=note,
                user=user or actor(),
                seconds=retry_seconds,
            )

    @contextmanager
    def read(self) -> Iterator[Any]:
        """The root for reading; any attempt to commit a change raises ``ImageError``."""
        with self.connection() as conn:
            tm = conn.transaction_manager
            tm.begin()
            try:
                yield conn.root()
                if conn._registered_objects:
                    raise ImageError(
                        "a read-only view of the image was modified; nothing was saved",
                        hint="change the image through LivingImage.transact",
                    )
            finally:
                tm.abort()

    # -- history --------------------------------------------------------------------------

    def history(self, limit: int = 20) -> list[TransactionRecord]:
        """The newest undoable transactions, newest first."""
        if not self._live_db().supportsUndo():
            raise ImageError(
                f"the storage behind {shown_uri(self.uri)} keeps no undo history",
                hint="use a file:// image, a ZEO server over one, or history-preserving RelStorage",
            )
        with _server_errors(self.uri):
            return self._history(limit)

    def _history(self, limit: int) -> list[TransactionRecord]:
        return [
            TransactionRecord(
                tid=_tid_hex(entry["id"]),
                time=entry["time"],
                user=_text(entry.get("user_name", "")),
                description=_text(entry.get("description", "")),
            )
            for entry in self.db.undoLog(0, limit)
        ]

    def undo(self, tid: str, *, user: str | None = None) -> str:
        """Revert the transaction ``tid`` (as printed by ``history``) in a new transaction;
        returns what the undone transaction had recorded as its description."""
        with _server_errors(self.uri):
            return self._undo(tid, user=user)

    def _undo(self, tid: str, *, user: str | None) -> str:
        wanted = tid.strip().lower()
        for entry in self._live_db().undoLog(0, 10_000):
            if _tid_hex(entry["id"]) == wanted:
                break
        else:
            raise ImageError(
                f"no undoable transaction {_cut(repr(tid), 80)} in {shown_uri(self.uri)}",
                hint="list them with 'batos history'",
            )
        undone_by = [
            _tid_hex(later["id"])
            for later in self.db.undoLog(0, 10_000)
            if _text(later.get("description", b"")) == f"undo {wanted}"
        ]
        tm = transaction.TransactionManager()
        txn = tm.begin()
        txn.user = user or actor()
        txn.note(f"undo {wanted}")
        try:
            self.db.undo(entry["id"], txn)
            tm.commit()
            metrics.count("transactions_committed")
            return _text(entry.get("description", b""))
        except (UndoError, ReadOnlyError) as exc:
            tm.abort()
            metrics.count("transactions_aborted")
            if undone_by:
                raise ImageError(
                    f"transaction {wanted} was undone already, by transaction {undone_by[0]}",
                    hint=f"to bring its changes back, undo that one: 'batos undo {undone_by[0]}'",
                ) from exc
            # ZODB's message repeats itself ("Undo error 0x32: Undo error 0x32 …"): its reason
            # is the last part
            reason = str(exc).rsplit(":", 1)[-1].strip() or type(exc).__name__
            raise ImageError(
                f"transaction {wanted} cannot be undone ({reason})",
                hint="a later transaction changed the same objects; undo that one first",
            ) from exc


def _tid_hex(raw: bytes | str) -> str:
    # FileStorage and ZEO report undo ids base64-encoded; others give the 8 raw bytes.
    if isinstance(raw, str):
        raw = raw.encode("ascii")
    if len(raw) != 8:
        raw = base64.decodebytes(raw)
    return raw.hex()


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def image_path(uri: str) -> Path | None:
    """The FileStorage path of a file:// URI, or None for other schemes.

    The path is percent-decoded, as a file URI writes it (``Path.as_uri`` gives
    ``file:///tmp/my%20images/live_image.fs``); the scheme is read in any case. A file URI
    that names a host (``file://relative/dir/x.fs`` reads "relative" as one), carries a
    fragment (an unencoded '#'), or has no absolute path is refused: each would put the image
    somewhere other than where it was asked for.
    """
    parts = urlsplit(uri)
    if parts.scheme != "file":
        return None
    shown = _cut(repr(uri))
    if parts.netloc not in ("", "localhost"):
        meant = Path(parts.netloc + parts.path).absolute().as_uri()
        raise ImageURIError(
            f"image URI {shown} names the host {parts.netloc!r}: a file image is a path here",
            hint=f"write the absolute path after three slashes, e.g. {meant}",
        )
    if parts.fragment or uri.endswith("#"):
        raise ImageURIError(
            f"image URI {shown} has a '#', which ends a URI's path",
            hint="write a '#' in a folder's name as %23 (Path.as_uri() does)",
        )
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise ImageURIError(
            f"image URI {shown} has no absolute path",
            hint="write it as file:///abs/path/live_image.fs",
        )
    if "?" in path or "\0" in path:
        raise ImageURIError(
            f"the image path in {shown} holds a '?' or a NUL, which a storage URI cannot carry",
            hint="keep the image in a folder whose name has neither",
        )
    return Path(path)


class _SharedImages:
    """One open ``LivingImage`` per URI in this process, reference-counted.

    The LangGraph server enters its checkpointer and store factories once per event-loop
    thread, and a file:// image can be opened only once per process, so they share it. The
    registry lives here, in a module imported under one name only, because the server loads
    ``./file.py:factory`` paths as modules of their own names.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[LivingImage, int]] = {}

    @staticmethod
    def _key(uri: str) -> str:
        """One key per image: ``FILE:///x.fs``, ``file:///x%2Efs``, ``file:///a/../x.fs`` and a
        link to it name one file, which a second opening in this process would find locked."""
        path = image_path(uri)
        return uri if path is None else path.resolve().as_uri()

    def acquire(self, uri: str) -> LivingImage:
        """Never creates a file image: a server started on a mistyped or missing path would
        otherwise serve a new, empty image instead of the user's."""
        key = self._key(uri)
        with self._lock:
            image, count = self._open.get(key, (None, 0))
            if image is None:
                image = LivingImage.open(uri, create=False)
            self._open[key] = (image, count + 1)
            return image

    def release(self, uri: str) -> None:
        key = self._key(uri)
        with self._lock:
            image, count = self._open[key]
            if count > 1:
                self._open[key] = (image, count - 1)
                return
            del self._open[key]
        image.close()


_SHARED = _SharedImages()


def _refuse_blocking_detector(uri: str) -> None:
    """A ZEO client reads its cache file in its own event loop, by design; the LangGraph dev
    server's blocking-call detector (on unless ``--allow-blocking``, which it records in this
    variable) raises there, so every load would fail and end as a misleading conflict."""
    if urlsplit(uri).scheme == "zeo" and os.environ.get("LANGGRAPH_ALLOW_BLOCKING") == "false":
        raise ConfigurationError(
            f"the LangGraph dev server cannot serve the ZEO image {_cut(uri)} with its "
            "blocking-call detector on",
            hint="run 'langgraph dev --allow-blocking', or 'batos serve' (which passes it for "
            "zeo:// images)",
        )


def acquire_shared(uri: str) -> LivingImage:
    """The process's one open image at ``uri`` (opened on first use); pair with release.

    Raises ``ConfigurationError`` for a ``zeo://`` image in a LangGraph dev server that
    detects blocking calls (it needs ``--allow-blocking``)."""
    _refuse_blocking_detector(uri)
    return _SHARED.acquire(uri)


def release_shared(uri: str) -> None:
    """Drop one use of the shared image at ``uri``; the last use closes it."""
    _SHARED.release(uri)


@asynccontextmanager
async def shared_image(uri: str | None = None) -> AsyncIterator[LivingImage]:
    """The shared image of this server process: one open ``LivingImage`` per URI.

    ``uri`` defaults to the ``image`` setting. The first user opens it, the last one leaving
    closes it; opening and closing run in the event loop's executor, since both can block.
    langgraph.json's checkpointer and store factories both hold the image through this.
    """
    uri = uri or default_uri()
    _refuse_blocking_detector(uri)
    loop = asyncio.get_running_loop()
    image = await loop.run_in_executor(None, _SHARED.acquire, uri)
    try:
        yield image
    finally:
        await loop.run_in_executor(None, _SHARED.release, uri)
