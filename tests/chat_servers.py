"""Loopback servers that speak the documented HTTP APIs of Ollama and of OpenAI-compatible
servers, scripted and recording every request; the client side in tests is the real thing
(the ``ollama`` and ``openai`` packages, langchain-ollama, langchain-openai)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler that answers with JSON: what both scripted servers share."""

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeOllama:
    """Replays /api/version, /api/tags, /api/pull, /api/create, /api/blobs and a streaming
    NDJSON /api/chat (404 for a model it does not have), recording every request."""

    def __init__(self, version: str = "0.6.5") -> None:
        self.version = version
        self.models: set[str] = set()
        self.requests: list[tuple[str, str, Any]] = []
        self.reply = ["Hello", ", friend", "."]
        #: When set, the whole reply to a chat request body (``reply`` is then unused).
        self.answer: Callable[[dict], str] | None = None
        self.die_after: int | None = None
        self.lock = threading.Lock()
        fake = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> Any:
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size) if size else b""
                if self.path.startswith("/api/blobs/"):
                    return len(raw)
                return json.loads(raw) if raw else None

            def do_GET(self) -> None:
                with fake.lock:
                    fake.requests.append(("GET", self.path, None))
                if self.path == "/api/version":
                    self._send(200, {"version": fake.version})
                elif self.path == "/api/tags":
                    self._send(
                        200,
                        {
                            "models": [
                                {
                                    "name": m,
                                    "model": m,
                                    "modified_at": "2025-01-01T00:00:00Z",
                                    "size": 1,
                                    "digest": "0" * 64,
                                    "details": {"format": "gguf", "family": "qwen2"},
                                }
                                for m in sorted(fake.models)
                            ]
                        },
                    )
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = self._body()
                with fake.lock:
                    fake.requests.append(("POST", self.path, body))
                if self.path.startswith("/api/blobs/sha256:"):
                    self.send_response(201)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path in ("/api/pull", "/api/create"):
                    with fake.lock:
                        fake.models.add(_tag(body["model"]))
                    self._send(200, {"status": "success"})
                elif self.path == "/api/chat":
                    self._chat(body)
                else:
                    self._send(404, {"error": "not found"})

            def _chat(self, body: dict) -> None:
                if _tag(body["model"]) not in fake.models:
                    self._send(404, {"error": f"model '{body['model']}' not found"})
                    return
                pieces = [fake.answer(body)] if fake.answer is not None else fake.reply
                lines = [
                    {
                        "model": body["model"],
                        "created_at": "2025-01-01T00:00:00Z",
                        "message": {"role": "assistant", "content": piece},
                        "done": False,
                    }
                    for piece in pieces
                ]
                lines.append(
                    {
                        "model": body["model"],
                        "created_at": "2025-01-01T00:00:00Z",
                        "message": {"role": "assistant", "content": ""},
                        "done": True,
                        "done_reason": "stop",
                        "total_duration": 1000,
                        "load_duration": 10,
                        "prompt_eval_count": 12,
                        "prompt_eval_duration": 100,
                        "eval_count": len(pieces),
                        "eval_duration": 300,
                    }
                )
                data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fake.die_after is None:
                    self.wfile.write(data)
                    return
                partial = lines[: fake.die_after]
                self.wfile.write(b"".join(json.dumps(x).encode() + b"\n" for x in partial))
                self.wfile.flush()
                self.close_connection = True
                self.connection.close()  # the server dies mid-stream

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def paths(self, method: str, path: str) -> list[Any]:
        return [body for m, p, body in self.requests if m == method and p.startswith(path)]


def _tag(name: str) -> str:
    return name if ":" in name else f"{name}:latest"


class FakeOpenAI:
    """An OpenAI-compatible server: GET /v1/models lists ``models``; POST /v1/chat/completions
    answers ``answer(body)`` whole or as server-sent events (``"stream": true``), 404 for a
    model it does not serve. ``requests`` holds every (method, path, body)."""

    def __init__(self) -> None:
        self.models: set[str] = set()
        self.requests: list[tuple[str, str, Any]] = []
        #: The Authorization header of each chat request.
        self.keys: list[str] = []
        self.answer: Callable[[dict], str] = lambda body: "Hello, friend."
        #: A status and error document to answer a chat request with instead, or None.
        self.refuse: Callable[[dict], tuple[int, dict] | None] = lambda body: None
        self.lock = threading.Lock()
        fake = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with fake.lock:
                    fake.requests.append(("GET", self.path, None))
                if self.path == "/v1/models":
                    models = [{"id": m, "object": "model"} for m in sorted(fake.models)]
                    self._send(200, {"object": "list", "data": models})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(size) or b"null")
                with fake.lock:
                    fake.requests.append(("POST", self.path, body))
                    fake.keys.append(self.headers.get("Authorization", ""))
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": "not found"}})
                elif body["model"] not in fake.models:
                    message = f"The model `{body['model']}` does not exist."
                    self._send(404, {"error": {"message": message, "code": "model_not_found"}})
                elif (refused := fake.refuse(body)) is not None:
                    self._send(*refused)
                elif body.get("stream"):
                    self._stream(body["model"], fake.answer(body))
                else:
                    self._send(200, _completion(body["model"], fake.answer(body)))

            def _stream(self, model: str, text: str) -> None:
                chunks = [
                    {"role": "assistant", "content": text},
                    {},
                ]
                events = b"".join(
                    b"data: " + json.dumps(_chunk(model, delta, last=not delta)).encode() + b"\n\n"
                    for delta in chunks
                )
                events += b"data: [DONE]\n\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(events)))
                self.end_headers()
                self.wfile.write(events)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def paths(self, method: str, path: str) -> list[Any]:
        return [body for m, p, body in self.requests if m == method and p.startswith(path)]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


_USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": _USAGE,
    }


def _chunk(model: str, delta: dict[str, Any], *, last: bool) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": "stop" if last else None}],
        **({"usage": _USAGE} if last else {}),
    }
