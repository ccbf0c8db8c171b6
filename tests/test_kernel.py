"""The generative kernel without LangGraph: missions, the gate, rollback, persistence."""

from __future__ import annotations

import pytest
from fakes import image_digest
from persistent.mapping import PersistentMapping

from batos.errors import DoesNotUnderstand, MissionFailed, SlotError
from prototypes import kernel
from prototypes.uvm import Method, UvmObject
from store.core.image import LivingImage

ADD_ITEM = (
    "def add_item(self, x):\n"
    "    items = list(self.items)\n"
    "    items.append(x)\n"
    "    self.items = items\n"
    "    return len(items)\n"
)


def _world(image: LivingImage) -> None:
    def build(root):
        traits = UvmObject(name="traits", intents=PersistentMapping(add_item="Append x; count."))
        root["box"] = UvmObject(traits, name="box", items=[1])

    image.transact(build)


def _mission(receiver, selector, args, draft, attempts):
    """The kernel's gate for one draft at a time, each draft told the attempts before it."""
    mission = kernel.Mission(receiver, selector, args)
    for _ in range(attempts):
        if not mission.attempt(draft(mission.brief(), mission.attempts)):
            return mission.result
    raise mission.failure()


def _scripted(*drafts: str):
    queue = list(drafts)
    seen: list[list[kernel.AttemptRecord]] = []

    def draft(brief, attempts):
        seen.append(list(attempts))
        return queue.pop(0)

    draft.seen = seen  # type: ignore[attr-defined]
    return draft


def test_good_code_installs_on_the_intent_holder_runs_and_persists(file_uri: str) -> None:
    image = LivingImage.open(file_uri)
    _world(image)
    draft = _scripted(ADD_ITEM)
    result = image.transact(lambda root: _mission(root["box"], "add_item", (7,), draft, 3))
    assert result == 2
    image.close()
    with LivingImage.open(file_uri) as image, image.read() as root:  # recompiled after load
        box, traits = root["box"], root["box"]._parents()[0]
        assert box.items == [1, 7]
        method = traits._methods["add_item"]
        assert method.compiler == "sandbox" and method.author == "BRICK"
        assert method.intent == "Append x; count." and method.audit["verdict"] == "approved"
        assert method.audit["attempt"] == 1 and method.created <= method.updated
        assert "add_item" not in box._methods
        assert box._responds_to("add_item")


def test_retries_recover_and_are_fed_the_findings(memory_image: LivingImage) -> None:
    _world(memory_image)
    draft = _scripted(
        "def add_item(self, x):\n    return self.__class__\n",  # audit
        "def add_item(self, x):\n    return x / 0\n",  # trial
        ADD_ITEM,
    )
    result = memory_image.transact(lambda root: _mission(root["box"], "add_item", (3,), draft, 3))
    assert result == 2
    fed = draft.seen
    assert [len(a) for a in fed] == [0, 1, 2]
    assert fed[1][0].stage == "audit" and "__class__" in fed[1][0].findings[0]
    assert fed[2][1].stage == "trial" and "ZeroDivisionError" in fed[2][1].findings[0]


def test_failure_leaves_the_image_unchanged_and_lists_every_finding(memory_image) -> None:
    _world(memory_image)
    before = image_digest(memory_image.db)
    draft = _scripted(
        "import os\ndef add_item(self, x):\n    return eval(x)\n",
        # passes the audit, but changes a slot in place without assigning it: the dynamic
        # covenant check, which runs with every call, stops it in the trial
        "def add_item(self, x):\n    s = self.items\n    t = s\n    t.append(x)\n    return 1\n",
    )
    with pytest.raises(MissionFailed) as caught:
        memory_image.transact(lambda root: _mission(root["box"], "add_item", (5,), draft, 2))
    findings = caught.value.findings
    assert any("attempt 1 (audit)" in f and "'os'" in f for f in findings)
    assert any("attempt 1 (audit)" in f and "'eval'" in f for f in findings)
    assert any("attempt 2 (trial)" in f and "persistence covenant" in f for f in findings)
    assert "image is unchanged" in caught.value.message
    assert image_digest(memory_image.db) == before


def test_invoke_failure_rolls_back_inside_a_transaction_that_goes_on(memory_image) -> None:
    _world(memory_image)

    def work(root):
        box = root["box"]
        box.note = "kept"  # the caller's own change, made before the mission
        mission = kernel.Mission(box, "add_item", (1,))
        # the isolated trial passes (it sees no database); the host call raises
        mission.install("def add_item(self, x):\n    self.items = [x]\n    return self.missing\n")
        findings = mission.invoke()
        assert findings and "AttributeError" in findings[0]
        assert box.items == [1] and "add_item" not in box._parents()[0]._methods

    memory_image.transact(work)
    with memory_image.read() as root:
        assert root["box"].note == "kept" and root["box"].items == [1]


def test_transient_objects_are_restored_from_a_snapshot() -> None:
    obj = UvmObject(name="loose", n=1)
    mission = kernel.Mission(obj, "bump", (2,))
    mission.install("def bump(self, k):\n    self.n = self.n + k\n    raise ValueError('no')\n")
    assert mission.invoke() and obj.n == 1 and not obj._methods


def test_pending_message_carries_arguments_to_the_runner() -> None:
    calls = []

    class Runner:
        def send(self, receiver, selector, args, kwargs):
            calls.append((receiver, selector, args, kwargs))
            return "done"

        async def asend(self, receiver, selector, args, kwargs):
            return self.send(receiver, selector, args, kwargs)

    obj = UvmObject(name="o")
    kernel.install_handler(Runner())
    try:
        assert obj.greet("Ann", loud=True) == "done"
        assert calls == [(obj, "greet", ("Ann",), {"loud": True})]
        with pytest.raises(AttributeError):
            obj._private  # noqa: B018 - private names never start missions
    finally:
        kernel.install_handler(None)
    with pytest.raises(DoesNotUnderstand):
        obj.greet  # noqa: B018


def test_sandboxed_code_never_starts_a_mission() -> None:
    class Runner:
        def send(self, *a):
            raise AssertionError("a mission was started from inside the sandbox")

        async def asend(self, *a):
            raise AssertionError

    obj = UvmObject(name="o")
    obj.probe = Method(
        "probe", "def probe(self):\n    return hasattr(self, 'nothing')\n", compiler="sandbox"
    )
    kernel.install_handler(Runner())
    try:
        assert obj.probe() is False
    finally:
        kernel.install_handler(None)


def test_brief_shows_public_slots_and_intent_but_no_private_names() -> None:
    traits = UvmObject(name="traits")
    obj = UvmObject(traits, name="robin", mood="calm", _secret="x")
    brief = kernel.build_brief(obj, "reflect_feelings", ("I am tired",))
    assert brief.author == "ROBIN" and "feeling" in brief.intent
    assert brief.args == ("'I am tired'",) and "mood" in brief.slots
    assert "_secret" not in str(brief.as_dict()) and brief.parents == (repr(traits),)


def test_hand_written_method_goes_through_the_same_gate() -> None:
    obj = UvmObject(name="o")
    kernel.add_method(obj, "twice", "def twice(self, x):\n    return x * 2\n")
    assert obj.twice(4) == 8 and kernel.generated_methods(obj)[0].author == "human"


def test_a_method_that_calls_itself_passes_its_trial(memory_image) -> None:
    memory_image.transact(lambda root: root.__setitem__("calc", UvmObject(name="calc")))
    draft = _scripted(
        "def fact(self, n):\n    if n <= 1:\n        return 1\n    return n * self.fact(n - 1)\n"
    )
    assert memory_image.transact(lambda root: _mission(root["calc"], "fact", (5,), draft, 1)) == 120
    with memory_image.read() as root:
        assert root["calc"].fact(6) == 720


def test_dates_format_in_the_sandbox_while_time_stays_out_of_reach() -> None:
    """``date.strftime`` imports ``time`` from C through the method's ``__import__``."""
    from batos.errors import AuditRejected
    from prototypes import sandbox

    source = (
        "from datetime import date\n\n"
        "def weekday(self):\n"
        "    return date(2024, 2, 14).strftime('%A, %d %B %Y')\n"
    )
    kernel.add_method(obj := UvmObject(), "weekday", source)
    assert obj.weekday() == "Wednesday, 14 February 2024"
    outcome = sandbox.run_isolated(sandbox.compile_sandboxed("weekday", source), UvmObject())
    assert outcome.ok and outcome.value == "Wednesday, 14 February 2024"
    with pytest.raises(AuditRejected, match="time"):
        kernel.add_method(UvmObject(), "clock", "import time\n\ndef clock(self):\n    return 1\n")


@pytest.mark.parametrize("selector", ["class", "lambda", "None"])
def test_a_keyword_selector_is_refused_before_any_draft(selector: str) -> None:
    with pytest.raises(DoesNotUnderstand, match=selector) as info:
        kernel.Mission(UvmObject(name="box"), selector)
    assert "Python keyword" in info.value.hint


def test_a_data_slot_is_refused_as_a_selector_before_any_draft() -> None:
    parent = UvmObject(name="traits", size=3)
    with pytest.raises(SlotError, match="'size' is a data slot") as info:
        kernel.Mission(UvmObject(parent, name="box"), "size", (1,))  # inherited data too
    assert "batos inspect" in info.value.hint
