"""One approve-and-install step: every path a method takes into the image runs the guardian
and the sandbox compiler again, and no other code builds a compiled method record."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import image_digest

from batos.errors import AuditRejected
from batos.shell.runtime import open_image
from graph import cycle, facet_writing, facets, missions, rejection
from prototypes import install, kernel, rejected, tools
from prototypes.incarnation import personas
from prototypes.uvm import UvmObject
from store.checkpoint import effects
from store.core.image import LivingImage

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("batos", "graph", "prototypes", "store")

#: Source the PersistenceGuardian refuses (a dunder reaches the class), for each selector.
REFUSED = "def {selector}(self, query):\n    return self.__class__\n"
GUARDIAN = "PersistenceGuardian rejected"
FACET = ("ROBIN", "facet_feelings")


@pytest.fixture
def image() -> Iterator[LivingImage]:
    """A memory image with the personas, an object ``calc`` and a generated method rejected
    from it."""
    with open_image("memory://") as img:

        def setup(root: Any) -> None:
            calc = root["objects"]["calc"] = UvmObject(name="calc", bias=1)
            install.install_method(
                calc, "double", "def double(self, x):\n    return x * 2\n", author="BRICK"
            )

        img.transact(setup)
        rejection.reject(img, "calc", "double")
        yield img


def _written(selector: str) -> facets.WrittenMethod:
    persona, _ = FACET
    return facets.WrittenMethod(
        persona=persona,
        selector=selector,
        source=REFUSED.format(selector=selector),
        intent="",
        author=persona,
        audit={"verdict": "approved", "findings": []},  # a forged verdict: data, not proof
        attempts=1,
    )


def _facet_ahead_of_use(root: Any) -> None:
    facet_writing.install(root, _written(FACET[1]))


def _cycle_effect(root: Any) -> None:
    persona, selector = FACET
    commit = effects.check(
        {
            "id": "cycle-1",
            "effects": [
                {
                    "kind": "install_method",
                    "persona": persona,
                    "selector": selector,
                    "source": REFUSED.format(selector=selector),
                }
            ],
        },
        cycle.EFFECT_KINDS,
    )
    effects.apply_commit(root, commit, ("thread", "", "checkpoint"), cycle.EFFECT_KINDS)


def _mission(root: Any) -> None:
    persona, selector = FACET
    source = REFUSED.format(selector=selector)
    missions._install_facet(root, persona, selector, source, "", persona, "mission 1", 1)


def _jit_install(root: Any) -> None:
    # The JIT graph's install node hands its chosen candidate to ``Mission.install``; a
    # candidate that skipped the audit is still refused there.
    mission = kernel.Mission(root["objects"]["calc"], "triple", (2,))
    mission.install(REFUSED.format(selector="triple"))


def _hand_written(root: Any) -> None:
    kernel.add_method(root["objects"]["calc"], "triple", REFUSED.format(selector="triple"))


def _tool_method(root: Any) -> None:
    toolbox = root["objects"][tools.TOOLBOX]
    proxy = tools.open_proxy(toolbox, "weather")
    kernel.add_method(proxy, "today", REFUSED.format(selector="today"))


PATHS: dict[str, Callable[[Any], None]] = {
    "facet written ahead of use": _facet_ahead_of_use,
    "cycle effect at COMPLETE": _cycle_effect,
    "self-improvement mission": _mission,
    "JIT mission": _jit_install,
    "hand-written method": _hand_written,
    "tool proxy method": _tool_method,
}


@pytest.mark.parametrize("path", list(PATHS))
def test_every_install_path_runs_the_guardian_and_changes_nothing(image, path: str) -> None:
    before = image_digest(image.db)
    with pytest.raises(AuditRejected, match=GUARDIAN) as caught:
        image.transact(PATHS[path])
    assert any("__class__" in finding for finding in caught.value.findings)
    assert image_digest(image.db) == before


def test_restore_runs_the_guardian_and_changes_nothing(image) -> None:
    def tamper(root: Any) -> None:  # the record is data anyone could have edited
        next(rejected.entries(root))["method"].source = REFUSED.format(selector="double")

    image.transact(tamper)
    before = image_digest(image.db)
    with pytest.raises(AuditRejected, match=GUARDIAN):
        rejection.restore(image, "calc", "double")
    assert image_digest(image.db) == before


def test_a_facet_written_in_the_cycle_degrades_when_its_install_is_refused(image) -> None:
    persona, selector = FACET
    writers = facets.FacetWriters()
    # Another branch of the cycle "wrote" it: whatever it hands over is checked again here.
    writers.slot("cycle-1", persona, selector).made = _written(selector)
    with image.connection() as conn:
        prepared = facets.prepare(
            conn.root(),
            persona,
            selector,
            "why am I tired?",
            models=lambda persona, **options: pytest.fail("nothing is drafted"),
            attempts=1,
            cycle_id="cycle-1",
            writers=writers,
            write=True,
        )
        assert GUARDIAN in prepared.degraded and prepared.written is None
        assert prepared.instruction == facets.fallback("why am I tired?")
        assert personas(conn.root())[persona]._own_slot(selector) is None


def test_the_fresh_verdict_replaces_a_forged_one_and_only_sandboxed_compilers_install() -> None:
    obj = UvmObject(name="o")
    method = install.install_method(
        obj,
        "twice",
        "def twice(self, x):\n    return x * 2\n",
        author="BRICK",
        audit={"verdict": "forged", "findings": ["none"], "cycle": "c1"},
    )
    assert method.audit == {"verdict": "approved", "findings": [], "cycle": "c1"}
    assert method.compiler == "sandbox" and obj.twice(4) == 8
    with pytest.raises(AuditRejected, match="'plain'"):
        install.install_method(
            obj, "thrice", "def thrice(self, x):\n    return x * 3\n", author="x", compiler="plain"
        )
    assert obj._own_slot("thrice") is None


def _product_calls(name: str) -> list[tuple[str, str, ast.Call]]:
    """Every call of ``name`` (as a plain name or an attribute) in product code: (file,
    enclosing function, call)."""
    found = []
    for package in PRODUCT:
        for file in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(file.read_text(encoding="utf-8"))
            for function in ast.walk(tree):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(function):
                    if not isinstance(node, ast.Call):
                        continue
                    called = node.func
                    label = called.id if isinstance(called, ast.Name) else None
                    if isinstance(called, ast.Attribute):
                        label = called.attr
                    if label == name:
                        where = str(file.relative_to(REPO))
                        found.append((where, function.name, node))
    return found


def test_a_compiled_method_record_is_built_in_one_place() -> None:
    built = {
        (where, function)
        for where, function, call in _product_calls("Method")
        if any(k.arg == "compiler" for k in call.keywords)
    }
    # ``Method.copy`` repeats an installed method's own fields when an object is cloned; every
    # new method record with a compiler is made by the install step's one builder.
    assert built == {("prototypes/install.py", "_record"), ("prototypes/uvm.py", "copy")}


def test_only_the_install_step_puts_methods_in_slots() -> None:
    callers = {(where, function) for where, function, _ in _product_calls("_add_method")}
    assert callers == {
        ("prototypes/install.py", "install_method"),
        ("prototypes/install.py", "trial_slot"),
        ("prototypes/install.py", "end_trial"),
    }
