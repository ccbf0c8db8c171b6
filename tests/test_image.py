"""The living image: opening by URI, transactions, conflicts, history and undo, bad files."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path

import pytest
from persistent.mapping import PersistentMapping

from batos.errors import ImageCorruptError, ImageError, ImageLockedError, ImageURIError
from batos.shell.runtime import open_image
from prototypes.codex import load_codex
from prototypes.incarnation import incarnate, personas
from prototypes.kernel import add_method
from store.core.image import LivingImage
from store.core.schema import UpgradeStep, applied, upgrade

#: The shipped codex's version, and one newer.
SHIPPED = load_codex().version
NEWER = SHIPPED + 1


def test_image_persists_and_has_blobs(lasting_image_uri):
    from ZODB.blob import Blob
    from ZODB.interfaces import IBlobStorage

    def store(root):
        root["k"] = "v"
        root["blob"] = Blob(b"large payload " * 1000)

    with LivingImage.open(lasting_image_uri) as image:
        assert IBlobStorage.providedBy(image.db.storage)
        image.transact(store, note="set k and a blob")
    if lasting_image_uri.startswith("file://"):
        blob_dir = Path(lasting_image_uri.removeprefix("file://") + ".blobs")
        assert any(p.suffix == ".blob" for p in blob_dir.rglob("*"))  # the bytes live outside
    with LivingImage.open(lasting_image_uri) as image, image.read() as root:
        assert root["k"] == "v"
        with root["blob"].open("r") as handle:
            assert handle.read() == b"large payload " * 1000


def test_failed_transaction_leaves_nothing(any_image):
    def boom(root):
        root["half"] = "written"
        raise RuntimeError("fail mid-way")

    with pytest.raises(RuntimeError):
        any_image.transact(boom)
    with any_image.read() as root:
        assert "half" not in root


def test_conflict_is_retried(any_image):
    any_image.transact(lambda root: root.__setitem__("counter", PersistentMapping(n=0)))
    attempts = []

    def bump(root):
        attempts.append(1)
        root["counter"]["n"] += 1
        if len(attempts) == 1:
            # Another writer commits a change to the same object before we commit.
            any_image.transact(lambda other: other["counter"].__setitem__("n", 100))
        return root["counter"]["n"]

    assert any_image.transact(bump) == 101
    assert len(attempts) == 2


def test_every_transient_error_is_retried_not_only_conflicts(memory_image):
    from transaction.interfaces import TransientError
    from ZEO.Exceptions import ClientDisconnected

    failures = [TransientError("a resubmittable failure"), ClientDisconnected("server restarted")]

    def flaky(root):
        root["flaky"] = len(failures)
        if failures:
            raise failures.pop(0)
        return "done"

    assert memory_image.transact(flaky) == "done"
    with memory_image.read() as root:
        assert root["flaky"] == 0


def test_conflicts_beyond_retries_fail_cleanly(any_image):
    from batos.errors import TransactionFailed

    any_image.transact(lambda root: root.__setitem__("c", PersistentMapping(n=0)))

    def always_conflicts(root):
        root["c"]["n"] += 1
        any_image.transact(lambda other: other["c"].__setitem__("n", -1))

    with pytest.raises(TransactionFailed, match=r"bump conflicted \d+ times in") as info:
        any_image.transact(always_conflicts, note="bump", retry_seconds=0.2)
    assert "retry later" in info.value.hint
    with any_image.read() as root:
        assert root["c"]["n"] == -1  # only the other writer's commits, none of ours


def test_read_view_refuses_changes(any_image):
    any_image.transact(lambda root: root.__setitem__("m", PersistentMapping()))
    with pytest.raises(ImageError, match="read-only"):
        with any_image.read() as root:
            root["m"]["x"] = 1
    with any_image.read() as root:
        assert "x" not in root["m"]


def test_history_and_undo(lasting_image_uri):
    with LivingImage.open(lasting_image_uri) as image:
        image.transact(lambda root: root.__setitem__("a", 1), note="set a", user="tester")
        image.transact(lambda root: root.__setitem__("b", 2), note="set b")
        log = image.history(5)
        assert [r.description for r in log[:2]] == ["set b", "set a"]
        assert log[1].user == "tester"
        image.undo(log[0].tid)
        with image.read() as root:
            assert "b" not in root and root["a"] == 1
        assert image.history(1)[0].description.startswith("undo ")
        with pytest.raises(ImageError, match="no undoable transaction"):
            image.undo("00000000deadbeef")
        undoing = image.history(1)[0].tid
        with pytest.raises(ImageError, match=f"undone already, by transaction {undoing}") as info:
            image.undo(log[0].tid)
        assert f"undo {undoing}" in info.value.hint
        image.undo(undoing)  # the undo undone: b is back
        with image.read() as root:
            assert root["b"] == 2


def test_undo_unsupported_on_memory(memory_image):
    with pytest.raises(ImageError, match="no undo history"):
        memory_image.history()


def test_unknown_scheme_and_bad_uri():
    with pytest.raises(ImageURIError, match="no storage for URI scheme 'nosuch'"):
        LivingImage.open("nosuch://x")


def test_locked_by_another_process(file_uri, tmp_path):
    LivingImage.open(file_uri).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from store.core.image import LivingImage
                image = LivingImage.open({file_uri!r})
                print("open", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(ImageLockedError) as info:
            LivingImage.open(file_uri)
        assert "zeo" in info.value.hint.lower()
    finally:
        holder.communicate("")


def test_garbage_file_is_reported_corrupt(tmp_path):
    path = tmp_path / "garbage.fs"
    path.write_bytes(b"this is not a FileStorage" * 40)
    with pytest.raises(ImageCorruptError, match="damaged or not a ZODB FileStorage"):
        LivingImage.open(f"file://{path}")
    assert path.read_bytes() == b"this is not a FileStorage" * 40
    assert [p.name for p in tmp_path.iterdir()] == ["garbage.fs"]  # no blobs, lock, temp file


def test_failed_open_removes_what_it_added(tmp_path):
    """ZODB itself finds the damage (a record inside a transaction): its files go again."""
    import shutil
    import struct

    from ZODB.FileStorage import FileIterator

    made = tmp_path / "made" / "image.fs"
    with LivingImage.open(f"file://{made}") as image:
        image.transact(lambda root: root.__setitem__("k", "v"))
    copy = tmp_path / "copy" / "image.fs"
    copy.parent.mkdir()
    shutil.copy(made, copy)  # the data file alone, as if brought from elsewhere
    iterator = FileIterator(str(copy))
    record_pos = [record.pos for txn in iterator for record in txn][-1]
    iterator.close()
    with open(copy, "r+b") as handle:  # the record's back-pointer to its transaction
        handle.seek(record_pos + 24)
        handle.write(struct.pack(">Q", 12345))
    with pytest.raises(ImageCorruptError):
        LivingImage.open(f"file://{copy}")
    assert [p.name for p in copy.parent.iterdir()] == ["image.fs"]


def test_missing_image_is_created_only_when_asked(tmp_path):
    from batos.errors import ImageNotFoundError
    from store.core.image import creating

    path = tmp_path / "new" / "image.fs"
    with pytest.raises(ImageNotFoundError, match="no image at"):
        LivingImage.open(f"file://{path}", create=False)
    with creating(False), pytest.raises(ImageNotFoundError):
        LivingImage.open(f"file://{path}")
    assert not path.parent.exists()
    LivingImage.open(f"file://{path}").close()  # creating is the default
    assert path.exists()


def test_upgrade_steps_apply_once_and_are_recorded():
    memory_image = LivingImage.open("memory://")  # bare: no step applied yet
    calls = []
    steps = [
        UpgradeStep("s-1", "first", lambda root: calls.append("s-1")),
        UpgradeStep("s-2", "second", lambda root: calls.append("s-2")),
    ]
    assert upgrade(memory_image, steps) == ["s-1", "s-2"]
    assert upgrade(memory_image, steps) == []
    assert upgrade(memory_image, [*steps, UpgradeStep("s-3", "third", calls.append)]) == ["s-3"]
    assert calls[:2] == ["s-1", "s-2"]
    with memory_image.read() as root:
        assert list(applied(root)) == ["s-1", "s-2", "s-3"]


def test_failed_upgrade_step_is_not_recorded(memory_image):
    def broken(root):
        root["partial"] = 1
        raise ValueError("bad step")

    with pytest.raises(ValueError):
        upgrade(memory_image, [UpgradeStep("bad", "fails", broken)])
    with memory_image.read() as root:
        assert "partial" not in root and "bad" not in applied(root)


def test_incarnation_is_idempotent_and_keeps_grown_methods(file_uri):
    with open_image(file_uri, create=True) as image:
        with image.read() as root:
            found = personas(root)
            assert sorted(found) == ["ALFRED", "BABS", "BRICK", "ROBIN"]
            assert found["ROBIN"].name == "ROBIN"
            assert found["BRICK"].codex_version == SHIPPED  # inherited from traits
            assert "decompose" in found["BRICK"].intents
        assert image.transact(incarnate) == []  # same codex: nothing changes

        def grow(root):
            brick = root["objects"]["brick"]
            add_method(brick, "double", "def double(self, x):\n    return 2 * x\n")
            brick.role = "edited by hand"

        image.transact(grow)

    codex2 = _codex(NEWER)
    with open_image(file_uri, codex=codex2) as image, image.read() as root:
        brick = root["objects"]["brick"]
        assert brick.codex_version == NEWER
        assert brick.role == codex2.personas["BRICK"].role  # codex-owned slot restored
        assert brick.double(4) == 8  # what the image grew is kept
        assert f"codex-{NEWER}" in applied(root)


def _codex(version: int, drop_intent: str | None = None):
    text = resources.files("prototypes").joinpath("codex.toml").read_text()
    text = text.replace(f"version = {SHIPPED}", f"version = {version}", 1)
    if drop_intent:
        text = "\n".join(line for line in text.splitlines() if not line.startswith(drop_intent))
    return load_codex(text)


def test_new_codex_drops_the_intents_it_no_longer_declares(file_uri):
    with open_image(file_uri, create=True) as image:
        image.transact(
            lambda root: root["objects"]["robin"].intents.__setitem__("hum", "hum a tune")
        )
    with open_image(file_uri, codex=_codex(NEWER, drop_intent="gentle_reframe")) as image:
        with image.read() as root:
            intents = root["objects"]["robin"].intents
            assert "gentle_reframe" not in intents
            assert "reflect_feelings" in intents
            assert intents["hum"] == "hum a tune"  # added by hand: not the codex's to drop


def test_intents_of_an_image_without_the_record_are_taken_as_the_codex(file_uri):
    from prototypes.incarnation import CODEX_INTENTS

    with open_image(
        file_uri, create=True
    ) as image:  # as an image incarnated before the record was kept
        image.transact(lambda root: delattr(root["objects"]["robin"], CODEX_INTENTS))
    with open_image(file_uri, codex=_codex(NEWER, drop_intent="gentle_reframe")) as image:
        with image.read() as root:
            assert "gentle_reframe" not in root["objects"]["robin"].intents


def test_an_older_codex_never_overwrites_a_newer_incarnation(file_uri):
    with open_image(file_uri, codex=_codex(NEWER), create=True):
        pass
    with pytest.raises(ImageError, match=f"codex version {NEWER}, newer than"):
        open_image(file_uri)  # the shipped codex, one version older
    with open_image(file_uri, codex=_codex(NEWER)) as image, image.read() as root:
        assert root["objects"]["traits"].codex_version == NEWER
        assert f"codex-{SHIPPED}" not in applied(root)


@pytest.mark.parametrize("folder", ["my images", "a#b", "50% off", "ünï"])
def test_a_file_uri_is_percent_decoded_and_its_scheme_read_in_any_case(tmp_path, folder):
    # A folder of its own: BATOS_HOME (the process's stats) also lives under tmp_path.
    images = tmp_path / "images"
    path = images / folder / "live_image.fs"
    with LivingImage.open(path.as_uri()) as image:  # file:///…/my%20images/live_image.fs
        image.transact(lambda root: root.__setitem__("k", "v"))
    assert sorted(p.name for p in images.iterdir()) == [folder]  # no sibling folder
    assert (path.parent / "live_image.fs.blobs").is_dir()
    shouted = "FILE" + path.as_uri()[len("file") :]
    with LivingImage.open(shouted, create=False) as image, image.read() as root:
        assert root["k"] == "v"


def test_the_default_image_of_a_relative_or_odd_home_is_one_absolute_folder(tmp_path, monkeypatch):
    from batos import settings
    from store.core.image import image_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BATOS_IMAGE", raising=False)
    for home in ("relative/dir", "odd #home"):
        monkeypatch.setenv("BATOS_HOME", home)
        uri = settings.get_str("image")
        assert image_path(uri) == tmp_path / home / "live_image.fs"
        LivingImage.open(uri).close()
        assert (tmp_path / home / "live_image.fs.blobs").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd #home", "relative"]
    monkeypatch.setenv("BATOS_HOME", "q?x=1")  # refused, not read as a storage option
    with pytest.raises(ImageURIError, match=re.escape("holds a '?'")):
        LivingImage.open(settings.get_str("image"))


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("file://relative/dir/x.fs", "names the host 'relative'"),
        ("file:///tmp/a#b/x.fs", "has a '#'"),
        ("file:x.fs", "no absolute path"),
        ("file:///tmp/what%3Fnow/x.fs", "holds a '?'"),
    ],
)
def test_a_file_uri_that_would_put_the_image_elsewhere_is_refused(tmp_path, uri, says):
    with pytest.raises(ImageURIError, match=re.escape(says)) as info:
        LivingImage.open(uri)
    assert info.value.hint


def test_a_path_that_cannot_hold_an_image_is_a_clear_error(tmp_path):
    from batos.errors import ImageNotFoundError

    with pytest.raises(ImageURIError, match="is a folder") as info:
        LivingImage.open(tmp_path.as_uri(), create=False)
    assert "live_image.fs" in info.value.hint
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ImageURIError, match="cannot be used"):
        LivingImage.open((blocker / "x.fs").as_uri())
    empty = tmp_path / "empty.fs"
    empty.touch()
    with pytest.raises(ImageNotFoundError, match="the file there is empty"):
        LivingImage.open(empty.as_uri(), create=False)
    assert empty.stat().st_size == 0  # a command that creates nothing wrote nothing
    spaced = tmp_path / "new dir" / "x.fs"
    with pytest.raises(ImageNotFoundError) as info:
        LivingImage.open(spaced.as_uri(), create=False)
    assert f"--image {spaced.as_uri()} init" in info.value.hint  # quoted only when needed


def test_an_image_used_after_close_says_so(file_uri):
    image = LivingImage.open(file_uri)
    image.close()
    image.close()  # twice is harmless
    for use in (
        lambda: image.transact(lambda root: 1),
        lambda: image.read().__enter__(),
        lambda: image.history(1),
        lambda: image.undo("00000000deadbeef"),
    ):
        with pytest.raises(ImageError, match="is closed") as info:
            use()
        assert "open it again" in info.value.hint
