"""``batos ask``, ``chat``, ``cycles`` and ``run`` against a file image, with a scripted model."""

from __future__ import annotations

import io
import json

import pytest
from fakes import FakeModels
from test_mind import plan_of, responder

from graph.cli import main
from store.image import LivingImage


def run(capsys, *argv: str, models=None) -> tuple[int, str, str]:
    code = main(list(argv), models=models)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def image(capsys, file_uri: str) -> str:
    assert run(capsys, "--image", file_uri, "init")[0] == 0
    return file_uri


def test_ask_streams_the_cycle_and_says_what_it_committed(capsys, image) -> None:
    plan = plan_of(("ALFRED.facet_audit", "is the image healthy"))
    models = FakeModels(responder(plan=plan))
    code, out, err = run(
        capsys,
        "--image",
        image,
        "ask",
        "audit the image health",
        "-p",
        "alfred",
        "-t",
        "t1",
        models=models,
    )
    assert code == 0, err
    assert "route → ALFRED" in out and "depth full: planning cue 'audit'" in out
    assert "plan  ALFRED.facet_audit: is the image healthy" in out
    assert "✓ facet ALFRED.facet_audit" in out and "(method written)" in out
    assert "answer: About audit the image health" in out
    assert "COMPLETE cycle" in out and "on thread t1" in out

    code, out, _ = run(capsys, "--image", image, "cycles", "--json")
    rows = json.loads(out)["committed"]
    assert rows[0]["facets"] == ["ALFRED.facet_audit"]
    assert rows[0]["methods_written"] == ["ALFRED.facet_audit"]
    code, out, _ = run(capsys, "--image", image, "cycles", rows[0]["id"])
    assert code == 0 and "ALFRED.facet_audit" in out


def test_ask_json_and_a_failed_cycle(capsys, image) -> None:
    models = FakeModels(responder())
    code, out, _ = run(
        capsys, "--image", image, "ask", "hello there", "-p", "robin", "--json", models=models
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["status"] == "COMPLETE" and summary["depth"]["mode"] == "fast"
    assert summary["response"] == "About hello there: here is the answer."

    code, out, err = run(capsys, "--image", image, "ask", "  ", "-p", "robin", models=models)
    assert code == 10
    assert "FAILED at route: the request is empty" in err and "image is unchanged" in err
    code, out, err = run(capsys, "--image", image, "ask", "hi", "-p", "joker", models=models)
    assert code == 10 and "unknown persona 'joker'" in err
    code, out, err = run(capsys, "--image", image, "ask", "hi", "-t", "no/slash", models=models)
    assert code == 10 and "thread id 'no/slash' is malformed" in err
    code, out, _ = run(capsys, "--image", image, "cycles")
    assert code == 0 and "FAILED thread" in out and "unknown persona" in out


def test_chat_keeps_a_thread_and_undoes_the_last_exchange(capsys, image, monkeypatch) -> None:
    models = FakeModels(responder())
    lines = "hello there\nhow are you\n/history\n/undo\n/history\n/thread\n/nope\n/quit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    code, out, err = run(
        capsys, "--image", image, "chat", "-t", "kitchen", "-p", "robin", models=models
    )
    assert code == 0, err
    history = out.split("the last exchange is undone")
    assert "you: how are you" in history[0]
    assert "you: hello there" in history[1] and "you: how are you" not in history[1]
    assert "thread kitchen" in out and "unknown command /nope" in out
    with LivingImage.open(image) as living, living.read() as root:
        assert root["objects"]["robin"].stats["cycles"] == 2  # the image keeps both


def test_run_answers_a_sample_request_end_to_end(capsys, image) -> None:
    plan = plan_of(("BRICK.facet_steps", "which steps"), ("BRICK.facet_design", "what design"))
    models = FakeModels(responder(plan=plan))
    code, out, err = run(capsys, "--image", image, "run", models=models)
    assert code == 0, err
    assert "Plan my first week of learning to program" in out
    assert "✓ facet BRICK.facet_steps" in out and "✓ facet BRICK.facet_design" in out
    assert "COMPLETE cycle" in out


def test_serve_refuses_other_than_loopback(capsys, image) -> None:
    code, _, err = run(capsys, "--image", image, "serve", "--host", "0.0.0.0")
    assert code == 1 and "loopback only" in err
