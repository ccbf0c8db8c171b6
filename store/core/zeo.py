"""Serving one FileStorage image to several processes through a real ZEO server.

A file:// image can be open in one process only. ``ZeoServer`` runs ZEO's own ``runzeo``
over the same file (blobs included) in a child process, so the LangGraph server, the heartbeat
and the CLI can all open ``zeo://HOST:PORT`` at once. The child never outlives the process
that started it, however that process ends (SIGKILL included).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from batos.errors import ImageError, ImageLockedError

log = logging.getLogger("batos.zeo")

#: Seconds to wait for a freshly started server to accept connections.
START_TIMEOUT = 30.0

_CONFIG = """\
<zeo>
  address {host}:{port}
</zeo>
<filestorage>
  path {path}
  blob-dir {blobs}
  pack-keep-old false
</filestorage>
"""


#: What the server process runs: ZEO's ``runzeo``, stopped when the process that started it
#: ends, however it ends (SIGKILL included). It holds the read end of a pipe whose only write
#: end is in that process: when the process is gone the kernel closes it, the read returns end
#: of file, and the server sends itself SIGTERM, on which runzeo closes the storage, releasing
#: the image's lock and the port. (A pipe, not PR_SET_PDEATHSIG, which fires when the *thread*
#: that started the child exits, and exists on Linux only.) The server unpickles stored states
#: only to resolve conflicts: ``guard_zodb`` holds those to the image's allow-list there too.
_SUPERVISED_RUNZEO = """\
import os, signal, sys, threading, runpy
from store.core.image_globals import guard_zodb
guard_zodb()
lifeline = int(sys.argv.pop(1))
def watch():
    while os.read(lifeline, 1):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=watch, name="lifeline", daemon=True).start()
sys.argv[0] = "runzeo"
runpy.run_module("ZEO.runzeo", run_name="__main__", alter_sys=True)
"""


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ImageError(f"ZEO address {address!r} is not HOST:PORT", hint="e.g. 127.0.0.1:8100")
    if not 0 < int(port) < 65536:  # 0 would bind a port nobody is told of
        raise ImageError(
            f"ZEO address {address!r} has port {int(port)}; a port is 1 to 65535",
            hint="e.g. 127.0.0.1:8100, or leave --address out for a free port",
        )
    return host or "127.0.0.1", int(port)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _answers(host: str, port: int) -> bool:
    try:
        # an IPv6 host is written in brackets in an address ([::1]:8100), not to a socket
        with socket.create_connection((host.strip("[]"), port), timeout=0.5):
            return True
    except OSError:
        return False


class ZeoServer:
    """A ZEO server process serving ``path`` on ``address``; a context manager."""

    def __init__(self, path: Path, address: str | None = None) -> None:
        self.path = Path(path).resolve()
        host, port = parse_address(address) if address else ("127.0.0.1", free_port())
        self.host, self.port = host, port
        self.process: subprocess.Popen[bytes] | None = None
        self._config: Path | None = None
        # The server's log goes to an unnamed file, not a pipe: a pipe nobody reads fills up
        # after some thousands of log lines and then blocks the server.
        self._log: IO[bytes] | None = None
        # The write end of the server's lifeline (see _SUPERVISED_RUNZEO); open while it serves.
        self._lifeline: int | None = None

    @property
    def uri(self) -> str:
        return f"zeo://{self.host}:{self.port}"

    def command(self, lifeline: int) -> list[str]:
        """runzeo's command line, stopping when file descriptor ``lifeline`` reads end of file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blobs = Path(str(self.path) + ".blobs")
        blobs.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile("w", suffix=".zeo.conf", delete=False)
        with handle:
            handle.write(
                _CONFIG.format(host=self.host, port=self.port, path=self.path, blobs=blobs)
            )
        self._config = Path(handle.name)
        return [sys.executable, "-c", _SUPERVISED_RUNZEO, str(lifeline), "-C", str(self._config)]

    def spawn(self, stderr: int | IO[bytes] | None = None) -> subprocess.Popen[bytes]:
        """Start runzeo on its lifeline (this process), without waiting for it to answer."""
        lifeline, self._lifeline = os.pipe()  # both ends close on exec: only `lifeline` passes
        try:
            self.process = subprocess.Popen(
                self.command(lifeline),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(lifeline,),
            )
        finally:
            os.close(lifeline)
        return self.process

    def start(self) -> ZeoServer:
        if _answers(self.host, self.port):
            raise ImageError(
                f"something already listens on {self.host}:{self.port}",
                hint="pick another address with --address, or use the server already running",
            )
        self._prepare_image()
        self._log = tempfile.TemporaryFile()
        process = self.spawn(stderr=self._log)
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(self.host, self.port):
            if process.poll() is not None:
                err = self.output()
                self._cleanup()
                if "LockError" in err:
                    raise ImageLockedError(
                        f"{self.path} is open in another process; ZEO cannot serve it",
                        hint="close that process first (only the ZEO server may open the file)",
                    )
                raise ImageError(f"the ZEO server exited at start:\n{err[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise ImageError(f"the ZEO server did not answer within {START_TIMEOUT:.0f} s")
            time.sleep(0.05)
        # The server read its configuration before it answered: nothing is left behind, even
        # if this process is killed outright.
        self._remove_config()
        log.info("ZEO serving %s at %s", self.path, self.uri)
        return self

    def output(self, limit: int = 4000) -> str:
        """The end of what the server has logged so far."""
        if self._log is None:
            return ""
        self._log.seek(0, os.SEEK_END)
        self._log.seek(max(0, self._log.tell() - limit))
        return self._log.read().decode(errors="replace")

    def _prepare_image(self) -> None:
        """Open the file once here: it is checked for damage, and a new one gets its root.

        Clients connecting to a brand-new image would otherwise all try to create the root
        object at once, and all but one fail with a conflict.
        """
        from store.core.image import LivingImage

        try:
            LivingImage.open(self.path.absolute().as_uri()).close()
        except ImageLockedError:
            raise ImageLockedError(
                f"{self.path} is open in another process; ZEO cannot serve it",
                hint="close that process first (only the ZEO server may open the file)",
            ) from None

    def wait(self) -> int:
        assert self.process is not None
        try:
            return self.process.wait()
        finally:
            self._cleanup()

    def serve(self, on_ready: Callable[[], object] | None = None) -> None:
        """Start the server, call ``on_ready``, wait until the server exits or this process is
        told to stop; then stop it.

        SIGTERM and SIGHUP (a service manager, a closed terminal) stop it as Ctrl-C does, from
        before the server starts, so it never outlives this process holding the image's lock
        and the port; only SIGKILL cannot be caught. Call it from the main thread, where
        signals are handled. A server that fails by itself raises ``ImageError`` with its log.
        """
        stopped: list[int] = []

        def stop(signum: int, frame: object) -> None:
            # Raising here could be lost: a handler runs between any two bytecodes, and an
            # exception raised while a weakref callback or a __del__ runs is printed and
            # ignored (the server then outlived its stop). The stop is recorded and the
            # server told to end, which ends the wait below.
            stopped.append(signum)
            process = self.process
            if process is not None and process.poll() is None:
                process.terminate()

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            try:
                self.start()
            except ImageError:
                if not stopped:  # a server stopped while it started exits "at start"
                    raise
            if not stopped and on_ready is not None:
                on_ready()
            if not stopped:
                assert self.process is not None
                status = None
                while status is None and not stopped:
                    # Woken each second to see a stop: a SIGTERM that reaches runzeo in its
                    # first moments can be lost there, and the server would serve on; the
                    # stop below then terminates it again, and kills it if need be.
                    try:
                        status = self.process.wait(timeout=1.0)
                    except subprocess.TimeoutExpired:
                        continue
                if stopped and status is None:
                    try:  # its own shutdown first, before stop() signals it again
                        self.process.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        pass
                if status and not stopped:
                    raise ImageError(
                        f"the ZEO server stopped by itself with status {status}:\n{self.output()}"
                    )
            if stopped:
                log.info("stopping the ZEO server at %s (signal %d)", self.uri, stopped[0])
        except KeyboardInterrupt:
            log.info("stopping the ZEO server at %s", self.uri)
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._cleanup()

    def _remove_config(self) -> None:
        if self._config is not None:
            self._config.unlink(missing_ok=True)
            self._config = None

    def _cleanup(self) -> None:
        self._remove_config()
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ZeoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
