"""What a sandboxed call's child process gives up before it runs generated code.

The child is a fork of the host, so it starts with everything the host has: its open files
(the image among them, read-write), its environment, its right to start processes, open
sockets and signal its parent. ``confine`` takes away what the OS lets a process take away
from itself cheaply, in this order:

1. **Descriptors.** The channel to the host moves to descriptors 3 and 4, standard input and
   output and error become ``/dev/null``, every other descriptor is closed, and
   ``RLIMIT_NOFILE`` is set to 5, so no file, socket or pipe can be opened afterwards.
2. **Environment.** ``os.environ`` is emptied (the limits the child needs were read before).
3. **Limits.** ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE`` 0 and ``RLIMIT_CORE`` 0.
4. **No new privileges** (``PR_SET_NO_NEW_PRIVS``): nothing it could execute gains any.
5. **A seccomp filter** (Linux on x86-64): opening files, sockets, ``execve``, new processes
   (threads stay allowed), signals to any process but itself, ``ptrace`` and reading or
   writing other processes' memory, changing the filesystem, mounts and namespaces, and
   setting limits or priorities of other processes fail with ``EPERM``.

Where a step is unavailable (no seccomp, another architecture), the others still apply;
``applied()`` says which did. Namespaces are not used: creating a network or user namespace
costs milliseconds per call, and the filter already refuses sockets.
"""

from __future__ import annotations

import ctypes
import os
import platform
import resource
import struct
from typing import Any

#: Descriptors the channel gets in the child; nothing above them stays open.
TO_HOST_FD, FROM_HOST_FD = 3, 4

_applied: list[str] = []

# -- the seccomp filter (x86-64 syscall numbers) ------------------------------------------------

#: System calls the child may not make, as name=number (x86-64), by what they reach.
_DENIED_X86_64_TEXT = """
files: opening, creating, changing the filesystem:
    open=2 openat=257 openat2=437 creat=85 truncate=76 ftruncate=77 rename=82 renameat=264
    renameat2=316 mkdir=83 mkdirat=258 rmdir=84 link=86 linkat=265 unlink=87 unlinkat=263
    symlink=88 symlinkat=266 chmod=90 fchmod=91 fchmodat=268 chown=92 fchown=93 lchown=94
    fchownat=260 mknod=133 mknodat=259 utimensat=280 chroot=161 acct=163
network:
    socket=41 connect=42 accept=43 bind=49 listen=50 socketpair=53 accept4=288
programs and processes:
    execve=59 execveat=322 fork=57 vfork=58 ptrace=101 process_vm_readv=310
    process_vm_writev=311 process_madvise=440 pidfd_open=434 pidfd_send_signal=424
    pidfd_getfd=438 tkill=200 setpriority=141 sched_setparam=142 sched_setscheduler=144
    sched_setaffinity=203 ioprio_set=251 migrate_pages=256 move_pages=279
the system:
    mount=165 umount2=166 pivot_root=155 unshare=272 setns=308 swapon=167 swapoff=168 reboot=169
    init_module=175 finit_module=313 delete_module=176 kexec_load=246 bpf=321
    perf_event_open=298 userfaultfd=323 io_uring_setup=425 io_uring_enter=426
    io_uring_register=427 keyctl=250 add_key=248 request_key=249 personality=135
"""
_DENIED_X86_64 = {
    name: int(number)
    for name, number in (word.split("=") for word in _DENIED_X86_64_TEXT.split() if "=" in word)
}
_CLONE, _CLONE3, _KILL, _TGKILL, _PRLIMIT64 = 56, 435, 62, 234, 302
_CLONE_THREAD = 0x00010000
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_RET_ALLOW, _RET_KILL_PROCESS = 0x7FFF0000, 0x80000000
_RET_EPERM, _RET_ENOSYS = 0x00050000 | 1, 0x00050000 | 38
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low word, little-endian)


_PID = 0xFFFFFFFF  # stands for the child's pid until it is known


def _filter_template() -> tuple[bytes, list[int]]:
    """The BPF program, and the offsets of the constants that must become the child's pid:
    deny the listed calls, allow clone only for threads, and signals and limits only for
    the child itself."""
    code: list[tuple[int, int, int, int]] = [
        (_LD_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, _AUDIT_ARCH_X86_64),
        (_RET, 0, 0, _RET_KILL_PROCESS),
        (_LD_ABS, 0, 0, _NR),
        (_JGE, 0, 1, _X32_SYSCALL_BIT),
        (_RET, 0, 0, _RET_EPERM),
        # clone3 hides its flags in memory a filter cannot read: ENOSYS makes libc use clone.
        (_JEQ, 0, 1, _CLONE3),
        (_RET, 0, 0, _RET_ENOSYS),
        (_JEQ, 0, 4, _CLONE),
        (_LD_ABS, 0, 0, _ARG0),
        (_JSET, 0, 1, _CLONE_THREAD),
        (_RET, 0, 0, _RET_ALLOW),
        (_RET, 0, 0, _RET_EPERM),
    ]
    for number in (_KILL, _TGKILL):
        code += [
            (_JEQ, 0, 4, number),
            (_LD_ABS, 0, 0, _ARG0),
            (_JEQ, 0, 1, _PID),
            (_RET, 0, 0, _RET_ALLOW),
            (_RET, 0, 0, _RET_EPERM),
        ]
    code += [
        (_JEQ, 0, 5, _PRLIMIT64),
        (_LD_ABS, 0, 0, _ARG0),
        (_JEQ, 2, 0, 0),
        (_JEQ, 1, 0, _PID),
        (_RET, 0, 0, _RET_EPERM),
        (_RET, 0, 0, _RET_ALLOW),
    ]
    for number in sorted(_DENIED_X86_64.values()):
        code += [(_JEQ, 0, 1, number), (_RET, 0, 0, _RET_EPERM)]
    code.append((_RET, 0, 0, _RET_ALLOW))
    pid_at = [index * 8 + 4 for index, op in enumerate(code) if op[0] == _JEQ and op[3] == _PID]
    return b"".join(struct.pack("=HBBI", *op) for op in code), pid_at


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


def _libc_function(name: str) -> Any:
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


# Everything a child needs is prepared in the host: the child cannot open the library file,
# and each millisecond here is one more per call.
_prctl = _libc_function("prctl")
_clearenv = _libc_function("clearenv")
_TEMPLATE, _PID_AT = _filter_template()
_SECCOMP_HERE = _prctl is not None and platform.machine() in ("x86_64", "AMD64")


def _no_new_privileges() -> bool:
    return _prctl is not None and _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0


# The program's buffer is made in the host; a child only writes its pid into its own copy.
_PROGRAM = ctypes.create_string_buffer(_TEMPLATE, len(_TEMPLATE))
_FPROG = _SockFprog(len(_TEMPLATE) // 8, ctypes.cast(_PROGRAM, ctypes.c_void_p))


def _seccomp() -> bool:
    if not _SECCOMP_HERE:
        return False
    pid = struct.pack("=I", os.getpid())
    for offset in _PID_AT:
        _PROGRAM[offset : offset + 4] = pid
    return _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(_FPROG), 0, 0) == 0


def _empty_environment() -> None:
    # One C call instead of an unsetenv per variable; then Python's copy of the table.
    if _clearenv is not None:
        _clearenv()
        os.environ._data.clear()  # type: ignore[attr-defined]  # the mapping's own store
    else:
        os.environ.clear()


# -- the whole confinement ------------------------------------------------------------------------


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


def confine(to_host: int, from_host: int, *, address_space: int, cpu_seconds: int) -> None:
    """Confine this (child) process; afterwards the channel is ``TO_HOST_FD``/``FROM_HOST_FD``.

    Runs before any generated code. Every step that fails raises: a child that cannot be
    confined must not run the code (only the optional kernel features degrade silently).
    """
    _applied.clear()
    _descriptors(to_host, from_host)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FROM_HOST_FD + 1,) * 2)
    _applied.append("descriptors")
    _empty_environment()
    _applied.append("environment")
    resource.setrlimit(resource.RLIMIT_AS, (address_space,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _applied.append("limits")
    if _no_new_privileges():
        _applied.append("no-new-privileges")
        if _seccomp():
            _applied.append("seccomp")


def applied() -> list[str]:
    """The steps in force in this process (in a child after ``confine``; [] in the host)."""
    return list(_applied)
