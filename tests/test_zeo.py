"""A real ZEO server: two client processes share one image and see each other's commits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from batos.errors import ImageError, ImageLockedError
from store.core.image import LivingImage
from store.core.zeo import ZeoServer, _answers, free_port

CLIENT = textwrap.dedent(
    """
    import sys, time
    from store.core.image import LivingImage
    uri, me, other = sys.argv[1], sys.argv[2], sys.argv[3]
    image = LivingImage.open(uri)
    image.transact(lambda root: root.__setitem__(me, "hello from " + me), note=me)
    deadline = time.time() + 30
    while time.time() < deadline:
        with image.read() as root:
            if other in root:
                print(root[other], flush=True)
                break
        time.sleep(0.05)
    else:
        print("timeout", flush=True)
    image.close()
    """
)


@pytest.mark.slow
def test_two_processes_share_one_image(tmp_path):
    with ZeoServer(tmp_path / "shared.fs") as server:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, server.uri, me, other],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for me, other in (("alpha", "beta"), ("beta", "alpha"))
        ]
        results = [p.communicate(timeout=60) for p in procs]
        errors = [err for _, err in results]
        outputs = [out.strip() for out, _ in results]
        assert outputs == ["hello from beta", "hello from alpha"], errors
        assert all(p.returncode == 0 for p in procs), errors
        with LivingImage.open(server.uri) as image:
            with image.read() as root:
                assert {"alpha", "beta"} <= set(root)
            assert {r.description for r in image.history(5)} >= {"alpha", "beta"}


INCREMENTER = textwrap.dedent(
    """
    import pathlib, sys, time
    from store.core.image import LivingImage

    def bump(root):
        root["counter"] += 1

    uri, count, ready, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], pathlib.Path(sys.argv[4])
    with LivingImage.open(uri) as image:
        pathlib.Path(ready).touch()
        while not go.exists():  # start together, so that every commit races the others
            time.sleep(0.001)
        for _ in range(count):
            image.transact(bump, note="bump")
    """
)

WRITERS = 4
INCREMENTS = 50


@pytest.mark.slow
def test_several_writers_on_one_hot_counter_all_get_through(tmp_path):
    """Every writer conflicts with the others on every commit; the retries must outlast it."""
    with ZeoServer(tmp_path / "hot.fs") as server:
        with LivingImage.open(server.uri) as image:
            image.transact(lambda root: root.__setitem__("counter", 0))
        go = tmp_path / "go"
        ready = [tmp_path / f"ready-{i}" for i in range(WRITERS)]
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", INCREMENTER, server.uri, str(INCREMENTS), str(r), str(go)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in ready
        ]
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready):
            assert all(w.poll() is None for w in writers) and time.monotonic() < deadline
            time.sleep(0.01)
        go.touch()
        errors = [w.communicate(timeout=300)[1] for w in writers]
        assert [w.returncode for w in writers] == [0] * WRITERS, errors
        with LivingImage.open(server.uri) as image, image.read() as root:
            assert root["counter"] == WRITERS * INCREMENTS


OPENER = textwrap.dedent(
    """
    import sys
    from store.core.image import LivingImage
    with LivingImage.open(sys.argv[1]) as image:
        image.transact(lambda root: root.__setitem__(sys.argv[2], 1))
    """
)


@pytest.mark.slow
def test_clients_racing_to_create_the_root_all_open(tmp_path):
    """A server that did not create the root first (plain runzeo): every client still opens."""
    server = ZeoServer(tmp_path / "raw.fs")
    server.spawn(stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _answers(server.host, server.port):
            assert server.process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        clients = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, server.uri, f"c{i}"],
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(6)
        ]
        errors = [c.communicate(timeout=60)[1] for c in clients]
        assert [c.returncode for c in clients] == [0] * 6, errors
        with LivingImage.open(server.uri) as image, image.read() as root:
            assert {f"c{i}" for i in range(6)} <= set(root)
    finally:
        server.stop()  # SIGTERM, then SIGKILL if it has not exited within 10 s


@pytest.mark.slow
def test_zeo_refuses_an_image_open_elsewhere(tmp_path):
    path = tmp_path / "busy.fs"
    holder = LivingImage.open(f"file://{path}")
    try:
        with pytest.raises(ImageLockedError):
            ZeoServer(path).start()
    finally:
        holder.close()


def test_unreachable_zeo_server_is_a_clear_error(monkeypatch):
    monkeypatch.setattr("store.core.image.ZEO_CONNECT_TIMEOUT", 1)
    with pytest.raises(ImageError, match="no ZEO server answers") as info:
        LivingImage.open(f"zeo://127.0.0.1:{free_port()}")
    assert "batos zeo start" in info.value.hint


@pytest.mark.parametrize(
    ("address", "said"),
    [("127.0.0.1:0", "a port is 1 to 65535"), ("h:70000", "a port is 1 to 65535"), ("h", "HOST")],
)
def test_an_address_no_server_could_be_reached_at_is_refused_at_once(address, said) -> None:
    from store.core.zeo import parse_address

    with pytest.raises(ImageError, match=said):
        parse_address(address)


def test_an_ipv6_address_in_brackets_is_probed_without_them() -> None:
    import socket

    try:
        server = socket.socket(socket.AF_INET6)
        server.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with server:
        server.listen()
        assert _answers("[::1]", server.getsockname()[1])


def test_a_pack_through_zeo_keeps_no_copy_of_the_file_before_it(tmp_path) -> None:
    from store.core.packing import pack

    with ZeoServer(tmp_path / "served.fs") as server, LivingImage.open(server.uri) as image:
        for n in range(3):
            image.transact(lambda root, n=n: root.__setitem__("k", "x" * 10_000 * (n + 1)))
        report = pack(image)
        assert report.after.bytes < report.before.bytes
    assert not (tmp_path / "served.fs.old").exists()
