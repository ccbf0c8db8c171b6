"""bench/name_recall.py: licence files found by their folder's name, now and as before."""

from __future__ import annotations

from pathlib import Path

from bench.name_recall import measure, table, text_alone, within
from store.knowledge import catalog as catalog_module
from store.knowledge.catalog import Chunk

LICENCES = {
    "libquill-perl": "This module is free software; you can redistribute it under the "
    "same terms as Perl itself.",
    "tidewatch": "Permission is hereby granted, free of charge, to any person obtaining a copy "
    "of this software, to deal in it without restriction.",
    "purrd": "purrd is licensed under the GNU General Public License, version 2 or later.",
}


def test_files_are_found_by_their_folder_now_and_were_not_before(tmp_path: Path) -> None:
    files = []
    for package, text in LICENCES.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "copyright").write_text(text)
        files.append(tmp_path / package / "copyright")
    results = measure(files)
    named, before = results["file names indexed"], results["text alone (before)"]
    # purrd's file names its package, so only the other two are asked for
    assert len(named["the name alone"]) == 2
    assert named["the name alone"] == [1, 1]
    assert within(before["the name alone"], 1) < 2
    assert catalog_module.indexed_text.__name__ == "indexed_text"  # put back after the arm
    lines = table(results)
    assert lines[2].startswith("| the name alone | 2 | 2 / ")


def test_text_alone_indexes_the_text_and_puts_the_names_back() -> None:
    chunk = Chunk(1, "/doc/tidewatch/copyright", 0, 4, "Text", "text", {})
    with text_alone():
        assert catalog_module.indexed_text(chunk) == "Text"
    assert catalog_module.indexed_text(chunk) == "Text\ntidewatch copyright"


def test_within_counts_ranks_at_most_k_and_skips_the_missing() -> None:
    assert within([1, 3, None, 2], 1) == 1
    assert within([1, 3, None, 2], 3) == 3


def test_text_alone_also_ranks_no_named_file() -> None:
    chunk = Chunk(1, "/doc/tidewatch/copyright", 0, 4, "Text", "text", {})
    with text_alone():
        assert catalog_module.name_terms(chunk) == set()
    assert catalog_module.name_terms(chunk) == {"tidewatch", "copyright"}
