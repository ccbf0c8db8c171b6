"""Files written beside their target and renamed into place: whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.core.files import copy_file, replacing, write_text


def test_a_write_that_fails_leaves_the_old_file_and_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    write_text(target, "old")
    with pytest.raises(RuntimeError, match="mid-write"):
        with replacing(target) as draft:
            draft.write_text("half of the new")
            raise RuntimeError("mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_files_and_folders_take_the_targets_place(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "robin.gguf"
    source = tmp_path / "source.gguf"
    source.write_bytes(b"GGUF")
    assert copy_file(source, target, durable=True).read_bytes() == b"GGUF"
    folder = tmp_path / "tools"
    (folder / "stale").mkdir(parents=True)
    with replacing(folder) as draft:
        draft.mkdir()
        (draft / "convert.py").write_text("print()")
    assert [p.name for p in folder.iterdir()] == ["convert.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "source.gguf", "tools"]
