"""Images written before the code moved into its rooms still open: their pickles name classes
by the old modules (``store.checkpoint_layout.CheckpointTree``...), and those names resolve."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import transaction
import ZODB
import ZODB.FileStorage

from batos.moved import MOVED, current_name
from store.checkpoint.layout import CheckpointTree

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_name_is_the_module_that_holds_the_code_now(old):
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


def test_submodules_of_a_moved_package_follow_it():
    assert current_name("graph.cli.app") == "batos.shell.cli.app"
    assert importlib.import_module("graph.llm.engine") is importlib.import_module(
        "batos.models.engine"
    )
    assert current_name("graph.mind") is None
    assert current_name("store.core.image") is None


def test_a_name_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("store.no_such_module")


def test_an_image_written_under_the_old_module_names_opens(tmp_path, monkeypatch):
    path = tmp_path / "old.fs"
    # What the code before the move wrote: the same class under its old module name.
    monkeypatch.setattr(CheckpointTree, "__module__", "store.checkpoint_layout")
    db = ZODB.DB(ZODB.FileStorage.FileStorage(str(path)))
    with db.transaction() as conn:
        tree = CheckpointTree()
        tree.thread("kitchen", create=True)
        conn.root()["checkpoints"] = tree
    db.close()
    transaction.abort()
    assert b"store.checkpoint_layout" in path.read_bytes()
    monkeypatch.undo()

    # A fresh process that never imported the old name: opening the image must find the class.
    script = textwrap.dedent(
        f"""
        from store.core.image import LivingImage
        image = LivingImage.open({path.as_uri()!r})
        tree = image.transact(lambda root: root["checkpoints"])
        threads = image.transact(lambda root: sorted(root["checkpoints"].threads))
        print(type(tree).__module__, threads)
        image.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["store.checkpoint.layout", "['kitchen']"]
