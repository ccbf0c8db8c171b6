"""Wrong methods do not stay: rejecting a generated method, restoring it, the refusal of its
code, the periodic check that takes out methods whose examples fail, and the CLI."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from fakes import ScriptedChatModel
from test_cli_kernel import run

from batos.errors import AuditRejected, ObjectPathError
from batos.shell.heartbeat import Heartbeat
from batos.shell.runtime import open_image
from graph import facet_writing, jit, rejection
from prototypes import kernel, rejected
from prototypes.incarnation import personas
from prototypes.uvm import Method, UvmObject
from store.core import method_queue
from store.core.image import LivingImage

DOUBLE = "def double(self, x):\n    return x * 2 + self.bias\n"
INTENT = "Given a number x, return twice x plus the bias slot."


def generated(obj: UvmObject, selector: str = "double", source: str = DOUBLE, **kw) -> Method:
    """A method as a mission installs it: written by a persona, with agreed examples."""
    method = Method(
        selector,
        source,
        intent=kw.get("intent", INTENT),
        author=kw.get("author", "BRICK"),
        compiler="sandbox",
        audit={"verdict": "approved", "findings": []},
    )
    pairs = kw.get("examples", (([2], 5), ([0], 1)))
    method.examples = [
        {"args": args, "slots": {}, "returns": returns, "slots_after": {}, "status": "agreed"}
        for args, returns in pairs
    ]
    method.audit["examples_check"] = kernel.check_record(method, len(pairs), [])
    return obj._add_method(method)


@pytest.fixture
def image() -> Iterator[LivingImage]:
    """A memory image with the personas and one object, calc, holding a generated method."""
    with open_image("memory://") as img:

        def setup(root):
            calc = root["objects"]["calc"] = UvmObject(name="calc", bias=1)
            generated(calc)

        img.transact(setup)
        yield img


def test_reject_takes_the_method_out_and_keeps_it_whole(image) -> None:
    done = rejection.reject(image, "calc", "double", reason="it should triple")
    assert (done.number, done.path, done.selector, done.cause) == (1, "calc", "double", "user")
    assert done.rewritten_by.startswith("doesNotUnderstand")
    with image.read() as root:
        calc = root["objects"]["calc"]
        assert calc._lookup("double") is None
        # The intent stays declared: the method written next has the same one.
        assert calc.intents["double"] == INTENT
        (row,) = rejection.rejected_rows(root)
        record = next(rejected.entries(root))
        assert record["method"].source == DOUBLE and record["holder"] is calc
        assert record["method"].audit["examples_check"]["passed"] == 2
    assert row["reason"] == "it should triple" and row["status"] == "pending"
    assert row["source"] == DOUBLE and [e["args"] for e in row["examples"]] == [[2], [0]]
    assert "(" in row["by"] and row["at"] > 0


def test_restore_puts_it_back_through_the_gate_and_lifts_the_refusal(image) -> None:
    rejection.reject(image, "calc", "double")
    with image.read() as root:
        calc = root["objects"]["calc"]
        assert rejected.refusal(calc, "double", "# the same code\n" + DOUBLE)
    done = rejection.restore(image, "calc", "double")
    assert (done.number, done.path, done.disputed) == (1, "calc", ())
    with image.read() as root:
        calc = root["objects"]["calc"]
        assert calc.double(2) == 5
        assert calc._methods["double"].audit["restored"]["record"] == 1
        assert rejection.rejected_rows(root)[0]["status"] == "restored"
        assert rejected.refusal(calc, "double", DOUBLE) is None
    with pytest.raises(rejection.RejectionError, match="no rejected method"):
        rejection.restore(image, "calc", "double")


def test_restore_goes_through_the_guardian_again_and_changes_nothing_when_refused(image) -> None:
    rejection.reject(image, "calc", "double")

    def tamper(root):  # the record is data anyone could have edited
        record = next(rejected.entries(root))
        record["method"].source = "import os\ndef double(self, x):\n    return os.getcwd()\n"

    image.transact(tamper)
    with pytest.raises(AuditRejected, match="os"):
        rejection.restore(image, "calc", "double")
    with image.read() as root:
        assert root["objects"]["calc"]._lookup("double") is None
        assert rejection.rejected_rows(root)[0]["status"] == "pending"


def test_restore_keeps_examples_it_fails_as_disputed(image) -> None:
    image.transact(lambda root: setattr(root["objects"]["calc"], "bias", 2))
    assert rejection.check_methods(image).removed[0].cause == "examples"
    done = rejection.restore(image, "calc", "double")
    assert len(done.disputed) == 2 and "should return 5, but it returned 6" in done.disputed[0]
    with image.read() as root:
        method = root["objects"]["calc"]._methods["double"]
        assert {e["status"] for e in method.examples} == {"disputed"}
    # The user's word outweighs the examples: the next check leaves it alone.
    report = rejection.check_methods(image)
    assert report.removed == [] and report.checked == 0


def test_restore_refuses_a_slot_written_again(image) -> None:
    rejection.reject(image, "calc", "double")
    image.transact(lambda root: generated(root["objects"]["calc"], source=DOUBLE + "\n"))
    with pytest.raises(rejection.RejectionError, match="has a method again"):
        rejection.restore(image, "calc", "double")
    with image.read() as root:
        assert rejection.rejected_rows(root)[0]["status"] == "written again"


def test_rejected_code_drafted_again_is_refused_and_the_author_is_told(image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "1")
    rejection.reject(image, "calc", "double", reason="not what I meant")
    examples = json.dumps(
        {"examples": [{"args": [2], "slots": {}, "returns": 5, "slots_after": {}}]}
    )
    # The same code as the rejected one, spelled otherwise: refused all the same.
    same = "```python\ndef double(self, x):\n    # twice\n    return x*2 + self.bias\n```"
    other = "```python\ndef double(self, x):\n    return x + x + self.bias\n```"
    model = ScriptedChatModel().enqueue(examples, same, other)
    runner = jit.JitRunner(model, drafts=1)
    assert image.transact(lambda root: runner.send(root["objects"]["calc"], "double", (2,))) == 5
    assert "this code was rejected as double" in model.history[-1][-1].content
    assert "not what I meant" in model.history[-1][-1].content
    with image.read() as root:
        assert "x + x" in root["objects"]["calc"]._methods["double"].source
        assert rejection.rejected_rows(root)[0]["status"] == "written again"


def test_errors_are_clear_and_write_nothing(image) -> None:
    image.transact(
        lambda root: kernel.add_method(
            root["objects"]["calc"], "shout", "def shout(self, t):\n    return t.upper()\n"
        )
    )
    with image.read() as root:
        before = set(root.keys())
    with pytest.raises(ObjectPathError, match="nobody"):
        rejection.reject(image, "nobody", "double")
    with pytest.raises(ObjectPathError, match="not a method") as unknown:
        rejection.reject(image, "calc", "triple")
    assert "its generated methods: double" in unknown.value.hint
    with pytest.raises(rejection.RejectionError, match="data slot"):
        rejection.reject(image, "calc", "bias")
    with pytest.raises(rejection.RejectionError, match="written by hand") as hand:
        rejection.reject(image, "calc", "shout")
    assert "batos methods remove calc shout" in hand.value.hint
    with image.read() as root:
        assert set(root.keys()) == before  # not even the record's container
        assert isinstance(root["objects"]["calc"]._lookup("shout")[1], Method)


def test_rejecting_a_facet_makes_it_pending_for_the_heartbeat(image) -> None:
    source = (
        "def facet_steps(self, question):\n"
        "    return {'instruction': 'List the steps: ' + question, 'temperature': 0.2}\n"
    )
    image.transact(lambda root: generated(personas(root)["BRICK"], "facet_steps", source))
    done = rejection.reject(image, "brick", "facet_steps", reason="too terse")
    assert done.rewritten_by == "the heartbeat's facets job"
    with image.read() as root:
        entry = method_queue.entries(root)["BRICK.facet_steps"]
        (row,) = [r for r in facet_writing.status(root) if r["facet"] == "BRICK.facet_steps"]
    assert entry["state"] == "pending" and entry["reason"] == "rejected: too terse"
    assert row["state"] == "pending"
    assert ("BRICK", "facet_steps") in facet_writing.due(image)
    rejection.restore(image, "brick", "facet_steps")
    with image.read() as root:
        assert method_queue.entries(root)["BRICK.facet_steps"]["state"] == "written"


def test_the_periodic_check_takes_out_methods_whose_examples_fail(image) -> None:
    def setup(root):
        calc = root["objects"]["calc"]
        generated(calc, "half", "def half(self, x):\n    return x / 2\n", examples=(([4], 2),))
        # A hand-written method keeps its failures in view, but is never taken out.
        kernel.add_method(calc, "shout", "def shout(self, t):\n    return t\n")
        calc._methods["shout"].examples = [
            {"args": ["a"], "slots": {}, "returns": "A", "slots_after": {}, "status": "agreed"}
        ]
        calc.bias = 2  # double's examples assumed a bias of 1

    image.transact(setup)
    said = Heartbeat(image).run("methods")
    assert said.startswith("methods: 2 checked") and "took out 1 that fail them" in said
    with image.read() as root:
        calc = root["objects"]["calc"]
        assert calc._lookup("double") is None and {"half", "shout"} <= set(calc._methods)
        (row,) = rejection.rejected_rows(root)
    assert row["cause"] == "examples" and row["selector"] == "double"
    assert row["reason"].startswith("2 stored example(s) fail: ")
    assert "should return 5, but it returned 6" in row["reason"]
    assert row["examples_check"]["passed"] == 0  # the failing check is kept with it
    assert "took out" not in Heartbeat(image).run("methods")


def test_a_failure_on_compile_is_noted_and_taken_out_after_that_transaction(
    image, monkeypatch
) -> None:
    """The compile happens inside someone else's transaction: it is not committed by the
    removal, and the removal waits for a transaction of its own."""
    rejected.take_failing()
    monkeypatch.setattr(kernel, "runtime_fingerprint", lambda: "a later release")
    image.transact(lambda root: setattr(root["objects"]["calc"], "bias", 2))
    image.db.cacheMinimize()  # as after a restart: compiled again on the next send
    with image.connection() as conn:
        tm = conn.transaction_manager
        tm.begin()
        calc = conn.root()["objects"]["calc"]
        calc.note = "half done"
        assert calc.double(1) == 4  # compiled: its examples run again, and fail
        assert "double" in calc._methods  # not taken out inside this transaction
        report = rejection.remove_noted(image)  # while that one is still open
        assert [r.selector for r in report.removed] == ["double"]
        tm.abort()
    with image.read() as root:
        calc = root["objects"]["calc"]
        assert calc._lookup("double") is None
        assert "note" not in calc._slots()  # the other transaction was never committed
    assert rejection.remove_noted(image).checked == 0  # the notes were taken


# -- on a file image: history, undo, a killed process, the command line ---------------------------


@pytest.fixture
def file_image(capsys, file_uri: str) -> str:
    assert run(capsys, "--image", file_uri, "init")[0] == 0

    def setup(root):
        brick = personas(root)["BRICK"]
        brick.bias = 1
        generated(brick)

    with LivingImage.open(file_uri) as img:
        img.transact(setup)
    return file_uri


def test_the_rejection_is_one_transaction_that_batos_undo_reverts(file_image: str) -> None:
    with LivingImage.open(file_image) as img:
        rejection.reject(img, "brick", "double")
        entry = img.history(1)[0]
        assert entry.description == "methods reject brick.double"
        img.undo(entry.tid)
        with img.read() as root:
            assert root["objects"]["brick"].double(2) == 5
            assert rejection.rejected_rows(root) == []


@pytest.mark.parametrize("where", ["in the transaction", "mid-commit"])
def test_a_process_killed_mid_removal_leaves_all_of_it_or_none(file_image: str, where) -> None:
    kill = {
        "in the transaction": """
            add = rejected.add
            def dying(*args, **kwargs):
                add(*args, **kwargs)
                os.kill(os.getpid(), signal.SIGKILL)
            rejected.add = dying
        """,
        "mid-commit": """
            FileStorage._finish = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
        """,
    }[where]
    script = textwrap.dedent(
        """
        import os, signal
        from ZODB.FileStorage import FileStorage
        from graph import rejection
        from prototypes import rejected
        from store.core.image import LivingImage
        image = LivingImage.open({uri!r})
        {kill}
        rejection.reject(image, "brick", "double", reason="killed on the way")
        """
    ).format(uri=file_image, kill=textwrap.dedent(kill))
    victim = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert victim.returncode == -9, victim.stderr.decode()
    with LivingImage.open(file_image) as img:
        with img.read() as root:
            assert root["objects"]["brick"].double(2) == 5  # still there, and nothing recorded
            assert rejection.rejected_rows(root) == []
            assert "BRICK.double" not in method_queue.entries(root)
        done = rejection.reject(img, "brick", "double")  # and the next try goes through whole
        with img.read() as root:
            assert root["objects"]["brick"]._lookup("double") is None
            assert [r["id"] for r in rejection.rejected_rows(root)] == [done.number]


def test_cli_reject_list_restore(capsys, file_image: str) -> None:
    uri = ("--image", file_image)
    code, out, err = run(capsys, *uri, "methods", "reject", "brick", "double", "-r", "off by one")
    assert code == 0 and "rejected brick.double (record 1)" in out, err
    assert "doesNotUnderstand" in out and "batos methods restore brick double" in err
    code, out, _ = run(capsys, *uri, "methods", "--no-source")
    assert code == 0 and "1 method(s) taken out as wrong" in out
    code, out, _ = run(capsys, *uri, "methods", "--rejected")
    assert code == 0 and "off by one" in out and "pending" in out and "x * 2" in out
    assert "self.double(2) → 5" in out
    code, out, _ = run(capsys, *uri, "methods", "--rejected", "--json")
    (row,) = json.loads(out)
    assert row["reason"] == "off by one" and row["status"] == "pending"
    assert row["examples"][0]["status"] == "agreed" and row["source"] == DOUBLE
    code, out, _ = run(capsys, *uri, "methods", "--rejected", "--json", "--no-source")
    assert code == 0 and [set(r) for r in json.loads(out)] == [set(row) - {"source"}]
    code, out, _ = run(capsys, *uri, "methods", "restore", "brick", "double")
    assert code == 0 and "restored brick.double from record 1" in out
    code, out, _ = run(capsys, *uri, "send", "brick", "double", "3", "--json")
    assert code == 0 and json.loads(out) == 7
    code, out, _ = run(capsys, *uri, "methods", "--rejected", "--no-source")
    assert code == 0 and "restored" in out


def test_cli_errors(capsys, file_image: str, tmp_path) -> None:
    uri = ("--image", file_image)
    shout = tmp_path / "shout.py"
    shout.write_text("def shout(self, text):\n    return text.upper()\n")
    assert run(capsys, *uri, "methods", "add", "brick", "shout", str(shout))[0] == 0
    with LivingImage.open(file_image) as img:
        before = len(img.history(1000))
    code, _, err = run(capsys, *uri, "methods", "reject", "nobody", "double")
    assert code == 4 and "nobody" in err
    code, _, err = run(capsys, *uri, "methods", "reject", "brick", "nothing")
    assert code == 4 and "not a method" in err and "double" in err
    code, _, err = run(capsys, *uri, "methods", "reject", "brick", "name")
    assert code == 1 and "data slot" in err
    code, _, err = run(capsys, *uri, "methods", "reject", "brick", "shout")
    assert code == 1 and "written by hand" in err and "batos methods remove brick shout" in err
    code, _, err = run(capsys, *uri, "methods", "restore", "brick", "double")
    assert code == 1 and "no rejected method" in err and "--rejected" in err
    code, out, _ = run(capsys, *uri, "methods", "--rejected")
    assert code == 0 and "no method has been rejected" in out
    with LivingImage.open(file_image) as img:
        assert len(img.history(1000)) == before


def test_a_send_that_finds_failing_examples_takes_the_method_out_after_it(
    capsys, caplog, file_image: str
) -> None:
    uri = ("--image", file_image)

    def edit(root):  # a new source, as an edit or an upgrade would bring
        root["objects"]["brick"]._methods["double"].source = DOUBLE.replace("2", "3")

    with LivingImage.open(file_image) as img:
        img.transact(edit)
    with caplog.at_level(logging.WARNING, logger="batos.kernel"):
        code, out, err = run(capsys, *uri, "send", "brick", "double", "1", "--json")
    assert code == 0 and json.loads(out) == 4  # the send itself went through
    assert "took out brick.double: 1 stored example(s) fail" in err
    # The failure is logged once, where it was found; the removal's own check is quiet.
    said = [r.getMessage() for r in caplog.records if "stored example" in r.getMessage()]
    assert said == ["method 'double' fails 1 stored example(s)"]
    with LivingImage.open(file_image) as img:
        notes = [e.description for e in img.history(3)]
    assert notes[0] == "methods reject brick.double: its examples fail"
    assert "send brick.double" in notes[1:]
    code, out, _ = run(capsys, *uri, "methods", "--rejected", "--json")
    assert json.loads(out)[0]["cause"] == "examples"
