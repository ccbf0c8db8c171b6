"""The sandbox child's policy (``prototypes/confine.py``), probed from children the product makes.

Each escape below was found by running plain code in a child, as code that got past every
in-process guard would: each is a regression test. The broad probe (``sandbox_probe``) tries
every call the child must not make, as the user the tests run as and, when that is root, again
as an unprivileged user.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sandbox_probe
from pgcluster import unprivileged_account
from sandbox_probe import open_folder, syscall

from batos.errors import ConfigurationError, SandboxViolation
from prototypes import confine, isolation
from prototypes.uvm import UvmObject

AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="the escape needs root's capabilities")
_AT_FDCWD, _O_RDWR = -100, os.O_RDWR
_PROT_RW, _MAP_SHARED = 3, 1
_EPERM = -1


def _in_child(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """``fn(receiver, **kwargs)`` in a child made and confined exactly as for a method call."""
    return isolation.run(fn, (UvmObject(name="probe"),), kwargs, seconds=10, memory_mb=256)


# -- the policy as data ---------------------------------------------------------------------------

_HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")


@pytest.mark.skipif(not _HEADER.exists(), reason="the kernel's headers are not installed")
def test_the_tables_numbers_are_the_kernels() -> None:
    kernel = dict(
        (name, int(number))
        for name, number in re.findall(r"#define __NR_(\w+) (\d+)", _HEADER.read_text())
    )
    for table in (confine.X86_64_NUMBERS, sandbox_probe.NUMBERS):
        known = {name: table[name] for name in table if name in kernel}
        assert known == {name: kernel[name] for name in known}
        # Calls newer than the headers: numbers past the headers' last one.
        assert all(table[name] > max(kernel.values()) for name in set(table) - set(kernel))


def test_every_call_of_the_policy_has_a_number_and_the_probe_tries_only_refused_ones() -> None:
    assert {rule.call for rule in confine.POLICY} <= set(confine.X86_64_NUMBERS)
    unconditional = {rule.call for rule in confine.POLICY if not rule.when}
    assert not {call for _, call, _ in sandbox_probe.ATTEMPTS} & unconditional


def test_other_platforms_are_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confine, "_SUPPORTED", False)
    with pytest.raises(ConfigurationError, match="Linux on x86-64 only") as caught:
        _in_child(lambda receiver: 1)
    assert "BATOS_SANDBOX_ISOLATION=host" in caught.value.hint


def _i386_getpid() -> Callable[[], int]:
    """A function that asks for its pid through the i386 ABI (``int 0x80``), as x86-64 code
    may: the filter cannot judge such a call by its number, so the call kills the process."""
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")  # mov eax, 20 (getpid); int 0x80; ret
    function = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    function.page = page  # the code lives as long as the function
    return function


def test_a_call_through_another_abi_kills_the_child() -> None:
    getpid_i386 = _i386_getpid()
    pid = os.fork()
    if pid == 0:  # unconfined: does this kernel run i386 calls at all?
        os._exit(0 if getpid_i386() == os.getpid() else 1)
    if os.waitpid(pid, 0)[1] != 0:
        pytest.skip("this kernel runs no i386 calls (no IA-32 emulation)")
    with pytest.raises(SandboxViolation, match="SIGSYS"):
        _in_child(lambda receiver: getpid_i386())
    assert _in_child(lambda receiver: syscall("getpid", x32=True)) == _EPERM


# -- the broad probe ------------------------------------------------------------------------------


def _refusals(result: dict[str, Any]) -> None:
    expected = {"clone3 (answered ENOSYS)": "refused: ENOSYS"}
    allowed = {
        what: outcome
        for what, outcome in result["outcomes"].items()
        if outcome != expected.get(what, "refused: EPERM")
    }
    assert allowed == {}
    assert len(result["outcomes"]) > 300
    assert result["targets unchanged"], result["targets"]
    assert result["content"] == "host data\n"
    assert result["decoy alive"]


def test_every_call_outside_the_allow_list_is_refused() -> None:
    _refusals(sandbox_probe.run())


def _as_user(uid: int, gid: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` in a fork of this process that became ``uid``/``gid`` (no exec: the interpreter
    may sit where that user cannot read), its result back as JSON."""
    inbox, outbox = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(inbox)
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            answer = {"result": fn()}
        except BaseException as exc:  # everything goes back to the test, then the fork leaves
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(outbox, "w") as pipe:
            json.dump(answer, pipe)
        os._exit(0)
    os.close(outbox)
    with os.fdopen(inbox) as pipe:
        answer = json.loads(pipe.read() or '{"error": "no answer"}')
    os.waitpid(pid, 0)
    assert "error" not in answer, answer["error"]
    return answer["result"]


@pytest.mark.skipif(not AS_ROOT, reason="the tests run as a normal user: the probe above was one")
def test_every_call_outside_the_allow_list_is_refused_for_a_normal_user_too() -> None:
    account = unprivileged_account()
    result = _as_user(account.pw_uid, account.pw_gid, sandbox_probe.run)
    assert result["uid"] == account.pw_uid
    _refusals(result)


# -- the child as the kernel sees it --------------------------------------------------------------


def _wait_for_the_host_to_look(receiver: UvmObject) -> None:
    while True:
        time.sleep(0.005)


def _children(confined: bool = False) -> set[int]:
    """This process's living children (those under a seccomp filter only, if ``confined``)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        mine = f"\nPPid:\t{os.getpid()}\n" in status and "\nState:\tZ" not in status
        if mine and (not confined or "\nSeccomp:\t2\n" in status):
            found.add(int(entry.name))
    return found


def _new_confined_child(earlier: set[int]) -> int:
    """The pid of the confined child forked after ``earlier`` were (those may be dying)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        new = _children(confined=True) - earlier
        if new:
            return new.pop()
        time.sleep(0.005)
    raise AssertionError("no confined child appeared")


def test_the_child_is_never_root_and_holds_nothing_but_its_channel() -> None:
    seen: dict[str, Any] = {}
    earlier = _children()

    def look() -> None:
        pid = _new_confined_child(earlier)
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            seen.update(re.findall(r"^(\w+):\t(.*)$", status, re.MULTILINE))
            fds = Path(f"/proc/{pid}/fd")
            seen["fds"] = {int(fd.name): os.readlink(fd).split(":")[0] for fd in fds.iterdir()}
        finally:
            os.kill(pid, signal.SIGKILL)

    watcher = threading.Thread(target=look)
    watcher.start()
    with pytest.raises(SandboxViolation, match="died of SIGKILL"):
        _in_child(_wait_for_the_host_to_look)
    watcher.join()
    assert seen["fds"] == {0: "/dev/null", 1: "/dev/null", 2: "/dev/null", 3: "pipe", 4: "pipe"}
    assert (seen["NoNewPrivs"], seen["Seccomp"], seen["Seccomp_filters"]) == ("1", "2", "1")
    for held in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(seen[held], 16) == 0, held
    if AS_ROOT:
        unprivileged = str(confine.UNPRIVILEGED_ID)
        assert seen["Uid"].split() == seen["Gid"].split() == [unprivileged] * 4
        assert seen["Groups"].strip() == ""
        assert int(seen["CapBnd"], 16) == 0
    else:
        assert seen["Uid"].split() == [str(os.getuid())] * 4


def test_without_the_filter_landlock_alone_keeps_a_child_off_every_path(tmp_path: Path) -> None:
    if not confine._LANDLOCK_RULESET:
        pytest.skip("this kernel has no Landlock: the allow list alone keeps paths out of reach")
    folder, target = open_folder(tmp_path)
    inbox, outbox = os.pipe()
    pid = os.fork()
    if pid == 0:  # Landlock as the child applies it, and nothing else of the confinement
        tried: dict[str, str] = {}
        try:
            assert confine._prctl(38, 1, 0, 0, 0) == 0  # no new privileges, which it needs
            assert confine._landlock()
            for what, action in {
                "write": lambda: target.write_text("escaped"),
                "create": lambda: (folder / "new").write_text("escaped"),
                "mkdir": lambda: (folder / "sub").mkdir(),
                "unlink": lambda: target.unlink(),
                "read": lambda: target.read_text(),
                "list": lambda: os.listdir(folder),
            }.items():
                try:
                    action()
                    tried[what] = "done"
                except OSError as exc:
                    tried[what] = os.strerror(exc.errno or 0)
        finally:
            os.write(outbox, json.dumps(tried).encode())
            os._exit(0)
    os.close(outbox)
    with os.fdopen(inbox) as pipe:
        tried = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert tried == dict.fromkeys(
        ["write", "create", "mkdir", "unlink", "read", "list"], "Permission denied"
    )
    assert sorted(os.listdir(folder)) == ["notes.txt"] and target.read_text() == "host data\n"


# -- each escape found, as a regression test ------------------------------------------------


def _sigqueue_kill(receiver: UvmObject, victim: int) -> list[int]:
    info = sandbox_probe._siginfo()
    return [
        syscall("rt_sigqueueinfo", victim, signal.SIGKILL, info),
        syscall("rt_tgsigqueueinfo", victim, victim, signal.SIGKILL, info),
    ]


def test_a_child_cannot_kill_another_process_through_sigqueue() -> None:
    decoy = subprocess.Popen(["sleep", "60"])  # a process of the same user, like a ZEO server
    try:
        assert _in_child(_sigqueue_kill, victim=decoy.pid) == [-1, -1]
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()


def _open_by_handle(folder: bytes, path: bytes, flags: int) -> int:
    """A descriptor for ``path`` by its file handle, freeing descriptor 0 for it first."""
    syscall("chdir", folder)  # the handle is read against the working directory's filesystem
    handle = sandbox_probe._handle()
    syscall("close", 0)
    found = syscall("name_to_handle_at", _AT_FDCWD, path, handle, ctypes.create_string_buffer(8), 0)
    if found < 0:
        return found
    return syscall("open_by_handle_at", _AT_FDCWD, handle, flags)


def _read_by_handle(receiver: UvmObject, folder: bytes, path: bytes) -> bytes:
    fd = _open_by_handle(folder, path, os.O_RDONLY)
    if fd < 0:
        return b""
    buffer = ctypes.create_string_buffer(100)
    size = syscall("read", fd, buffer, 100)
    return buffer.raw[: max(size, 0)]


@needs_root
def test_a_child_cannot_read_a_private_file_by_its_handle(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("the host's key")
    secret.chmod(0o600)
    assert _in_child(_read_by_handle, folder=bytes(tmp_path), path=bytes(secret)) == b""


def _rewrite_through_mapping(receiver: UvmObject, folder: bytes, path: bytes) -> int:
    fd = _open_by_handle(folder, path, _O_RDWR)
    if fd < 0:
        return fd
    address = syscall("mmap", None, 4096, _PROT_RW, _MAP_SHARED, fd, 0)
    if address < 0:
        return address
    ctypes.memmove(address, b"VALUE = 666", 11)  # RLIMIT_FSIZE does not see a mapping
    return 0


@needs_root
def test_a_child_cannot_rewrite_a_module_through_a_shared_mapping(tmp_path: Path) -> None:
    module = tmp_path / "plugin.py"
    module.write_text("VALUE = 1\n" + "#" * 100 + "\n")
    before = module.read_bytes()
    outcome = _in_child(_rewrite_through_mapping, folder=bytes(tmp_path), path=bytes(module))
    assert module.read_bytes() == before
    assert outcome < 0


def _mount_over(receiver: UvmObject, source: bytes, targets: list[bytes]) -> list[int]:
    for fd in (0, 1, 2):  # descriptors for the new mounts
        syscall("close", fd)
    results = []
    filesystem = syscall("fsopen", b"tmpfs", 0)
    if filesystem >= 0:
        syscall("fsconfig", filesystem, 6, None, None, 0)  # FSCONFIG_CMD_CREATE
        mounted = syscall("fsmount", filesystem, 0, 0)
        results.append(syscall("move_mount", mounted, b"", _AT_FDCWD, targets[0], 4))
    else:
        results.append(filesystem)
    tree = syscall("open_tree", _AT_FDCWD, source, 1)  # OPEN_TREE_CLONE: a bind mount
    results.append(
        syscall("move_mount", tree, b"", _AT_FDCWD, targets[1], 4) if tree >= 0 else tree
    )
    return results


@needs_root
def test_a_child_cannot_mount_over_a_host_directory(tmp_path: Path) -> None:
    targets = [tmp_path / "over-tmpfs", tmp_path / "over-bind"]
    for target in targets:
        target.mkdir()
    try:
        outcome = _in_child(
            _mount_over, source=bytes(tmp_path), targets=[bytes(t) for t in targets]
        )
        assert [os.path.ismount(t) for t in targets] == [False, False]
        assert outcome == [_EPERM, _EPERM]
    finally:
        for target in targets:  # what an old filter let through must not outlive the test
            while os.path.ismount(target):
                sandbox_probe._libc.umount2(bytes(target), 2)  # MNT_DETACH


def _change_metadata(receiver: UvmObject, path: bytes) -> list[int]:
    zeros = ctypes.create_string_buffer(32)
    return [
        syscall("fchmodat2", _AT_FDCWD, path, 0o600, 0),
        syscall("utime", path, zeros),
        syscall("utimes", path, zeros),
        syscall("futimesat", _AT_FDCWD, path, zeros),
        syscall("setxattr", path, b"user.batos", b"x", 1, 0),
        syscall("lsetxattr", path, b"user.batos", b"x", 1, 0),
        syscall("removexattr", path, b"user.keep"),
    ]


def test_a_child_cannot_change_modes_times_or_attributes_of_host_files(tmp_path: Path) -> None:
    _, target = open_folder(tmp_path)
    before = target.stat()
    assert _in_child(_change_metadata, path=bytes(target)) == [_EPERM] * 7
    after = target.stat()
    assert (after.st_mode, after.st_mtime_ns, after.st_atime_ns) == (
        before.st_mode,
        before.st_mtime_ns,
        before.st_atime_ns,
    )
    assert os.listxattr(target) == ["user.keep"]


def _share_memory(receiver: UvmObject, size: int) -> int:
    segment = syscall("shmget", 0, size, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    if segment >= 0:
        address = syscall("shmat", segment, None, 0)
        if address >= 0:
            ctypes.memset(address, 1, size)
    return segment


def _segments() -> set[int]:
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {int(line.split()[1]) for line in lines}


def test_a_childs_shared_memory_cannot_outlive_it() -> None:
    segment = _in_child(_share_memory, size=4 << 20)
    outlived = segment >= 0 and segment in _segments()
    if outlived:  # what an old filter let through must not outlive the test
        sandbox_probe._syscall(sandbox_probe.NUMBERS["shmctl"], segment, 0, None)  # IPC_RMID
    assert not outlived
    assert segment == _EPERM
