"""The sandbox child's policy: what a sandboxed call's process gives up before generated code runs.

This docstring and ``POLICY`` below are the policy, in one place; ``tests/test_confine.py``
probes it from a child made the way the product makes one.

The child is a fork of the host, so it starts with everything the host has: its open files
(the image among them, read-write), its environment, its user and capabilities (root, where
BAT OS runs as root), its right to start processes, open sockets and signal other processes.
``confine`` takes all of that away, in this order, before any generated code runs:

1. **Descriptors.** The channel to the host moves to descriptors 3 (to the host) and 4 (from
   the host), standard input, output and error become ``/dev/null``, every other descriptor
   is closed.
2. **Environment.** ``os.environ`` is emptied (the limits the child needs were read before).
3. **No new privileges** (``PR_SET_NO_NEW_PRIVS``): nothing it could execute gains any.
4. **No filesystem** (Landlock, where the kernel has it: Linux 5.13 and later with Landlock
   enabled): every access right Landlock knows is handled and none is granted, so no path can
   be opened, created, written, truncated, removed, linked or executed, whatever its mode;
   on kernels whose Landlock is new enough (ABI 4 and 6) TCP bind and connect, abstract Unix
   sockets and signals to processes outside the child are refused too. Where the kernel lacks
   Landlock this step is skipped (``applied()`` then lacks ``"landlock"``) and the child
   still cannot reach a path: the allow list (step 7) has no call that takes one.
5. **Limits.** ``RLIMIT_NOFILE`` 5 (no descriptor can be made), ``RLIMIT_AS`` (memory),
   ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` 0 and ``RLIMIT_CORE`` 0.
6. **Never root.** When the host is root, the child clears its capability bounding and
   ambient sets, drops every supplementary group and sets its real, effective and saved gid
   and uid to ``UNPRIVILEGED_ID`` (65534, ``nobody``/``nogroup`` on most systems), which
   clears every capability for good. Any other user keeps its ids and loses whatever
   capabilities it held. The child checks the result and refuses to go on otherwise.
7. **An allow list of system calls** (seccomp, Linux x86-64): the calls in ``POLICY`` are
   allowed, under the argument conditions written there; every other call fails with
   ``EPERM``. Calls made through another ABI kill the process (i386, whose numbers differ) or
   fail (x32). In short the child may: read the channel from the host and write the channel
   to it; map, unmap and protect anonymous memory that is never executable; run the
   watchdog thread (``clone`` of a thread only, futexes, signal masks); read clocks, sleep,
   draw random bytes; signal itself; exit. It has no call that names a path, makes a
   descriptor or a process, reaches another process, shares memory with one (SysV or POSIX
   IPC, ``memfd``), changes credentials, limits, mounts or namespaces, or talks to the kernel
   about anything else (``bpf``, ``perf_event_open``, ``io_uring``, keys, modules, ...).

Every step that fails raises, and the code does not run; only Landlock degrades, as said.
The host refuses process isolation where the allow list cannot be installed (another OS or
architecture) with a ``ConfigurationError`` that says so (``require_supported``).

**What this does not guarantee.** The child can still read everything the host held in
memory at the fork (secrets in Python objects included) and burn its CPU and memory limits;
it can send the host any report the host accepts (see ``prototypes.report``). The argument
conditions look at the low 32 bits of an argument, which is what the kernel reads for the
descriptors, flags and process ids conditioned here. As a non-root user the child keeps
that user's uid and groups (the allow list and Landlock are what keep it off the user's
files). The filter is written for x86-64 alone.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import struct
import sys
from dataclasses import dataclass
from typing import Any

from batos.errors import ConfigurationError, SandboxViolation

#: Descriptors the channel gets in the child; nothing above them stays open.
TO_HOST_FD, FROM_HOST_FD = 3, 4
#: The uid and gid a child of a root host runs as.
UNPRIVILEGED_ID = 65534

_applied: list[str] = []

# -- the policy: the system calls the child may make ---------------------------------------------

#: Stands for the child's own process id in a condition; written into its copy of the filter.
SELF = -1


@dataclass(frozen=True)
class ArgMatches:
    """A condition on argument ``index`` (0-5): ``argument & mask == value``, low 32 bits."""

    index: int
    mask: int
    value: int


def arg_is(index: int, value: int) -> ArgMatches:
    return ArgMatches(index, 0xFFFFFFFF, value)


def arg_lacks(index: int, bits: int) -> ArgMatches:
    return ArgMatches(index, bits, 0)


def arg_has(index: int, bits: int) -> ArgMatches:
    return ArgMatches(index, bits, bits)


@dataclass(frozen=True)
class Rule:
    """One row of the policy: ``call`` is answered ``answer`` when every condition holds.

    A call may have several rows (any one that matches answers it); a call with no matching
    row fails with ``EPERM``.
    """

    call: str
    why: str
    when: tuple[ArgMatches, ...] = ()
    answer: str = "allow"  # or "ENOSYS"


_PROT_EXEC, _MAP_ANONYMOUS, _MADV_DONTNEED = 0x4, 0x20, 4
_CLONE_THREAD = 0x00010000
#: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME.
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000
_CLONE_NAMESPACES |= 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

#: The allow list, most frequent calls first (the filter tests rows in this order).
POLICY: tuple[Rule, ...] = (
    Rule("futex", "locks: the GIL, the watchdog's event, thread joins"),
    Rule(
        "mmap",
        "memory for malloc and thread stacks: anonymous, never executable",
        (arg_lacks(2, _PROT_EXEC), arg_has(3, _MAP_ANONYMOUS)),
    ),
    Rule("munmap", "returning memory"),
    Rule(
        "mprotect",
        "thread stack guards and heap growth, never executable",
        (arg_lacks(2, _PROT_EXEC),),
    ),
    Rule("brk", "the heap"),
    Rule("mremap", "realloc of large blocks"),
    Rule(
        "madvise",
        "malloc and thread stacks giving pages back (other advice fails, harmlessly)",
        (arg_is(2, _MADV_DONTNEED),),
    ),
    Rule(
        "read",
        "records the host serves, on the channel from the host only",
        (arg_is(0, FROM_HOST_FD),),
    ),
    Rule("write", "the report, on the channel to the host only", (arg_is(0, TO_HOST_FD),)),
    Rule("rt_sigprocmask", "threads block signals while they start and end"),
    Rule("rt_sigreturn", "return from a signal handler"),
    Rule("restart_syscall", "the kernel resumes a sleep or wait interrupted by a stop"),
    Rule("gettid", "threading's native thread id; glibc's raise and pthread_kill"),
    Rule("getpid", "glibc's raise and abort"),
    Rule(
        "clone",
        "the watchdog thread: a thread of this process only, in no new namespace",
        (ArgMatches(0, _CLONE_THREAD | _CLONE_NAMESPACES, _CLONE_THREAD),),
    ),
    Rule(
        "clone3",
        "its flags are in memory a filter cannot read: ENOSYS makes glibc fall back to clone",
        answer="ENOSYS",
    ),
    Rule("set_robust_list", "a new thread's futex list"),
    Rule("rseq", "a new thread's restartable sequences"),
    Rule("exit", "a thread ends"),
    Rule("exit_group", "the process ends"),
    Rule("clock_gettime", "clocks (where the vDSO falls back to the kernel)"),
    Rule("clock_getres", "clock resolution"),
    Rule("gettimeofday", "the wall clock (where the vDSO falls back to the kernel)"),
    Rule("time", "the wall clock (where the vDSO falls back to the kernel)"),
    Rule("clock_nanosleep", "sleeping"),
    Rule("nanosleep", "sleeping"),
    Rule("sched_yield", "spinning locks yield"),
    Rule("getrandom", "random seeds (random.Random(), os.urandom)"),
    Rule("tgkill", "a signal to one of its own threads (abort)", (arg_is(0, SELF),)),
    Rule("kill", "a signal to itself", (arg_is(0, SELF),)),
)

#: x86-64 numbers of the calls ``POLICY`` names.
X86_64_NUMBERS = {
    "read": 0, "write": 1, "mmap": 9, "mprotect": 10, "munmap": 11, "brk": 12,
    "rt_sigprocmask": 14, "rt_sigreturn": 15, "sched_yield": 24, "mremap": 25, "madvise": 28,
    "nanosleep": 35, "getpid": 39, "clone": 56, "exit": 60, "kill": 62, "gettimeofday": 96,
    "gettid": 186, "time": 201, "futex": 202, "restart_syscall": 219, "clock_gettime": 228,
    "clock_getres": 229, "clock_nanosleep": 230, "exit_group": 231, "tgkill": 234,
    "set_robust_list": 273, "getrandom": 318, "rseq": 334, "clone3": 435,
}  # fmt: skip

# -- the filter generated from the policy --------------------------------------------------------

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_RET_ALLOW, _RET_KILL_PROCESS = 0x7FFF0000, 0x80000000
_RET_ERRNO = 0x00050000
_ANSWERS = {"allow": _RET_ALLOW, "ENOSYS": _RET_ERRNO | 38}
_RET_EPERM = _RET_ERRNO | 1
_LD_ABS, _ALU_AND, _JEQ, _JGE, _RET = 0x20, 0x54, 0x15, 0x35, 0x06
_NR, _ARCH, _ARGS = 0, 4, 16  # offsets in struct seccomp_data; an argument is 8 bytes
_SELF_PLACEHOLDER = 0xFFFFFFFF


def compile_policy(policy: tuple[Rule, ...], numbers: dict[str, int]) -> tuple[bytes, list[int]]:
    """The BPF program for ``policy``, and the offsets of the constants that must become the
    child's pid (``SELF``).

    The program kills the process for a call made through another architecture's ABI, fails
    x32 calls, then tests the rows in order; the first that matches answers; none: ``EPERM``.
    """
    code: list[tuple[int, int, int, int]] = [
        (_LD_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, _AUDIT_ARCH_X86_64),
        (_RET, 0, 0, _RET_KILL_PROCESS),
        (_LD_ABS, 0, 0, _NR),
        (_JGE, 0, 1, _X32_SYSCALL_BIT),
        (_RET, 0, 0, _RET_EPERM),
    ]
    nr_loaded = True
    for rule in policy:
        body: list[tuple[int, int, int, int]] = []
        for condition in rule.when:
            body.append((_LD_ABS, 0, 0, _ARGS + 8 * condition.index))  # low word, little-endian
            if condition.mask != 0xFFFFFFFF:
                body.append((_ALU_AND, 0, 0, condition.mask))
            value = _SELF_PLACEHOLDER if condition.value == SELF else condition.value
            body.append((_JEQ, 0, -1, value))  # -1: to the next row, filled in below
        body.append((_RET, 0, 0, _ANSWERS[rule.answer]))
        row = [] if nr_loaded else [(_LD_ABS, 0, 0, _NR)]
        row.append((_JEQ, 0, len(body), numbers[rule.call]))
        row += [
            (op, jt, len(body) - at - 1 if jf == -1 else jf, k)
            for at, (op, jt, jf, k) in enumerate(body)
        ]
        code += row
        nr_loaded = not rule.when
    code.append((_RET, 0, 0, _RET_EPERM))
    if any(jt > 255 or jf > 255 for _, jt, jf, _ in code):
        raise ValueError("a policy row is too long for a BPF jump")
    self_at = [
        at * 8 + 4 for at, (op, _, _, k) in enumerate(code) if op == _JEQ and k == _SELF_PLACEHOLDER
    ]
    return b"".join(struct.pack("=HBBI", *op) for op in code), self_at


# -- the steps ------------------------------------------------------------------------------------


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAPGET, _CAPSET, _CAP_VERSION_3 = 125, 126, 0x20080522
_LANDLOCK_CREATE_RULESET, _LANDLOCK_RESTRICT_SELF, _LANDLOCK_VERSION = 444, 446, 1
_EINVAL = 22


def _libc_function(name: str, restype: Any = ctypes.c_int) -> Any:
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.restype = restype
    return function


# Everything a child needs is prepared in the host: the child cannot open the library file,
# and each millisecond here is one more per call.
_prctl = _libc_function("prctl")
_syscall = _libc_function("syscall", ctypes.c_long)
_clearenv = _libc_function("clearenv")
_SUPPORTED = (
    sys.platform == "linux"
    and platform.machine() == "x86_64"
    and _prctl is not None
    and _syscall is not None
)
_TEMPLATE, _SELF_AT = compile_policy(POLICY, X86_64_NUMBERS)
# The program's buffer is made in the host; a child only writes its pid into its own copy.
_PROGRAM = ctypes.create_string_buffer(_TEMPLATE, len(_TEMPLATE))
_FPROG = _SockFprog(len(_TEMPLATE) // 8, ctypes.cast(_PROGRAM, ctypes.c_void_p))


def require_supported() -> None:
    """Raise ``ConfigurationError`` where a child cannot be confined as the policy says."""
    if not _SUPPORTED:
        raise ConfigurationError(
            "process isolation needs the sandbox's system-call allow list, which exists for "
            f"Linux on x86-64 only (this is {sys.platform} on {platform.machine()})",
            hint="run BAT OS on Linux x86-64, or set BATOS_SANDBOX_ISOLATION=host to run "
            "generated methods in process (weaker: see docs/self-extension.md)",
        )


def _landlock_abi() -> int:
    if not _SUPPORTED:
        return 0
    version = _syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_VERSION)
    return max(int(version), 0)


def _landlock_ruleset(abi: int) -> bytes:
    """``struct landlock_ruleset_attr`` handling every right ``abi`` knows (none granted)."""
    if abi <= 0:
        return b""
    fs = (1 << 13) - 1  # execute, read, write, remove, make anything
    fs |= (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0) | (1 << 15 if abi >= 5 else 0)
    attr = struct.pack("=Q", fs)
    if abi >= 4:
        attr += struct.pack("=Q", 0b11)  # TCP bind, TCP connect
    if abi >= 6:
        attr += struct.pack("=Q", 0b11)  # abstract Unix sockets, signals out of the domain
    return attr


_LANDLOCK_RULESET = _landlock_ruleset(_landlock_abi())


def _fail(step: str, detail: str) -> SandboxViolation:
    return SandboxViolation(
        "the method's process could not be confined, so the method did not run",
        [f"{step}: {detail}: BAT OS's sandbox needs it on this machine"],
    )


def _check(ok: bool, step: str) -> None:
    if not ok:
        raise _fail(step, os.strerror(ctypes.get_errno()))


def _landlock() -> bool:
    if not _LANDLOCK_RULESET:
        return False
    attr = ctypes.create_string_buffer(_LANDLOCK_RULESET, len(_LANDLOCK_RULESET))
    ruleset = _syscall(_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), 0)
    _check(ruleset >= 0, "Landlock ruleset")
    try:
        _check(_syscall(_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), 0) == 0, "Landlock")
    finally:
        os.close(ruleset)
    return True


def _capabilities() -> list[int]:
    """The effective, permitted and inheritable sets, each as one 64-bit mask."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_syscall(_CAPGET, ctypes.byref(header), data) == 0, "reading capabilities")
    return [
        data[0].effective | data[1].effective << 32,
        data[0].permitted | data[1].permitted << 32,
        data[0].inheritable | data[1].inheritable << 32,
    ]


def _never_root() -> None:
    """Drop root for good, or (any other user) every capability held."""
    was_root = 0 in os.getresuid()
    try:
        if was_root:
            for cap in range(64):
                if _prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                    _check(ctypes.get_errno() == _EINVAL, "dropping the capability bounding set")
                    break  # past the last capability this kernel has
            os.setgroups([])
            os.setresgid(UNPRIVILEGED_ID, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
            os.setresuid(UNPRIVILEGED_ID, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
    except OSError as exc:
        raise _fail(
            f"dropping root for uid and gid {UNPRIVILEGED_ID}", exc.strerror or str(exc)
        ) from None
    if _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        _check(ctypes.get_errno() == _EINVAL, "clearing ambient capabilities")  # before 4.3
    header = _CapHeader(_CAP_VERSION_3, 0)
    _check(_syscall(_CAPSET, ctypes.byref(header), (_CapData * 2)()) == 0, "dropping capabilities")
    ids = {*os.getresuid(), *os.getresgid(), *os.getgroups()} if was_root else set()
    if any(_capabilities()) or ids - {UNPRIVILEGED_ID}:
        raise _fail("dropping root", "the process still holds other ids or capabilities")


def _seccomp() -> None:
    pid = struct.pack("=I", os.getpid())
    for offset in _SELF_AT:
        # a char buffer takes bytes of the slice's length (typeshed types only single chars)
        _PROGRAM[offset : offset + 4] = pid  # type: ignore[call-overload]
    _check(
        _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(_FPROG), 0, 0) == 0,
        "the seccomp filter",
    )


def _empty_environment() -> None:
    # One C call instead of an unsetenv per variable; then Python's copy of the table.
    if _clearenv is not None:
        _clearenv()
        os.environ._data.clear()  # type: ignore[attr-defined]  # the mapping's own store
    else:
        os.environ.clear()


def _descriptors(to_host: int, from_host: int) -> None:
    # Out of the way first: the channel may sit on 0-4 itself.
    high = max(to_host, from_host, 10) + 1
    to_high = os.dup2(to_host, high)
    from_high = os.dup2(from_host, high + 1)
    os.dup2(to_high, TO_HOST_FD)
    os.dup2(from_high, FROM_HOST_FD)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(FROM_HOST_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0] + 1)
    os.set_inheritable(TO_HOST_FD, False)
    os.set_inheritable(FROM_HOST_FD, False)


# -- the whole confinement ------------------------------------------------------------------------


def confine(to_host: int, from_host: int, *, address_space: int, cpu_seconds: int) -> None:
    """Confine this (child) process; afterwards the channel is ``TO_HOST_FD``/``FROM_HOST_FD``.

    Runs before any generated code. Every step that fails raises ``SandboxViolation``: a
    child that cannot be confined must not run the code (only Landlock degrades, where the
    kernel lacks it).
    """
    _applied.clear()
    if not _SUPPORTED:
        raise _fail(
            "the system-call allow list", f"none exists for {sys.platform} on {platform.machine()}"
        )
    _descriptors(to_host, from_host)
    _applied.append("descriptors")
    _empty_environment()
    _applied.append("environment")
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "no new privileges")
    _applied.append("no-new-privileges")
    if _landlock():  # needs a descriptor of its own: before RLIMIT_NOFILE
        _applied.append("landlock")
    resource.setrlimit(resource.RLIMIT_NOFILE, (FROM_HOST_FD + 1,) * 2)
    resource.setrlimit(resource.RLIMIT_AS, (address_space,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _applied.append("limits")
    _never_root()  # after the limits: one above the host's hard limit needs root to be set
    _applied.append("never-root")
    _seccomp()
    _applied.append("seccomp")


def applied() -> list[str]:
    """The steps in force in this process (in a child after ``confine``; [] in the host)."""
    return list(_applied)
