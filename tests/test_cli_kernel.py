"""``batos methods`` and ``batos send`` against a file image, with a scripted model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import ScriptedChatModel

from batos.shell.cli import main
from store.core.image import LivingImage


def run(capsys, *argv: str, models=None) -> tuple[int, str, str]:
    code = main(list(argv), models=models)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def image(capsys, file_uri: str) -> str:
    assert run(capsys, "--image", file_uri, "init")[0] == 0
    return file_uri


def test_add_list_send_remove_and_undo(capsys, image: str, tmp_path: Path) -> None:
    source = tmp_path / "shout.py"
    source.write_text("def shout(self, text):\n    return text.upper() + '!'\n")
    code, out, _ = run(capsys, "--image", image, "methods", "add", "brick", "shout", str(source))
    assert code == 0 and "installed" in out
    code, out, _ = run(capsys, "--image", image, "send", "brick", "shout", '"hi"', "--json")
    assert code == 0 and json.loads(out) == "HI!"
    code, out, _ = run(capsys, "--image", image, "methods", "--json")
    rows = json.loads(out)
    assert rows[0]["selector"] == "shout" and rows[0]["verdict"] == "approved"
    assert rows[0]["author"] == "human" and "upper" in rows[0]["source"]
    code, out, _ = run(capsys, "--image", image, "methods", "--json", "--no-source")
    assert code == 0 and [set(r) for r in json.loads(out)] == [set(rows[0]) - {"source"}]
    assert run(capsys, "--image", image, "methods", "remove", "brick", "shout")[0] == 0
    with LivingImage.open(image) as img:
        with img.read() as root:
            assert "shout" not in root["objects"]["brick"]._methods
        tid = img.history(1)[0].tid
    assert run(capsys, "--image", image, "undo", tid)[0] == 0  # undo the removal
    with LivingImage.open(image) as img, img.read() as root:
        assert root["objects"]["brick"].shout("x") == "X!"


def test_rejected_method_exits_non_zero_with_every_finding(capsys, image, tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\ndef bad(self):\n    return self.__class__, eval('1')\n")
    code, _, err = run(capsys, "--image", image, "methods", "add", "brick", "bad", str(bad))
    assert code == 7
    for fragment in ("'os'", "'__class__'", "'eval'"):
        assert fragment in err


def test_a_method_never_replaces_a_data_slot(capsys, image, tmp_path) -> None:
    source = tmp_path / "name.py"
    source.write_text('def name(self):\n    return "x"\n')
    with LivingImage.open(image) as living, living.read() as root:
        before = root["objects"]["brick"]._slots()["name"]
    code, _, err = run(capsys, "--image", image, "methods", "add", "brick", "name", str(source))
    assert code != 0 and "is a data slot" in err and "another name" in " ".join(err.split())
    with LivingImage.open(image) as living, living.read() as root:
        assert root["objects"]["brick"]._slots()["name"] == before


def test_send_unknown_selector_goes_through_does_not_understand(capsys, image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "1")
    model = ScriptedChatModel().enqueue(
        '{"examples": [{"args": [[1]], "slots": {}, "returns": {"total": 1, "largest": 1}, '
        '"slots_after": {}}]}',
        "```python\ndef estimate(self, sizes):\n"
        "    return {'total': sum(sizes), 'largest': max(sizes)}\n```",
    )
    code, out, err = run(
        capsys,
        "--image",
        image,
        "send",
        "brick",
        "estimate",
        "[3, 5, 2]",
        "--json",
        models=lambda persona, **options: model,
    )
    assert code == 0 and json.loads(out) == {"total": 10, "largest": 5}
    assert "Given a list of task sizes" in model.history[1][-1].content  # the codex intent
    assert "wrote brick.estimate in" in err and "1/1 examples agree" in err
    code, out, _ = run(capsys, "--image", image, "methods", "--json")
    (row,) = json.loads(out)
    assert row["examples"] == [
        {
            "args": [[1]],
            "returns": {"total": 1, "largest": 1},
            "slots": {},
            "slots_after": {},
            "status": "agreed",
        }
    ]
    assert row["seconds"] > 0 and row["examples_check"]["passed"] == 1
    code, out, _ = run(capsys, "--image", image, "methods")
    assert 'self.estimate([1]) → {"total": 1, "largest": 1}' in out
    with LivingImage.open(image) as img:
        install = img.history(1)[0]
        assert install.description == "send brick.estimate"
        img.undo(install.tid)  # 'batos undo' reverts an install
        with img.read() as root:
            assert "estimate" not in root["objects"]["brick"]._methods


def test_bad_arguments_and_paths_are_clear_errors(capsys, image) -> None:
    code, _, err = run(capsys, "--image", image, "send", "brick", "estimate", "[3,")
    assert code == 1 and "JSON literal" in err
    code, _, err = run(capsys, "--image", image, "send", "nobody", "x")
    assert code == 4 and "nobody" in err
    for empty in ("", " . "):  # not the registry of objects, read as one
        code, _, err = run(capsys, "--image", image, "send", empty, "estimate")
        assert code == 4 and "path is empty" in err and "robin" in err
    for gap in ("brick.", ".brick", "brick..name"):  # shown back as given, they misled
        for argv in (["send", gap, "estimate"], ["inspect", gap], ["methods", "--path", gap]):
            code, _, err = run(capsys, "--image", image, *argv)
            assert code == 4 and "has an empty name" in err, (argv, err)


def test_a_data_slot_or_a_failing_method_is_a_clear_error(capsys, image, tmp_path) -> None:
    code, out, _ = run(capsys, "--image", image, "send", "brick", "name", "--json")
    assert code == 0 and json.loads(out) == "BRICK"
    code, _, err = run(capsys, "--image", image, "send", "brick", "name", "1")
    assert code == 1 and "data slot, not a method" in err
    div = tmp_path / "div.py"
    div.write_text("def div(self, x):\n    return 10 // x\n")
    assert run(capsys, "--image", image, "methods", "add", "brick", "div", str(div))[0] == 0
    code, _, err = run(capsys, "--image", image, "send", "brick", "div", "0")
    assert code == 1 and "raised ZeroDivisionError" in err and "line 2" in err
    assert "Traceback" not in err


def test_json_is_json_both_ways_nan_and_infinity_are_refused(capsys, image, tmp_path) -> None:
    echo = tmp_path / "echo.py"
    echo.write_text("def echo(self, x):\n    return x\n")
    assert run(capsys, "--image", image, "methods", "add", "brick", "echo", str(echo))[0] == 0
    for literal in ("NaN", "[-Infinity]", '{"a": Infinity}', "1e400"):
        code, _, err = run(capsys, "--image", image, "send", "brick", "echo", literal)
        assert code == 1 and "is not a JSON literal" in err, (literal, err)
    overflow = tmp_path / "overflow.py"
    overflow.write_text("def overflow(self):\n    return [1.5, float('inf')]\n")
    added = run(capsys, "--image", image, "methods", "add", "brick", "overflow", str(overflow))
    assert added[0] == 0
    code, out, err = run(capsys, "--image", image, "send", "brick", "overflow", "--json")
    assert code == 1 and out == "" and "NaN or an infinity" in err and "leave out --json" in err
    code, out, _ = run(capsys, "--image", image, "send", "brick", "overflow")
    assert code == 0 and "inf" in out
    code, out, _ = run(capsys, "--image", image, "send", "brick", "echo", "1e308", "--json")
    assert code == 0 and json.loads(out) == 1e308


def test_methods_lists_methods_on_objects_nested_anywhere(capsys, image, tmp_path) -> None:
    from prototypes import kernel
    from prototypes.uvm import UvmObject

    def build(root):
        deep = UvmObject(name="deep")
        kernel.add_method(deep, "hello", "def hello(self):\n    return 'hi'\n")
        root["objects"]["brick"].workshop = UvmObject(name="workshop", drawer=deep)

    with LivingImage.open(image) as img:
        img.transact(build)
    code, out, _ = run(capsys, "--image", image, "methods", "--json")
    assert code == 0
    assert [r["path"] for r in json.loads(out)] == ["brick.workshop.drawer"]


BOMB = (
    "def probe(self, depth, width):\n"
    "    a = [0] * width\n"
    "    for i in range(depth):\n"
    "        a = [a] * width\n"
    "    if depth > 3:\n"
    "        stats = self.stats\n"
    "        stats['notes'] = a\n"
    "        self.stats = stats\n"
    "    return a\n"
)


def test_a_shared_structure_bomb_is_refused_and_the_image_stays_readable(
    capsys, image, tmp_path
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(BOMB)
    assert run(capsys, "--image", image, "methods", "add", "brick", "probe", str(probe))[0] == 0
    code, out, _ = run(capsys, "--image", image, "send", "brick", "probe", "1", "2", "--json")
    assert code == 0 and json.loads(out) == [[0, 0], [0, 0]]
    code, _, err = run(capsys, "--image", image, "send", "brick", "probe", "4", "200", "--json")
    assert code == 7 and "more than 1,000,000 items" in err
    code, out, _ = run(capsys, "--image", image, "send", "brick", "stats", "--json")
    assert code == 0 and "notes" not in json.loads(out)  # nothing was stored
    assert run(capsys, "--image", image, "inspect", "brick")[0] == 0


def test_a_bomb_already_in_the_image_is_shown_bounded(capsys, image) -> None:
    def plant(root):  # as an image written before the limits could hold one
        a: list = [0] * 200
        for _ in range(4):
            a = [a] * 200
        root["objects"]["brick"].notes = a

    with LivingImage.open(image) as img:
        img.transact(plant)
    code, out, _ = run(capsys, "--image", image, "inspect", "brick")
    assert code == 0 and "notes" in out and "…" in out
    code, _, err = run(capsys, "--image", image, "send", "brick", "notes", "--json")
    assert code == 1 and "too large to print" in err


def _estimate(total: str, name: str = "estimate") -> str:
    return (
        f"```python\ndef {name}(self, sizes):\n"
        f"    return {{'total': {total}, 'largest': max(sizes)}}\n```"
    )


def test_send_asks_for_an_example_when_the_method_is_not_trusted(
    capsys, image, monkeypatch
) -> None:
    import io

    monkeypatch.setenv("BATOS_JIT_DRAFTS", "2")
    monkeypatch.setenv("BATOS_JIT_TRUST", "0.6")
    models = lambda persona, **options: model  # noqa: E731
    model = ScriptedChatModel().enqueue(
        '{"examples": []}', _estimate("len(sizes)"), _estimate("sum(sizes)")
    )
    monkeypatch.setattr(
        "sys.stdin", io.StringIO('{"args": [[1, 2]], "returns": {"total": 3, "largest": 2}}\n')
    )
    code, out, err = run(
        capsys,
        "--image",
        image,
        "send",
        "brick",
        "estimate",
        "[3, 5, 2]",
        "--json",
        "--ask",
        models=models,
    )
    assert code == 0 and json.loads(out) == {"total": 10, "largest": 5}
    said = " ".join(err.split())  # the terminal wraps long lines
    assert "not trusted enough to install" in said and "no two of the 2 drafts agree" in said
    # Refused without asking: the exit code of a failed mission, the reason and the hint.
    model.enqueue(
        '{"examples": []}', _estimate("len(sizes)", "size"), _estimate("sum(sizes)", "size")
    )
    code, out, err = run(
        capsys, "--image", image, "send", "brick", "size", "[3]", "--no-ask", models=models
    )
    said = " ".join(err.split())
    assert code != 0 and "not trusted enough to install" in said and "hint:" in said
    with LivingImage.open(image) as img, img.read() as root:
        assert "size" not in root["objects"]["brick"]._methods
