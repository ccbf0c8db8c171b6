"""The Ollama path against a loopback server that speaks the documented Ollama HTTP API.

``FakeOllama`` (``chat_servers``) replays /api/version, /api/tags, /api/pull, /api/create,
/api/blobs and a streaming NDJSON /api/chat, and records every request. The client side is
the real thing: the ``ollama`` package and langchain-ollama's ``ChatOllama``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from chat_servers import FakeOllama

from batos.errors import ModelError
from batos.models import chat_model, select_backend
from batos.models import ollama as llm_ollama
from batos.models.ollama import provision

SHIPPED = Path(__file__).resolve().parent.parent / "modelfiles"
PERSONAS = ["batos-robin", "batos-brick", "batos-babs", "batos-alfred"]


@pytest.fixture
def ollama_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOllama]:
    fake = FakeOllama()
    fake.thread.start()
    monkeypatch.setenv("OLLAMA_HOST", fake.url)
    monkeypatch.delenv("BATOS_OPENAI_BASE_URL", raising=False)
    monkeypatch.setattr(llm_ollama, "_provisioned", set())
    yield fake
    fake.stop()


def test_provision_builds_what_is_missing_then_nothing(ollama_server: FakeOllama) -> None:
    report = provision(ollama_server.url, folder=SHIPPED)
    assert report.pulled == ["qwen2.5-coder:1.5b-instruct-q4_K_M"]
    assert sorted(report.created) == sorted(["batos-base", *PERSONAS])
    creates = {body["model"]: body for body in ollama_server.paths("POST", "/api/create")}
    assert creates["batos-base"]["from"] == "qwen2.5-coder:1.5b-instruct-q4_K_M"
    assert creates["batos-base"]["parameters"]["num_ctx"] == 4096
    assert creates["batos-brick"]["from"] == "batos-base"
    assert creates["batos-brick"]["system"].startswith("You are BRICK")
    assert creates["batos-brick"]["parameters"] == {"temperature": 0.2}
    assert len(ollama_server.paths("POST", "/api/create")) == 5

    again = provision(ollama_server.url, folder=SHIPPED)
    assert again.created == [] and again.pulled == []
    assert sorted(again.present) == sorted(["batos-base", *PERSONAS])
    assert len(ollama_server.paths("POST", "/api/create")) == 5


def test_provision_uploads_adapters_that_exist(ollama_server: FakeOllama, tmp_path: Path) -> None:
    for path in SHIPPED.glob("*.Modelfile"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "adapters" / "default").mkdir(parents=True)
    (tmp_path / "adapters" / "default" / "babs.gguf").write_bytes(b"GGUF-adapter-bytes")
    ollama_server.models = {"batos-base:latest", "qwen2.5-coder:1.5b-instruct-q4_K_M"}
    report = provision(ollama_server.url, folder=tmp_path)
    assert sorted(report.without_adapter) == ["batos-alfred", "batos-brick", "batos-robin"]
    creates = {body["model"]: body for body in ollama_server.paths("POST", "/api/create")}
    digest = creates["batos-babs"]["adapters"]["babs.gguf"]
    assert digest.startswith("sha256:") and ollama_server.paths("POST", f"/api/blobs/{digest}")
    assert "adapters" not in creates["batos-robin"] or not creates["batos-robin"]["adapters"]
    assert "batos-base" not in creates


def test_chat_model_uses_ollama_when_it_answers(ollama_server: FakeOllama) -> None:
    assert select_backend() == "ollama"
    robin = chat_model("robin", temperature=0.1, timeout=5)
    reply = robin.invoke("I feel lost")
    assert reply.content == "Hello, friend."
    assert reply.usage_metadata["input_tokens"] == 12
    assert reply.usage_metadata["output_tokens"] == 3
    chat = ollama_server.paths("POST", "/api/chat")[-1]
    assert chat["model"] == "batos-robin"
    assert chat["options"]["temperature"] == 0.1
    assert chat["messages"] == [{"role": "user", "content": "I feel lost"}]
    assert ollama_server.paths("POST", "/api/create")  # provisioned on first use


def test_streaming_through_ollama(ollama_server: FakeOllama) -> None:
    pieces = [chunk.content for chunk in chat_model("BRICK").stream("plan it")]
    assert "".join(pieces) == "Hello, friend."
    assert len([p for p in pieces if p]) == 3


async def test_async_streaming_through_ollama(ollama_server: FakeOllama) -> None:
    pieces = [chunk.content async for chunk in chat_model("BABS").astream("look it up")]
    assert "".join(pieces) == "Hello, friend."


def test_ollama_dying_mid_stream_is_a_clear_error(ollama_server: FakeOllama) -> None:
    model = chat_model("ALFRED", timeout=5)
    ollama_server.die_after = 1
    received = []
    with pytest.raises(ModelError, match="lost the connection to Ollama") as info:
        for chunk in model.stream("audit"):
            received.append(chunk.content)
    assert received == ["Hello"]
    assert "ollama serve" in (info.value.hint or "")
    ollama_server.die_after = None
    assert model.invoke("audit").content == "Hello, friend."


def test_a_model_deleted_behind_our_back_says_how_to_rebuild(ollama_server: FakeOllama) -> None:
    model = chat_model("ROBIN")
    ollama_server.models.discard("batos-robin:latest")
    with pytest.raises(ModelError, match="no model 'batos-robin'") as info:
        model.invoke("hello")
    assert "batos models build" in (info.value.hint or "")


def test_unreachable_ollama_falls_back_to_the_embedded_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from batos.models.embedded import EmbeddedChatModel

    monkeypatch.setenv("OLLAMA_HOST", "http://127.0.0.1:9")
    monkeypatch.delenv("BATOS_OPENAI_BASE_URL", raising=False)
    assert select_backend() == "embedded"
    assert isinstance(chat_model("ROBIN"), EmbeddedChatModel)
    with pytest.raises(ModelError, match="no Ollama server answers"):
        provision("http://127.0.0.1:9", folder=SHIPPED)


def test_too_old_ollama_is_refused(ollama_server: FakeOllama) -> None:
    ollama_server.version = "0.3.14"
    with pytest.raises(ModelError, match="too old"):
        provision(ollama_server.url, folder=SHIPPED)
    assert not ollama_server.paths("POST", "/api/create")
