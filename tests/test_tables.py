"""Tables in passages written out row by row (graph.tables)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.tables import linearized

ROOT = Path(__file__).resolve().parent.parent


def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"\w+", text)}


def test_a_markdown_table_gives_each_value_after_its_column_header() -> None:
    text = (
        "The two models:\n\n"
        '| | SM-30 | SM-30Q ("Quilter") |\n'
        "|---|---|---|\n"
        "| Built-in stitches | 120 | 200 |\n"
        "| Extension table | optional (ET-30, £39) | supplied |\n\n"
        "Both use class 15 bobbins."
    )
    assert linearized(text) == (
        "The two models:\n\n"
        'Built-in stitches — SM-30: 120; SM-30Q ("Quilter"): 200.\n'
        'Extension table — SM-30: optional (ET-30, £39); SM-30Q ("Quilter"): supplied.\n'
        "\nBoth use class 15 bobbins."
    )


def test_a_table_as_the_html_parser_writes_it_keeps_its_header_across_blank_lines() -> None:
    text = (
        "Session | Off-peak | Peak\n\n"
        "Two hours | £34 | £42\n\n"
        "Twilight | — | £47\n\n"
        "Prices from 1 March 2025."
    )
    assert linearized(text) == (
        "Session:\n"
        "Two hours — Off-peak: £34; Peak: £42.\n"
        "Twilight — Off-peak: —; Peak: £47.\n"
        "\nPrices from 1 March 2025."
    )


def test_a_markdown_table_of_names_and_values_with_an_empty_header() -> None:
    text = "| | |\n|---|---|\n| Policy | HR-07, version 5 |\n| Owner | Tamsin Reid |"
    assert linearized(text) == "Policy — HR-07, version 5.\nOwner — Tamsin Reid."


def test_fixed_width_columns_are_read_under_the_header_they_line_up_with() -> None:
    text = (
        "2. PERMIT PRICES (a year)\n"
        "                              until 2 Nov 2025    from 3 Nov 2025\n"
        " First permit for a household      30.00               45.00\n"
        " Second permit                     60.00               90.00\n"
        " Third permit                      90.00           not available\n"
        "\n"
        "No more than two permits."
    )
    assert linearized(text) == (
        "2. PERMIT PRICES (a year)\n"
        "First permit for a household — until 2 Nov 2025: 30.00; from 3 Nov 2025: 45.00.\n"
        "Second permit — until 2 Nov 2025: 60.00; from 3 Nov 2025: 90.00.\n"
        "Third permit — until 2 Nov 2025: 90.00; from 3 Nov 2025: not available.\n"
        "\n"
        "No more than two permits."
    )


def test_an_underlined_header_of_two_lines_names_each_column_by_its_dashes() -> None:
    text = (
        "  Watercourse            Length    Latrines   Latrines\n"
        "                         walked    2022       2025\n"
        "  ---------------------  --------  ---------  ---------\n"
        "  Thurlsey Lode          6.0 km       118        143\n"
        "  Mardleby Cut           2.5 km         9          0\n"
    )
    assert linearized(text) == (
        "Watercourse:\n"
        "Thurlsey Lode — Length walked: 6.0 km; Latrines 2022: 118; Latrines 2025: 143.\n"
        "Mardleby Cut — Length walked: 2.5 km; Latrines 2022: 9; Latrines 2025: 0.\n"
    )


def test_a_cell_or_label_carried_on_to_the_next_line_stays_in_its_row() -> None:
    trees = (
        " Tag  Tree                            Girth 2025  Height 2025\n"
        " ---  ------------------------------  ----------  -----------\n"
        " T01  Sedley Oak (pedunculate oak)       6.58 m      22 m\n"
        " T02  Cedar of Lebanon (\"the Bishop's\n"
        '      Cedar"), by the Pump Room           6.05 m      27 m\n'
    )
    assert linearized(trees).splitlines()[2] == (
        'T02 — Tree: Cedar of Lebanon ("the Bishop\'s Cedar"), by the Pump Room; '
        "Girth 2025: 6.05 m; Height 2025: 27 m."
    )
    departures = (
        "                      Tue-Thu    Fri       Sat\n"
        "  Wharf Shuttle       11:00 L    11:00 L   10:30 L\n"
        "                      12:00 L    12:00 L   11:30 L\n"
        "  Flight Cruise         --       10:15 M   10:00 M\n"
    )
    assert linearized(departures).splitlines() == [
        "Wharf Shuttle — Tue-Thu: 11:00 L 12:00 L; Fri: 11:00 L 12:00 L; Sat: 10:30 L 11:30 L.",
        "Flight Cruise — Tue-Thu: --; Fri: 10:15 M; Sat: 10:00 M.",
    ]
    swims = (
        "SWIMMING                                   Pay as you go\n"
        "  Adult swim (16+)                         5.20   (4.85)\n"
        "  Concession swim (60+, students,\n"
        "    Leisure Card holders)                  3.90\n"
    )
    assert linearized(swims).splitlines() == [
        "SWIMMING:",
        "Adult swim (16+) — Pay as you go: 5.20 (4.85).",
        "Concession swim (60+, students, Leisure Card holders) — Pay as you go: 3.90.",
    ]


@pytest.mark.parametrize(
    "text",
    [
        # names and values, no header: its first line is a row, not column names
        "AUTUMN TERM 2025\n"
        "  Training days (school closed to pupils)  Mon 1 and Tue 2 September\n"
        "  Pupils return                            Wednesday 3 September 2025\n"
        "  Half term                                Mon 27 - Fri 31 October\n",
        # a first line that starts with a value is a row
        "  Flex (gym, swimming, sauna)              34.99 a month   (32.50)\n"
        "  Flex Plus (as Flex, with all classes)    42.99 a month\n"
        "  Flex, paid yearly in one payment        379.00\n",
        # a table of one row is left as it is
        "| Item | Price |\n|---|---|\n",
        "Plain prose, with a | in it and   some   spaces.\nAnd another line.",
        "",
    ],
)
def test_what_is_not_a_table_is_left_as_it_is(text: str) -> None:
    assert linearized(text) == text


def test_a_table_whose_writing_out_would_drop_a_word_is_left_as_it_is() -> None:
    # the second header names a column no row has a value in: its words would be lost
    text = "| Part | Clean | Replace |\n|---|---|---|\n| Brush | weekly | |\n| Filter | monthly | |"
    assert linearized(text) == text


_CELL = st.text(alphabet=st.characters(blacklist_characters="|\n\r"), max_size=12)
_LINE = st.one_of(
    st.text(max_size=60),
    st.lists(_CELL, min_size=2, max_size=4).map(lambda cells: "| " + " | ".join(cells) + " |"),
    st.lists(_CELL, min_size=2, max_size=4).map("    ".join),
    st.sampled_from(["|---|---|", "  -----  -----", "", "   "]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINE, max_size=12))
def test_no_word_of_a_passage_is_lost_whatever_its_lines(lines: list[str]) -> None:
    text = "\n".join(lines)
    out = linearized(text)
    assert _words(text) <= _words(out)


def test_no_word_of_a_real_document_is_lost() -> None:
    """The bench's documents and text files of this machine: tables of every shape, and many
    files with none."""
    files = sorted((ROOT / "bench" / "data" / "usefulness").glob("*/docs/*"))
    files += sorted(Path("/usr/share/doc").glob("*/copyright"))[:150]
    files += sorted(Path("/etc").glob("*.conf"))[:50]
    changed = 0
    for path in files:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        out = linearized(text)
        assert _words(text) <= _words(out), path
        changed += out != text
    assert changed >= 10  # the bench's tables were written out


def test_the_passages_a_persona_reads_have_their_tables_written_out(monkeypatch) -> None:
    from graph.answer import passages_text

    passage = {"citation": "prices.md:0-80", "text": "| Item | Price |\n|---|---|\n| Tea | £2 |"}
    passage["text"] += "\n| Cake | £3 |"
    assert "| Tea | £2 |" in passages_text([passage])  # off by default: as stored
    monkeypatch.setenv("BATOS_MIND_TABLES", "on")
    assert "Tea — Price: £2." in passages_text([passage])
