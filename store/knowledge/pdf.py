"""A PDF's text, read by pypdf in a forked child held to CPU seconds and memory.

A PDF is a program of drawing instructions, and a hostile one costs what its author wants:
pages that all draw one stream of no-op operators, a form drawn thousands of times, fonts
whose character maps are built again for every drawing — a file of kilobytes parsed for
hours, or decoded into gigabytes. Each way can be counted, and each count has a way around
it; a process of its own, with ``RLIMIT_CPU`` and ``RLIMIT_AS``, bounds them all. The child
sends back bytes only (a tag and UTF-8), which the host bounds and decodes; nothing it sends
is unpickled.

The extracted characters are still held to ``limit`` inside the child, counted as pypdf
produces them, so a file holding more text than the catalog takes fails at the page that
passes it, whatever the machine's speed.
"""

from __future__ import annotations

import errno
import faulthandler
import io
import os
import resource
import select
import signal
import time
from typing import Any

from batos import metrics, settings
from batos.errors import DocumentError

#: Seconds the host waits for a child past its CPU limit (a busy machine gives it less than
#: one core) before killing it.
_GRACE = 10.0
#: Bytes of the child's report besides the text (its tag).
_TAG = 1
#: Characters of an exception's text kept in a file's error (the rest is cut off).
_REASON_CHARS = 300
_PR_SET_PDEATHSIG = 1


class _TooMuchText(Exception):
    """The extracted text passed its bound (raised from inside pypdf's extraction)."""


def pdf_text(path: str, data: bytes, limit: int) -> str:
    """The text of a PDF's pages (at most ``limit`` characters), or a ``DocumentError``."""
    seconds = settings.get_float("catalog_pdf_seconds")
    memory_mb = settings.get_int("catalog_pdf_memory_mb")
    address_space = metrics.address_space()  # the child's, at the fork
    read_end, write_end = os.pipe()
    host = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read_end)
        _die_with(host)
        _child(write_end, data, limit, int(seconds) + 1, address_space + (memory_mb << 20))
    os.close(write_end)
    try:
        report, timed_out = _collect(read_end, limit, time.monotonic() + seconds + _GRACE)
    finally:
        os.close(read_end)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:  # still running: past its time, or Ctrl-C in the host
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    return _outcome(path, report, timed_out, status, limit, seconds, memory_mb)


def _die_with(host: int) -> None:  # pragma: no cover - runs in the forked child
    """Have the kernel kill this process when the host dies (a kill -9 of ``batos ingest``
    would otherwise leave it reading for up to its CPU limit)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != host:  # the host died before the request took effect
        os._exit(72)


def _collect(fd: int, limit: int, deadline: float) -> tuple[bytes, bool]:
    """What the child wrote until it closed its end, at most its largest report's length; and
    whether the deadline passed first."""
    most = _TAG + 4 * limit  # UTF-8 takes at most four bytes a character
    got = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(got), True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            piece = os.read(fd, 1 << 20)
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise
        if not piece:
            return bytes(got), False
        got += piece
        if len(got) > most:
            return b"", False  # more than any honest report: read as a crash


def _outcome(
    path: str,
    report: bytes,
    timed_out: bool,
    status: int,
    limit: int,
    seconds: float,
    memory_mb: int,
) -> str:
    slow = DocumentError(
        f"{path} took more than {seconds:g} s of CPU to read (its drawing is too costly to "
        "read for its text)",
        hint="print it to a new PDF, or extract its text another way; a PDF worth the time "
        "can have more: raise BATOS_CATALOG_PDF_SECONDS",
    )
    if timed_out or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGXCPU):
        raise slow
    tag, body = report[:_TAG], report[_TAG:]
    if tag == b"T" and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        try:
            text = body.decode("utf-8", "surrogatepass")  # pypdf can give lone surrogates
        except UnicodeDecodeError:
            raise DocumentError(f"{path} could not be read: its reader sent back no text") from None
        if len(text) > limit:
            raise DocumentError(f"{path} gave more text than it may hold")
        return text
    if tag == b"E" and body:
        kind, _, said = body.decode("utf-8", "replace").partition("\n")
        raise _error(path, kind, said[:400], limit)
    raise DocumentError(
        f"{path} could not be read: its reader stopped ({_how(status)}), most likely out of "
        f"its {memory_mb:,} MB of memory",
        hint="print it to a new PDF, or extract its text another way; a PDF worth it can "
        "have more: raise BATOS_CATALOG_PDF_MEMORY_MB",
    )


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            return f"signal {signal.Signals(number).name}"
        except ValueError:
            return f"signal {number}"
    return f"exit status {os.WEXITSTATUS(status)}"


def _error(path: str, kind: str, said: str, limit: int) -> DocumentError:
    if kind == "encrypted":
        return DocumentError(f"{path} is an encrypted PDF", hint="decrypt it (qpdf --decrypt)")
    if kind == "text":
        return DocumentError(
            f"{path} holds more than {limit:,} characters of text ({said}); a PDF's text is "
            "held to BATOS_CATALOG_MAX_BYTES characters",
            hint="split it into smaller PDFs (qpdf --split-pages), or raise "
            "BATOS_CATALOG_MAX_BYTES",
        )
    if kind == "memory":
        return DocumentError(
            f"{path} could not be read within the memory its reader may use ({said})",
            hint="print it to a new PDF, or extract its text another way; a PDF worth it can "
            "have more: raise BATOS_CATALOG_PDF_MEMORY_MB",
        )
    return DocumentError(
        f"{path} is not a readable PDF: {said}",
        hint="open and re-save it with a PDF tool, or extract its text another way",
    )


def _child(  # pragma: no cover - runs in the forked child
    fd: int, data: bytes, limit: int, cpu_seconds: int, address_space: int
) -> None:
    status = 70
    try:
        # Its failures are reported by the host: the host's stack, inherited from the fork,
        # is not printed, and Ctrl-C is the host's to handle.
        faulthandler.disable()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        try:
            report = b"T" + _extract(data, limit).encode("utf-8", "surrogatepass")
        except _Refused as exc:
            report = b"E" + f"{exc.kind}\n{exc.said}".encode("utf-8", "replace")
        except MemoryError:
            report = b"E" + b"memory\nits reader ran out of memory"
        except RecursionError:
            report = b"E" + b"unreadable\nRecursionError: its objects nest too deeply"
        except Exception as exc:  # whatever a malformed file provokes: this file's fault
            report = b"E" + f"unreadable\n{reason(exc)}".encode("utf-8", "replace")
        view = memoryview(report)
        while view:
            view = view[os.write(fd, view) :]
        status = 0
    except BaseException:
        status = 71
    finally:
        os._exit(status)


class _Refused(Exception):
    def __init__(self, kind: str, said: str) -> None:
        super().__init__(said)
        self.kind, self.said = kind, said


def _extract(data: bytes, limit: int) -> str:  # pragma: no cover - runs in the child
    import logging

    from pypdf import PdfReader

    # pypdf logs what it repairs ("EOF marker not found"); the file's own error says enough.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    extracted = 0
    pages: list[str] = []

    def count(text: str, *_: Any) -> None:
        nonlocal extracted
        extracted += len(text)
        if extracted > limit:
            raise _TooMuchText

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):
        raise _Refused("encrypted", "")
    for page in reader.pages:
        try:
            text = page.extract_text(visitor_text=count)
        except _TooMuchText:
            text = None
        # pypdf drops what a form's extraction raises and goes on with the page: the count
        # is checked again once the page is done.
        if text is None or extracted > limit:
            raise _Refused("text", f"stopped at page {len(pages) + 1:,} of {len(reader.pages):,}")
        pages.append(text)
    return "\n\n".join(page.strip() for page in pages if page.strip())


def reason(exc: BaseException) -> str:
    """``exc`` as one bounded line for a file's error."""
    said = " ".join(str(exc).split())
    if len(said) > _REASON_CHARS:
        said = said[: _REASON_CHARS - 1] + "…"
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__
