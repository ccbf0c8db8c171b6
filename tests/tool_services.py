"""A real HTTP service on loopback for the tool tests: one that answers JSON, one that is slow,
one that sends garbage, one that redirects (on and off the allow-list) and one that floods;
and hostile ones (``_HOSTILE``): answers that never come, compression bombs, echoes of the
secrets sent, charsets that are no text encoding, NaN."""

from __future__ import annotations

import functools
import gzip
import json
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

#: The key the weather route wants in its X-Api-Key header.
WEATHER_KEY = "s3cret-weather-key"
#: How long /slow waits before it answers, in seconds.
SLOW_SECONDS = 2.0


class _Handler(BaseHTTPRequestHandler):
    # Every request the server saw: (method, path, headers), for tests that check what was sent.
    seen: list[tuple[str, str, dict[str, str]]]

    def log_message(self, format: str, *args: object) -> None:
        pass  # the tests read what they need from ``seen``

    def _json(self, status: int, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        type(self).seen.append((method, self.path, dict(self.headers.items())))
        port = self.server.server_address[1]
        if parts.path == "/weather":
            if self.headers.get("X-Api-Key") != WEATHER_KEY:
                self._json(401, {"error": "bad key"})
                return
            city = query.get("city", "")
            self._json(200, {"city": city, "temp_c": len(city) + 2, "sky": "clear"})
        elif parts.path == "/echo":
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            self._json(200, {"method": method, "query": query, "body": body})
        elif parts.path == "/slow":
            time.sleep(SLOW_SECONDS)
            self._json(200, {"late": True})
        elif parts.path == "/garbage":
            body = b"<html><body>\x00\xff not json at all"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif parts.path == "/flood":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()  # no length: the client must stop reading by itself
            chunk = b"[" + b"0," * 50_000
            for _ in range(40):
                self.wfile.write(chunk)
        elif parts.path == "/moved":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{port}/weather?city=Moved")
            self.end_headers()
        elif parts.path == "/away":
            # localhost is the same machine, but not a host the allow-list names.
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{port}/weather?city=Away")
            self.end_headers()
        elif parts.path in _HOSTILE:
            try:
                _HOSTILE[parts.path](self, query, port)
            except OSError:
                pass  # the client hung up, as it should
        else:
            self._json(404, {"error": "no such route"})

    def _raw(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()


#: How long a hostile service goes on before it gives up by itself, in seconds.
HOSTILE_SECONDS = 20.0
#: What the bomb routes decompress to: far over any limit the tests set.
BOMB_BYTES = 64 * 1024 * 1024


def _processing_for_ever(handler: _Handler, query: dict[str, str], port: int) -> None:
    """``102 Processing`` every 0.1 s and never an answer: each read gets data in time."""
    end = time.monotonic() + HOSTILE_SECONDS
    while time.monotonic() < end:
        handler._raw(b"HTTP/1.1 102 Processing\r\n\r\n")
        time.sleep(0.1)


def _dribbled_headers(handler: _Handler, query: dict[str, str], port: int) -> None:
    """A status line, then one header line every 0.1 s, never the end of the headers."""
    handler._raw(b"HTTP/1.1 200 OK\r\n")
    end = time.monotonic() + HOSTILE_SECONDS
    while time.monotonic() < end:
        handler._raw(b"X-Wait: 1\r\n")
        time.sleep(0.1)


def _bomb(handler: _Handler, query: dict[str, str], port: int) -> None:
    """BOMB_BYTES of zeros, compressed as ``enc`` says (``gzip``, ``deflate``, ``gzip,
    gzip``), or a few bytes said to be in an encoding httpx would decode unbounded."""
    encoding = query.get("enc", "gzip")
    body = _compressed(encoding)
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Encoding", encoding)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler._raw(body)


@functools.cache
def _compressed(encoding: str) -> bytes:
    if encoding == "gzip":
        return _zeros_packed(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return _zeros_packed(zlib.MAX_WBITS)
    if encoding == "gzip, gzip":
        return gzip.compress(_zeros_packed(16 + zlib.MAX_WBITS), compresslevel=9)
    return b"\x28\xb5\x2f\xfd" + bytes(60)  # zstd's magic: never decoded


def _zeros_packed(wbits: int) -> bytes:
    """BOMB_BYTES of zeros compressed a MiB at a time (the tests measure the client's memory
    in this process: the service must not hold the 64 MiB itself)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    mib = bytes(1 << 20)
    parts = [packer.compress(mib) for _ in range(BOMB_BYTES >> 20)]
    return b"".join([*parts, packer.flush()])


def _gzip_json(handler: _Handler, query: dict[str, str], port: int) -> None:
    """A small JSON answer compressed though nobody asked for it: decoded, within the limit.
    ``form``: ``gzip`` (default), ``deflate`` (zlib-wrapped) or ``raw`` (raw deflate, sent as
    "deflate" by some servers); ``split``: its first byte sent alone."""
    data = json.dumps({"packed": True}).encode()
    form = query.get("form", "gzip")
    if form == "gzip":
        body = gzip.compress(data)
    elif form == "deflate":
        body = zlib.compress(data)
    else:
        packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        body = packer.compress(data) + packer.flush()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Encoding", "gzip" if form == "gzip" else "deflate")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if query.get("split"):  # its first byte alone, the rest a moment later
        handler._raw(body[:1])
        time.sleep(0.3)
        body = body[1:]
    handler._raw(body)


def _text(handler: _Handler, status: int, body: str, content_type: str) -> None:
    data = body.encode()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler._raw(data)


def _echo_text(handler: _Handler, query: dict[str, str], port: int) -> None:
    """The key it was sent, after ``pad``, in a body that is not JSON (status ``status``)."""
    key = handler.headers.get("X-Api-Key") or query.get("k", "")
    status = int(query.get("status", "200"))
    _text(handler, status, query.get("pad", "") + "key=" + key + " is fine", "text/plain")


def _key_in_a_number_and_a_header_name(handler: _Handler, query: dict[str, str], port: int) -> None:
    """The key it was sent, inside a JSON number, as a number of its own and as a response
    header's name."""
    key = handler.headers.get("X-Api-Key") or ""
    body = ('{"n": 9' + key + '6, "echo": [' + key + "]}").encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header(f"X-Seen-{key}", "1")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler._raw(body)


def _odd_charset(handler: _Handler, query: dict[str, str], port: int) -> None:
    """JSON said to be in a charset that is no text encoding."""
    _text(handler, 200, '{"a": 1}', f"application/json; charset={query.get('cs', 'rot13')}")


def _not_a_number(handler: _Handler, query: dict[str, str], port: int) -> None:
    _text(handler, 200, '{"x": NaN, "y": Infinity}', "application/json")


def _overflowing(handler: _Handler, query: dict[str, str], port: int) -> None:
    """A number no float holds: Python's reader would make it infinity."""
    _text(handler, 200, '{"x": 1e400}', "application/json")


def _away_with_query(handler: _Handler, query: dict[str, str], port: int) -> None:
    """A redirect off the allow-list that carries the query it was sent along."""
    handler.send_response(302)
    handler.send_header("Location", f"http://localhost:{port}/echo?{urlencode(query)}")
    handler.end_headers()


_HOSTILE = {
    "/processing": _processing_for_ever,
    "/dribble": _dribbled_headers,
    "/bomb": _bomb,
    "/gzipped": _gzip_json,
    "/echotext": _echo_text,
    "/charset": _odd_charset,
    "/keyed": _key_in_a_number_and_a_header_name,
    "/nan": _not_a_number,
    "/overflow": _overflowing,
    "/away-with-query": _away_with_query,
}


@contextmanager
def service() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """A service on 127.0.0.1 (a free port): its base URL and the list of requests it saw."""
    handler = type("Handler", (_Handler,), {"seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    finally:
        server.shutdown()
        server.server_close()
