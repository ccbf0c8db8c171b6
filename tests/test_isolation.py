"""Process isolation of generated methods: the host survives, and only checked state returns.

Each case below passed the PersistenceGuardian and the in-process guards, so only the process
boundary stands between it and the host: a C-stack crash armed for a later call, a C-level
loop the watchdog cannot interrupt, a trial-detecting bomb, lazy results, unstorable slots,
covenant tricks. The report the child sends is attacked directly, as a child that escaped
every guard would write it, in ``test_sandbox_boundary``.
"""

from __future__ import annotations

import threading

import persistent
import pytest
from fakes import image_digest
from persistent.list import PersistentList

from batos.errors import SandboxLimitExceeded, SandboxViolation
from prototypes import kernel
from prototypes.uvm import UvmObject
from store.core.image import LivingImage

SEGFAULT_LATER = (
    "def greet(self, name):\n"
    "    if hasattr(self, 'armed'):\n"
    "        x = iter([1])\n"
    "        for i in range(300000):\n"
    "            x = map(abs, x)\n"
    "        next(x)\n"
    "    self.armed = True\n"
    "    return 'hello ' + name\n"
)
# Harmless wherever the database is out of reach, a crash wherever it is not.
TRIAL_DETECTOR = (
    "def greet(self, name):\n"
    "    try:\n"
    "        len(self.cfg.data)\n"
    "    except Exception:\n"
    "        return 'hello ' + name\n"
    "    x = iter([1])\n"
    "    for i in range(300000):\n"
    "        x = map(abs, x)\n"
    "    return next(x)\n"
)
C_LEVEL_SPIN = (
    "import collections\nimport itertools\n"
    "def crunch(self, n):\n"
    "    collections.deque(itertools.product(range(100), repeat=n), maxlen=0)\n"
    "    return n\n"
)


@pytest.fixture(autouse=True)
def tight_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATOS_SANDBOX_SECONDS", "1")
    monkeypatch.setenv("BATOS_SANDBOX_MEMORY_MB", "128")


def _install(image: LivingImage, selector: str, source: str, args: tuple = ()) -> list[str]:
    """One draft through the whole gate, committed; the findings ([] = installed)."""
    with image.connection() as conn:
        conn.transaction_manager.begin()
        mission = kernel.Mission(conn.root()["target"], selector, args)
        findings = mission.attempt(source)
        conn.transaction_manager.commit()
    return findings


def _target(image: LivingImage, **slots) -> None:
    image.transact(lambda root: root.__setitem__("target", UvmObject(**slots)))


def test_a_crash_armed_for_a_later_call_kills_only_the_child(memory_image, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_SANDBOX_SECONDS", "20")  # building the chain is slow on a busy box
    _target(memory_image, name="vault")
    assert _install(memory_image, "greet", SEGFAULT_LATER, ("ann",)) == []  # and armed
    before = image_digest(memory_image.db)
    with pytest.raises(SandboxViolation, match="SIGSEGV"):
        memory_image.transact(lambda root: root["target"].greet("cy"))
    assert image_digest(memory_image.db) == before
    assert memory_image.transact(lambda root: root["target"].name) == "vault"  # host alive


def test_code_that_detects_its_trial_meets_the_same_boundary_at_invoke(
    memory_image, monkeypatch
) -> None:
    monkeypatch.setenv("BATOS_SANDBOX_SECONDS", "20")

    def build(root):
        root["target"] = UvmObject(
            name="vault", cfg=UvmObject(name="cfg", data=PersistentList([1]))
        )

    memory_image.transact(build)
    memory_image.db.cacheMinimize()  # cfg is a ghost: the child must ask the host for it
    before = image_digest(memory_image.db)
    findings = _install(memory_image, "greet", TRIAL_DETECTOR, ("ann",))
    assert any("SIGSEGV" in f for f in findings), findings
    assert image_digest(memory_image.db) == before


def test_a_c_level_loop_is_killed_at_the_wall_clock(memory_image) -> None:
    _target(memory_image, name="vault")
    assert _install(memory_image, "crunch", C_LEVEL_SPIN, (1,)) == []
    threads = threading.active_count()
    with pytest.raises(SandboxLimitExceeded, match="longer than 1 s"):
        memory_image.transact(lambda root: root["target"].crunch(9))
    assert threading.active_count() <= threads


def test_lazy_results_are_refused_before_they_run_in_the_host(memory_image) -> None:
    _target(memory_image, name="vault")
    source = "def spin(self):\n    return (i for i in range(10**7) for j in range(10**7))\n"
    findings = _install(memory_image, "spin", source)
    assert any("returned a generator" in f for f in findings), findings


def test_a_slot_the_image_cannot_store_is_refused_and_nothing_is_lost(memory_image) -> None:
    _target(memory_image, name="vault")
    source = "def remember(self, x):\n    self.last = lambda: x\n    return x\n"
    findings = _install(memory_image, "remember", source, (1,))
    assert any("self.last now holds a function" in f for f in findings), findings
    memory_image.transact(lambda root: root.__setitem__("after", 1))  # the image still commits


def test_objects_the_host_never_loaded_are_read_through_the_host(memory_image) -> None:
    def build(root):
        root["target"] = UvmObject(
            name="vault", cfg=UvmObject(name="cfg", data=PersistentList([2, 3]))
        )

    memory_image.transact(build)
    memory_image.db.cacheMinimize()
    source = "def total(self):\n    return sum(self.cfg.data)\n"
    assert _install(memory_image, "total", source) == []
    assert memory_image.transact(lambda root: root["target"].total()) == 5


def test_an_unbound_mutation_on_a_later_branch_is_caught_at_that_call(memory_image) -> None:
    _target(memory_image, name="vault", items=[0])
    source = (
        "def note(self, x):\n    if x > 5:\n        list.append(self.items, x)\n"
        "    return len(self.items)\n"
    )
    assert _install(memory_image, "note", source, (1,)) == []
    with pytest.raises(SandboxViolation, match="persistence covenant: self.items"):
        memory_image.transact(lambda root: root["target"].note(10))
    memory_image.db.cacheMinimize()
    with memory_image.read() as root:
        assert root["target"].items == [0]


def test_changes_come_back_applied_values_as_copies(memory_image) -> None:
    def build(root):
        root["target"] = UvmObject(name="vault", items=PersistentList([1]), log=[])

    memory_image.transact(build)
    source = (
        "def grow(self, x):\n    items = self.items\n    items.append(x)\n"
        "    self.items = items\n    entry = [x]\n    self.log = self.log + [entry]\n"
        "    return entry\n"
    )
    assert _install(memory_image, "grow", source, (2,)) == []

    def call(root):
        target = root["target"]
        entry = target.grow(3)
        # Values cross as copies: equal, not shared (as two records would load them).
        assert entry == target.log[-1] and entry is not target.log[-1]
        return list(target.items), [list(e) for e in target.log]

    assert memory_image.transact(call) == ([1, 2, 3], [[2], [3]])
    memory_image.db.cacheMinimize()
    with memory_image.read() as root:
        assert list(root["target"].items) == [1, 2, 3] and root["target"].log == [[2], [3]]


def test_ordinary_exceptions_keep_their_type_and_line(memory_image) -> None:
    _target(memory_image, name="vault")
    source = "def div(self, x):\n    y = x + 1\n    return 10 // (y - y)\n"
    findings = _install(memory_image, "div", source, (1,))
    assert any("ZeroDivisionError" in f and "line 3" in f for f in findings), findings
    obj = UvmObject(name="loose")
    kernel.add_method(obj, "div", source)
    with pytest.raises(ZeroDivisionError) as caught:
        obj.div(1)
    assert any("line 3" in note for note in caught.value.__notes__)


def test_unsaved_prototypes_work_too() -> None:
    base = UvmObject(greeting="hi")
    obj = UvmObject(base, name="loose", count=0)
    kernel.add_method(
        obj,
        "bump",
        "def bump(self):\n    self.count = self.count + 1\n"
        "    return self.greeting + ' ' + str(self.count)\n",
    )
    assert obj.bump() == "hi 1" and obj.bump() == "hi 2" and obj.count == 2


def test_host_mode_runs_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATOS_SANDBOX_ISOLATION", "host")
    obj = UvmObject(name="loose", count=0)
    kernel.add_method(
        obj, "pid", "def pid(self):\n    self.count = self.count + 1\n    return self.count\n"
    )
    assert obj.pid() == 1 and obj.count == 1
    kernel.add_method(obj, "lazy", "def lazy(self):\n    return map(abs, [1])\n")
    with pytest.raises(SandboxViolation, match="returned a map"):
        obj.lazy()


def test_math_functions_that_could_run_unbounded_are_guarded() -> None:
    obj = UvmObject(name="calc")
    kernel.add_method(
        obj, "fact", "import math\ndef fact(self, n):\n    return math.factorial(n)\n"
    )
    assert obj.fact(5) == 120
    with pytest.raises(SandboxViolation, match="bits"):
        obj.fact(10**6)
    kernel.add_method(
        obj,
        "choose",
        "import math\ndef choose(self, n, k):\n    return math.comb(n, k) + math.perm(n, 2)\n",
    )
    assert obj.choose(5, 2) == 10 + 20
    with pytest.raises(SandboxViolation, match="bits"):
        obj.choose(10**7, 3)


def test_an_object_with_an_old_bad_parent_slot_can_still_be_written(memory_image) -> None:
    # An image written before parent slots were checked: the child sends the bad value back
    # unchanged with the object's new state, and that is not a new write of it.
    def build(root):
        target = root["target"] = UvmObject(name="robin")
        persistent.Persistent.__setattr__(target, "old*", 3)
        kernel.add_method(target, "mark", "def mark(self):\n    self.marked = True\n    return 1\n")

    memory_image.transact(build)
    assert memory_image.transact(lambda root: root["target"].mark()) == 1
    with memory_image.read() as root:
        assert root["target"].marked is True and root["target"].__dict__["old*"] == 3
