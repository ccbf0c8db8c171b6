"""A real HTTP service on loopback for the tool tests: one that answers JSON, one that is slow,
one that sends garbage, one that redirects (on and off the allow-list) and one that floods."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

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
        else:
            self._json(404, {"error": "no such route"})


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
