"""Starting a LangGraph server process for a test or a benchmark, and stopping it whatever
happens: the one place that knows how a server is launched, waited for and taken down."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


@contextmanager
def serving(
    command: Sequence[str],
    *,
    port: int,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    timeout: float,
) -> Iterator[str]:
    """Run ``command`` (a server on 127.0.0.1:``port``, its output in ``log_path``) in its own
    process group; yield its base URL once ``/ok`` answers; SIGTERM the group on the way out
    (SIGKILL after 30 s). A server that exits or does not answer within ``timeout`` seconds
    raises ``AssertionError`` with the end of its log."""
    with log_path.open("w") as log:
        server = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                raise AssertionError(f"the server exited:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/ok", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
