"""bench/answers.py's checker, and the usefulness sets it judges: well-formed and fair.

The checker must find the value a reply states, not any mention of it; the sets must hold what
the benchmark's headline figures stand on: unique ids, answers their own check accepts, document
answers that are in (or derivable from) the document named, and held-out sets (headline, and
fresh1 to fresh18, which have document questions only, fresh14 recall too) kept apart from the
development one and each other.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from datetime import date, timedelta
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from hypothesis import given
from hypothesis import strategies as st

from bench.answers import (
    WEEKDAYS,
    date_mentions,
    judge,
    matches,
    normalise,
    number_mentions,
)

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "usefulness"
#: The held-out sets of document questions alone, each about a world of its own.
FRESH = tuple(f"fresh{n}" for n in range(1, 19))
SPLITS = ("dev", "headline", *FRESH)
#: The question files each split must have, and has only: the fresh sets are document questions
#: alone, but for fresh14's recall set.
SPLIT_FILES = {
    "dev": ("doc_questions", "computations", "recall"),
    "headline": ("doc_questions", "computations", "recall"),
    **{split: ("doc_questions",) for split in FRESH},
    "fresh14": ("doc_questions", "recall"),
}
KINDS = {"number", "string", "date"}
REQUEST_FAMILIES = {
    "plan",
    "question",
    "feeling",
    "greeting",
    "computation",
    "document",
    "design",
    "awkward",
}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _split_lines(split: str, name: str) -> list[dict]:
    """The items of ``split``'s ``name``.jsonl; the test is skipped for a split without one."""
    if name not in SPLIT_FILES[split]:
        pytest.skip(f"{split} has no {name}.jsonl")
    return _lines(DATA / split / f"{name}.jsonl")


def _item(kind: str, answer: str, question: str = "", **extra) -> dict:
    return {"kind": kind, "answer": answer, "question": question, "accept": [], **extra}


def _values(text: str) -> list[float]:
    return [v for m in number_mentions(text) for v in m.values]


# --- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("It costs $1,280.50 in total.", 1280.5),
        ("About 11.7% of the water.", 11.7),
        ("Twenty-three boats were lost.", 23),
        ("one hundred and six", 106),
        ("The grant was 1.2 million dollars.", 1_200_000),
        ("It fell to -5 degrees.", -5),
        ("She takes 20mg a day.", 20),
    ],
)
def test_reads_numbers_in_their_usual_dress(reply: str, expected: float) -> None:
    assert _values(reply) == [expected]


def test_digits_inside_words_versions_and_list_markers_are_not_numbers() -> None:
    assert _values("Flight TP1357, release 2.5.0, IP 10.0.0.1") == []
    assert _values("1. Soften the onion\n2) Add 600 g") == [600]
    assert _values("Room B-214, years 2019-2021") == [214, 2019, 2021]


def test_citations_of_passages_are_not_numbers() -> None:
    assert _values("The answer, from [1], is $18 [2][3, 4].") == [18]
    assert matches(_item("number", "18"), "The answer, from [1], is $18 [2].")


def test_the_sources_line_of_a_cited_answer_states_nothing() -> None:
    # The mind ends a cited answer with its passages' files and character spans.
    sources = (
        "\n\nSources: [1] /data/docs/otter_survey.txt (1200–1900); "
        "[2] /data/docs/library_board_minutes_2024-05-14.txt (0–812)"
    )
    assert matches(_item("number", "31"), "It is 31 metres tall [1]." + sources)
    assert not matches(_item("number", "812"), "The passages do not say [2]." + sources)
    assert not matches(_item("number", "1900"), "It was 41, then 44, then 47 [1][2]." + sources)


def test_a_number_answer_is_the_one_after_the_last_conclusion_marker() -> None:
    item = _item("number", "74", "A printer prints 23 pages a minute; 46 copies of 37 pages?")
    assert matches(item, "46 x 37 = 1702 pages. 1702 / 23 = 74. So it takes 74 minutes.")
    assert matches(item, "The answer is 74 minutes (about 1.2 hours).")
    # The right number as an intermediate step, then another conclusion: not the answer.
    assert not matches(item, "First 37 + 37 = 74. Then 74 x 23 = 1702, so the answer is 1702.")


def test_numbers_of_the_question_are_never_the_answer() -> None:
    item = _item("number", "6584.05", "$5,000 at 3.5% for 8 years?", tolerance={"absolute": 0.5})
    assert matches(item, "Therefore, after 8 years the investment is worth $6,584.05.")
    verdict = judge(item, "After 8 years at 3.5%, your $5,000 grows.")
    assert not verdict.matched and "in the question" in verdict.reason


def test_a_passage_full_of_numbers_passes_only_where_a_reply_states_its_answer() -> None:
    item = _item("number", "41", "How many fresh spraints were found?")
    dump = (
        "Signs were found at 13 of the 17 sites. Camera traps ran for 212 trap-nights and took "
        "1,046 clips. There were 41 fresh spraints and 5 holts. Volunteers gave 388 hours."
    )
    assert not matches(item, dump)
    assert matches(item, "The survey found 41 fresh spraints. " + dump)
    assert matches(item, "41")


def test_tolerance_absolute_and_relative() -> None:
    absolute = _item("number", "42.16", tolerance={"absolute": 0.01})
    assert matches(absolute, "about 42.17 km")
    assert not matches(absolute, "about 42.2 km")
    relative = _item("number", "42.16", tolerance={"relative": 0.005})
    assert matches(relative, "about 42.2 km")
    assert not matches(relative, "about 42.5 km")
    assert not matches(_item("number", "93"), "93.01 km/h")
    with pytest.raises(ValueError, match="absolute"):
        judge(_item("number", "1", tolerance={"percent": 1}), "1")


def test_a_number_answer_must_hold_one_number() -> None:
    with pytest.raises(ValueError, match="exactly one number"):
        judge(_item("number", "4 or 5"), "4")


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(["{}", "${}", "{}%", "{} kg"]))
def test_any_integer_with_commas_and_dress_matches_itself_and_not_its_neighbour(
    value: int, dress: str
) -> None:
    written = dress.format(f"{value:,}")
    assert matches(_item("number", str(value)), f"The answer is {written}.")
    assert not matches(_item("number", str(value + 1)), f"The answer is {written}.")


@given(st.decimals(min_value=0, max_value=10**6, places=2, allow_nan=False))
def test_any_decimal_matches_within_a_cent(value) -> None:
    item = _item("number", str(value), tolerance={"absolute": 0.005})
    assert matches(item, f"That comes to ${value:,.2f} altogether.")


_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
_ONES += "fifteen sixteen seventeen eighteen nineteen"
_ONES_WORDS = _ONES.split()
_TENS_WORDS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def _spelled(n: int) -> str:
    if n < 20:
        return _ONES_WORDS[n]
    if n < 100:
        return _TENS_WORDS[n // 10] + ("-" + _ONES_WORDS[n % 10] if n % 10 else "")
    if n < 1000:
        rest = f" and {_spelled(n % 100)}" if n % 100 else ""
        return f"{_ONES_WORDS[n // 100]} hundred{rest}"
    rest = f" {_spelled(n % 1000)}" if n % 1000 else ""
    return f"{_spelled(n // 1000)} thousand{rest}"


@given(st.integers(min_value=0, max_value=999_999))
def test_spelled_out_numbers_read_as_their_value(n: int) -> None:
    assert _values(f"It was {_spelled(n)}.") == [n]


# --- dates -----------------------------------------------------------------------------------

_DATE_FORMATS = (
    lambda d: d.isoformat(),
    lambda d: f"{d.day} {d:%B %Y}",
    lambda d: f"{d:%A}, {d.day} {d:%B %Y}",
    lambda d: f"{d:%B} {d.day}, {d.year}",
    lambda d: f"{d:%b} {d.day}th {d.year}",
    lambda d: f"the {d.day}th of {d:%B}, {d.year}",
    lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
)


@given(st.dates(min_value=date(1200, 1, 1), max_value=date(2999, 12, 31)), st.integers(0, 6))
def test_every_supported_date_format_reads_as_the_date(day: date, which: int) -> None:
    text = f"It is on {_DATE_FORMATS[which](day)}."
    item = _item("date", day.isoformat())
    assert matches(item, text), (text, judge(item, text).reason)
    assert not matches(_item("date", (day + timedelta(days=1)).isoformat()), text)


def test_numeric_dates_match_on_either_reading_only_when_both_are_valid() -> None:
    assert matches(_item("date", "2024-03-04"), "Due 04/03/2024.")
    assert matches(_item("date", "2024-04-03"), "Due 04/03/2024.")
    assert not matches(_item("date", "2024-03-13"), "Due 03/14/2024.")
    assert matches(_item("date", "2024-03-14"), "Due 03/14/2024.")


def test_a_date_without_a_year_matches_on_month_and_day_and_question_dates_are_operands() -> None:
    item = _item("date", "2025-03-20", "What date is 90 days after 20 December 2024?")
    assert matches(item, "It's March 20.")
    assert matches(item, "90 days after 20 December 2024 is 20 March 2025.")
    assert not matches(item, "20 December 2024 plus 90 days is 21 March 2025.")
    assert not matches(item, "It is 20 December 2024, plus 90 days.")


def test_invalid_calendar_dates_are_not_read() -> None:
    assert date_mentions("31 February 2024 and 2023-02-29") == []


# --- strings ---------------------------------------------------------------------------------


def test_strings_match_whole_words_after_normalising() -> None:
    item = _item("string", "Cobbler's Point", accept=["Cobblers Point"])
    assert matches(item, "It is at COBBLERS POINT, on the shore.")
    assert matches(item, "At the Cobbler’s Point plant.")
    assert not matches(_item("string", "Tern"), "The pattern of the ferry.")
    assert not matches(_item("string", "2.5.0", accept=["2.5"]), "In version 2.5.1.")
    assert matches(_item("string", "2.5.0", accept=["2.5"]), "In version 2.5.")
    assert matches(_item("string", "Saint-Aubrec"), "It's twinned with Saint Aubrec.")
    assert matches(_item("string", "The Salt Road"), "You're reading Salt Road.")


def test_a_weekday_is_judged_on_the_one_stated_not_on_all_named() -> None:
    item = _item("string", "Tuesday", "What day of the week will 29 February 2028 be?")
    assert matches(item, "1 March 2028 is a Wednesday, so 29 February 2028 is a Tuesday.")
    assert matches(item, "The answer is Tuesday, not Monday.")
    assert not matches(item, "Monday, Tuesday or Wednesday? I think Monday.")


def test_a_weekday_in_the_plural_states_that_day() -> None:
    item = _item("string", "Tuesday", "On which day must staff be in the office?")
    assert matches(item, "Staff must be in the office on Tuesdays.")
    assert not matches(item, "Staff must be in the office on Thursdays.")
    assert not matches(item, "Staff come in on Mondays, Tuesdays or Fridays, as they like.")
    assert not matches(item, "It falls on a Monday.")


def test_the_reason_names_what_was_stated() -> None:
    verdict = judge(_item("number", "24"), "It makes 12 biscuits.")
    assert not verdict.matched and "12" in verdict.reason and "24" in verdict.reason
    assert "none of" in judge(_item("string", "Tobias Venn"), "Nia Castell").reason
    with pytest.raises(ValueError, match="kind"):
        judge(_item("colour", "red"), "red")


@given(st.text(max_size=200))
def test_normalise_is_idempotent(text: str) -> None:
    assert normalise(normalise(text)) == normalise(text)


# --- the data files --------------------------------------------------------------------------


def _doc_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".html":
        soup = BeautifulSoup(text, "html.parser")
        for hidden in soup(["style", "script"]):
            hidden.decompose()
        text = soup.get_text(" ")
    # A word hyphenated across a line break ("Twenty-\nthree") is one word to a reader.
    return " ".join(re.sub(r"-\n\s*", "-", text).split())


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _ARITHMETIC[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError(f"not plain arithmetic: {ast.dump(node)}")


def _derivation_holds(item: dict, document: str) -> bool:
    """A 'Derived: a - b = c' note: a and b are in the document and the arithmetic gives c."""
    found = re.fullmatch(r"Derived: (?P<terms>[^=]+)= (?P<result>[\d.,]+)\.", item["note"])
    if not found:
        return False
    terms = re.sub(r"[^\d.+\-*() ]", "", re.sub(r"\s[A-Za-z/]+", " ", found["terms"]))
    in_document = {v for m in number_mentions(document) for v in m.values}
    operands = [v for m in number_mentions(found["terms"]) for v in m.values]
    value = _evaluate(ast.parse(terms.strip(), mode="eval").body)
    return set(operands) <= in_document and matches(item, f"The answer is {value:.6g}.")


def _in_document(item: dict, document: str) -> bool:
    if item["kind"] == "number":
        return any(
            matches(item, f"The answer is {document[m.start : m.end]}.")
            for m in number_mentions(document)
        )
    if item["kind"] == "date":
        expected = date.fromisoformat(item["answer"])
        return any(
            (expected.year, expected.month, expected.day) in m.values
            for m in date_mentions(document)
        )
    return f" {normalise(item['answer'])} " in f" {normalise(document)} "


def _all_items() -> list[tuple[str, dict]]:
    items = []
    for split in SPLITS:
        for name in SPLIT_FILES[split]:
            items += [(f"{split}/{name}", item) for item in _lines(DATA / split / f"{name}.jsonl")]
    return items


@pytest.mark.parametrize("split", SPLITS)
def test_each_split_has_its_question_files_and_no_others(split: str) -> None:
    present = {p.stem for p in (DATA / split).glob("*.jsonl")}
    assert present == set(SPLIT_FILES[split])


def test_ids_are_unique_across_every_set() -> None:
    ids = [item["id"] for _, item in _all_items()]
    ids += [
        r["id"] for r in _lines(DATA / "requests.jsonl") + _lines(DATA / "readme_requests.jsonl")
    ]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize(
    "where,item", _all_items(), ids=lambda x: x if isinstance(x, str) else x["id"]
)
def test_every_answer_passes_its_own_check_and_a_wrong_one_fails(where: str, item: dict) -> None:
    assert {"id", "family", "question", "answer", "accept", "kind"} <= set(item), where
    assert item["kind"] in KINDS
    assert item["answer"].strip() and all(a.strip() for a in item["accept"])
    if item["kind"] == "number":
        assert set(item["tolerance"]) <= {"absolute", "relative"} and len(item["tolerance"]) == 1
        wrong = f"{float(item['answer']) * 1.5 + 7:.2f}"
    elif item["kind"] == "date":
        wrong = (date.fromisoformat(item["answer"]) + timedelta(days=3)).isoformat()
    else:
        wrong = "Zebulon Quagmire"
    assert "tolerance" in item or item["kind"] != "number"
    assert matches(item, f"The answer is {item['answer']}."), judge(item, item["answer"]).reason
    for alternative in item["accept"]:
        assert matches(item, f"I believe it is {alternative}."), alternative
    assert not matches(item, f"The answer is {wrong}."), wrong
    # The question does not give its answer away.
    assert not matches(item, item["question"]), item["question"]


@pytest.mark.parametrize(
    "where,item", _all_items(), ids=lambda x: x if isinstance(x, str) else x["id"]
)
def test_no_answer_is_a_value_its_question_holds(where: str, item: dict) -> None:
    """The checker takes a question's values for operands: an answer among them never counts."""
    if item["kind"] == "number":
        answer = _values(item["answer"])
        assert not set(answer) & set(_values(item["question"])), where
    elif item["kind"] == "date":
        day = date.fromisoformat(item["answer"])
        for mention in date_mentions(item["question"]):
            assert (day.month, day.day) not in {v[1:] for v in mention.values}, where


def _doc_questions() -> list[tuple[str, dict]]:
    return [
        (split, item) for split in SPLITS for item in _lines(DATA / split / "doc_questions.jsonl")
    ]


@pytest.mark.parametrize(
    "split,item", _doc_questions(), ids=lambda x: x if isinstance(x, str) else x["id"]
)
def test_a_document_question_cites_a_document_that_holds_its_answer(split: str, item: dict) -> None:
    assert item["family"] == "document" and item["note"]
    source = DATA / split / "docs" / item["source"]
    assert source.is_file(), item["source"]
    document = _doc_text(source)
    if item["note"].startswith("Derived:"):
        assert _derivation_holds(item, document), item["note"]
    else:
        assert _in_document(item, document), item["answer"]


@pytest.mark.parametrize("split", SPLITS)
def test_each_corpus_has_eight_to_twelve_documents_of_300_to_2000_words(split: str) -> None:
    documents = sorted((DATA / split / "docs").iterdir())
    assert 8 <= len(documents) <= 12
    assert {d.suffix for d in documents} >= {".md", ".txt", ".html"}
    for document in documents:
        assert 300 <= len(_doc_text(document).split()) <= 2000, document.name


def test_the_headline_set_shares_no_document_question_or_fact_with_the_development_set() -> None:
    dev_docs = {p.name for p in (DATA / "dev" / "docs").iterdir()}
    headline_docs = {p.name for p in (DATA / "headline" / "docs").iterdir()}
    assert not dev_docs & headline_docs
    for name in ("doc_questions", "computations", "recall"):
        dev = _lines(DATA / "dev" / f"{name}.jsonl")
        headline = _lines(DATA / "headline" / f"{name}.jsonl")
        assert not {i["question"] for i in dev} & {i["question"] for i in headline}, name
    dev_text = " ".join(_doc_text(p) for p in sorted((DATA / "dev" / "docs").iterdir()))
    for item in _lines(DATA / "headline" / "doc_questions.jsonl"):
        if item["kind"] == "string":
            assert f" {normalise(item['answer'])} " not in f" {normalise(dev_text)} ", item["id"]


def _corpus_text(split: str) -> str:
    return " ".join(_doc_text(p) for p in sorted((DATA / split / "docs").iterdir()))


@pytest.mark.parametrize("fresh_split", FRESH)
def test_a_fresh_set_shares_no_document_question_or_fact_with_any_other_set(
    fresh_split: str,
) -> None:
    fresh_docs = {p.name for p in (DATA / fresh_split / "docs").iterdir()}
    fresh = _lines(DATA / fresh_split / "doc_questions.jsonl")
    questions = {i["question"] for i in fresh}
    for other in (split for split in SPLITS if split != fresh_split):
        assert not fresh_docs & {p.name for p in (DATA / other / "docs").iterdir()}, other
        for name in SPLIT_FILES[other]:
            asked = {i["question"] for i in _lines(DATA / other / f"{name}.jsonl")}
            assert not questions & asked, (other, name)
        # no answer of the fresh set (a weekday aside) is to be found in another corpus
        text = f" {normalise(_corpus_text(other))} "
        for item in fresh:
            answer = normalise(item["answer"])
            if item["kind"] == "string" and answer not in WEEKDAYS:
                assert f" {answer} " not in text, (other, item["id"])


@pytest.mark.parametrize("split", SPLITS)
def test_computations_cover_every_topic(split: str) -> None:
    items = _split_lines(split, "computations")
    assert {i["family"] for i in items} == {"computation"}
    assert {i["topic"] for i in items} == {
        "arithmetic",
        "unit conversion",
        "date arithmetic",
        "percentages",
        "compound growth",
    }


@pytest.mark.parametrize("split", SPLITS)
def test_recall_items_give_the_fact_once_then_one_to_three_unrelated_turns(split: str) -> None:
    """A recall item's ``shape``: a fact, then one to three unrelated turns (the default);
    ``said``, the user's only message, asked back; ``corrected``, a fact, unrelated turns,
    then a turn changing it: the later value is the answer, the first is not."""
    for item in _split_lines(split, "recall"):
        shape = item.get("shape", "fact")
        assert shape in {"fact", "said", "corrected"}, item["id"]
        fact, *filler = item["turns"]
        if shape == "said":
            assert not filler and matches(item, fact), item["id"]
            continue
        if shape == "corrected":
            *filler, fact = filler
            first = item["turns"][0]
            assert not matches(item, first), (item["id"], first)
        assert 1 <= len(filler) <= 3, item["id"]
        assert matches(item, fact), (item["id"], judge(item, fact).reason)
        for turn in filler:
            assert not matches({**item, "kind": "string"}, turn), (item["id"], turn)


def test_the_fifty_requests_are_varied() -> None:
    requests = _lines(DATA / "requests.jsonl")
    assert len(requests) == 50
    assert all(set(r) == {"id", "family", "text"} and r["text"].strip() for r in requests)
    families = [r["family"] for r in requests]
    assert set(families) == REQUEST_FAMILIES
    assert min(families.count(f) for f in REQUEST_FAMILIES) >= 5
    assert len({r["text"] for r in requests}) == 50
    lengths = sorted(len(r["text"]) for r in requests)
    assert lengths[0] <= 5 and 500 <= lengths[-1] < 1000


def test_every_example_request_of_the_docs_is_in_the_readme_set() -> None:
    from batos.shell.cli.mind import SAMPLE_REQUEST

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    readme = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    examples = set(re.findall(r'batos ask "([^"]+)"', readme))
    examples |= set(re.findall(r"batos ask ([^\s\"-][^\s]*)", readme))
    examples |= set(re.findall(r'\bask\(\s*"([^"]+)"', readme))
    examples |= set(re.findall(r'\("user", "([^"]+)"\)', readme))
    examples |= set(re.findall(r'"role": "user", "content": "([^"…]+)"', readme))
    assert len(examples) >= 4, examples
    listed = _lines(DATA / "readme_requests.jsonl")
    assert all({"id", "family", "text", "origin"} <= set(r) for r in listed)
    assert examples | {SAMPLE_REQUEST} <= {r["text"] for r in listed}
