"""bench/name_search.py: its package samples and its measure, on a small copyright tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import name_search


def _tree(root: Path, names: list[str]) -> Path:
    docs = root / "doc"
    for name in names:
        (docs / name).mkdir(parents=True)
        (docs / name / "copyright").write_text(
            f"Upstream-Name: project {len(name)}\nFiles: *\nCopyright: 2001 Someone\n"
            f"License: GPL-2+\n This package is free software.\n"
        )
    (docs / "alias").symlink_to(docs / names[0])  # a doc folder that is another package's
    (docs / "no-copyright").mkdir()
    return docs


def test_packages_leave_out_symlinked_folders_and_folders_without_a_file(tmp_path: Path) -> None:
    docs = _tree(tmp_path, ["zlib1g", "libdpkg-perl", "apt"])
    assert name_search.packages(docs) == ["apt", "libdpkg-perl", "zlib1g"]


def test_the_samples_are_seeded_and_never_share_a_package() -> None:
    names = [f"pkg{i:03d}" for i in range(300)]
    dev, held = name_search.sample(names, "dev", 60), name_search.sample(names, "held", 60)
    held2 = name_search.sample(names, "held2", 60)
    assert len(dev) == len(held) == len(held2) == 60
    assert not set(dev) & set(held) and not set(held2) & (set(dev) | set(held))
    assert dev == name_search.sample(list(reversed(names)), "dev", 60) == sorted(dev)
    assert len(name_search.sample(names[:10], "held", 60)) == 5  # at most its half


def test_rank_of_is_the_first_place_of_the_file() -> None:
    assert name_search.rank_of(["a", "b", "b"], "b") == 2
    assert name_search.rank_of(["a"], "b") is None


def test_what_answers_a_question_is_read_from_the_files_layout() -> None:
    licence, holder, _, source, terms, wrote = name_search.PHRASINGS
    header = "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
    header += "Upstream-Name: dpkg"
    for phrasing in name_search.PHRASINGS:
        assert not name_search.answering(phrasing, header)  # the header answers nothing
    assert name_search.answering(licence, "Files: *\nLicense: GPL-2+\n This program is free")
    assert name_search.answering(terms, "released under the MIT licence")
    assert not name_search.answering(licence, "Copyright © 1994 Ian Murdock")
    assert name_search.answering(holder, " Copyright © 1994-1999, 2007 Ian Jackson")
    assert name_search.answering(wrote, "Copyright (C) 2001 Someone")
    assert not name_search.answering(holder, "the above copyright notice")
    assert name_search.answering(source, "Source: https://git.dpkg.org/git/dpkg/dpkg.git")
    assert name_search.answering(source, "It was downloaded from ftp.gnu.org")
    assert not name_search.answering(source, "License: GPL-2+")


def test_the_table_counts_answers_only_where_a_file_holds_one() -> None:
    rows = [
        {"rank": 1, "answer_rank": 2, "answerable": True, "named_in_text": False},
        {"rank": 1, "answer_rank": None, "answerable": True, "named_in_text": True},
        {"rank": 2, "answer_rank": None, "answerable": False, "named_in_text": False},
    ]
    text = name_search.table({"sample": "dev", "chunks": 9, "ingest_s": 1.0, "rows": rows})
    assert "all                                2   0 / 1 / 1 / 1" in text
    assert "name only in the path              1   0 / 1 / 1 / 1" in text
    # a result written before the answer check has no answer rows at all
    old = [{"rank": 1, "named_in_text": False}]
    assert "could answer" not in name_search.table(
        {"sample": "dev", "chunks": 1, "ingest_s": 1.0, "rows": old}
    )


@pytest.mark.slow
def test_measure_ranks_every_package_on_a_real_catalog(tmp_path: Path) -> None:
    docs = _tree(tmp_path, [f"libthing{i}" for i in range(8)])
    result = name_search.measure("dev", 10, docs)
    rows = result["rows"]
    assert len(rows) == 4 and result["chunks"] >= 4  # the dev half of eight packages
    for row in rows:
        assert row["package"] in row["question"]
        assert row["rank"] is None or 1 <= row["rank"] <= name_search.DEPTH
        assert row["named_in_text"] is False  # the name is in the path alone
        assert row["answerable"] is True  # each file has a licence, a holder and no source
        assert row["answer_rank"] is None or row["rank"] <= row["answer_rank"]
    text = name_search.table(result)
    assert "name only in the path" in text and "sample dev: 4 packages" in text
