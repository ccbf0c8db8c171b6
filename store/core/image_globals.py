"""What an image's records may name: the allow-list every unpickling of image data goes through.

A ZODB record is a pickle, and unpickling one calls whatever global it names, so an image
written by anyone else could run any importable function (``os.system``) in every process that
opens it. Here every global a record names is resolved against an allow-list instead:

- classes (nothing but types) of BAT OS's own packages and of the libraries the image is made
  of (``CLASS_PACKAGES``); a class that no longer exists there becomes ZODB's ``Broken``, as
  it always did;
- a short list of other globals records need (``GLOBALS``);
- what the ``image_globals`` setting adds, for an image the user trusts.

Anything else raises ``ImageGlobalRefused`` before it is imported, so nothing it names runs.
``ImageDB`` puts the allow-list on every database ``LivingImage`` opens and names the record
in the error; ``guard_zodb`` puts it on the places ZODB unpickles stored data by itself
(conflict resolution, and the class a ``ConflictError`` names); ``is_plain_data`` tells a
pickle that builds nothing but data (a FileStorage index) from one that names code.
"""

from __future__ import annotations

import importlib
import io
import logging
import pickletools
import sys
import threading
from _compat_pickle import IMPORT_MAPPING, NAME_MAPPING
from typing import Any

import ZODB
import ZODB._compat
import ZODB.ConflictResolution
import ZODB.Connection
import ZODB.FileStorage.FileStorage
import ZODB.fstools
import ZODB.utils
from ZODB.broken import find_global
from ZODB.Connection import Connection
from ZODB.POSException import StateLoadError

from batos import settings
from batos.errors import ImageGlobalRefused

log = logging.getLogger("batos.image")

#: Packages whose classes a record may name: BAT OS's own rooms, old module names included
#: (``batos.moved`` keeps them importable), and the persistence and indexing libraries the image
#: is built from. Every global in every record of the images the project writes (``batos
#: init``, ``ingest``, ``ask``, ``send``, the heartbeat, ``prune``, ``pack``, the test suite's
#: file images), read opcode by opcode, is a class of one of these or ZODB's Blob. Only
#: classes: a function of these packages is refused like any other.
CLASS_PACKAGES = (
    "batos",
    "graph",
    "prototypes",
    "store",
    "persistent",
    "BTrees",
    "zope.index",
)

#: Globals outside those packages a record may name: ZODB's blob, and Python's own value
#: types, which a pickle of protocol 3 writes as a call of their class. No image the project
#: writes holds them, but a slot may (a set, a date, a Decimal); each only builds a value from
#: the values it is given.
GLOBALS = frozenset(
    {
        ("ZODB.blob", "Blob"),
        *(
            ("builtins", name)
            for name in "bool int float complex str bytes bytearray tuple list dict set "
            "frozenset".split()
        ),
        *(("datetime", name) for name in ("date", "datetime", "time", "timedelta", "timezone")),
        *(("collections", name) for name in ("OrderedDict", "deque", "defaultdict", "Counter")),
        ("decimal", "Decimal"),
        ("fractions", "Fraction"),
        ("uuid", "UUID"),
    }
)


def _in_packages(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in CLASS_PACKAGES)


#: How a global the allow-list has may be resolved: to whatever it is, or only to a class.
_ANY, _CLASS = "any", "class"


class ImageGlobals:
    """The allow-list in force: the built-in one plus ``extra`` (the setting's entries)."""

    def __init__(self, extra: str = "") -> None:
        entries = [e for e in extra.split(",") if e]
        self.modules = frozenset(e[:-2] for e in entries if e.endswith(".*"))
        self.globals = GLOBALS | {
            (module, name) for module, _, name in (e.rpartition(".") for e in entries)
        }
        #: The rule of each global named so far (refused ones are not kept: a forged image
        #: could name any number of them).
        self._rules: dict[tuple[str, str], str] = {}

    def _rule(self, module: str, name: str) -> str | None:
        if (module, name) in NAME_MAPPING:  # Python 2 names, as ZODB maps them
            module, name = NAME_MAPPING[(module, name)]
        module = IMPORT_MAPPING.get(module, module)
        if (module, name) in self.globals or module in self.modules:
            return _ANY
        # A package's __main__ runs a program when imported: never a place for a class.
        if "__main__" not in module.split(".") and _in_packages(module):
            return _CLASS
        return None

    def resolve(self, module: str, name: str) -> Any:
        """The global ``module.name`` if the allow-list has it (a ``Broken`` class where it
        no longer exists); ``ImageGlobalRefused`` without importing anything if not."""
        key = (module, name)
        rule = self._rules.get(key)
        if rule is None:
            rule = self._rule(module, name)
            if rule is None:
                raise ImageGlobalRefused(module, name)
            self._rules[key] = rule
        # ZODB's own resolver, looked up on every call as ZODB does: a class removed since
        # becomes Broken, one put back is found again.
        found = find_global(module, name)
        # A class the package defines, not one it imports: a module's namespace also holds
        # what it imported (functools.partial, the module type, a thread pool), which would
        # widen the list with every import. A Broken class names the module asked for.
        if rule is _CLASS and not (
            isinstance(found, type) and _in_packages(getattr(found, "__module__", "") or "")
        ):
            raise ImageGlobalRefused(module, name)
        return found


_lock = threading.Lock()
_in_force: tuple[str, ImageGlobals] | None = None


def in_force() -> ImageGlobals:
    """The allow-list of the ``image_globals`` setting in force (read on each call, like
    every setting; built again only when it changes)."""
    global _in_force
    text = settings.raw_text("image_globals")
    current = _in_force
    if current is None or current[0] != text:
        policy = ImageGlobals(settings.get_str("image_globals"))
        with _lock:
            current = _in_force = (text, policy)
    return current[1]


def class_factory(connection: Connection | None, module: str, name: str) -> Any:
    """ZODB's ``class_factory``: every global a connection's records name comes here, and
    is resolved by the allow-list in force when the connection was opened."""
    policy = getattr(connection, "image_globals", None) or in_force()
    return policy.resolve(module, name)


def _refused(exc: BaseException) -> ImageGlobalRefused | None:
    # ZODB wraps what a state's unpickling raises in a StateLoadError.
    if isinstance(exc, ImageGlobalRefused):
        return exc
    if isinstance(exc, StateLoadError) and isinstance(exc.__cause__, ImageGlobalRefused):
        return exc.__cause__
    return None


class ImageConnection(Connection):
    """A connection that reads the allow-list as it opens, and whose refusals name the
    record that named the refused global."""

    image_globals: ImageGlobals | None = None

    def open(self, *args: Any, **kw: Any) -> None:
        # Read once per use of the connection, not per global: a record names several, and a
        # setting is an environment lookup.
        self.image_globals = in_force()
        try:
            super().open(*args, **kw)
        except BaseException:
            # ZODB's open can fail after taking the connection from the pool and before the
            # transaction manager knows it (RelStorage polls a server that has gone away):
            # handed back now, or closing the database fails on it with a bare KeyError.
            self.transaction_manager = None
            self._db._returnToPool(self)
            raise

    def get(self, oid: bytes) -> Any:
        try:
            return super().get(oid)
        except (ImageGlobalRefused, StateLoadError) as exc:
            refused = _refused(exc)
            if refused is None or refused.oid is not None:
                raise
            raise ImageGlobalRefused(refused.module, refused.name, oid=oid) from None

    def setstate(self, obj: Any) -> None:
        try:
            super().setstate(obj)
        except (ImageGlobalRefused, StateLoadError) as exc:
            refused = _refused(exc)
            if refused is None or refused.oid is not None:
                raise
            raise ImageGlobalRefused(refused.module, refused.name, oid=obj._p_oid) from None


class ImageDB(ZODB.DB):
    """A ZODB database whose records are unpickled through the allow-list."""

    klass = ImageConnection

    def __init__(self, storage: Any, **kw: Any) -> None:
        in_force()  # a malformed setting fails here, before any record is read
        guard_zodb()
        # Set before the base class reads the root: no record is unpickled without it.
        super().__init__(storage, class_factory=class_factory, **kw)


def _conflict_find_global(*args: Any) -> Any:
    """ZODB's conflict resolution resolves the globals of stored states through this."""
    return in_force().resolve(*args)


def pickled_class_name(data: bytes) -> tuple[str, str]:
    """The module and name of the class a record's first pickle names, read from its opcodes
    without unpickling it; two empty strings where it names none."""
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
            if opcode.name in ("GLOBAL", "INST"):
                module, _, name = str(arg).partition(" ")
                return module, name
            if opcode.name == "STOP":
                break
    except Exception:  # bytes that are no pickle name no class
        pass
    return "", ""


class _RefusalNotLogged(logging.Filter):
    """ZODB logs every state it could not load, traceback and all, before it raises; a
    refusal reaches its caller as an ``ImageGlobalRefused`` naming the record and what to do,
    which says it once, so the log's copies of it are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        raised = record.exc_info[1] if record.exc_info else None
        return raised is None or _refused(raised) is None


_REFUSAL_NOT_LOGGED = _RefusalNotLogged()


def transaction_extension(data: bytes) -> dict[str, Any]:
    """A transaction's extension metadata, read only when its pickle builds plain data; {}
    otherwise (with a warning). BAT OS reads a transaction's user and description only, and
    writes no extension; one that names a global was written by something else."""
    if not data:
        return {}
    if not is_plain_data(data):
        log.warning(
            "a transaction's extension metadata names code, which BAT OS does not run: "
            "it is read as empty"
        )
        return {}
    value = ZODB._compat.loads(data)
    return value if isinstance(value, dict) else {}


#: What a ZEO client's pickled messages may name, in the server: value types, and the prefix
#: ZEO's undo filters use. ZEO's own list allows all of ``builtins`` (``eval``, ``exec``,
#: ``open``), which let anyone who could reach the port run code in the server.
ZEO_MESSAGE_GLOBALS = frozenset(
    {
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytes"),
        ("builtins", "bytearray"),
        ("builtins", "complex"),
        ("builtins", "slice"),
        ("__builtin__", "set"),
        ("__builtin__", "frozenset"),
        ("zodbpickle", "binary"),
        ("ZopeUndo.Prefix", "Prefix"),
    }
)


def zeo_message_global(module: str, name: str) -> Any:
    """ZEO's server-side ``find_global``, held to ``ZEO_MESSAGE_GLOBALS``."""
    if (module, name) not in ZEO_MESSAGE_GLOBALS:
        raise ImportError(f"a ZEO message may not name {module[:80]}.{name[:80]}")
    return getattr(importlib.import_module(module), name)


def guard_zodb() -> None:
    """Put the allow-list on the places ZODB (and RelStorage) unpickle stored data by
    themselves, in this process.

    Conflict resolution unpickles the stored states of a conflicting object with a resolver of
    its own, which imports anything; a ``ConflictError`` given a record names its class by
    loading the record's first pickle with no resolver at all; a transaction's extension
    metadata is unpickled with no resolver by every reader of the history (``undoLog``,
    ``history``, a storage's iterator), in a ZEO server too. ZODB looks each up by its
    module-level name on every use, and those names are the only hooks they have. A refusal
    in conflict resolution ends as the ConflictError the conflict would have been without it.
    """
    ZODB.ConflictResolution.find_global = _conflict_find_global
    ZODB.utils.get_pickle_metadata = pickled_class_name
    ZODB.Connection.loads = transaction_extension  # TransactionMetaData.extension
    # the package's name FileStorage is the class; the module is only in sys.modules
    file_storage: Any = sys.modules["ZODB.FileStorage.FileStorage"]
    file_storage.loads = transaction_extension  # undoLog, history
    ZODB.fstools.loads = transaction_extension
    try:
        import relstorage.storage.history as relstorage_history
    except ImportError:  # no RelStorage here, so no postgres:// image either
        pass
    else:
        relstorage_history.loads = transaction_extension  # undoLog, history
    import ZEO.asyncio.marshal

    ZEO.asyncio.marshal.server_find_global = zeo_message_global  # a server's client messages
    logging.getLogger("ZODB.Connection").addFilter(_REFUSAL_NOT_LOGGED)  # once: a set


#: Opcodes that build plain data only: no global, no call, no persistent reference.
_DATA_OPCODES = frozenset(
    """PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2
    LONG LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING BINBYTES SHORT_BINBYTES
    BINBYTES8 UNICODE SHORT_BINUNICODE BINUNICODE BINUNICODE8 EMPTY_TUPLE TUPLE TUPLE1 TUPLE2
    TUPLE3 EMPTY_LIST APPEND APPENDS LIST EMPTY_DICT DICT SETITEM SETITEMS PUT BINPUT
    LONG_BINPUT MEMOIZE GET BINGET LONG_BINGET""".split()
)


def is_plain_data(data: bytes) -> bool:
    """Whether every pickle in ``data`` (one after another) builds plain data only; False
    also for bytes that are no pickle. Reads the opcodes, runs none."""
    stream = io.BytesIO(data)
    try:
        while stream.tell() < len(data):
            stopped = False
            for opcode, _, _ in pickletools.genops(stream):
                if opcode.name not in _DATA_OPCODES:
                    return False
                stopped = opcode.name == "STOP"
            if not stopped:
                return False
    except Exception:  # not a pickle, or cut short
        return False
    return True
