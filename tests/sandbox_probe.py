"""A probe of the sandbox child's policy: from a child made the way the product makes one, it
tries a broad list of system calls that the child must not make, and reports what each did.

Every call is chosen to be harmless if it were allowed (an invalid argument, a path that does
not exist, a signal 0, the host's own hostname), except those aimed at the targets the probe
prepares: a directory of mode 0777 and a file of mode 0666 that the probing process owns, and a
decoy process of the same user. ``run()`` returns what each call did and what became of the
targets.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prototypes import isolation
from prototypes.uvm import UvmObject

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long

#: x86-64 numbers of every call the probe makes.
NUMBERS = {
    "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "fstat": 5, "lstat": 6,
    "lseek": 8, "mmap": 9, "mprotect": 10, "ioctl": 16, "access": 21, "pipe": 22,
    "shmget": 29, "shmat": 30, "shmctl": 31, "dup": 32, "dup2": 33, "getpid": 39, "socket": 41,
    "connect": 42, "accept": 43, "sendto": 44, "recvfrom": 45, "sendmsg": 46, "bind": 49,
    "listen": 50, "socketpair": 53, "setsockopt": 54, "clone": 56, "fork": 57, "vfork": 58,
    "execve": 59, "kill": 62, "uname": 63, "semget": 64, "semctl": 66, "shmdt": 67,
    "msgget": 68, "msgctl": 71, "fcntl": 72, "truncate": 76, "ftruncate": 77, "getcwd": 79,
    "chdir": 80, "fchdir": 81, "rename": 82, "mkdir": 83, "rmdir": 84, "creat": 85,
    "link": 86, "unlink": 87, "symlink": 88, "readlink": 89, "chmod": 90, "fchmod": 91,
    "chown": 92, "fchown": 93, "lchown": 94, "getrusage": 98, "sysinfo": 99, "ptrace": 101,
    "getuid": 102, "syslog": 103, "setuid": 105, "setgid": 106, "setpgid": 109,
    "getppid": 110, "setsid": 112, "setgroups": 116, "setresuid": 117, "setresgid": 119,
    "setfsuid": 122, "capget": 125, "capset": 126, "rt_sigqueueinfo": 129, "utime": 132,
    "mknod": 133, "personality": 135, "statfs": 137, "fstatfs": 138, "setpriority": 141,
    "sched_setscheduler": 144, "modify_ldt": 154, "pivot_root": 155, "prctl": 157,
    "arch_prctl": 158, "adjtimex": 159, "chroot": 161, "sync": 162, "acct": 163,
    "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
    "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
    "init_module": 175, "delete_module": 176, "quotactl": 179, "setxattr": 188,
    "lsetxattr": 189, "fsetxattr": 190, "getxattr": 191, "listxattr": 194,
    "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199, "tkill": 200,
    "sched_setaffinity": 203, "getdents64": 217, "clock_settime": 227, "tgkill": 234,
    "utimes": 235, "mbind": 237, "mq_open": 240, "mq_unlink": 241, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "ioprio_set": 251,
    "migrate_pages": 256, "openat": 257, "mkdirat": 258, "mknodat": 259, "fchownat": 260,
    "futimesat": 261, "newfstatat": 262, "unlinkat": 263, "renameat": 264, "linkat": 265,
    "symlinkat": 266, "readlinkat": 267, "fchmodat": 268, "faccessat": 269, "unshare": 272,
    "get_robust_list": 274, "move_pages": 279, "utimensat": 280, "timerfd_create": 283,
    "eventfd2": 290, "epoll_create1": 291, "dup3": 292, "pipe2": 293, "inotify_init1": 294,
    "rt_tgsigqueueinfo": 297, "perf_event_open": 298, "fanotify_init": 300,
    "prlimit64": 302, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "syncfs": 306, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "sched_setattr": 314,
    "renameat2": 316, "seccomp": 317, "memfd_create": 319, "kexec_file_load": 320, "bpf": 321,
    "execveat": 322, "userfaultfd": 323, "pkey_mprotect": 329, "statx": 332,
    "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435,
    "openat2": 437, "pidfd_getfd": 438, "faccessat2": 439, "process_madvise": 440,
    "mount_setattr": 442, "quotactl_fd": 443, "landlock_create_ruleset": 444,
    "memfd_secret": 447, "fchmodat2": 452, "statmount": 457, "listmount": 458,
    "setxattrat": 463, "removexattrat": 466,
}  # fmt: skip

_AT_FDCWD = -100
_NOWHERE = b"/nonexistent-batos-probe"
_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_SHARED, _MAP_PRIVATE, _MAP_ANONYMOUS = 1, 2, 0x20
_IPC_PRIVATE, _IPC_CREAT, _IPC_RMID = 0, 0o1000, 0
_SIGCHLD, _SIGKILL = 17, 9
_CLONE_THREAD, _CLONE_NEWNET, _CLONE_NEWUSER, _CLONE_NEWUTS = (
    0x10000,
    0x40000000,
    0x10000000,
    0x4000000,
)
_X32_SYSCALL_BIT = 0x40000000
_SOCKET_TYPES = (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW)


def open_folder(root: Path) -> tuple[Path, Path]:
    """A folder of mode 0777 holding a file of mode 0666 with an attribute, both the host's:
    the targets a confined child must not change."""
    folder = root / "open"
    folder.mkdir()
    folder.chmod(0o777)
    target = folder / "notes.txt"
    target.write_text("host data\n")
    target.chmod(0o666)
    os.setxattr(target, "user.keep", b"1")
    return folder, target


def _buffer(size: int = 4096) -> Any:
    return ctypes.create_string_buffer(size)


def _siginfo() -> Any:
    info = _buffer(128)
    ctypes.memmove(info, (ctypes.c_int * 3)(0, 0, -1), 12)  # si_code SI_QUEUE, as sigqueue
    return info


def _cap_header() -> Any:
    return (ctypes.c_uint32 * 2)(0x20080522, 0)


def _handle() -> Any:
    handle = _buffer(136)
    ctypes.memmove(handle, (ctypes.c_uint32 * 1)(128), 4)  # handle_bytes
    return handle


#: (what is tried, the call, its arguments from the targets): every one must be refused.
Attempt = tuple[str, str, Callable[[dict[str, Any]], tuple]]
ATTEMPTS: list[Attempt] = [
    # the targets: a 0777 directory and a 0666 file the host owns
    ("create a file in the open directory", "creat", lambda t: (t["dir"] + b"/new", 0o666)),
    ("open the file for writing", "open", lambda t: (t["file"], os.O_WRONLY)),
    ("openat the file for writing", "openat", lambda t: (_AT_FDCWD, t["file"], os.O_WRONLY)),
    ("openat2 the file", "openat2", lambda t: (_AT_FDCWD, t["file"], _buffer(24), 24)),
    ("open the host's hostname file", "open", lambda t: (b"/etc/hostname", os.O_RDONLY)),
    ("truncate the file", "truncate", lambda t: (t["file"], 0)),
    ("make a directory", "mkdir", lambda t: (t["dir"] + b"/sub", 0o777)),
    ("make a directory (at)", "mkdirat", lambda t: (_AT_FDCWD, t["dir"] + b"/sub", 0o777)),
    ("make a fifo", "mknod", lambda t: (t["dir"] + b"/fifo", 0o10666, 0)),
    ("make a fifo (at)", "mknodat", lambda t: (_AT_FDCWD, t["dir"] + b"/fifo", 0o10666, 0)),
    ("symlink", "symlink", lambda t: (t["file"], t["dir"] + b"/link")),
    ("symlink (at)", "symlinkat", lambda t: (t["file"], _AT_FDCWD, t["dir"] + b"/link")),
    ("hard link", "link", lambda t: (t["file"], t["dir"] + b"/hard")),
    ("hard link (at)", "linkat", lambda t: (_AT_FDCWD, t["file"], _AT_FDCWD, t["dir"] + b"/h", 0)),
    ("rename the file", "rename", lambda t: (t["file"], t["dir"] + b"/moved")),
    (
        "rename the file (at)",
        "renameat",
        lambda t: (_AT_FDCWD, t["file"], _AT_FDCWD, t["dir"] + b"/m"),
    ),
    (
        "rename the file (at2)",
        "renameat2",
        lambda t: (_AT_FDCWD, t["file"], _AT_FDCWD, t["dir"] + b"/m", 0),
    ),
    ("unlink the file", "unlink", lambda t: (t["file"],)),
    ("unlink the file (at)", "unlinkat", lambda t: (_AT_FDCWD, t["file"], 0)),
    ("remove a directory", "rmdir", lambda t: (t["dir"] + b"/missing",)),
    ("chmod the file", "chmod", lambda t: (t["file"], 0o600)),
    ("fchmodat the file", "fchmodat", lambda t: (_AT_FDCWD, t["file"], 0o600)),
    ("fchmodat2 the file", "fchmodat2", lambda t: (_AT_FDCWD, t["file"], 0o600, 0)),
    ("fchmod a descriptor", "fchmod", lambda t: (-1, 0o600)),
    ("chown the file", "chown", lambda t: (t["file"], -1, -1)),
    ("lchown the file", "lchown", lambda t: (t["file"], -1, -1)),
    ("fchownat the file", "fchownat", lambda t: (_AT_FDCWD, t["file"], -1, -1, 0)),
    ("fchown a descriptor", "fchown", lambda t: (-1, -1, -1)),
    ("utime the file", "utime", lambda t: (t["file"], _buffer(16))),
    ("utimes the file", "utimes", lambda t: (t["file"], _buffer(32))),
    ("futimesat the file", "futimesat", lambda t: (_AT_FDCWD, t["file"], _buffer(32))),
    ("utimensat the file", "utimensat", lambda t: (_AT_FDCWD, t["file"], None, 0)),
    ("setxattr on the file", "setxattr", lambda t: (t["file"], b"user.batos", b"x", 1, 0)),
    ("lsetxattr on the file", "lsetxattr", lambda t: (t["file"], b"user.batos", b"x", 1, 0)),
    ("fsetxattr on a descriptor", "fsetxattr", lambda t: (0, b"user.batos", b"x", 1, 0)),
    ("setxattrat on the file", "setxattrat", lambda t: (_AT_FDCWD, t["file"], 0, _buffer(32), 32)),
    ("removexattr from the file", "removexattr", lambda t: (t["file"], b"user.keep")),
    ("lremovexattr from the file", "lremovexattr", lambda t: (t["file"], b"user.keep")),
    ("fremovexattr from a descriptor", "fremovexattr", lambda t: (0, b"user.keep")),
    (
        "removexattrat from the file",
        "removexattrat",
        lambda t: (_AT_FDCWD, t["file"], 0, b"user.keep"),
    ),
    ("getxattr of the file", "getxattr", lambda t: (t["file"], b"user.keep", _buffer(), 64)),
    ("listxattr of the file", "listxattr", lambda t: (t["file"], _buffer(), 64)),
    (
        "name_to_handle_at the file",
        "name_to_handle_at",
        lambda t: (_AT_FDCWD, t["file"], _handle(), _buffer(8), 0),
    ),
    ("open_by_handle_at", "open_by_handle_at", lambda t: (_AT_FDCWD, _handle(), os.O_RDONLY)),
    ("stat the root", "stat", lambda t: (b"/", _buffer())),
    ("lstat the root", "lstat", lambda t: (b"/", _buffer())),
    ("newfstatat the root", "newfstatat", lambda t: (_AT_FDCWD, b"/", _buffer(), 0)),
    ("statx the root", "statx", lambda t: (_AT_FDCWD, b"/", 0, 0xFFF, _buffer())),
    ("access the file", "access", lambda t: (t["file"], 0)),
    ("faccessat the file", "faccessat", lambda t: (_AT_FDCWD, t["file"], 0)),
    ("faccessat2 the file", "faccessat2", lambda t: (_AT_FDCWD, t["file"], 0, 0)),
    ("readlink", "readlink", lambda t: (b"/proc/self/exe", _buffer(), 256)),
    ("readlinkat", "readlinkat", lambda t: (_AT_FDCWD, b"/proc/self/exe", _buffer(), 256)),
    ("getcwd", "getcwd", lambda t: (_buffer(), 4096)),
    ("chdir", "chdir", lambda t: (b"/",)),
    ("fchdir", "fchdir", lambda t: (0,)),
    ("statfs", "statfs", lambda t: (b"/", _buffer())),
    ("fstatfs", "fstatfs", lambda t: (0, _buffer())),
    ("fstat", "fstat", lambda t: (0, _buffer())),
    ("getdents64", "getdents64", lambda t: (0, _buffer(), 4096)),
    ("chroot", "chroot", lambda t: (_NOWHERE,)),
    ("pivot_root", "pivot_root", lambda t: (_NOWHERE, _NOWHERE)),
    ("acct", "acct", lambda t: (_NOWHERE,)),
    ("sync", "sync", lambda t: ()),
    ("syncfs", "syncfs", lambda t: (-1,)),
    # descriptors
    ("read the null device", "read", lambda t: (0, _buffer(), 1)),
    ("read the channel to the host", "read", lambda t: (3, _buffer(), 0)),
    ("write the null device", "write", lambda t: (1, b"x", 1)),
    ("write the channel from the host", "write", lambda t: (4, b"", 0)),
    ("close", "close", lambda t: (-1,)),
    ("lseek", "lseek", lambda t: (0, 0, 0)),
    ("ioctl (TIOCSTI)", "ioctl", lambda t: (0, 0x5412, b"x")),
    ("fcntl", "fcntl", lambda t: (3, 1)),
    ("dup", "dup", lambda t: (3,)),
    ("dup2", "dup2", lambda t: (3, 3)),
    ("dup3", "dup3", lambda t: (3, 3, 0)),
    ("ftruncate", "ftruncate", lambda t: (-1, 0)),
    ("pipe", "pipe", lambda t: (_buffer(8),)),
    ("pipe2", "pipe2", lambda t: (_buffer(8), 0)),
    ("eventfd2", "eventfd2", lambda t: (0, 0)),
    ("timerfd_create", "timerfd_create", lambda t: (1, 0)),
    ("epoll_create1", "epoll_create1", lambda t: (0,)),
    ("inotify_init1", "inotify_init1", lambda t: (0,)),
    ("fanotify_init", "fanotify_init", lambda t: (0, 0)),
    # memory
    (
        "map executable memory",
        "mmap",
        lambda t: (None, 4096, _PROT_READ | _PROT_EXEC, _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0),
    ),
    (
        "map a descriptor shared",
        "mmap",
        lambda t: (None, 4096, _PROT_READ | _PROT_WRITE, _MAP_SHARED, 0, 0),
    ),
    ("make memory executable", "mprotect", lambda t: (None, 0, _PROT_READ | _PROT_EXEC)),
    ("pkey_mprotect", "pkey_mprotect", lambda t: (None, 0, _PROT_READ, -1)),
    ("memfd_create (exec)", "memfd_create", lambda t: (b"probe", 0x10)),
    ("memfd_secret", "memfd_secret", lambda t: (0,)),
    ("userfaultfd", "userfaultfd", lambda t: (0,)),
    ("mbind", "mbind", lambda t: (None, 0, 0, None, 0, 0)),
    ("migrate_pages of the host", "migrate_pages", lambda t: (t["host"], 0, None, None)),
    ("move_pages of the host", "move_pages", lambda t: (t["host"], 0, None, None, None, 0)),
    # shared memory and IPC
    ("SysV shared memory", "shmget", lambda t: (_IPC_PRIVATE, 1 << 20, _IPC_CREAT | 0o600)),
    ("SysV shmat", "shmat", lambda t: (-1, None, 0)),
    ("SysV shmctl", "shmctl", lambda t: (-1, 2, _buffer())),
    ("SysV shmdt", "shmdt", lambda t: (None,)),
    ("SysV semaphores", "semget", lambda t: (_IPC_PRIVATE, 1, _IPC_CREAT | 0o600)),
    ("SysV semctl", "semctl", lambda t: (-1, 0, 0, 0)),
    ("SysV message queues", "msgget", lambda t: (_IPC_PRIVATE, _IPC_CREAT | 0o600)),
    ("SysV msgctl", "msgctl", lambda t: (-1, 2, _buffer())),
    (
        "POSIX message queue",
        "mq_open",
        lambda t: (b"batos-probe", os.O_CREAT | os.O_RDWR, 0o600, None),
    ),
    ("POSIX message queue unlink", "mq_unlink", lambda t: (b"batos-probe-none",)),
    # other processes: the host, the decoy, every process
    ("signal the host", "kill", lambda t: (t["host"], 0)),
    ("signal the decoy", "kill", lambda t: (t["decoy"], 0)),
    ("signal the process group", "kill", lambda t: (0, 0)),
    ("signal every process", "kill", lambda t: (-1, 0)),
    ("tkill the host", "tkill", lambda t: (t["host"], 0)),
    ("tgkill the host", "tgkill", lambda t: (t["host"], t["host"], 0)),
    ("rt_sigqueueinfo the host", "rt_sigqueueinfo", lambda t: (t["host"], 0, _siginfo())),
    (
        "rt_sigqueueinfo SIGKILL the decoy",
        "rt_sigqueueinfo",
        lambda t: (t["decoy"], _SIGKILL, _siginfo()),
    ),
    (
        "rt_tgsigqueueinfo the host",
        "rt_tgsigqueueinfo",
        lambda t: (t["host"], t["host"], 0, _siginfo()),
    ),
    (
        "rt_tgsigqueueinfo SIGKILL the decoy",
        "rt_tgsigqueueinfo",
        lambda t: (t["decoy"], t["decoy"], _SIGKILL, _siginfo()),
    ),
    ("pidfd_open the host", "pidfd_open", lambda t: (t["host"], 0)),
    ("pidfd_send_signal", "pidfd_send_signal", lambda t: (-1, 0, None, 0)),
    ("pidfd_getfd", "pidfd_getfd", lambda t: (-1, 0, 0)),
    ("ptrace the host", "ptrace", lambda t: (2, t["host"], None, None)),
    ("read the host's memory", "process_vm_readv", lambda t: (t["host"], None, 0, None, 0, 0)),
    ("write the host's memory", "process_vm_writev", lambda t: (t["host"], None, 0, None, 0, 0)),
    ("process_madvise", "process_madvise", lambda t: (-1, None, 0, 0, 0)),
    ("kcmp with the host", "kcmp", lambda t: (t["host"], t["host"], 0, 0, 0)),
    (
        "get_robust_list of the host",
        "get_robust_list",
        lambda t: (t["host"], _buffer(8), _buffer(8)),
    ),
    ("setpriority", "setpriority", lambda t: (99, 0, 0)),
    ("sched_setaffinity of the host", "sched_setaffinity", lambda t: (t["host"], 0, None)),
    ("sched_setscheduler of the host", "sched_setscheduler", lambda t: (t["host"], -1, None)),
    ("sched_setattr of the host", "sched_setattr", lambda t: (t["host"], None, 0)),
    ("ioprio_set", "ioprio_set", lambda t: (99, 0, 0)),
    ("prlimit64 of the host", "prlimit64", lambda t: (t["host"], 4, None, _buffer(16))),
    ("prlimit64 of itself", "prlimit64", lambda t: (0, 4, None, _buffer(16))),
    ("setpgid", "setpgid", lambda t: (0, 0)),
    ("setsid", "setsid", lambda t: ()),
    # programs and processes
    ("execve", "execve", lambda t: (_NOWHERE, None, None)),
    ("execveat", "execveat", lambda t: (_AT_FDCWD, _NOWHERE, None, None, 0)),
    ("fork", "fork", lambda t: ()),
    ("vfork", "vfork", lambda t: ()),
    ("clone a process", "clone", lambda t: (_SIGCHLD, None, None, None, None)),
    (
        "clone a thread into a namespace",
        "clone",
        lambda t: (_CLONE_THREAD | _CLONE_NEWNET, None, None, None, None),
    ),
    (
        "clone a thread into a user namespace",
        "clone",
        lambda t: (_CLONE_THREAD | _CLONE_NEWUSER, None, None, None, None),
    ),
    # credentials
    ("setuid", "setuid", lambda t: (0,)),
    ("setgid", "setgid", lambda t: (0,)),
    ("setresuid", "setresuid", lambda t: (-1, -1, -1)),
    ("setresgid", "setresgid", lambda t: (-1, -1, -1)),
    ("setgroups", "setgroups", lambda t: (0, None)),
    ("setfsuid", "setfsuid", lambda t: (-1,)),
    ("capget", "capget", lambda t: (_cap_header(), _buffer(24))),
    ("capset", "capset", lambda t: (None, None)),
    ("prctl", "prctl", lambda t: (3, 0, 0, 0, 0)),
    ("seccomp", "seccomp", lambda t: (2, 0, _buffer(4))),
    ("landlock", "landlock_create_ruleset", lambda t: (None, 0, 1)),
    ("personality", "personality", lambda t: (0xFFFFFFFF,)),
    ("arch_prctl", "arch_prctl", lambda t: (0x1003, _buffer(8))),
    ("modify_ldt", "modify_ldt", lambda t: (0, _buffer(16), 16)),
    ("iopl", "iopl", lambda t: (0,)),
    ("ioperm", "ioperm", lambda t: (0, 0, 0)),
    # mounts and namespaces
    ("mount", "mount", lambda t: (b"none", _NOWHERE, b"tmpfs", 0, None)),
    ("umount2", "umount2", lambda t: (_NOWHERE, 0)),
    ("fsopen", "fsopen", lambda t: (b"tmpfs", 0)),
    ("fsconfig", "fsconfig", lambda t: (-1, 6, None, None, 0)),
    ("fsmount", "fsmount", lambda t: (-1, 0, 0)),
    ("move_mount", "move_mount", lambda t: (-1, b"", _AT_FDCWD, t["dir"], 4)),
    ("open_tree", "open_tree", lambda t: (_AT_FDCWD, t["dir"], 1)),
    ("fspick", "fspick", lambda t: (_AT_FDCWD, t["dir"], 0)),
    ("mount_setattr", "mount_setattr", lambda t: (-1, b"", 0, None, 0)),
    ("statmount", "statmount", lambda t: (None, None, 0, 0)),
    ("listmount", "listmount", lambda t: (None, None, 0, 0)),
    ("unshare a user namespace", "unshare", lambda t: (_CLONE_NEWUSER,)),
    ("unshare a UTS namespace", "unshare", lambda t: (_CLONE_NEWUTS,)),
    ("setns", "setns", lambda t: (-1, 0)),
    # the system
    ("reboot", "reboot", lambda t: (0, 0, 0, None)),
    ("kexec_load", "kexec_load", lambda t: (0, 1000, None, 0x12340000)),
    ("kexec_file_load", "kexec_file_load", lambda t: (-1, -1, 0, None, 0xFFFFFFFF)),
    ("init_module", "init_module", lambda t: (None, 0, None)),
    ("finit_module", "finit_module", lambda t: (-1, b"", 0)),
    ("delete_module", "delete_module", lambda t: (b"batos_probe_none", 0)),
    ("swapon", "swapon", lambda t: (_NOWHERE, 0)),
    ("swapoff", "swapoff", lambda t: (_NOWHERE,)),
    ("sethostname", "sethostname", lambda t: (t["hostname"], len(t["hostname"]))),
    ("setdomainname", "setdomainname", lambda t: (t["domainname"], len(t["domainname"]))),
    ("quotactl", "quotactl", lambda t: (0x7FFFFFFF, _NOWHERE, 0, None)),
    ("quotactl_fd", "quotactl_fd", lambda t: (-1, 0, 0, None)),
    ("syslog", "syslog", lambda t: (10, None, 0)),
    ("settimeofday", "settimeofday", lambda t: (None, None)),
    ("clock_settime", "clock_settime", lambda t: (0, None)),
    ("adjtimex", "adjtimex", lambda t: (_buffer(256),)),
    ("clock_adjtime", "clock_adjtime", lambda t: (0, _buffer(256))),
    ("bpf", "bpf", lambda t: (-1, None, 0)),
    ("perf_event_open", "perf_event_open", lambda t: (None, 0, -1, -1, 0)),
    ("io_uring_setup", "io_uring_setup", lambda t: (1, _buffer(120))),
    ("io_uring_enter", "io_uring_enter", lambda t: (-1, 0, 0, 0, None, 0)),
    ("io_uring_register", "io_uring_register", lambda t: (-1, 0, None, 0)),
    ("keyctl", "keyctl", lambda t: (0, -3, 0)),
    ("add_key", "add_key", lambda t: (None, None, None, 0, 0)),
    ("request_key", "request_key", lambda t: (None, None, None, 0)),
    ("uname", "uname", lambda t: (_buffer(390),)),
    ("sysinfo", "sysinfo", lambda t: (_buffer(112),)),
    ("getrusage", "getrusage", lambda t: (0, _buffer(144))),
    ("getuid", "getuid", lambda t: ()),
    ("getppid", "getppid", lambda t: ()),
    # the network
    ("socketpair", "socketpair", lambda t: (socket.AF_UNIX, socket.SOCK_STREAM, 0, _buffer(8))),
    ("connect", "connect", lambda t: (3, _buffer(16), 16)),
    ("bind", "bind", lambda t: (3, _buffer(16), 16)),
    ("listen", "listen", lambda t: (3, 1)),
    ("accept", "accept", lambda t: (3, None, None)),
    ("sendto", "sendto", lambda t: (3, b"x", 1, 0, None, 0)),
    ("sendmsg", "sendmsg", lambda t: (3, _buffer(56), 0)),
    ("recvfrom", "recvfrom", lambda t: (4, _buffer(), 0, 0, None, None)),
    ("setsockopt", "setsockopt", lambda t: (3, 1, 2, _buffer(4), 4)),
] + [
    (f"socket family {family} type {kind}", "socket", lambda t, f=family, k=kind: (f, k, 0))
    for family in range(46)
    for kind in _SOCKET_TYPES
]


def _argument(value: Any) -> Any:
    if isinstance(value, int):
        return ctypes.c_long(value)
    return value  # None (NULL), bytes (a C string) or a ctypes buffer


def syscall(call: str, *args: Any, x32: bool = False) -> int:
    """Make one system call: its result, or minus its errno."""
    number = NUMBERS[call] | (_X32_SYSCALL_BIT if x32 else 0)
    ctypes.set_errno(0)
    result = _syscall(number, *map(_argument, args))
    if result == 0 and call in ("fork", "vfork", "clone"):
        os._exit(0)  # a process that must never have been made: it leaves at once
    if result == -1 and ctypes.get_errno():
        return -ctypes.get_errno()
    return result


def attempt(call: str, args: tuple, *, x32: bool = False) -> str:
    """Make one system call: 'refused: EPERM' (or another errno's name), or 'returned N'."""
    result = syscall(call, *args, x32=x32)
    if result < 0 and -result in errno.errorcode:
        return f"refused: {errno.errorcode[-result]}"
    return f"returned {result}"


def _undo(call: str, outcome: str) -> None:
    """Remove what an allowed IPC call made, so a failing probe leaves nothing behind."""
    if not outcome.startswith("returned "):
        return
    made = int(outcome.split()[1])
    removers = {"shmget": "shmctl", "semget": "semctl", "msgget": "msgctl"}
    if call in removers:
        _syscall(NUMBERS[removers[call]], made, _IPC_RMID, None)
    elif call == "mq_open":
        _syscall(NUMBERS["mq_unlink"], b"batos-probe")


def probe(receiver: UvmObject, targets: dict[str, Any]) -> dict[str, Any]:
    """Run in the confined child: every attempt, and one x32 call."""
    outcomes = {}
    for what, call, arguments in ATTEMPTS:
        outcomes[what] = outcome = attempt(call, arguments(targets))
        _undo(call, outcome)
    outcomes["getpid through the x32 ABI"] = attempt("getpid", (), x32=True)
    outcomes["clone3 (answered ENOSYS)"] = attempt("clone3", (None, 0))
    return {"outcomes": outcomes}


def _state(path: Path) -> dict[str, Any]:
    info = path.lstat()
    return {
        "mode": oct(info.st_mode),
        "owner": [info.st_uid, info.st_gid],
        "times": [info.st_mtime_ns, info.st_atime_ns],
        "size": info.st_size,
        "attributes": sorted(os.listxattr(path)) if path.is_file() else [],
    }


def run() -> dict[str, Any]:
    """Probe a child of this process; what each call did and what became of the targets."""
    root = Path(tempfile.mkdtemp(prefix="batos-probe-"))
    decoy = subprocess.Popen(["sleep", "60"])
    try:
        folder, target = open_folder(root)
        before = {p.name: _state(p) for p in [folder, *folder.iterdir()]}
        name = os.uname()
        targets = {
            "dir": bytes(folder),
            "file": bytes(target),
            "host": os.getpid(),
            "decoy": decoy.pid,
            "hostname": name.nodename.encode(),
            "domainname": _domainname(),
        }
        seen = isolation.run(
            probe, (UvmObject(name="probe"),), {"targets": targets}, seconds=20, memory_mb=256
        )
        after = {p.name: _state(p) for p in [folder, *folder.iterdir()]}
        return {
            "outcomes": seen["outcomes"],
            "targets unchanged": before == after,
            "targets": after,
            "content": target.read_text() if target.exists() else None,
            "decoy alive": decoy.poll() is None,
            "uid": os.geteuid(),
        }
    finally:
        decoy.kill()
        decoy.wait()
        shutil.rmtree(root, ignore_errors=True)


def _domainname() -> bytes:
    buffer = _buffer(65)
    _libc.getdomainname(buffer, 65)
    return buffer.value
