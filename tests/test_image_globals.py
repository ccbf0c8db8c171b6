"""What an image's records may name: forged records that would run code are refused, and
nothing they name runs; images BAT OS writes load; the setting allows more; Broken stays."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import transaction
from BTrees.Length import Length
from persistent import Persistent
from persistent.mapping import PersistentMapping
from ZODB.broken import Broken
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import ConflictError

from batos.errors import ConfigurationError, ImageGlobalRefused
from batos.shell.cli import main
from batos.shell.runtime import open_image
from store.core.image import LivingImage
from store.core.image_globals import ImageGlobals, is_plain_data

ROOT = Path(__file__).resolve().parents[1]


def _text(value: str) -> bytes:
    """A pickle's BINUNICODE of ``value``."""
    raw = value.encode()
    return b"X" + len(raw).to_bytes(4, "little") + raw


def _open_call(marker: Path) -> bytes:
    """Pickle opcodes (no PROTO, no STOP) of ``builtins.open(marker, 'w')``: run, it creates
    the marker file."""
    return b"cbuiltins\nopen\n" + _text(str(marker)) + _text("w") + b"\x86R"


def _state(marker: Path) -> bytes:
    return b"\x80\x03" + _open_call(marker) + b"."


#: The class pickle ZODB writes for a PersistentMapping.
MAPPING_CLASS = b"\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00N\x86q\x01."


class Call:
    """A value that pickles as a call of ``function(*args)``: what a forged record holds."""

    def __init__(self, function, *args):
        self.call = (function, args)

    def __reduce__(self):
        return self.call


def _store_raw(image: LivingImage, oid: bytes, data: bytes) -> None:
    """Write ``data`` as the record of ``oid`` through the storage itself, as anything that can
    write the image file (or reach its server) can."""
    storage = image.db.storage
    _, serial = storage.load(oid)
    meta = TransactionMetaData()
    storage.tpc_begin(meta)
    storage.store(oid, serial, data, "", meta)
    storage.tpc_vote(meta)
    storage.tpc_finish(meta)


def _victim(uri: str) -> bytes:
    """A new image at ``uri`` holding root['victim'], a PersistentMapping; its oid."""
    with LivingImage.open(uri) as image:
        image.transact(lambda root: root.__setitem__("victim", PersistentMapping(a=1)))
        with image.read() as root:
            return root["victim"]._p_oid


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "marker"


def test_a_state_that_calls_code_is_refused_and_nothing_runs(file_uri, marker):
    oid = _victim(file_uri)
    with LivingImage.open(file_uri) as image:
        _store_raw(image, oid, MAPPING_CLASS + _state(marker))
    with LivingImage.open(file_uri) as image:
        with pytest.raises(ImageGlobalRefused) as refused, image.read() as root:
            dict(root["victim"])
    assert not marker.exists()
    error = refused.value
    assert (error.module, error.name, error.oid) == ("builtins", "open", oid)
    assert f"record 0x{oid.hex()}" in error.message and "builtins.open" in error.message
    # a function: the hint does not invite allowing it
    assert "BATOS_IMAGE_GLOBALS" not in error.hint and "a function, most likely" in error.hint
    assert error.exit_code == 3
    named_class = ImageGlobalRefused("subprocess", "Popen")
    assert "BATOS_IMAGE_GLOBALS='subprocess.Popen'" in named_class.hint


def test_a_class_pickle_that_calls_code_is_refused_and_nothing_runs(file_uri, marker):
    oid = _victim(file_uri)
    forged_class = b"\x80\x03" + _open_call(marker) + b"N\x86."
    state = b"\x80\x03}q\x00X\x04\x00\x00\x00datas."
    with LivingImage.open(file_uri) as image:
        _store_raw(image, oid, forged_class + state)
    with LivingImage.open(file_uri) as image:
        with image.connection() as conn:  # read by oid: the class pickle makes the ghost
            with pytest.raises(ImageGlobalRefused, match=re.escape(f"record 0x{oid.hex()}")):
                conn.get(oid)
        with pytest.raises(ImageGlobalRefused), image.read() as root:  # or through a parent
            dict(root["victim"])
    assert not marker.exists()


def test_a_global_of_protocol_4_is_no_way_round(file_uri, marker):
    """ZODB's unpickler reads protocol 3 at most; were it to read STACK_GLOBAL, that too would
    be resolved through the allow-list."""
    from ZODB.POSException import StateLoadError

    oid = _victim(file_uri)
    call = b"\x8c\x08builtins\x8c\x04open\x93" + _text(str(marker)) + _text("w") + b"\x86R"
    with LivingImage.open(file_uri) as image:
        _store_raw(image, oid, MAPPING_CLASS + b"\x80\x04" + call + b".")
    with LivingImage.open(file_uri) as image:
        with pytest.raises((StateLoadError, ImageGlobalRefused)), image.read() as root:
            dict(root["victim"])
    assert not marker.exists()


def _popen(marker: Path) -> Call:
    return Call(subprocess.Popen, ["touch", str(marker)])


def _exec(marker: Path) -> Call:
    return Call(exec, f"open({str(marker)!r}, 'w')")


def _our_function(marker: Path) -> Call:
    from store.core.files import write_text

    return Call(write_text, marker, "x")


@pytest.mark.parametrize(
    ("forge", "named"),
    [
        (_popen, "subprocess.Popen"),  # a class, but of no package on the list
        (_exec, "builtins.exec"),
        (_our_function, "store.core.files.write_text"),  # of our packages only classes load
    ],
)
def test_refused_on_every_image_kind(any_image_uri, marker, forge, named):
    """Forged with ZODB's own pickler: a value whose pickle is a call, on every storage."""
    with LivingImage.open(any_image_uri) as image:
        image.transact(lambda root: root.__setitem__("victim", PersistentMapping(v=forge(marker))))
        image.db.cacheMinimize()  # a ghost again: the next read unpickles the record
        with pytest.raises(ImageGlobalRefused, match=re.escape(named)), image.read() as root:
            root["victim"]["v"]
    assert not marker.exists()


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("store.checkpoint.saver", "partial"),  # functools.partial, imported there
        ("batos.moved", "ModuleType"),  # the module type
    ],
)
def test_a_class_a_package_imported_is_not_one_of_its_own(module: str, name: str) -> None:
    with pytest.raises(ImageGlobalRefused, match=re.escape(f"{module}.{name}")):
        ImageGlobals().resolve(module, name)
    assert ImageGlobals().resolve("persistent.mapping", "PersistentMapping") is PersistentMapping
    assert issubclass(ImageGlobals().resolve("store.knowledge.catalog", "NoSuchClass"), Broken)


def test_what_init_writes_loads_record_by_record(file_uri):
    with open_image(file_uri, create=True):
        pass
    with LivingImage.open(file_uri) as image, image.connection() as conn:
        oids = {record.oid for txn in image.db.storage.iterator() for record in txn}
        for oid in oids:
            conn.get(oid)._p_activate()  # each record, whether anything reaches it or not
    assert len(oids) > 50


def test_the_setting_allows_a_global_or_a_module(file_uri, monkeypatch):
    import ipaddress

    with LivingImage.open(file_uri) as image:
        image.transact(
            lambda root: root.__setitem__("m", PersistentMapping(ip=ipaddress.ip_address("::1")))
        )
    with LivingImage.open(file_uri) as image:
        with pytest.raises(ImageGlobalRefused, match=r"ipaddress\.IPv6Address"):
            with image.read() as root:
                root["m"]["ip"]
    for allowed in ("ipaddress.IPv6Address", "collections.ChainMap, ipaddress.*"):
        monkeypatch.setenv("BATOS_IMAGE_GLOBALS", allowed)
        with LivingImage.open(file_uri) as image, image.read() as root:
            assert root["m"]["ip"] == ipaddress.ip_address("::1")


@pytest.mark.parametrize(
    "value",
    ["os", "os.", ".system", "os.system()", "os.sys tem", "*", "os.*.x", "a." + "b" * 300],
)
def test_a_malformed_setting_fails_before_the_image_opens(file_uri, monkeypatch, value):
    monkeypatch.setenv("BATOS_IMAGE_GLOBALS", value)
    with pytest.raises(ConfigurationError, match="BATOS_IMAGE_GLOBALS"):
        LivingImage.open(file_uri)


def test_the_setting_holds_at_most_so_many_entries(monkeypatch):
    from batos import settings

    many = ",".join(f"m{i}.Thing" for i in range(settings.MAX_IMAGE_GLOBALS + 1))
    monkeypatch.setenv("BATOS_IMAGE_GLOBALS", many)
    with pytest.raises(ConfigurationError, match="at most"):
        settings.get("image_globals")
    monkeypatch.setenv("BATOS_IMAGE_GLOBALS", " a.B ,, a.B , c.d.* ")
    assert settings.get("image_globals") == "a.B,c.d.*"


class Gone(Persistent):
    """A class of ours that a later version removes."""


def test_a_class_removed_from_our_packages_loads_broken(file_uri, monkeypatch):
    module = types.ModuleType("store.removed_since")
    module.Gone = Gone
    monkeypatch.setattr(Gone, "__module__", module.__name__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with LivingImage.open(file_uri) as image:
        image.transact(lambda root: root.__setitem__("gone", Gone()))
    monkeypatch.undo()  # the module is gone, as after an upgrade that removed it
    with LivingImage.open(file_uri) as image, image.read() as root:
        assert isinstance(root["gone"], Broken)
        assert type(root["gone"]).__module__ == "store.removed_since"


def test_nothing_outside_the_list_is_imported_to_decide(tmp_path):
    # A package's __main__ runs a program when imported, ours included.
    script = textwrap.dedent(
        """
        import sys
        from batos.errors import ImageGlobalRefused
        from store.core.image_globals import ImageGlobals
        for module in ("batos.shell.cli.__main__", "antigravity", "this"):
            try:
                ImageGlobals().resolve(module, "main")
            except ImageGlobalRefused:
                pass
            assert module not in sys.modules, module
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_python_2_names_are_judged_by_what_they_map_to():
    globals_ = ImageGlobals()
    assert globals_.resolve("__builtin__", "set") is set
    with pytest.raises(ImageGlobalRefused):
        globals_.resolve("__builtin__", "eval")


def test_a_conflict_resolved_against_a_forged_state_runs_nothing(file_uri, marker):
    with LivingImage.open(file_uri) as image:
        image.transact(lambda root: root.__setitem__("count", Length(1)))
        tm = transaction.TransactionManager()
        conn = image.db.open(transaction_manager=tm)
        length = conn.root()["count"]
        length.change(1)  # Length resolves conflicts from the stored states
        # Meanwhile the record is rewritten with a state that calls code.
        _store_raw(image, length._p_oid, b"\x80\x03cBTrees.Length\nLength\nq\x00." + _state(marker))
        with pytest.raises(ConflictError):
            tm.commit()
        tm.abort()
        conn.close()
    assert not marker.exists()


def test_a_zeo_client_cannot_run_code_in_the_server(tmp_path, marker):
    """A client's conflicting store is unpickled by the server (conflict resolution, then the
    ConflictError naming its class): neither resolves anything off the list."""
    from store.core.zeo import ZeoServer

    inst = b"\x80\x03(" + _text(str(marker)) + _text("w") + b"ibuiltins\nopen\n."
    with ZeoServer(tmp_path / "zeo" / "live_image.fs") as server:
        with LivingImage.open(server.uri) as image:
            image.transact(lambda root: root.__setitem__("count", Length(1)))
            with image.read() as root:
                oid = root["count"]._p_oid
            storage = image.db.storage
            _, old = storage.load(oid)
            _store_raw(image, oid, b"\x80\x03cBTrees.Length\nLength\nq\x00.\x80\x03K\x05.")
            meta = TransactionMetaData()
            storage.tpc_begin(meta)
            storage.store(oid, old, inst + b"\x80\x03K\x07.", "", meta)  # against the old one
            with pytest.raises(ConflictError):
                storage.tpc_vote(meta)
            storage.tpc_abort(meta)
    assert not marker.exists()


def test_a_forged_index_file_is_set_aside_and_rebuilt(file_uri, marker):
    with LivingImage.open(file_uri) as image:
        image.transact(lambda root: root.__setitem__("kept", PersistentMapping(a=1)))
    path = Path(file_uri.removeprefix("file://"))
    index = Path(f"{path}.index")
    assert is_plain_data(index.read_bytes())  # what FileStorage writes: data only
    index.write_bytes(_state(marker))
    with LivingImage.open(file_uri) as image, image.read() as root:
        assert dict(root["kept"]) == {"a": 1}
    assert not marker.exists()
    assert Path(f"{index}.refused").exists()
    assert is_plain_data(index.read_bytes())  # the one ZODB wrote again


def test_a_forged_index_that_cannot_be_set_aside_refuses_the_image(file_uri, marker, monkeypatch):
    """A folder the user cannot write (a read-only share) gave a raw PermissionError."""
    import os

    from batos.errors import ImageError

    with LivingImage.open(file_uri) as image:
        image.transact(lambda root: root.__setitem__("kept", PersistentMapping(a=1)))
    index = Path(f"{file_uri.removeprefix('file://')}.index")
    index.write_bytes(_state(marker))

    def read_only(*args, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", read_only)
    with pytest.raises(ImageError, match="cannot be set aside") as refused:
        LivingImage.open(file_uri)
    assert f"delete {index}" in refused.value.hint
    assert not marker.exists()


def test_reading_references_never_resolves_a_global(marker):
    """Pack and the doctor read a record's references with noload: no global is looked up."""
    from ZODB.serialize import referencesf

    assert referencesf(MAPPING_CLASS + _state(marker)) == []
    assert not marker.exists()


def test_a_forged_value_is_reported_by_the_command_line(capsys, caplog, file_uri, marker):
    main(["--image", file_uri, "init"])
    with LivingImage.open(file_uri) as image:
        image.transact(lambda root: setattr(root["objects"]["brick"], "x", Call(open, marker, "w")))
    capsys.readouterr()
    with caplog.at_level(logging.ERROR, logger="ZODB.Connection"):
        code = main(["--image", file_uri, "inspect", "brick"])
    _, err = capsys.readouterr()
    assert code == 3
    assert "names io.open" in err and "open it only if you trust" in err
    assert not marker.exists()
    # said once, by the error: ZODB's own log of the load, with its traceback, was two more
    assert not [r for r in caplog.records if "Couldn't load state" in r.getMessage()]


def test_only_the_image_opens_a_zodb_database():
    """Every database the project opens is an ImageDB: no other module calls ZODB's DB."""
    opened = re.compile(r"\bDB\(")
    found = [
        str(path.relative_to(ROOT))
        for room in ("batos", "graph", "prototypes", "store")
        for path in (ROOT / room).rglob("*.py")
        if path.name != "image_globals.py" and opened.search(path.read_text(encoding="utf-8"))
    ]
    assert found == []


def _commit_with_extension(db, marker: Path) -> None:
    """A transaction whose extension metadata is a pickled call, as ZODB itself writes it."""
    manager = transaction.TransactionManager()
    conn = db.open(transaction_manager=manager)
    try:
        conn.root()["touched"] = conn.root().get("touched", 0) + 1
        txn = manager.get()
        txn.note("a perfectly normal change")
        txn.setExtendedInfo("x", Call(open, str(marker), "w"))
        manager.commit()
    finally:
        conn.close()


def test_a_transactions_extension_metadata_runs_nothing(lasting_image_uri, tmp_path, marker):
    """ZODB (and RelStorage) unpickle a transaction's extension metadata with no resolver at
    all wherever the history is read: 'batos history', undo, the heartbeat's missions."""
    import ZODB
    from ZODB.FileStorage import FileStorage

    from store.core.zeo import ZeoServer

    if lasting_image_uri.startswith("zeo://"):
        # A ZEO client cannot send such metadata; whoever writes the server's file can.
        path = tmp_path / "served" / "live_image.fs"
        path.parent.mkdir()
        plain = ZODB.DB(FileStorage(str(path)))
        _commit_with_extension(plain, marker)
        plain.close()
        with ZeoServer(path) as server, LivingImage.open(server.uri) as image:
            listed = image.history(5)
    else:
        with LivingImage.open(lasting_image_uri) as image:
            _commit_with_extension(image.db, marker)
        with LivingImage.open(lasting_image_uri) as image:
            listed = image.history(5)
            image.undo(listed[0].tid)  # reads the history to find it
            assert [t.extension for t in image.db.storage.iterator()][-2] == {}
    assert listed[0].description == "a perfectly normal change"
    assert not marker.exists()


def test_a_zeo_servers_client_messages_name_no_code(marker):
    """ZEO's server decodes a client's pickled messages with all of builtins allowed: a
    message that called builtins.open (or exec) ran it in the server."""
    import ZEO.asyncio.marshal

    from store.core.image_globals import guard_zodb

    guard_zodb()
    hostile = b"\x80\x03" + _open_call(marker) + b"."
    with pytest.raises(ImportError, match=r"may not name builtins\.open"):
        ZEO.asyncio.marshal.pickle_server_decode(hostile)
    assert not marker.exists()
    legit = (1, False, "undoLog", (0, 20, {"description": set()}))
    assert (
        ZEO.asyncio.marshal.pickle_server_decode(ZEO.asyncio.marshal.encoder(b"Z5")(*legit))
        == legit
    )
