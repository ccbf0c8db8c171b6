"""Serving one FileStorage image to several processes through a real ZEO server.

A file:// image can be open in one process only. ``ZeoServer`` runs ZEO's own ``runzeo``
over the same file (blobs included) in a child process, so the LangGraph server, the heartbeat
and the CLI can all open ``zeo://HOST:PORT`` at once.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
</filestorage>
"""


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ImageError(f"ZEO address {address!r} is not HOST:PORT", hint="e.g. 127.0.0.1:8100")
    return host or "127.0.0.1", int(port)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
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

    @property
    def uri(self) -> str:
        return f"zeo://{self.host}:{self.port}"

    def command(self) -> list[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blobs = Path(str(self.path) + ".blobs")
        blobs.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile("w", suffix=".zeo.conf", delete=False)
        with handle:
            handle.write(
                _CONFIG.format(host=self.host, port=self.port, path=self.path, blobs=blobs)
            )
        self._config = Path(handle.name)
        return [sys.executable, "-m", "ZEO.runzeo", "-C", str(self._config)]

    def start(self) -> ZeoServer:
        if _answers(self.host, self.port):
            raise ImageError(
                f"something already listens on {self.host}:{self.port}",
                hint="pick another address with --address, or use the server already running",
            )
        self._prepare_image()
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not _answers(self.host, self.port):
            if self.process.poll() is not None:
                err = (
                    self.process.stderr.read().decode(errors="replace")
                    if self.process.stderr
                    else ""
                )
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
        log.info("ZEO serving %s at %s", self.path, self.uri)
        return self

    def _prepare_image(self) -> None:
        """Open the file once here: it is checked for damage, and a new one gets its root.

        Clients connecting to a brand-new image would otherwise all try to create the root
        object at once, and all but one fail with a conflict.
        """
        from store.image import LivingImage

        try:
            LivingImage.open(f"file://{self.path}").close()
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

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._config is not None:
            self._config.unlink(missing_ok=True)
            self._config = None

    def __enter__(self) -> ZeoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
