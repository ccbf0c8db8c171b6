"""Stopping model calls in progress (``batos.models.cancel``): the persona seam, the HTTP backends
against loopback servers that stream slowly, and the embedded engine on the test model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fakes import PacedPersonaModel

from batos.errors import GenerationCancelled
from batos.models import chat_model
from batos.models.cancel import cancellable
from batos.models.engine import FairLock, Sampling, engine
from batos.models.ollama import OllamaPersonaChat
from store.core.model_files import model_path

#: Seconds between the pieces the slow servers and models stream, and how many they send:
#: about a minute in all, unless the client stops reading.
PACE, PIECES = 0.02, 3000


class SlowChatServer:
    """Streams a chat reply a piece every PACE seconds, as Ollama does (/api/chat, NDJSON) and as
    an OpenAI-compatible server does (/v1/chat/completions, server-sent events). ``gone`` is
    set when the client stops reading: a write fails."""

    def __init__(self) -> None:
        self.gone = threading.Event()
        self.sent = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection closes

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ollama = self.path == "/api/chat"
                self.send_response(200)
                kind = "application/x-ndjson" if ollama else "text/event-stream"
                self.send_header("Content-Type", kind)
                self.end_headers()
                try:
                    for i in range(PIECES):
                        self.wfile.write(_ollama_line(i) if ollama else _openai_event(i))
                        self.wfile.flush()
                        server.sent += 1
                        time.sleep(PACE)
                except (BrokenPipeError, ConnectionResetError):
                    server.gone.set()

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


def _ollama_line(i: int) -> bytes:
    message = {"role": "assistant", "content": f"word{i} "}
    line = {"model": "m", "created_at": "2025-01-01T00:00:00Z", "message": message, "done": False}
    return json.dumps(line).encode() + b"\n"


def _openai_event(i: int) -> bytes:
    delta = {"role": "assistant", "content": f"word{i} "}
    chunk = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


@pytest.fixture
def slow_server() -> Iterator[SlowChatServer]:
    server = SlowChatServer()
    yield server
    server.http.shutdown()
    server.http.server_close()


def stream_until_stopped(model: Any, after: int = 3) -> list[str]:
    """Stream ``model``, setting the cancel event once ``after`` pieces arrived; the pieces
    (``GenerationCancelled`` must end the stream)."""
    pieces: list[str] = []
    with cancellable() as stop, pytest.raises(GenerationCancelled):
        for chunk in model.stream("go on"):
            if chunk.content:
                pieces.append(str(chunk.content))
            if len(pieces) == after:
                stop.set()
    return pieces


def test_the_persona_seam_stops_a_stream_at_its_next_piece() -> None:
    model = PacedPersonaModel(reply=lambda messages: "one two three four five six", pace=0.0)
    assert stream_until_stopped(model) == ["one", " two", " three"]
    with cancellable() as stop:  # already stopped: the call does not begin
        stop.set()
        with pytest.raises(GenerationCancelled):
            model.invoke("go on")
    assert model.invoke("go on").content == "one two three four five six"  # outside: as ever


def test_the_seam_stops_a_call_another_thread_cancels() -> None:
    model = PacedPersonaModel(reply=lambda messages: " ".join(["word"] * PIECES), pace=PACE)
    with cancellable() as stop:
        threading.Timer(0.2, stop.set).start()
        started = time.monotonic()
        with pytest.raises(GenerationCancelled):
            list(model.stream("go on"))
    assert time.monotonic() - started < 5  # the reply alone takes a minute


def test_ollama_stops_reading_its_stream(slow_server: SlowChatServer) -> None:
    model = OllamaPersonaChat(model="batos-robin", base_url=slow_server.url)
    assert stream_until_stopped(model) == ["word0 ", "word1 ", "word2 "]
    assert slow_server.gone.wait(10), "the server kept streaming to a client that had stopped"
    assert slow_server.sent < PIECES


def test_an_openai_compatible_server_stops_being_read(
    slow_server: SlowChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.setenv("BATOS_OPENAI_BASE_URL", f"{slow_server.url}/v1")
    assert stream_until_stopped(chat_model("ROBIN")) == ["word0 ", "word1 ", "word2 "]
    assert slow_server.gone.wait(10), "the server kept streaming to a client that had stopped"
    assert slow_server.sent < PIECES


def test_a_waiter_for_the_fair_lock_gives_up_its_place_when_cancelled() -> None:
    lock = FairLock()
    assert lock.acquire()
    stop = threading.Event()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(lock.acquire(timeout=60, cancel=stop)))
    waiter.start()
    stop.set()
    waiter.join(timeout=5)
    assert got == [False] and not waiter.is_alive()
    lock.release()
    assert lock.acquire(timeout=1) is True  # the abandoned ticket does not block the next one
    assert lock.waiting == 1


@pytest.mark.model
def test_a_cancelled_generation_stops_at_the_next_token_and_frees_the_engine() -> None:
    eng = engine(model_path("test"))
    count = [{"role": "user", "content": "Count from 1 to 500, one number a line."}]
    stop = threading.Event()
    pieces = []
    with pytest.raises(GenerationCancelled):
        for piece in eng.generate(
            count, sampling=Sampling(temperature=0, num_predict=0), cancel=stop
        ):
            pieces.append(piece)
            if len(pieces) == 3:
                stop.set()
    assert len(pieces) == 3
    # the engine is free, and its cache holds nothing of the stopped generation
    again = list(eng.generate(count, sampling=Sampling(temperature=0, num_predict=3)))
    assert again[:-1] and again[-1].completion_tokens == 3


@pytest.mark.model
def test_a_caller_queued_for_the_engine_stops_waiting_when_cancelled() -> None:
    eng = engine(model_path("test"))
    stop = threading.Event()
    raised: list[BaseException] = []

    def call() -> None:
        try:
            list(eng.generate([{"role": "user", "content": "hi"}], cancel=stop, timeout=60))
        except BaseException as exc:
            raised.append(exc)

    assert eng.lock.acquire()  # another generation holds the engine
    try:
        caller = threading.Thread(target=call)
        caller.start()
        stop.set()
        caller.join(timeout=5)
        assert not caller.is_alive() and isinstance(raised[0], GenerationCancelled)
    finally:
        eng.lock.release()


@pytest.mark.model
def test_the_embedded_model_hands_the_callers_event_to_the_engine() -> None:
    # LlamaCppChat is the engine without the persona seam: only the engine can stop it
    from batos.models.embedded import LlamaCppChat

    model = LlamaCppChat(persona="ROBIN", temperature=0, num_predict=0)
    assert len(stream_until_stopped(model)) == 3
