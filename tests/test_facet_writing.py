"""Facet methods written ahead of use: by ``batos init --prepare`` and the heartbeat, with
failures recorded and tried again after a wait that doubles."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fakes import FakeModels, ModelCall, call_kind
from test_mind import facet_source

from batos.shell.cli import main
from batos.shell.doctor import check_facets
from batos.shell.runtime import open_image
from graph import facet_writing, facets
from prototypes.incarnation import personas
from prototypes.uvm import Method
from store.core import method_queue
from store.core.image import LivingImage

SELECTOR = re.compile(r"Write the method `(\w+)`")
ALL = len(facet_writing.codex_facets())


def drafting(source=facet_source) -> FakeModels:
    def respond(call: ModelCall) -> Any:
        assert call_kind(call) == "draft"
        return "```python\n" + source(SELECTOR.search(call.text).group(1)) + "```"

    return FakeModels(respond)


@pytest.fixture
def image() -> Any:
    living = open_image("memory://")
    yield living
    living.close()


def test_a_facet_is_written_tried_on_samples_and_installed(image: LivingImage) -> None:
    models = drafting()
    result = facet_writing.write_one(image, "BRICK", "facet_steps", models)
    assert result.ok and result.key == "BRICK.facet_steps"
    assert "vegetable patch" in models.calls[0].text  # a sample, never a user's request
    with image.read() as root:
        method = personas(root)["BRICK"]._slots()["facet_steps"]
        assert isinstance(method, Method) and method.compiler == "sandbox"
        assert method.audit["written"] == "ahead of use"
        assert ("BRICK", "facet_steps") not in facet_writing.missing(root)
        assert method_queue.entries(root)["BRICK.facet_steps"]["state"] == "written"


@pytest.mark.parametrize(
    "intent",
    [  # codex version 4's form, and the form before it (an image not yet upgraded)
        "Given a question, return {'instruction': 'Steps for: ' + question, 'temperature': 0.2}.",
        "Given a question, return a dict: 'instruction' is the text 'Steps for: ' followed by "
        "the question; 'temperature' is 0.2.",
    ],
)
def test_a_result_is_held_to_what_its_intent_states(intent: str) -> None:
    assert facets.stated(intent) == ("Steps for: ", 0.2)
    right = facets.Instruction("Steps for:  a shed", {"temperature": 0.2})
    assert facets._as_stated(right, "a shed", intent) == ""
    quoted = facets.Instruction('Steps for: "a shed"', {"temperature": 0.2})
    assert "must be exactly 'Steps for: a shed'" in facets._as_stated(quoted, "a shed", intent)
    hot = facets.Instruction("Steps for: a shed", {"temperature": 0.9})
    assert (
        facets._as_stated(hot, "a shed", intent) == "'temperature' must be 0.2, as the intent says"
    )
    assert facets.stated("Return the question upper-cased.") == (None, None)
    loose = facets.Instruction("Please: a shed", {})
    assert facets._as_stated(loose, "a shed", "Return the question upper-cased.") == ""


def test_keys_a_facet_s_dict_does_not_take_are_dropped_unread(image: LivingImage) -> None:
    extra = facet_source("facet_steps").replace("'temperature'", "'intent': 'steps', 'temperature'")
    assert "'intent': 'steps'" in extra
    result = facet_writing.write_one(image, "BRICK", "facet_steps", drafting(lambda s: extra))
    assert result.ok, result.reason
    instruction = facets.instruction_from({"instruction": "Do this", "details": {"x": 1}})
    assert instruction == facets.Instruction("Do this", {}, None)


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (lambda s: f"def {s}(self, query):\n    import os\n    return os.getcwd()\n", "os"),
        (  # a method that ignores its question and returns the same text for every one
            lambda s: f"def {s}(self, query):\n    return 'List the steps for a garden.'\n",
            "must contain the question the method was called with",
        ),
        (  # the intent's text with its placeholder read as a number, as drafts did
            lambda s: facet_source(s).replace("at most six steps", "at most 6 steps"),
            "the instruction must be exactly 'List the numbered steps that solve this, one "
            "short line each, at most six steps: how do I keep",
        ),
        (  # the question quoted: not the intent's text followed by the question
            lambda s: (
                f"def {s}(self, query):\n    return {{'instruction': 'List the numbered "
                "steps that solve this, one short line each, at most six steps: \"' + query + "
                "'\"', 'temperature': 0.2}\n"
            ),
            "the instruction must be exactly",
        ),
        (
            lambda s: facet_source(s).replace("'temperature': 0.2", "'temperature': 0.9"),
            "'temperature' must be 0.2, as the intent says",
        ),
    ],
)
def test_a_facet_that_cannot_be_written_waits_longer_after_each_failure(
    image: LivingImage, source, why: str
) -> None:
    models = drafting(source)
    first = facet_writing.write_one(image, "BRICK", "facet_steps", models)
    assert not first.ok and why in first.reason
    with image.read() as root:
        assert "facet_steps" not in personas(root)["BRICK"]._slots()
        entry = method_queue.entries(root)["BRICK.facet_steps"]
        assert entry["state"] == "failed" and entry["failures"] == 1
        wait = entry["next_try"] - entry["tried"]
        assert wait == method_queue.BACKOFF_BASE_S
    assert ("BRICK", "facet_steps") not in facet_writing.due(image)
    later = entry["next_try"] + 1
    assert ("BRICK", "facet_steps") in facet_writing.due(image, now=later)
    facet_writing.write_one(image, "BRICK", "facet_steps", models)
    with image.read() as root:
        entry = method_queue.entries(root)["BRICK.facet_steps"]
        assert entry["failures"] == 2 and entry["next_try"] - entry["tried"] == 2 * wait


def test_backoff_doubles_up_to_a_day() -> None:
    assert [method_queue.backoff(n) for n in (1, 2, 3)] == [600.0, 1200.0, 2400.0]
    assert method_queue.backoff(40) == method_queue.BACKOFF_MAX_S


def test_the_heartbeat_writes_a_few_due_facets_per_run(image: LivingImage) -> None:
    from batos.shell.heartbeat import JOBS

    job = JOBS["facets"][0]
    decided = job(image, drafting())
    said = decided.said
    assert said.startswith(f"facets: wrote {facet_writing.PER_RUN}")
    assert len(decided.facts["wrote"]) == facet_writing.PER_RUN and decided.facts["due"] == ALL
    assert f"{ALL - facet_writing.PER_RUN} still due" in said
    with image.read() as root:
        assert len(facet_writing.missing(root)) == ALL - facet_writing.PER_RUN


def test_init_prepare_writes_every_facet_and_doctor_says_so(capsys, file_uri: str) -> None:
    assert main(["--image", file_uri, "init", "--prepare"], models=drafting()) == 0
    out = capsys.readouterr().out
    assert out.count("✓ ") >= ALL and "BRICK.facet_steps" in out
    [check] = check_facets(file_uri)
    assert check.status == "ok" and check.detail == f"{ALL} of {ALL} facet methods written"
    assert main(["--image", file_uri, "init", "--prepare"], models=drafting()) == 0
    assert "every facet method is written" in capsys.readouterr().out


def test_ctrl_c_in_init_prepare_keeps_what_was_written_and_says_so(capsys, file_uri: str) -> None:
    drafts: list[str] = []

    def respond(call: ModelCall) -> Any:
        selector = SELECTOR.search(call.text).group(1)
        if len(set(drafts) | {selector}) > 2:  # the third facet: the user presses Ctrl-C
            raise KeyboardInterrupt
        drafts.append(selector)
        return "```python\n" + facet_source(selector) + "```"

    code = main(["--image", file_uri, "init", "--prepare"], models=FakeModels(respond))
    out = capsys.readouterr().out
    assert code == 130
    assert f"interrupted: 2 of {ALL} facet(s) written and kept" in " ".join(out.split())
    [check] = check_facets(file_uri)
    assert check.detail == f"2 of {ALL} facet methods written"


def test_doctor_names_a_facet_that_failed_and_when_it_is_tried_again(file_uri: str) -> None:
    with open_image(file_uri, create=True) as image:
        bad = drafting(lambda s: f"def {s}(self, query):\n    return self.__class__\n")
        facet_writing.write_one(image, "ROBIN", "facet_feelings", bad)
    checks = check_facets(file_uri)
    assert checks[0].status == "warn" and checks[0].detail == f"0 of {ALL} facet methods written"
    [failed] = checks[1:]
    assert failed.detail.startswith("ROBIN.facet_feelings could not be written (1 tries)")
    assert "tried again after" in failed.fix and "batos methods add robin" in failed.fix
