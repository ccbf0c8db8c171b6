"""The pieces an answer is made of, without a model: cutting at a sentence, citations, plan
quality, which requests are computations, and running a program for one."""

from __future__ import annotations

import datetime
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graph.answer import answer_prompt, cut_at_sentence, merged_passages
from graph.compute import Computed, compute, gives, looks_computational, run_program, shown
from graph.plan import near_duplicate, off_request, plan_quality
from graph.retrieval import render_citations

# -- cutting an answer that ran out of tokens -----------------------------------------------


@pytest.mark.parametrize(
    ("text", "cut"),
    [
        ("One. Two. Thre", "One. Two."),
        ("Steps:\n1. Buy seeds\n2. Dig the be", "Steps:\n1. Buy seeds"),
        ("Fly it upwind. 8. Stop when you have lear", "Fly it upwind."),
        ('He said "go." Then he wen', 'He said "go."'),
        (
            "a single run-on answer with no end at all and",
            "a single run-on answer with no end at all…",
        ),
    ],
)
def test_an_answer_is_cut_at_its_last_full_sentence(text: str, cut: str) -> None:
    assert cut_at_sentence(text) == cut


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=400))
def test_a_cut_answer_is_a_prefix_and_never_longer(text: str) -> None:
    cut = cut_at_sentence(text)
    body = cut[:-1] if cut.endswith("…") and not text.rstrip().endswith("…") else cut
    assert text.startswith(body) or text.rstrip().startswith(body)
    assert len(body) <= len(text)


# -- citations ----------------------------------------------------------------------------

CITATIONS = [
    {"n": 1, "source": "a.md", "start": 0, "end": 10},
    {"n": 2, "source": "b.md", "start": 5, "end": 50},
]


def test_cited_passages_are_named_once_in_order() -> None:
    text, cited = render_citations("X [2] and Y [1], again [2].", CITATIONS)
    assert cited == [1, 2]
    assert text.endswith("Sources: [1] a.md (0–10); [2] b.md (5–50)")


def test_a_placeholder_and_an_unknown_number_name_no_source() -> None:
    text, cited = render_citations("Facts [n] and more [9].", CITATIONS)
    assert cited == [] and text == "Facts and more [9]."


def test_with_no_passages_a_numbered_citation_points_at_nothing_and_goes() -> None:
    text, cited = render_citations("You owe Priya 35 pounds [1]. See [2, 3] and `row[1]`.", [])
    assert text == "You owe Priya 35 pounds. See and `row[1]`." and cited == []
    code = "def first(lst):\n    return lst[0] + grid[2][3] + f(x)[1]"  # code without fences
    assert render_citations(code, []) == (code, [])
    items = "[1] Choose a plot.\n[2] Dig it.[3]"
    assert render_citations(items, []) == ("[1] Choose a plot.\n[2] Dig it.", [])
    assert render_citations("A [link](http://x.org) [1](http://y.org).", []) == (
        "A [link](http://x.org) [1](http://y.org).",
        [],
    )


def test_citations_made_up_in_words_are_removed_and_links_stay() -> None:
    text, cited = render_citations(
        "Hello! [memory: none] The fee is £40 [memory] per year [b] [2].", CITATIONS
    )
    assert text.startswith("Hello! The fee is £40 per year [2].") and cited == [2]
    text, cited = render_citations("See [a.md] and [B.md], or [the docs](http://x.org).", CITATIONS)
    assert text == "See and, or [the docs](http://x.org)." and cited == []
    kept = "Dear [Your Name], the list [1, 2, 3] and [Source code](http://x.org) stay."
    assert render_citations(kept, CITATIONS) == (kept, [])
    code = "Use `rows[source]` or\n```python\nnames = [context]\nd[a] = [b.md]\n```\ndone [memory]."
    text, _ = render_citations(code, CITATIONS)
    assert text == code.removesuffix(" [memory].") + "."


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_rendering_citations_never_fails_and_keeps_the_answer(text: str) -> None:
    rendered, cited = render_citations(text, CITATIONS)
    assert set(cited) <= {1, 2}
    assert ("Sources:" in rendered) == bool(cited)


# -- plans ----------------------------------------------------------------------------------


def test_near_duplicates_and_generic_sub_queries_are_told_apart() -> None:
    assert near_duplicate("why gardens calm people", "why gardens calm people down")
    assert not near_duplicate("steps to paint the fence", "steps to fix the gate")
    assert off_request("What is the first step?", "how do I plan a vegetable garden?")
    assert not off_request("which vegetables to plant first", "how do I plan a vegetable garden?")
    quality = plan_quality(
        [
            {"query": "What is the first step?"},
            {"query": "Why do you need to know this?"},
            {"query": "what is the first step"},
        ],
        "how do I plan a vegetable garden?",
    )
    assert quality.as_dict() == {"steps": 3, "duplicates": 1, "off_request": 3}


def test_the_answer_prompt_folds_the_lead_s_steps_and_quotes_the_rest() -> None:
    partials = [
        {"kind": "instruction", "text": "List the steps: plant beans", "ok": True},
        {
            "kind": "note",
            "persona": "ROBIN",
            "facet": "facet_feelings",
            "text": "Be kind.",
            "ok": True,
        },
        {"kind": "computed", "text": "42", "ok": True},
        {"kind": "computed", "text": "", "ok": False},
        {"kind": "instruction", "text": "Describe the design: a bean trellis", "ok": True},
    ]
    passages = [{"citation": "beans.md:0-10", "text": "Beans climb."}]
    prompt = answer_prompt("grow beans", partials, passages)
    assert "[1] beans.md:0-10" in prompt and "Beans climb." in prompt
    assert "A program computed this for the request: 42" in prompt
    assert "Notes from ROBIN (facet_feelings):\nBe kind." in prompt
    assert "1. List the steps: plant beans\n2. Describe the design: a bean trellis" in prompt
    assert "cite each fact by its passage number" in prompt


def test_passages_of_several_retrievals_are_merged_best_first_each_once() -> None:
    a = [{"chunk_id": i, "text": str(i)} for i in (1, 2, 3)]
    b = [{"chunk_id": i, "text": str(i)} for i in (2, 4, 5, 6)]
    assert [p["chunk_id"] for p in merged_passages([a, b])] == [1, 2, 4, 3, 5]


# -- computations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A bakery sells 36 muffins at $2.75 each. How much for 14 days?", True),
        ("How many days are there between 3 March 2025 and 19 July 2025?", True),
        ("Convert 72 degrees Fahrenheit to Celsius, and 5 miles to km", True),
        ("What is 15% of 240?", True),
        ("My locker code is 4471, please remember it.", False),
        ("how do I plan a vegetable garden?", False),
        ("hello there", False),
        ("What's my gym locker code?", False),
        ("How much water does the DH-20 Pro extract than the DH-20?", False),
    ],
)
def test_computations_are_recognised(text: str, expected: bool) -> None:
    assert looks_computational(text) is expected


def test_a_question_about_memory_may_need_figures_from_its_passages() -> None:
    question = "How many more litres a day does the DH-20 Pro extract than the plain DH-20?"
    assert not looks_computational(question)
    assert looks_computational(question, grounded=True)
    assert not looks_computational("Who founded Calder Bay?", grounded=True)
    when = "When did part of the quay sink by more than a metre?"
    assert not looks_computational(when, grounded=True)


@pytest.mark.parametrize(
    ("question", "difference"),
    [
        ("How much cheaper is an off-peak visit than a peak one?", True),
        ("How much dearer is the big boat than the narrowboat for three hours?", True),
        ("How many minutes longer does the bus round the villages take?", True),
        ("I have a resident's card. How much do I save on a return compared with a visitor?", True),
        ("For how many years did trains run to the station?", False),  # a span: a program
    ],
)
def test_every_comparison_about_memory_is_a_derived_question(
    question: str, difference: bool
) -> None:
    from graph.compute import asks_difference

    assert looks_computational(question, grounded=True)
    assert not looks_computational(question)
    assert asks_difference(question) is difference


def test_a_comparison_word_alone_is_no_derived_question() -> None:
    from graph.compute import asks_difference

    for question in (
        "Which model is cheaper to run?",
        "How much is the cheaper ticket?",
        "How many people live there now that the town is larger?",
    ):
        assert not looks_computational(question, grounded=True), question
        assert not asks_difference(question), question


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("How many more owls nested in 2024 than in 2023?", True),
        ("How many fewer people lived there at the 1951 census than at the one of 1901?", True),
        ("By how many pounds did the allowance go up?", True),
        ("Tom has 12 apples and Ann has 5. How many more does Tom have?", False),
        ("How many days are there between 3 March 2025 and 19 July 2025?", False),
        ("What was the population at the 1951 census?", False),
    ],
)
def test_a_computation_names_figures_it_leaves_to_memory(text: str, expected: bool) -> None:
    from graph.compute import needs_facts

    assert needs_facts(text) is expected


@pytest.mark.parametrize(
    ("question", "value", "expected"),
    [
        ("How many fewer people lived there in 1951 than in 1901?", "-743", "743"),
        ("By how many pounds did the allowance go up?", "-125", "125"),
        ("By how much did the index rise?", "-12.5", "12.5"),
        ("What is the difference between the two fares?", "-1,200", "1,200"),
        ("How many more litres does the Pro extract?", "4", "4"),
        # a question that asks for a signed result keeps its sign
        ("What was the lowest temperature in January?", "-7", "-7"),
        ("What is 3 minus 5?", "-2", "-2"),
        # not a number: left as it is
        ("How many more days until -5 December?", "-5 December", "-5 December"),
    ],
)
def test_a_difference_is_answered_as_a_magnitude(question: str, value: str, expected: str) -> None:
    from graph.compute import magnitude

    assert magnitude(question, value) == expected


def test_a_program_that_subtracts_the_wrong_way_round_gives_the_difference() -> None:
    facts = "Census of 1901: 9,645. Census of 1951: 8,902."
    program = "```python\ndef solve(self):\n    return 8902 - 9645\n```"
    result = compute(
        "How many fewer people lived there in 1951 than in 1901?", lambda m: program, facts
    )
    assert result.ok and result.value == "743"
    # the same program for a question that asks for the signed change keeps the sign
    assert compute("What is 8902 minus 9645?", lambda m: program).value == "-743"


def test_by_how_much_is_a_derived_question_unless_that_is_switched_off() -> None:
    question = "By how many pounds did the allowance go up?"
    assert looks_computational(question, grounded=True)
    assert not looks_computational(question, grounded=True, derived=False)
    assert not looks_computational(question)


def test_a_program_s_result_is_stated_plainly() -> None:
    assert shown(2.75 * 36 * 14) == "1386"
    assert shown(22.22222222222222) == "22.22222222"
    assert shown("  Wednesday ") == "Wednesday"
    assert shown(datetime.date(2025, 8, 18)) == "18 August 2025"
    assert shown(datetime.datetime(2025, 8, 18, 9, 5)) == "18 August 2025 09:05"
    assert shown(datetime.timedelta(days=233)) == "233 days"
    # a date the sandbox sends back is a date, not its repr
    source = (
        "from datetime import date, timedelta\n\n"
        "def solve(self):\n    return date(2025, 1, 31) + timedelta(days=199)\n"
    )
    assert run_program(source) == "18 August 2025"
    for bad in (None, float("nan"), "  ", 2**200):
        with pytest.raises(ValueError):
            shown(bad)


def test_a_program_runs_in_the_sandbox_and_its_faults_are_words() -> None:
    assert run_program("def solve(self):\n    return 6 * 7\n") == "42"
    with pytest.raises(ValueError, match="import of 'os'|os"):
        run_program("import os\n\ndef solve(self):\n    return os.getcwd()\n")
    with pytest.raises(ValueError, match="ZeroDivisionError"):
        run_program("def solve(self):\n    return 1 / 0\n")


def test_a_failed_program_is_repaired_once_with_its_error() -> None:
    replies = iter(
        [
            "```python\ndef solve(self):\n    return undefined_name\n```",
            "```python\ndef solve(self):\n    return 2 + 2\n```",
        ]
    )
    seen: list = []

    def write(messages):
        seen.append(messages)
        return next(replies)

    result = compute("What is 2 plus 2, in total?", write)
    assert result == Computed(True, "4", "def solve(self):\n    return 2 + 2\n", attempts=2)
    assert "undefined_name" in str(seen[1][-1].content)


def test_names_and_codes_in_a_request() -> None:
    from graph.retrieval import names_in

    assert names_in("What does Tidewater 2.5 accept for the DH-20 Pro?") == [
        "Tidewater",
        "DH-20",
        "Pro",
    ]
    assert names_in("How much? What is it. I've been on Thursday") == []


class _Catalog:
    """Just what ``probe`` reads of a catalog: the nearest passage and the known words."""

    def __init__(self, score: float, known: set[str]) -> None:
        self.score, self.known = score, known

    def search(self, query: str, k: int, **_: object) -> list:
        from store.knowledge.catalog import Hit

        return [Hit(1, "ferry.md", 0, 10, "text", self.score)]

    def known_terms(self, terms) -> set[str]:
        return set(terms) & self.known


def test_a_request_naming_what_the_catalog_knows_is_held_to_a_lower_bar() -> None:
    from graph.retrieval import NAMED_MARGIN, probe

    question = "When does the Ondine leave?"
    assert not probe(_Catalog(0.35, set()), question, 0.4).about_catalog
    named = probe(_Catalog(0.35, {"Ondine"}), question, 0.4)
    assert named.about_catalog and named.threshold == 0.4 - NAMED_MARGIN
    assert not probe(_Catalog(0.25, {"Ondine"}), question, 0.4).about_catalog


def test_a_passage_is_focused_on_the_sentences_the_question_points_at() -> None:
    from graph.answer import focus

    text = (
        "The museum opened in 1921. Its curator is Mara Quill, who joined in 2010. "
        "The café sells soup. Tickets cost four pounds. The shop sells maps and books."
    )
    [kept] = focus([{"text": text, "chunk_id": 1}], "Who is the museum's curator?", 12)
    assert (
        kept["text"]
        == "The museum opened in 1921. Its curator is Mara Quill, who joined in 2010. …"
    )
    [whole] = focus([{"text": text, "chunk_id": 1}], "Who is the curator?", 0)
    assert whole["text"] == text


@pytest.mark.parametrize(
    ("text", "nothing"),
    [
        ("Found in [2].", True),
        ("Found in the reference: [1].", True),
        ("The passages do not contain the answer.", True),
        ("It is not mentioned in the documents [3].", True),
        ("Found: £350 [1].", False),
        ("Tuesday [2]", False),
        ("The lighthouse is 31 metres tall [2].\n\nSources: [2] a.md (0–9)", False),
    ],
)
def test_an_answer_that_found_nothing_is_told_apart(text: str, nothing: bool) -> None:
    from graph.answer import found_nothing

    assert found_nothing(text) is nothing


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=400), value=st.text(max_size=60))
def test_reading_an_answer_for_its_computed_value_never_raises(text: str, value: str) -> None:
    assert gives(text, value) in (True, False)


@settings(max_examples=300, deadline=None)
@given(
    number=st.floats(min_value=-1e12, max_value=1e12, allow_nan=False),
    decimals=st.integers(min_value=0, max_value=4),
    prose=st.text(alphabet=st.characters(categories=["L", "Zs"]), max_size=40),
)
def test_a_value_stated_rounded_among_words_is_given(number, decimals, prose) -> None:
    assert gives(f"{prose} {number:.{decimals}f} {prose}", repr(number))


# -- quote-first answers and programs about documents ---------------------------------------

_PASSAGES = [
    {"text": "The co-op opened in 1961. Attachments were raised from 40 MB to 250 MB in 2.6.0."},
    {"text": "Shelves replaced Notebooks in version 2.5.0, after a long vote."},
]


@pytest.mark.parametrize(
    ("reply", "answer", "quote", "passage"),
    [
        (
            'Quote: "Attachments were raised from 40 MB to 250 MB in 2.6.0." [1]\n'
            "Answer: 250 MB [1].",
            "250 MB [1].",
            "Attachments were raised from 40 MB to 250 MB in 2.6.0.",
            1,
        ),
        (  # markdown labels, and a quote that drops a word as it copies
            "**Quote:** Shelves replaced Notebooks in 2.5.0, after a long vote [2]\n"
            "**Answer:** In 2.5.0 [2].",
            "In 2.5.0 [2].",
            "Shelves replaced Notebooks in 2.5.0, after a long vote",
            2,
        ),
        ("Quote: none\nAnswer: The passages do not say.", "The passages do not say.", "", None),
        ("It opened in 1961 [1].", "It opened in 1961 [1].", "", None),  # kept to no line
        ("Quote: in 1961 [1]\nAnswer: 1961.", "1961.", "in 1961", None),  # too short to check
        (  # a quote and no "Answer:" line: what follows the quote is the answer
            "Quote: The co-op opened in 1961. [1]\nIt opened in 1961.",
            "It opened in 1961.",
            "The co-op opened in 1961.",
            1,
        ),
        (  # a quote the passages do not hold
            "Quote: The attachment limit is 900 MB in every version [1]\nAnswer: 900 MB.",
            "900 MB.",
            "The attachment limit is 900 MB in every version",
            None,
        ),
    ],
)
def test_a_quote_first_reply_is_taken_apart_and_its_quote_checked(
    reply: str, answer: str, quote: str, passage: int | None
) -> None:
    from graph.answer import split_quoted

    quoted = split_quoted(reply, _PASSAGES)
    assert (quoted.answer, quoted.quote, quoted.passage) == (answer, quote, passage)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=400))
def test_taking_a_quote_first_reply_apart_never_raises_or_loses_the_answer(text: str) -> None:
    from graph.answer import split_quoted

    quoted = split_quoted(text, _PASSAGES)
    assert quoted.passage in (None, 1, 2)
    assert quoted.answer == quoted.answer.strip()
    if text.strip():
        assert quoted.answer  # a reply with any text is never given as an empty answer


def test_a_program_about_documents_may_not_invent_its_figures() -> None:
    from graph.compute import unsourced

    facts = "The DH-20 extracts 16 litres a day; the DH-20 Pro extracts 20 litres."
    invented = "def solve(self):\n    plain = 18\n    pro = 24\n    return pro - plain\n"
    assert unsourced(invented, facts) == ["18"]  # 24 is a clock constant, let through
    copied = "def solve(self):\n    plain = 16\n    pro = 20.0\n    return (pro - plain) * 7\n"
    assert unsourced(copied, facts) == []
    assert unsourced("def solve(self):\n    return 1234.5 * 2\n", "costs $1,234.50") == []
    assert unsourced("def solve(self:\n", facts) == []  # the sandbox says what is wrong


def test_a_program_that_invents_a_figure_is_repaired_with_the_figure_named() -> None:
    replies = iter(
        [
            "```python\ndef solve(self):\n    return 24 - 18\n```",
            "```python\ndef solve(self):\n    return 20 - 16\n```",
        ]
    )
    seen: list = []

    def write(messages):
        seen.append(messages)
        return next(replies)

    facts = "The DH-20 extracts 16 litres a day; the DH-20 Pro extracts 20 litres."
    result = compute("How many more litres does the Pro extract?", write, facts)
    assert result.ok and result.value == "4" and result.attempts == 2
    assert "18, which neither the question nor the facts give" in str(seen[1][-1].content)
    # without facts (a word problem that gives its own figures) nothing is held back
    assert compute("What is 24 minus 18?", lambda m: "def solve(self):\n    return 24 - 18\n").ok


@pytest.mark.parametrize(
    ("text", "invented"),
    [
        ("The biggest attachment is 1 MB [2].\n\nSources: [2] a.md (0–771)", ["1"]),
        ("It is 250 MB [1].", []),
        ("The Pro extracts 4 more litres: 20 against 16 [1].", []),  # its working is shown
        ("The Pro extracts 4 more litres [1].", ["4"]),
        ("1. Open the lid\n2. Wait for the fan", []),  # list items are not figures
        ("It shows E5 while it defrosts; see the DH-20 notes.", []),  # codes are not figures
        ("Version 2.6.0 raised it [1].", []),
        ("Nothing to measure here.", []),
    ],
)
def test_figures_a_grounded_answer_makes_up_are_found(text: str, invented: list[str]) -> None:
    from graph.answer import unsupported_figures

    passages = [
        {"text": "Attachments were raised from 40 MB to 250 MB in 2.6.0."},
        {"text": "The DH-20 extracts 16 litres a day; the DH-20 Pro extracts 20 litres."},
    ]
    assert unsupported_figures(text, passages, "What is the biggest attachment?") == invented


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300), request=st.text(max_size=80))
def test_looking_for_made_up_figures_never_raises(text: str, request: str) -> None:
    from graph.answer import unsupported_figures

    found = unsupported_figures(text, [{"text": "It costs 4.80 dollars."}], request)
    assert all(f in text for f in found)


_SOURCES = [
    {"text": "Membership of the co-op costs £40 a year, paid in April."},
    {"text": "The survey ran in 2023 over 12 sites."},
    {"text": "We thank the Wrenfield Growers' Cooperative for the loan of their van."},
]


@pytest.mark.parametrize(
    ("text", "fixed", "moved"),
    [
        ("The yearly fee is £40 [3].", "The yearly fee is £40 [1].", (3, 1)),
        ("The yearly fee is £40 [1].", "The yearly fee is £40 [1].", None),  # cited right
        ("It was the Wrenfield co-op [3].", "It was the Wrenfield co-op [3].", None),  # no figure
        ("The fee is £40 [3], see [2].", "The fee is £40 [3], see [2].", None),  # two cited
        ("The fee is £99 [3].", "The fee is £99 [3].", None),  # no passage holds it
        ("It ran in 2023 and cost £40 [3].", "It ran in 2023 and cost £40 [3].", None),  # split
        ("The fee is £40 [9].", "The fee is £40 [9].", None),  # no passage 9
    ],
)
def test_a_citation_moves_to_the_one_passage_holding_the_answer_s_figures(
    text: str, fixed: str, moved: tuple[int, int] | None
) -> None:
    from graph.answer import recited

    assert recited(text, _SOURCES, "How much is the yearly fee?") == (fixed, moved)


def test_a_citation_stays_on_a_passage_holding_the_figure_inside_a_name() -> None:
    """A Debian copyright file says "License: LGPL-2.1+", which is no figure of its own; an
    answer of "version 2.1" cites it rightly, even though another passage spells it out."""
    from graph.answer import recited

    sources = [
        {"text": "Files: *\nLicense: LGPL-2.1+"},
        {"text": "Released under the GNU Lesser General Public License, version 2.1 or later."},
    ]
    text = "The LGPL, version 2.1 [1]."
    assert recited(text, sources, "which license covers libgpg-error?") == (text, None)
    # the digits of a longer figure are not the figure
    sources[0] = {"text": "License: LGPL-12.10"}
    assert recited(text, sources, "which license?") == ("The LGPL, version 2.1 [2].", (1, 2))


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200))
def test_correcting_a_citation_never_raises_and_changes_only_its_number(text: str) -> None:
    from graph.answer import recited

    fixed, moved = recited(text, _SOURCES, "How much?")
    if moved is None:
        assert fixed == text
    else:
        assert fixed == text.replace(f"[{moved[0]}]", f"[{moved[1]}]") and moved[0] != moved[1]


@pytest.mark.parametrize(
    ("text", "request_", "restated"),
    [
        ("The cheese goes in the oatcakes [1].", "Which cheese goes in the oatcakes?", True),
        ("The population at each census: [1]", "What was the population in 1951?", True),
        ("Harden Blue goes inside the oatcakes [1].", "Which cheese goes inside them?", False),
        ("It had 8,902 people [1].", "What was the population at the census?", False),
        ("The ferry leaves Harbour Pier [2].", "When does the ferry leave?", False),
    ],
)
def test_an_answer_that_only_restates_its_question_is_told_apart(
    text: str, request_: str, restated: bool
) -> None:
    from graph.answer import restates

    assert restates(text, request_) is restated


_ASKED_PASSAGES = [
    {"text": "Bus 58A stops at the villa gate every hour. Sunday buses start on 12 April 2026."},
    {"text": "Blade set CB-24 costs 31 pounds. Gorringe & Dymond will recast the tenor."},
]


@pytest.mark.parametrize(
    ("text", "request_", "missing"),
    [
        ("The bus stops at the villa gate [1].", "Which bus goes to the villa?", "name"),
        ("Take the 58A [1].", "Which bus goes to the villa?", None),
        ("Sunday buses start soon [1].", "When do Sunday buses start?", "date"),
        ("From Sunday 12 April [1].", "When do Sunday buses start?", None),
        ("In April [1].", "From what date do Sunday buses run?", None),
        ("On Tuesdays [1].", "On which day of the week do they meet?", None),
        ("For gardens above 150 metres [1].", "When did they fix the frost alerts?", "date"),
        ("At 0930 [1].", "What time does the bus leave?", None),
        ("Every two hours from Monday [1].", "Which bus goes to the villa?", "name"),
        ("See the blade set in the table [2].", "What's the part code for blades?", "code"),
        ("It is CB-24 [2].", "What's the part code for blades?", None),
        ("The blade set costs a fair amount [2].", "How much is a blade set?", "figure"),
        ("Thirty-one pounds [2].", "How much is a blade set?", None),
        ("The tenor is being recast [2].", "Who is recasting the tenor?", "name"),
        ("Gorringe & Dymond are [2].", "Who is recasting the tenor?", None),
        # "When", "who" and "code" inside a question that asks something else ask nothing.
        ("The device switches to mains power [1].", "What happens when the bus is late?", None),
        ("12 pounds [2].", "How much is a blade set when bought online?", None),
        ("The filter is blocked [2].", "What does error code E42 mean?", None),
        ("Smart casual [2].", "What is the dress code for the gala?", None),
        ("Peanuts [2].", "What should people who have allergies avoid?", None),
        # Answers "when" and "how many" in words, and a weekday the question already gave.
        ("In the 1820s [1].", "When was the villa built?", None),
        ("At eight o'clock [1].", "When does the villa open?", None),
        ("Both of them [1].", "How many buses stop at the villa?", None),
        ("On Sundays, as it says [1].", "When do Sunday buses start?", "date"),
        # An answer that says the passages do not hold it is not asked to find it there.
        ("The passages do not say when they start [1].", "When do Sunday buses start?", None),
        # Nothing of a kind is asked for: answered in words, never sent back.
        ("Because it cracked [2].", "Why is the tenor being recast?", None),
        ("Which of them? The cheaper one [2].", "Which of the two is cheaper?", None),
        # A kind the passages do not give either cannot be asked for again.
        ("Nobody says [1].", "How tall is the villa gate?", None),
    ],
)
def test_an_answer_missing_what_its_question_asks_for_is_told_apart(
    text: str, request_: str, missing: str | None
) -> None:
    from graph.answer import unasked

    passages = _ASKED_PASSAGES
    if request_.startswith("How tall"):
        passages = [{"text": "The villa gate is old and made of oak."}]
    assert unasked(text, request_, passages) == missing


def test_a_price_or_a_range_is_no_date_and_a_sentence_opener_no_name() -> None:
    from graph.answer import unasked

    prices = [{"text": "A single costs £4.50, a return 9-5 on weekdays costs £7.20."}]
    assert unasked("It runs often [1].", "When does the 58A run?", prices) == "date"
    prices = [{"text": "A single costs £4.50 and a return £7.20."}]
    assert unasked("It runs often [1].", "When does the 58A run?", prices) is None
    openers = [{"text": "The landlord fixes leaks. Tenants report them."}]
    assert unasked("The landlord [1].", "Who fixes leaks?", openers) is None
    inside = [{"text": "Leaks are fixed by Harbour Heating. Tenants report them."}]
    assert unasked("The landlord [1].", "Who fixes leaks?", inside) == "name"


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300), st.text(max_size=200), st.lists(st.text(max_size=200), max_size=3))
def test_checking_what_a_question_asks_for_never_raises(
    text: str, request_: str, passages: list[str]
) -> None:
    from graph.answer import ASKED_FOR, asked_kind, unasked

    missing = unasked(text, request_, [{"text": p} for p in passages])
    assert missing is None or (missing in ASKED_FOR and missing == asked_kind(request_))


FACTS = "The limit was raised from 100 MB to 250 MB. In 2024 we counted 91 adults, in 2023 64."


def _pair(first: object, second: object, words: tuple[str, str] | None = None) -> str:
    """A figures reply; each figure's words state it unless ``words`` are given."""
    said = words or (f"the passage says {first}", f"the passage says {second}")
    return json.dumps(
        {
            "first": {"words": said[0], "value": first},
            "second": {"words": said[1], "value": second},
        }
    )


def test_a_difference_is_worked_out_from_two_figures_the_passages_give() -> None:
    from graph.compute import difference

    result = difference("By how many MB was the limit raised?", FACTS, lambda m: _pair(250, 100.0))
    assert result.ok and result.value == "150"
    assert "first = 250" in result.source and "second = 100" in result.source
    assert difference("How many more adults?", FACTS, lambda m: _pair(64, 91)).value == "27"
    # a figure of the prompt that is no figure of the passages' text (a citation's offsets)
    cited = "[1] notes.md:3535-4261\n" + FACTS
    offsets = difference("How many more adults?", cited, lambda m: _pair(3535, 91), FACTS)
    assert not offsets.ok and offsets.reason == "3535 is not a figure the passages give"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("not json", "Expecting value"),
        ("[1, 2]", "not a JSON object"),
        (_pair(91, 65), "65 is not a figure the passages give"),
        (_pair(91, 91), "the two figures are the same"),
        # each figure is copied with words stating it, not another sentence's
        (
            _pair(91, 64, ("91 adults", "17.50 a month")),
            "the second figure's words do not state 64",
        ),
        (_pair(True, 64), "has no words and number"),
        (_pair("91", 64), "has no words and number"),
        (
            '{"first": {"words": "w", "value": 1e999}, "second": {"words": "w", "value": 64}}',
            "beyond the largest number a float holds",
        ),
        ('{"first": 91, "second": 64}', "not an object"),
        (_pair(91, 64) + " " * 5000, "longer than"),
        ("[" * 1900 + "]" * 1900, "nested too deeply"),
    ],
)
def test_two_figures_that_cannot_be_trusted_give_no_difference(reply: str, reason: str) -> None:
    from graph.compute import difference

    result = difference("How many more adults?", FACTS, lambda m: reply)
    assert not result.ok and reason in result.reason and result.value == ""
    assert len(result.source) <= 300


PRICES = (
    "Hot stone massage (50 minutes) £85. Bathing session with any treatment £20.\n"
    "Tent pitch with electric hook-up, per night: £29 (peak), £23 (off-peak).\n"
    "Residents' permits a year: first permit 45, second permit 90."
)


def _terms(*terms: tuple[str, object, object]) -> str:
    return json.dumps({"terms": [{"words": w, "value": v, "times": t} for w, v, t in terms]})


@pytest.mark.parametrize(
    ("question", "total"),
    [
        ("How much will a massage and a bathing session come to, in pounds?", True),
        ("What do the three Friday tickets add up to at full price?", True),
        ("How much will residents' permits for both cars cost us a year?", True),
        ("I want to go to all three Friday events. How much is that?", True),
        ("How much will a pitch cost for 3 nights in August?", True),
        ("How much do 2 adult tickets cost?", True),
        ("How many visitors came in total over the two years?", True),
        ("What does a residents' permit cost under the 2025 prices?", False),  # a year, no count
        ("How many weeks of sick pay after working there for three years?", False),
        ("How much do they pay if the water is off for 12 hours?", False),
        ("How many more visitors came in 2024 than in 2023?", False),  # a difference
        ("On which day does the physiotherapist come to the island?", False),  # no amount
    ],
)
def test_a_question_about_memory_that_adds_figures_up_asks_for_a_total(
    question: str, total: bool
) -> None:
    from graph.compute import asks_total

    assert asks_total(question) is total
    if total:
        assert looks_computational(question, grounded=True)
        assert not looks_computational(question)  # without memory there is nothing to add


def test_a_total_is_worked_out_from_the_figures_the_passages_give() -> None:
    from graph.compute import total

    both = total(
        "How much will a massage and a bathing session come to, in pounds?",
        PRICES,
        lambda m: _terms(("Hot stone massage (50 minutes) £85", 85, 1), ("session £20", 20, 1)),
    )
    assert both.ok and both.value == "105" and both.figures == ("85", "20")
    assert "term1 = 85  # Hot stone massage" in both.source
    assert "total = term1 + term2" in both.source
    nights = total(
        "How much will a pitch with hook-up cost for 3 nights in August?",
        PRICES,
        lambda m: _terms(("per night: £29 (peak)", 29, 3)),
    )
    assert nights.ok and nights.value == "87" and "term1 = 29 * 3" in nights.source
    permits = total(
        "How much will permits for both cost a year?",
        PRICES,
        lambda m: _terms(("first permit 45", 45, 1), ("second permit 90", 90, 1)),
    )
    assert permits.value == "135"


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        ("not json", "Expecting value"),
        ('{"terms": 85}', "with a list of terms"),
        ('{"terms": []}', "lists 0 figures"),
        (_terms(*[("£85", 85, 1)] * 7), "lists 7 figures"),
        (_terms(("£85", 85, 1), ("£21", 21, 1)), "21 is not a figure the passages give"),
        (_terms(("£85", 85, 1), ("first permit 45", 20, 1)), "term 2's figure's words do not"),
        (_terms(("£85", 85, 1)), "one figure taken once is nothing to add up"),
        (_terms(("£29 a night", 29, 4)), "count 4 is not one the question states"),
        (_terms(("£29 a night", 29, 0)), "count 0 is not a whole number from 1"),
        (_terms(("£29 a night", 29, 2.5)), "count 2.5 is not a whole number"),
        (_terms(("£29 a night", 29, True)), "count is not a number"),
        (_terms(("£29 a night", 29, "3")), "count is not a number"),
        (_terms(("£29 a night", 29, 1e9)), "is not a whole number from 1"),
        ('{"terms": [{"words": "£85", "value": 85}, 4]}', "not an object"),
        (_terms(("£85", 85, 1), ("£20", 20, 1)) + " " * 5000, "longer than"),
        ('{"terms": ' + "[" * 1900 + "]" * 1900 + "}", "nested too deeply"),
    ],
)
def test_figures_that_cannot_be_trusted_give_no_total(reply: str, reason: str) -> None:
    from graph.compute import total

    result = total("How much will 3 nights on a pitch come to?", PRICES, lambda m: reply)
    assert not result.ok and reason in result.reason and result.value == ""
    assert len(result.source) <= 300


def test_a_word_label_before_a_citation_gives_way_to_it() -> None:
    from graph.answer import unlabelled

    assert unlabelled("Found: 1437 passengers [report] [1].") == "Found: 1437 passengers [1]."
    assert unlabelled("It is £5 [price list][2][3] a day.") == "It is £5 [2][3] a day."
    for kept in ("It is £5 [price list].", "[memory: none] [1]", "See [1] [2].", "[sic] a [b]"):
        assert unlabelled(kept) == kept


# -- citing where the answer's figures are stated -------------------------------------------

_FERRY = [
    {"text": "Files: *\nCopyright: 2001 Jane Roe\nLicense: GPL-2+"},
    {"text": "In 2024 the Kelvick ferry carried 18,412 passengers."},
    {"text": "In 2023 it carried 16,975 passengers, and the fare was £4.20."},
]


def test_a_computed_difference_gives_the_figures_it_was_worked_out_from() -> None:
    from graph.compute import difference

    result = difference("By how many MB was the limit raised?", FACTS, lambda m: _pair(250, 100.0))
    assert result.figures == ("250", "100")
    assert result.as_dict()["figures"] == ["250", "100"]


def test_a_program_s_figures_are_those_it_took_beyond_constants_years_and_the_question() -> None:
    from graph.compute import taken

    source = (
        "def solve(self):\n    a = 18412\n    b = 16975.0\n    weeks = 52\n"
        "    start = date(2024, 3, 14)\n    return (a - b) * 3 + 0.5 - weeks\n"
    )
    # 52 and 3 are common constants, 2024 a year, 0.5 the question's own, 14 a day: kept
    assert taken(source, "What is 0.5 more than three times the rise?") == ("18412", "16975", "14")
    assert taken("def solve(self:\n", "q") == ()
    assert taken("x = " + "9" * 400 + "\n", "q") == ()  # too large to be any figure


def test_a_program_with_an_integer_too_large_for_a_float_is_refused_not_crashed() -> None:
    from graph.compute import unsourced

    assert unsourced("x = " + "9" * 400 + "\n", "figures 12") == ["an integer of 1329 bits"]


@pytest.mark.parametrize(
    ("text", "fixed", "changed"),
    [
        # a licence file cited for a passenger count: the two passages stating the figures
        ("It carried 1437 more [1].", "It carried 1437 more [2][3].", ([1], [2, 3])),
        ("It carried 1,437 more. Good.", "It carried 1,437 more [2][3]. Good.", ([], [2, 3])),
        ("It carried 1437 more [2].", "It carried 1437 more [2][3].", ([], [3])),
        ("1437 [1][2]\nSee also [1].", "1437 [2][3]\nSee also [1].", ([1], [3])),
        # another sentence keeps its citation; a passage stating a figure keeps its own
        (
            "GPL [1]. It is 1437 [1] [3]. GPL [1].",
            "GPL [1]. It is 1437 [2][3]. GPL [1].",
            ([1], [2]),
        ),
        ("It is 1437 [2][3].", "It is 1437 [2][3].", None),  # cited right
        ("I could not work it out [1].", "I could not work it out [1].", None),  # not stated
    ],
)
def test_an_answer_stating_a_computed_result_cites_the_passages_of_its_figures(
    text: str, fixed: str, changed: tuple[list[int], list[int]] | None
) -> None:
    from graph.answer import cite_sources

    assert cite_sources(text, _FERRY, ["18412", "16975"], "1437") == (fixed, changed)


def test_figures_no_passage_states_leave_the_answer_as_it_is() -> None:
    from graph.answer import cite_sources, figure_sources

    assert figure_sources(["99", "18412", "18412.0"], _FERRY) == [2]
    assert cite_sources("It is 5 [1].", _FERRY, ["99", "94"], "5") == ("It is 5 [1].", None)


_MANUALS = [
    {
        "text": "The PowerStack warranty is 12 years from fitting for units fitted after April.",
        "citation": "/srv/docs/lumacor.md:0-500",
        "source": "/srv/docs/lumacor.md",
    },
    {
        "text": "Firmware 2.3 uploads readings every 60 seconds to the national network.",
        "citation": "/srv/docs/skyvane.md:0-400",
        "source": "/srv/docs/skyvane.md",
    },
    {
        "text": "The council meets next on Tuesday 19 August 2025 in the Village Hall.",
        "citation": "/srv/docs/minutes.txt:10-400",
        "source": "/srv/docs/minutes.txt",
    },
    {
        "text": "Council minutes: the Village Hall roof was repaired in August 2025; key safe B7.",
        "citation": "/srv/docs/minutes.txt:400-900",
        "source": "/srv/docs/minutes.txt",
    },
]


@pytest.mark.parametrize(
    ("text", "request_", "fixed", "n"),
    [
        # a word label where a citation would stand gives way to the passage's number
        (
            "A PowerStack fitted in May has a warranty of 12 years [warranty].",
            "How long is the PowerStack warranty?",
            "A PowerStack fitted in May has a warranty of 12 years [1].",
            1,
        ),
        (
            "It uploads every 60 seconds to the national network. That is new.",
            "How often does the weather station upload?",
            "It uploads every 60 seconds to the national network [2]. That is new.",
            2,
        ),
        # two passages state its figures: the one sharing more of its words
        (
            "On Tuesday 19 August 2025, in the Village Hall.",
            "When does the council meet next?",
            "On Tuesday 19 August 2025, in the Village Hall [3].",
            3,
        ),
        # cites already; a figure no passage states; nothing of its own to match
        ("It is 12 years [1].", "How long?", "It is 12 years [1].", None),
        ("It is 15 years.", "How long is the warranty?", "It is 15 years.", None),
        ("The warranty.", "How long is the warranty?", "The warranty.", None),
        # words alone that two passages share equally: no citation rather than a guess
        ("In the Village Hall.", "Where?", "In the Village Hall.", None),
        # a figure both passages state, with as many words: the best-ranked of them
        ("August 2025.", "When?", "August 2025 [3].", 3),
        # a code is as telling as a figure; a code no passage states cites nothing
        ("The code is B7.", "What is the hall's code?", "The code is B7 [4].", 4),
        ("The code is B8.", "What is the hall's code?", "The code is B8.", None),
    ],
)
def test_an_answer_citing_nothing_cites_the_one_passage_stating_it(
    text: str, request_: str, fixed: str, n: int | None
) -> None:
    from graph.answer import attributed

    assert attributed(text, _MANUALS, request_) == (fixed, n)


def test_a_citation_line_copied_into_an_answer_becomes_its_number() -> None:
    from graph.answer import unechoed

    text = "1. /srv/docs/minutes.txt:10-400. Tuesday 19 August, see /srv/docs/skyvane.md too."
    assert unechoed(text, _MANUALS) == "1. [3]. Tuesday 19 August, see [2] too."
    # two passages of one file: each citation line is its own passage's number
    text = "See /srv/docs/minutes.txt:400-900 and /srv/docs/minutes.txt:10-400."
    assert unechoed(text, _MANUALS) == "See [4] and [3]."


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=200), figures=st.lists(st.sampled_from(["18412", "16975", "7"])))
def test_citing_sources_or_attributing_never_raises_and_keeps_the_words(
    text: str, figures: list[str]
) -> None:
    import re

    from graph.answer import attributed, cite_sources

    def words(s: str) -> str:
        return re.sub(r"\[[^\]\n]{0,41}\]|\s", "", s)

    sourced, _ = cite_sources(text, _FERRY, figures, "1437")
    assert words(sourced) == words(text)
    given_one, n = attributed(text, _MANUALS, "How long is the warranty?")
    assert words(given_one) == words(text) and (n is None) == (given_one == text)


def test_copied_words_stating_no_figure_but_a_year_let_the_figure_through() -> None:
    from graph.compute import difference

    facts = "The ferry carried 18,412 passengers in 2024, against 16,975 in 2023."
    named = ("The ferry carried passengers in 2024", "passengers in 2023")
    result = difference("How many more passengers?", facts, lambda m: _pair(18412, 16975, named))
    assert result.ok and result.value == "1437"
    # words stating another figure are refused, however the figure is spelled
    other = ("carried 18,412 passengers", "against 16,975.0")
    assert difference("How many more?", facts, lambda m: _pair(18412, 16975, other)).ok
    # a number the document spells out is stated by its words
    spelled = ("six weeks at full pay", "Two weeks' paid leave (old policy)")
    assert difference(
        "How many more weeks?", "6 weeks now; 2 before.", lambda m: _pair(6, 2, spelled)
    ).ok
    # a date names the figure as a year does
    dated = ("6 weeks at full pay", "before 1 April 2025")
    assert difference(
        "How many more weeks?", "6 weeks now; 2 before.", lambda m: _pair(6, 2, dated)
    ).ok
    # words copied across a line break, the break kept raw inside the JSON string
    broken = _pair(6, 2, ("6 weeks at full pay", "before 1 April 2025: 2\nweeks")).replace(
        "\\n", "\n"
    )
    assert "\n" in broken
    assert difference("How many more weeks?", "6 weeks now; 2 before.", lambda m: broken).ok
    wrong = ("carried 18,412 passengers", "2024, against 17,000")
    refused = difference("How many more?", facts, lambda m: _pair(18412, 16975, wrong))
    assert refused.reason == "the second figure's words do not state 16975"
