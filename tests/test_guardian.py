"""The PersistenceGuardian: every finding collected, the covenant rule, unknown syntax refused."""

from __future__ import annotations

import ast

import pytest

from batos.errors import AuditRejected
from prototypes import guardian
from prototypes.guardian import audit, check

GOOD = """import math

def area(self, r):
    '''Area of a circle.'''
    return round(math.pi * r ** 2, 2)
"""


def test_good_method_is_approved() -> None:
    report = check("area", GOOD)
    assert report.verdict == "approved" and report.findings == []


def test_every_finding_is_collected_in_one_error() -> None:
    source = (
        "import os\n"
        "def bad(self):\n"
        "    x = self.__class__\n"
        "    y = eval('1')\n"
        "    z = '{}'.format(1)\n"
        "    return open('f')\n"
    )
    with pytest.raises(AuditRejected) as caught:
        check("bad", source)
    findings = caught.value.findings
    assert len(findings) == 5
    for fragment in ("'os'", "'__class__'", "'eval'", "'format'", "'open'"):
        assert any(fragment in f for f in findings), fragment
    assert all(f in caught.value.message for f in findings)
    assert caught.value.exit_code == 7


@pytest.mark.parametrize(
    "source",
    [
        "def m(self, x):\n    self.items.append(x)\n    return x\n",
        "def m(self, k):\n    self.counts[k] = 1\n",
        "def m(self, k):\n    self.counts[k] += 1\n",
        "def m(self, k):\n    del self.counts[k]\n",
        "def m(self, x):\n    items = self.items\n    items.append(x)\n",
        "def m(self, x):\n    self.items = self.items\n    self.items.append(x)\n",
    ],
    ids=["append", "setitem", "aug-item", "delitem", "alias", "assigned-before-change"],
)
def test_in_place_change_without_reassignment_breaks_the_covenant(source: str) -> None:
    findings = audit("m", source).findings
    assert len(findings) == 1 and "persistence covenant" in findings[0]


@pytest.mark.parametrize(
    "source",
    [
        "def m(self, x):\n    items = self.items\n    items.append(x)\n    self.items = items\n",
        "def m(self, x):\n    self.items.append(x)\n    self.items = self.items\n",
        "def m(self, x):\n    self.n += x\n    return self.n\n",
        "def m(self, x):\n    local = []\n    local.append(x)\n    return local\n",
        "def m(self, x):\n    self.items = self.items + [x]\n",
    ],
)
def test_covenant_kept(source: str) -> None:
    assert audit("m", source).findings == []


@pytest.mark.parametrize(
    ("source", "node"),
    [
        ("def m(self):\n    match 1:\n        case 1:\n            return 1\n", "Match"),
        ("def m(self):\n    with x:\n        pass\n", "With"),
        ("def m(self):\n    yield 1\n", "Yield"),
        ("def m(self):\n    global g\n", "Global"),
        ("def m(self):\n    class A:\n        pass\n", "ClassDef"),
        ("async def m(self):\n    pass\n", "AsyncFunctionDef"),
    ],
)
def test_unknown_or_unsafe_syntax_is_rejected_not_ignored(source: str, node: str) -> None:
    assert any(node in f for f in audit("m", source).findings)


def test_shape_of_a_method() -> None:
    other = audit("m", "def other(self):\n    pass\n").findings
    assert "exactly one top-level function" in other[0]
    assert "must be 'self'" in audit("m", "def m(x):\n    return x\n").findings[0]
    assert "syntax error" in audit("m", "def m(self):\n  return (\n").findings[0]
    nul = audit("m", "def m(self):\n    return 1\0\n").findings[0]
    assert "syntax error" in nul and "None" not in nul
    assert "public identifier" in audit("_m", "def _m(self):\n    pass\n").findings[0]


@pytest.mark.parametrize(
    "source",
    [
        "def m(self):\n    g = getattr\n    return g(self, '_p_jar')\n",
        "def m(self):\n    return list(map(getattr, [self], ['_p_jar']))\n",
        "def m(self):\n    h = hasattr\n    return h(self, '_p_jar')\n",
    ],
    ids=["renamed-getattr", "getattr-as-value", "renamed-hasattr"],
)
def test_getattr_may_only_be_called_by_name(source: str) -> None:
    assert any("may only be called directly" in f for f in audit("m", source).findings)


def test_code_too_deep_to_audit_is_a_finding_not_a_crash() -> None:
    for terms in (600, 4_000):
        source = "def m(self, a):\n    return " + " + ".join(["a"] * terms) + "\n"
        findings = audit("m", source).findings
        assert len(findings) == 1 and (
            "nested too deeply" in findings[0] or "parsed" in findings[0]
        )


def test_in_place_slot_changes_name_the_slot_and_how_the_code_reaches_it() -> None:
    fn = ast.parse(
        "def f(self, k):\n"
        "    items = self.items\n"
        "    items[k] = 1\n"
        "    self.log.append(k)\n"
        "    items = list(self.items)\n"  # a copy: no longer the slot
        "    items.append(k)\n"
        "    del self.table[k]\n"
    ).body[0]
    changes = [(c.slot, c.via, c.node.lineno) for c in guardian.in_place_slot_changes(fn)]
    assert changes == [("items", "items", 3), ("log", "self.log", 4), ("table", "self.table", 7)]


def test_the_covenant_and_the_kernels_rewrite_read_the_same_changes() -> None:
    """What the audit reports as an in-place change, the kernel's rewrite mends, and only that."""
    from graph import jit

    broken = (
        "def f(self, k):\n"
        "    q = self.q\n"
        "    q.append(k)\n"
        "    self.d[k] = 1\n"
        "    self.s.add(k)\n"
        "    return len(q)\n"
    )
    assert len(guardian.audit("f", broken).findings) == 3
    assert guardian.audit("f", jit.with_slots_assigned(broken)).findings == []
