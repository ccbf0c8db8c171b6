"""The process boundary under white-box attack: each finding of the audit, as a regression test.

The first part is reachable from ordinary generated code (shared-structure bombs, changes the
covenant used to lose). The second part is what a child that escaped RestrictedPython could
do: it is played by replacing the child's report function (``isolation._encode_report``) or
by running plain Python in the child, as such a child would. The last part fuzzes the host's
report decoder.
"""

from __future__ import annotations

import os
import pickle
import random
import socket
import time

import msgpack
import persistent
import pytest
from fakes import image_digest
from persistent.list import PersistentList
from persistent.mapping import PersistentMapping

from batos.errors import SandboxLimitExceeded, SandboxViolation
from prototypes import confine, isolation, kernel, report
from prototypes.bounded import ValueTooLarge, bounded_plain, bounded_repr
from prototypes.uvm import Method, UvmObject
from store.core.image import LivingImage

BOMB = (
    "def probe(self, depth, width):\n"
    "    a = [0] * width\n"
    "    for i in range(depth):\n"
    "        a = [a] * width\n"
    "    return a\n"
)
STORED_BOMB = (
    "def probe(self, depth, width):\n"
    "    a = [0] * width\n"
    "    for i in range(depth):\n"
    "        a = [a] * width\n"
    "    stats = self.stats\n"
    "    stats['notes'] = a\n"
    "    self.stats = stats\n"
    "    return len(a)\n"
)
REMEMBER = (
    "def remember(self, mood):\n"
    "    stats = self.stats\n"
    "    if 'moods' not in stats:\n"
    "        stats['moods'] = []\n"
    "        self.stats = stats\n"
    "    stats['moods'].append(mood)\n"
    "    self.stats = stats\n"
    "    return list(stats['moods'])\n"
)
BEFRIEND = "def befriend(self, x):\n    self.friend.items.append(x)\n    return x\n"


@pytest.fixture(autouse=True)
def tight_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATOS_SANDBOX_SECONDS", "5")
    monkeypatch.setenv("BATOS_SANDBOX_MEMORY_MB", "256")


def _install(image: LivingImage, selector: str, source: str, args: tuple = ()) -> list[str]:
    with image.connection() as conn:
        conn.transaction_manager.begin()
        mission = kernel.Mission(conn.root()["target"], selector, args)
        findings = mission.attempt(source)
        conn.transaction_manager.commit()
    return findings


def _bomb(depth: int = 4, width: int = 200) -> list:
    a: list = [0] * width
    for _ in range(depth):
        a = [a] * width
    return a


# -- 1. shared-structure bombs --------------------------------------------------------------------


def test_a_returned_shared_structure_bomb_is_refused_in_the_child(memory_image) -> None:
    memory_image.transact(lambda root: root.__setitem__("target", UvmObject(name="robin")))
    findings = _install(memory_image, "probe", BOMB, (1, 3))
    assert findings == []
    with pytest.raises(SandboxViolation) as caught:
        memory_image.transact(lambda root: root["target"].probe(4, 200))
    assert "more than 1,000,000 items" in str(caught.value) and "return less" in str(caught.value)


def test_a_bomb_stored_in_a_slot_is_refused_and_nothing_is_stored(memory_image) -> None:
    memory_image.transact(
        lambda root: root.__setitem__("target", UvmObject(name="robin", stats=PersistentMapping()))
    )
    before = image_digest(memory_image.db)
    findings = _install(memory_image, "probe", STORED_BOMB, (4, 200))
    assert any("more than 1,000,000 items" in f for f in findings)
    assert "nothing was stored" in findings
    assert image_digest(memory_image.db) == before
    with memory_image.read() as root:
        brief = kernel.build_brief(root["target"], "later")  # the next mission's brief
        assert brief.slots["stats"] == "PersistentMapping({})"


def test_every_display_of_a_value_is_bounded_by_nodes_visited() -> None:
    bomb = _bomb()
    text = bounded_repr(bomb, 120)
    assert len(text) <= 120 and text.endswith("…")
    assert len(bounded_repr(bomb, 10**6)) < 20_000  # the node budget stops it, not the width
    with pytest.raises(ValueTooLarge):
        bounded_plain(bomb)
    cyclic: list = [1]
    cyclic.append(cyclic)
    assert bounded_repr(cyclic) == "[1, […]]"
    assert bounded_repr(2**20_000) == "<int of 20001 bits>"
    assert bounded_repr("x" * 10**7, 10) == "'xxxxxxxx…"
    # An image written before these limits may already hold one: the brief still returns.
    obj = UvmObject(name="robin", notes=bomb)
    assert kernel.build_brief(obj, "later").slots["notes"].endswith("…")
    assert bounded_plain(PersistentMapping(a=PersistentList([{1}, (2,)]))) == {"a": [[1], [2]]}


def test_an_exception_holding_a_bomb_is_reported_bounded(memory_image) -> None:
    memory_image.transact(lambda root: root.__setitem__("target", UvmObject(name="robin")))
    source = BOMB.replace("    return a\n", "    raise ValueError(a)\n")
    findings = _install(memory_image, "probe", source, (4, 200))
    assert len(findings) == 1 and "ValueError: [[[" in findings[0] and len(findings[0]) < 3_000
    loose = UvmObject(name="robin")
    kernel.add_method(loose, "probe", source)
    with pytest.raises(ValueError) as caught:
        loose.probe(4, 200)
    assert len(str(caught.value)) < 5_000


# -- 2. the covenant keeps or refuses, never loses --------------------------------------------


def test_a_plain_list_inside_a_persistent_mapping_is_kept(memory_image) -> None:
    memory_image.transact(
        lambda root: root.__setitem__("target", UvmObject(name="robin", stats=PersistentMapping()))
    )
    assert _install(memory_image, "remember", REMEMBER, ("calm",)) == []
    assert memory_image.transact(lambda root: root["target"].remember("glad")) == ["calm", "glad"]
    memory_image.transact(lambda root: root["target"].remember("sad"))
    memory_image.db.cacheMinimize()
    with memory_image.read() as root:
        assert root["target"].stats["moods"] == ["calm", "glad", "sad"]


def test_a_container_reached_without_passing_a_guard_is_still_compared(memory_image) -> None:
    # max() hands the mapping out and dict() reaches its list at C speed: no attribute or
    # item guard sees the mapping itself, only the list of boards it came from.
    pin = (
        "def pin(self, x):\n"
        "    board = max(self.boards, key=len)\n"
        "    dict(board)['notes'].append(x)\n"
        "    return len(board)\n"
    )

    def build(root):
        root["target"] = UvmObject(name="robin", boards=[PersistentMapping(notes=[])])

    memory_image.transact(build)
    assert _install(memory_image, "pin", pin, ("first",)) == []
    memory_image.transact(lambda root: root["target"].pin("second"))
    memory_image.db.cacheMinimize()
    with memory_image.read() as root:
        assert root["target"].boards[0]["notes"] == ["first", "second"]


def test_a_list_in_a_mapping_taken_with_min_is_kept_call_after_call(memory_image) -> None:
    # The mapping comes out of stats.values() by min() and its list out of a copy made at C
    # speed: no guard ever sees the mapping. Once it was loaded in the host (after the first
    # call), nothing compared it and every later change was lost while the call succeeded.
    tally = (
        "def tally(self, x):\n"
        "    board = min(self.stats.values(), key=len)\n"
        "    dict(board)['items'].append(x)\n"
        "    self.stats = self.stats\n"
        "    return x\n"
    )

    def build(root):
        stats = PersistentMapping(a=PersistentMapping(items=[]), b=PersistentMapping(items=[]))
        root["target"] = UvmObject(name="robin", stats=stats)
        kernel.add_method(root["target"], "tally", tally)

    memory_image.transact(build)
    with memory_image.connection() as conn:  # one long-running process, one connection
        tm = conn.transaction_manager
        for x in range(4):
            tm.begin()
            assert conn.root()["target"].tally(x) == x
            tm.commit()
    memory_image.db.cacheMinimize()
    with memory_image.read() as root:
        assert root["target"].stats["a"]["items"] == [0, 1, 2, 3]


def test_a_slot_of_another_prototype_changed_in_place_is_refused(memory_image) -> None:
    def build(root):
        root["target"] = UvmObject(name="robin", friend=UvmObject(name="pal", items=[]))

    memory_image.transact(build)
    before = image_digest(memory_image.db)
    findings = _install(memory_image, "befriend", BEFRIEND, (1,))
    assert any("persistence covenant" in f and "'pal'" in f and ".items" in f for f in findings)
    assert image_digest(memory_image.db) == before
    # Unsaved objects have no record to lose a change against: it is kept.
    loose = UvmObject(name="robin", friend=UvmObject(name="pal", items=[]))
    kernel.add_method(loose, "befriend", BEFRIEND)
    assert loose.befriend(2) == 2 and loose.friend.items == [2]


# -- 3. a forged report: what a child that escaped could send ----------------------------------


def _forge(monkeypatch: pytest.MonkeyPatch, make) -> None:
    """Replace the child's report function, as code that escaped every guard would."""
    monkeypatch.setattr(isolation, "_encode_report", make)


def _call(obj: UvmObject, *, apply: bool = True, seconds: float = 5) -> object:
    return isolation.run(lambda o: None, (obj,), {}, seconds=seconds, memory_mb=256, apply=apply)


def _envelope(result: object, states: list | None = None) -> bytes:
    """A report as a child writes it: no new objects, ``result``, the changed states."""
    return msgpack.packb(["R", [], result, states or [], []])


def _with_method(image: LivingImage) -> None:
    def build(root):
        root["target"] = UvmObject(name="vault", secret="launch")
        kernel.add_method(root["target"], "greet", "def greet(self):\n    return 'hi'\n")

    image.transact(build)


def test_a_forged_report_cannot_rewrite_a_method(memory_image, monkeypatch) -> None:
    _with_method(memory_image)
    before = image_digest(memory_image.db)

    def rewrite(result, changed, known, jar):
        method = next(o for o in _KNOWN_IN_CHILD if isinstance(o, Method))
        state = ["compiler", "plain", "source", "def greet(self):\n    return open('/etc')\n"]
        return _envelope(None, [[[report._KNOWN, known[id(method)]], state]])

    _forge(monkeypatch, rewrite)

    def call(root):
        _KNOWN_IN_CHILD[:] = list(root["target"]._methods.values())
        return root["target"].greet()

    with pytest.raises(SandboxViolation, match="a Method cannot be changed by a method"):
        memory_image.transact(call)
    assert image_digest(memory_image.db) == before
    with memory_image.read() as root:
        assert root["target"]._methods["greet"].compiler == "sandbox"


_KNOWN_IN_CHILD: list = []


def _personas(image: LivingImage) -> None:
    """Two personas sharing a traits object; BRICK has a method ROBIN does not."""

    def build(root):
        traits = UvmObject(name="traits", motto="shared")
        root["robin"] = UvmObject(traits, name="robin")
        root["brick"] = UvmObject(traits, name="brick")
        kernel.add_method(root["brick"], "greet", "def greet(self):\n    return 'brick'\n")

    image.transact(build)


def _state(obj: UvmObject, known: dict[int, int], **slots: object) -> list:
    """``obj``'s whole state as a child reports it, its own methods kept, ``slots`` added."""
    methods = [report._DICT]
    for name, method in obj._methods.items():
        methods += [name, [report._KNOWN, known[id(method)]]]
    state = ["_methods", methods]
    for name, value in {**obj._slots(), **slots}.items():
        if isinstance(value, UvmObject):
            value = [report._KNOWN, known[id(value)]]
        if not isinstance(value, Method):
            state += [name, value]
    return state


def _forged_call(image: LivingImage, monkeypatch, make, receiver: str = "robin") -> None:
    """Send ROBIN a method with BRICK as its argument while ``make`` forges the report."""

    def forge(result, changed, known, jar):
        return make(known, *_KNOWN_IN_CHILD)

    _forge(monkeypatch, forge)

    def call(root):
        _KNOWN_IN_CHILD[:] = [root["robin"], root["brick"], root["robin"]._parents()[0]]
        return isolation.run(
            lambda o, other: None, (root[receiver], root["brick"]), {}, seconds=5, memory_mb=256
        )

    image.transact(call)


def test_a_forged_report_cannot_give_a_prototype_a_method_it_never_had(
    memory_image, monkeypatch
) -> None:
    _personas(memory_image)
    before = image_digest(memory_image.db)

    def lend(known, robin, brick, traits):
        state = _state(robin, known)
        state[1] += ["greet", [report._KNOWN, known[id(brick._methods["greet"])]]]
        return _envelope(None, [[[report._KNOWN, known[id(robin)]], state]])

    with pytest.raises(SandboxViolation, match="'greet' is not a method <UvmObject 'robin'"):
        _forged_call(memory_image, monkeypatch, lend)
    assert image_digest(memory_image.db) == before
    with memory_image.read() as root:
        assert "greet" not in root["robin"]._methods


def test_a_forged_report_cannot_shadow_a_method_with_a_data_slot(memory_image, monkeypatch) -> None:
    _personas(memory_image)
    before = image_digest(memory_image.db)

    def shadow(known, robin, brick, traits):
        state = _state(brick, known, greet="shadowed")
        return _envelope(None, [[[report._KNOWN, known[id(brick)]], state]])

    with pytest.raises(SandboxViolation, match="'greet' would be both data and a method"):
        _forged_call(memory_image, monkeypatch, shadow, receiver="brick")
    assert image_digest(memory_image.db) == before
    monkeypatch.undo()  # the child reports for real again
    with memory_image.read() as root:
        assert root["brick"].greet() == "brick"


def test_a_forged_report_cannot_take_a_method_out(memory_image, monkeypatch) -> None:
    """A child that drops a method from its table: before, the host applied it, and the method
    was gone with no record (a hand-written one, which is never taken out, too)."""
    _personas(memory_image)
    before = image_digest(memory_image.db)

    def drop(known, robin, brick, traits):
        state = _state(brick, known)
        state[1] = [report._DICT]  # the method table, emptied
        return _envelope(None, [[[report._KNOWN, known[id(brick)]], state]])

    with pytest.raises(SandboxViolation, match="a method may not remove methods: .* 'greet'"):
        _forged_call(memory_image, monkeypatch, drop, receiver="brick")
    assert image_digest(memory_image.db) == before


@pytest.mark.parametrize("isolation_mode", ["process", "host"])
@pytest.mark.parametrize(
    "body",
    [
        "    getattr(self, 'parent*').greet = 'pwned'\n",  # a parent's shared method
        "    self.own = 1\n",  # its own hand-written one
        "    del self.own\n",
        "    f = self.friend\n    f.greet = 'pwned'\n",  # another object's, a ghost until then
    ],
)
def test_a_method_cannot_replace_or_remove_methods_it_can_reach(
    memory_image, monkeypatch, body, isolation_mode
) -> None:
    """Writing a data slot named like a method replaces it in the object model; from generated
    code that took out any method it could reach, for every object sharing the parent."""
    monkeypatch.setenv("BATOS_SANDBOX_ISOLATION", isolation_mode)

    def build(root):
        traits = UvmObject(name="traits")
        friend = UvmObject(name="friend")
        kernel.add_method(friend, "greet", "def greet(self):\n    return 'hi'\n")
        root["target"] = UvmObject(traits, name="brick", friend=friend)
        kernel.add_method(traits, "greet", "def greet(self):\n    return 'hello ' + self.name\n")
        kernel.add_method(root["target"], "own", "def own(self):\n    return 1\n")
        kernel.add_method(root["target"], "wipe", f"def wipe(self):\n{body}    return 1\n")

    memory_image.transact(build)
    memory_image.db.cacheMinimize()  # every object a ghost until the call reaches it
    before = image_digest(memory_image.db)
    with pytest.raises(SandboxViolation) as refused:
        memory_image.transact(lambda root: root["target"].wipe())
    assert "is a method: a method may not replace or remove methods" in str(refused.value)
    assert image_digest(memory_image.db) == before
    with memory_image.read() as root:
        assert root["target"].greet() == "hello brick" and root["target"].own() == 1


def test_a_forged_report_cannot_put_a_non_prototype_in_a_parent_slot(
    memory_image, monkeypatch
) -> None:
    _personas(memory_image)
    before = image_digest(memory_image.db)
    for value in (7, None, [report._LIST, 1]):

        def break_traits(known, robin, brick, traits, value=value):
            state = _state(traits, known, **{"parent*": value})
            return _envelope(None, [[[report._KNOWN, known[id(traits)]], state]])

        with pytest.raises(SandboxViolation, match="parent slot 'parent\\*' must hold a proto"):
            _forged_call(memory_image, monkeypatch, break_traits)
    assert image_digest(memory_image.db) == before
    with memory_image.read() as root:  # every persona's inherited lookup still works
        assert root["robin"].motto == root["brick"].motto == "shared"


def test_a_new_prototype_cannot_arrive_with_methods(monkeypatch) -> None:
    brick = UvmObject(name="brick")
    kernel.add_method(brick, "greet", "def greet(self):\n    return 'brick'\n")

    def clone_with_method(result, changed, known, jar):
        methods = [report._DICT, "greet", [report._KNOWN, known[id(brick._methods["greet"])]]]
        state = ["_methods", methods, "name", "twin"]
        return msgpack.packb(["R", ["UvmObject"], [report._NEW, 0], [], [state]])

    _forge(monkeypatch, clone_with_method)
    with pytest.raises(SandboxViolation, match="'greet' is not a method"):
        _call(brick)


def test_nothing_is_applied_unless_the_whole_report_passes(memory_image, monkeypatch) -> None:
    _with_method(memory_image)
    before = image_digest(memory_image.db)

    def change_receiver_then_root(result, changed, known, jar):
        receiver = _KNOWN_IN_CHILD[0]
        methods = [report._DICT]
        for name, method in receiver._methods.items():
            methods += [name, [report._KNOWN, known[id(method)]]]
        own = [[report._KNOWN, known[id(receiver)]], ["_methods", methods, "secret", "pwned"]]
        root = [[report._OID, b"\0" * 8], ["data", [report._DICT]]]
        return _envelope(None, [own, root])

    _forge(monkeypatch, change_receiver_then_root)
    for apply in (False, True):  # a trial, then a real call
        with memory_image.connection() as conn:
            conn.transaction_manager.begin()
            target = conn.root()["target"]
            _KNOWN_IN_CHILD[:] = [target]
            with pytest.raises(SandboxViolation, match="never given to the method"):
                _call(target, apply=apply)
            assert target.secret == "launch" and "target" in conn.root()
            conn.transaction_manager.commit()
    assert image_digest(memory_image.db) == before


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"\x95\xa1R\x90" + b"\x91" * 2_000_000 + b"\xc0\x90\x90", "malformed"),  # C stack
        (b"\xdd\xff\xff\xff\xff", "envelope is malformed"),  # 4 G items claimed, 5 bytes
        (_envelope([report._DEQUE, 10**15]), "length limit"),
        (_envelope([report._LIST, [report._LIST]]), None),
        (
            _envelope([report._SET, *[report._big_int(k * (2**61 - 1) + 5) for k in range(50)]]),
            "share one hash",
        ),
        (_envelope(msgpack.ExtType(1, b"\x01" * 200_000)), "well-formed"),
        (_envelope({"a": 1}), "well-formed"),
        (_envelope(msgpack.ExtType(5, b"\0" * 4)), "unknown extension"),
        (b"\x95\xa1R\x90\xd6\xff\0\0\0\0\x90\x90", "malformed"),  # a msgpack timestamp
        (pickle.dumps(os.system), "malformed"),  # a pickle is not a report
    ],
    ids=[
        "deep",
        "huge-header",
        "deque-maxlen",
        "valid",
        "hash-bomb",
        "huge-int",
        "map",
        "ext",
        "timestamp",
        "pickle",
    ],
)
def test_forged_reports_are_refused_without_harm(monkeypatch, payload: bytes, why) -> None:
    obj = UvmObject(name="vault")
    _forge(monkeypatch, lambda *a: payload)
    if why is None:
        assert _call(obj) == [[]]
        return
    with pytest.raises(SandboxViolation) as caught:
        _call(obj)
    assert why in str(caught.value)
    assert obj.name == "vault"


def test_a_deeply_nested_value_within_the_bytes_is_refused() -> None:
    wire: list = [report._LIST]
    for _ in range(report.MAX_DEPTH + 5):
        wire = [report._LIST, wire]
    with pytest.raises(SandboxViolation, match="nested deeper"):
        isolation._decode(_envelope(wire), [], None, {})


def test_a_child_that_stalls_mid_message_is_stopped_at_the_deadline(monkeypatch) -> None:
    def stall(*args):
        os.write(confine.TO_HOST_FD, isolation._HEADER.pack(b"R", 1000) + b"x" * 10)
        time.sleep(600)

    _forge(monkeypatch, stall)
    with pytest.raises(SandboxLimitExceeded, match="longer than 0.5 s"):
        _call(UvmObject(name="vault"), seconds=0.5)


def test_a_child_that_lingers_after_reporting_is_killed(monkeypatch) -> None:
    real = isolation._encode_report

    def linger(*args):
        isolation._send(confine.TO_HOST_FD, b"R", real(*args))
        time.sleep(600)

    _forge(monkeypatch, linger)
    obj = UvmObject(name="vault")
    assert isolation.run(lambda o: 42, (obj,), {}, seconds=600, memory_mb=256) == 42


def test_an_oversized_message_is_refused_before_it_is_read(monkeypatch) -> None:
    def huge(*args):
        os.write(confine.TO_HOST_FD, isolation._HEADER.pack(b"R", report.MAX_REPORT_BYTES + 1))
        time.sleep(600)

    _forge(monkeypatch, huge)
    with pytest.raises(SandboxViolation, match="over the limit"):
        _call(UvmObject(name="vault"))


def _escaped(obj: UvmObject) -> dict:
    """Plain Python in the child: what code that escaped RestrictedPython could try."""
    seen: dict = {"applied": confine.applied(), "environment": dict(os.environ)}
    attempts = {
        "open": lambda: open("/etc/hostname").read(),
        "socket": lambda: socket.socket(),
        "signal the host": lambda: os.kill(os.getppid(), 0),
        "fork": lambda: os.fork(),
        "exec": lambda: os.execv("/bin/true", ["true"]),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            seen[what] = "done"
        except OSError:
            seen[what] = "refused"
    return seen


def test_an_escaped_child_has_no_files_environment_network_or_processes(file_uri) -> None:
    image = LivingImage.open(file_uri)  # the image file is open read-write in the host
    image.transact(lambda root: root.__setitem__("target", UvmObject(name="vault")))
    os.environ["BATOS_TEST_SECRET"] = "key"
    try:
        with image.connection() as conn:
            receiver = conn.root()["target"]
            seen = isolation.run(_escaped, (receiver,), {}, seconds=5, memory_mb=256)
    finally:
        del os.environ["BATOS_TEST_SECRET"]
        image.close()
    assert seen["environment"] == {}
    assert {"descriptors", "environment", "limits", "never-root", "seccomp"} <= set(seen["applied"])
    tried = ("open", "socket", "signal the host", "fork", "exec")
    assert [seen[what] for what in tried] == ["refused"] * len(tried)
    # What the kernel sees of the child (descriptors, ids, capabilities): test_confine.py.


def _load_the_root(obj: UvmObject) -> str:
    """An escaped child asking the host for the image's root record, which it was never given
    a way to reach, to rewrite it through a report that references it."""
    obj._p_jar._storage.load(b"\0" * 8)
    return "served"


def test_an_escaped_child_is_served_only_records_it_could_reach(file_uri) -> None:
    """The host used to serve any oid the child named; the decoder then took references to
    every record served, so an escaped child could rewrite the root (the catalog, the rejected
    methods, the method queue) though it was given one object."""
    image = LivingImage.open(file_uri)
    try:
        image.transact(
            lambda root: root.__setitem__("target", UvmObject(UvmObject(name="base"), name="t"))
        )
        image.db.cacheMinimize()  # the receiver and its parent are ghosts: loaded in the child
        with image.connection() as conn:
            receiver = conn.root()["target"]
            with pytest.raises(SandboxViolation, match="not reachable from its receiver"):
                isolation.run(_load_the_root, (receiver,), {}, seconds=5, memory_mb=256)
            # What it can reach is still served: its parent, loaded through its own record.
            assert (
                isolation.run(
                    lambda o: getattr(o, "parent*").name, (receiver,), {}, seconds=5, memory_mb=256
                )
                == "base"
            )
    finally:
        image.close()


def test_what_a_method_can_reach_is_served_however_it_gets_there(file_uri) -> None:
    """The host limits what it serves to what the child could reach, and the child starts
    with the host's loaded objects: an object it reaches through one of those, past a record
    it had served, and objects passed inside a list, are all still served."""
    image = LivingImage.open(file_uri)
    try:

        def build(root):
            far = UvmObject(name="far")  # a ghost in the host when the call is made
            near = UvmObject(name="near", child=far)  # loaded in the host
            root["target"] = UvmObject(name="t", data=PersistentMapping(k=near))
            root["listed"] = UvmObject(name="listed")
            return bytes(near._p_oid) if near._p_oid else None

        image.transact(build)
        with image.read() as root:
            near_oid = root["target"].data["k"]._p_oid
        image.db.cacheMinimize()
        with image.connection() as conn:
            receiver = conn.root()["target"]
            conn.get(near_oid)._p_activate()  # loaded, while the mapping holding it is a ghost
            receiver._p_activate()
            assert receiver.__dict__["data"]._p_state == persistent.GHOST
            reached = isolation.run(
                lambda o: o.data["k"].child.name, (receiver,), {}, seconds=5, memory_mb=256
            )
            assert reached == "far"
            listed = conn.root()["listed"]
            conn.cacheMinimize()
            named = isolation.run(
                lambda o, xs: xs[0].name, (receiver, [listed]), {}, seconds=5, memory_mb=256
            )
            assert named == "listed"
    finally:
        image.close()


# -- 4. fuzzing the decoder ---------------------------------------------------------------------


def _valid_reports() -> tuple[list, list[bytes]]:
    base = UvmObject(name="base")
    obj = UvmObject(base, name="vault", items=PersistentList([1, 2]))
    kernel.add_method(obj, "greet", "def greet(self):\n    return 'hi'\n")
    known = isolation._known_objects([obj, base], None)
    tokens = {id(o): i for i, o in enumerate(known)}
    obj.stats = {"n": 3, (1, 2): frozenset({"a"}), "when": __import__("datetime").date.today()}
    obj.items.append(2**80)
    fresh = obj.clone(name="copy")
    del fresh._methods["greet"]
    results = [
        None,
        [1, 2.5, "three", b"four", (5, {6}), {"seven": [8]}],
        {"deep": [[[[[[1]]]]]], "big": -(2**100), "c": 1j},
        fresh,
    ]
    return known, [
        report.Encoder(tokens, None).report(result, [obj, obj.items]) for result in results
    ]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        at = rng.randrange(len(data)) if data else 0
        if choice < 0.4 and data:
            data[at] = rng.randrange(256)
        elif choice < 0.6:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif choice < 0.8 and data:
            del data[at : at + rng.randint(1, 8)]
        else:
            data = data[: at or 1]
    return bytes(data)


def test_random_and_mutated_reports_never_crash_and_change_nothing() -> None:
    rng = random.Random(1234)
    known, valid = _valid_reports()
    digests = [isolation.state_digests(o) for o in known]
    accepted = refused = 0
    for round_ in range(3_000):
        if round_ % 10 == 0:
            payload = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        else:
            payload = _mutate(rng, rng.choice(valid))
        try:
            decoded = report.Decoder(known, lambda oid: None).report(payload)
        except report.ReportRefused:  # a named rule, never another exception
            refused += 1
        else:
            accepted += 1
            for obj, state in decoded.states:  # only states the host would accept
                assert any(obj is o for o in known) and isinstance(state, dict)
    assert [isolation.state_digests(o) for o in known] == digests  # decoding applies nothing
    assert refused > 1_000 and accepted > 10  # the fuzz reached both sides
    for payload in valid:
        assert isolation._decode(payload, known, None, {}).states


@pytest.mark.parametrize("isolation_mode", ["process", "host"])
def test_a_methods_stop_iteration_does_not_end_the_callers_loop(
    memory_image, monkeypatch, isolation_mode
) -> None:
    """Raised as itself, it ended whatever host loop made the call (``map``, ``next``) as if
    the loop were done: ``list(map(call, [1, 2]))`` gave ``[]`` with no error."""
    monkeypatch.setenv("BATOS_SANDBOX_ISOLATION", isolation_mode)
    source = "def stop(self):\n    raise StopIteration('x')\n"
    memory_image.transact(
        lambda root: kernel.add_method(
            root.setdefault("target", UvmObject(name="t")), "stop", source
        )
    )
    with pytest.raises(RuntimeError, match="the method raised StopIteration: x"):
        list(map(lambda _: memory_image.transact(lambda root: root["target"].stop()), [1, 2]))


@pytest.mark.parametrize("isolation_mode", ["process", "host"])
@pytest.mark.parametrize(
    "write",
    [
        "stats = self.stats\n    stats.data = [1, 2, 3]\n    self.stats = stats",
        "stats = self.stats\n    del stats.data\n    self.stats = stats",
        "log = self.log\n    log.data = 'x'\n    self.log = log",
    ],
)
def test_a_persistent_containers_attributes_are_not_writable(
    memory_image, monkeypatch, isolation_mode, write
) -> None:
    """In the host the write went through, and the mapping's state became a list."""
    monkeypatch.setenv("BATOS_SANDBOX_ISOLATION", isolation_mode)

    def build(root):
        root["target"] = UvmObject(name="t", stats=PersistentMapping(a=1), log=PersistentList())
        kernel.add_method(root["target"], "spoil", f"def spoil(self):\n    {write}\n    return 1\n")
        kernel.add_method(
            root["target"],
            "fill",
            "def fill(self):\n    stats = self.stats\n    stats['b'] = 2\n    del stats['a']\n"
            "    self.stats = stats\n    log = self.log\n    log[0:0] = [5]\n    self.log = log\n"
            "    return 1\n",
        )

    memory_image.transact(build)
    before = image_digest(memory_image.db)
    with pytest.raises(SandboxViolation):
        memory_image.transact(lambda root: root["target"].spoil())
    assert image_digest(memory_image.db) == before
    memory_image.transact(lambda root: root["target"].fill())  # items stay writable
    with memory_image.read() as root:
        assert dict(root["target"].stats) == {"b": 2} and list(root["target"].log) == [5]
