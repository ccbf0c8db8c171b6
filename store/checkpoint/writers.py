"""Which process stored a checkpoint, and whether that process is gone.

A request on a thread whose latest checkpoint another process stored mid-run is refused for a
while (``graph.mind.refuse_if_busy``): that process may be answering there now. When it was
killed (SIGKILL, the out-of-memory killer, a closed terminal), nothing says so, and the
thread stayed refused until the wait ran out. Each checkpoint therefore names its writer:
the boot, the pid namespace, the pid and the process's start time. A process that can see the
same boot and pid namespace can tell for sure that the writer is gone: no process of that
pid, or one started at another time (the pid was reused). From anywhere else (another host,
another container) nothing is known, and the wait stands.

A caller cannot name the writer through a run's metadata (LangGraph drops keys that start
with ``__`` from it). The writer's name is still read back as hostile data: what a stranger
could write there at worst makes a busy thread look free, and the checkpointer still stores
only one of two runs that read the same checkpoint (``ThreadMovedOn``).
"""

from __future__ import annotations

import os
import re

#: The metadata key a checkpoint's writer is kept under (taken out of what readers see).
WRITER_KEY = "__batos_writer__"
#: boot id | pid namespace | pid | start time (seconds since the boot, two decimals).
_NAME = re.compile(r"([0-9a-f-]{36})\|(pid:\[\d{1,20}\])\|(\d{1,10})\|(\d{1,12}\.\d{2})")
#: A start time read again differs from the one recorded by its rounding at most.
_STARTED_SLACK_S = 1.0

_mine: tuple[int, str | None] | None = None


def _boot() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            return file.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def this_process() -> str | None:
    """This process's name as a writer, or None where the system does not tell enough."""
    global _mine
    pid = os.getpid()
    if _mine is None or _mine[0] != pid:  # a forked child is a writer of its own
        boot, namespace = _boot(), _pid_namespace()
        name = None
        if boot and namespace:
            try:
                started = _started(pid)
            except OSError:
                started = None
            if started is not None:
                name = f"{boot}|{namespace}|{pid}|{started:.2f}"
                name = name if _NAME.fullmatch(name) else None
        _mine = (pid, name)
    return _mine[1]


def gone(writer: object) -> bool:
    """Whether the process named ``writer`` is known to have ended; False when unknown."""
    if not isinstance(writer, str) or len(writer) > 200:
        return False
    found = _NAME.fullmatch(writer)
    if found is None:
        return False
    boot, namespace, pid_text, started_text = found.groups()
    if boot != _boot() or namespace != _pid_namespace():
        return False  # another host or container: its processes cannot be seen from here
    try:
        started = _started(int(pid_text))
    except (FileNotFoundError, ProcessLookupError):
        return True
    except OSError:
        return False
    return abs(started - float(started_text)) > _STARTED_SLACK_S


def _started(pid: int) -> float:
    """Seconds from the boot to the start of process ``pid`` (field 22 of its stat file).

    Counted from the boot, not the epoch: the kernel works out the epoch time of a boot from
    today's clock, which moves when the clock is set or a paused machine resumes, so a live
    writer's start time read again an hour later could differ by seconds and look reused."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")
