"""The author model (``BATOS_AUTHOR_MODEL``): methods written on a stronger model, personas
answering on their own backend.

The author's servers are the scripted loopback ones of ``chat_servers`` (the real ``ollama``
and ``openai`` clients talk to them); the personas' usual backend is a scripted one,
registered in front of the others as an outside backend would be.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from chat_servers import FakeOllama, FakeOpenAI
from fakes import FakeModels, FakeRouter, ModelCall
from test_mind import MUFFINS, facet_source, mind, responder, run, steps_plan

from batos.errors import ConfigurationError, ModelError
from batos.models import author_model, chat_model, register_backend, unregister_backend
from batos.models.embedded import EmbeddedChatModel
from batos.shell.cli import main
from batos.shell.doctor import check_author
from batos.shell.runtime import open_image
from graph import jit
from prototypes.codex import load_codex
from prototypes.incarnation import personas
from prototypes.uvm import Method, UvmObject
from store.core.image import LivingImage

CODER = "qwen2.5-coder:7b"
SELECTOR = re.compile(r"Write the method `(\w+)`")
EXAMPLES = json.dumps(
    {
        "examples": [
            {"args": [2], "slots": {}, "returns": 5, "slots_after": {}},
            {"args": [0], "slots": {}, "returns": 1, "slots_after": {}},
        ]
    }
)


def authoring(body: dict[str, Any]) -> str:
    """What the author's server answers: examples when asked for JSON, else the method the
    prompt asks for (a facet, a program, or the JIT's ``double``)."""
    if body.get("format") or body.get("response_format"):
        return EXAMPLES
    system, task = body["messages"][0]["content"], body["messages"][-1]["content"]
    if "def solve(self)" in system:
        return "```python\ndef solve(self):\n    return 36 * 2.75 * 14\n```"
    asked = SELECTOR.search(task)
    if asked and asked.group(1) != "double":
        return "```python\n" + facet_source(asked.group(1)) + "```"
    return "Here:\n```python\ndef double(self, x):\n    return x * 2 + self.bias\n```"


@dataclass
class Author:
    """An author's server as a test sees it: its setting, and what each chat request asked."""

    server: FakeOllama | FakeOpenAI
    spec: str
    #: A chat request body → (model, the sampling options it carried, whether JSON was asked)
    read: Callable[[dict[str, Any]], tuple[str, dict[str, Any], bool]]
    chat_path: str

    def chats(self) -> list[dict[str, Any]]:
        return self.server.paths("POST", self.chat_path)


def _ollama_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    return body["model"], body.get("options") or {}, bool(body.get("format"))


def _openai_request(body: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
    options = {
        "temperature": body.get("temperature"),
        "seed": body.get("seed"),
        # langchain-openai sends max_tokens as the newer max_completion_tokens
        "num_predict": body.get("max_completion_tokens", body.get("max_tokens")),
        **{k: v for k, v in body.items() if k in ("top_k", "min_p", "repeat_penalty")},
    }
    return body["model"], options, "response_format" in body


@pytest.fixture(params=["ollama", "openai"])
def author(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Author]:
    """A scripted server serving the coder model, named by the author settings; the personas'
    own servers unset."""
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.delenv("BATOS_OPENAI_BASE_URL", raising=False)
    if request.param == "ollama":
        server: FakeOllama | FakeOpenAI = FakeOllama()
        server.models = {CODER}
        found = Author(server, f"ollama:{CODER}", _ollama_request, "/api/chat")
    else:
        server = FakeOpenAI()
        server.models = {CODER}
        monkeypatch.setenv("BATOS_AUTHOR_API_KEY", "sk-author")
        found = Author(server, f"openai:{CODER}", _openai_request, "/v1/chat/completions")
    server.answer = authoring
    server.thread.start()
    monkeypatch.setenv("BATOS_AUTHOR_MODEL", found.spec)
    monkeypatch.setenv("BATOS_AUTHOR_URL", server.url)
    yield found
    server.stop()


@pytest.fixture
def usual() -> Iterator[FakeModels]:
    """The personas' usual backend: scripted, tried before every other."""
    models = FakeModels(responder(plan=steps_plan()))
    register_backend(
        "usual",
        lambda persona, timeout, options: models(persona.name, **options),
        lambda: True,
        before="openai",
    )
    yield models
    unregister_backend("usual")


@pytest.fixture
def image(memory_image: LivingImage, monkeypatch: pytest.MonkeyPatch) -> LivingImage:
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "2")
    memory_image.transact(lambda root: root.__setitem__("o", UvmObject(name="calc", bias=1)))
    return memory_image


def test_a_mission_is_written_by_the_author_while_personas_answer_on_their_own_backend(
    image: LivingImage, author: Author, usual: FakeModels
) -> None:
    result = image.transact(lambda root: jit.JitRunner().send(root["o"], "double", (5,)))
    assert result == 11
    with image.read() as root:
        assert "x * 2 + self.bias" in root["o"]._methods["double"].source
    requests = [author.read(body) for body in author.chats()]
    # The examples, then two independent drafts: every one to the configured model.
    assert [model for model, _, _ in requests] == [CODER] * 3
    (_, examples, json_asked), (_, first, _), (_, second, _) = requests
    assert json_asked
    assert examples["temperature"] == jit.EXAMPLES_TEMPERATURE
    assert examples["num_predict"] == jit.EXAMPLES_MAX_TOKENS
    # The first draft at BRICK's own temperature (its Modelfile's), the second sampled hotter
    # with its own seed: the JIT's options reach the author's server as they reach a persona's.
    assert first["temperature"] == 0.2 and first["num_predict"] == jit.DRAFT_MAX_TOKENS
    assert second["temperature"] == jit.SAMPLE_TEMPERATURE and second["seed"] == 1_001
    assert second["repeat_penalty"] == jit.SAMPLE_REPEAT_PENALTY
    if isinstance(author.server, FakeOllama):  # the persona's context, not the server's default
        assert first["num_ctx"] == 4096
    # The persona's identity is in the author's prompt; its adapter is nowhere (a server model).
    system = author.chats()[1]["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith(load_codex().persona("BRICK").identity)
    assert not author.server.paths("POST", "/api/create")  # nothing provisioned on it
    # The personas' own calls never went to the author's server, and still go to theirs.
    assert usual.calls == []
    reply = chat_model("BRICK").invoke("hello")
    assert reply.content and len(usual.calls) == 1
    assert len(author.chats()) == 3


@pytest.mark.parametrize("author", ["openai"], indirect=True)
def test_the_openai_author_sends_its_own_key(author: Author) -> None:
    author_model("BRICK").invoke("hi")
    assert author.server.keys[-1] == "Bearer sk-author"


def test_the_mind_writes_facets_and_programs_on_the_author_and_answers_on_the_personas(
    author: Author, usual: FakeModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_MIND_WRITE_FACETS", "inline")
    living = open_image("memory://")
    try:
        services = mind(None, FakeRouter(("BRICK",)))  # type: ignore[arg-type]
        state = run(living, services, "plan the steps to build a garden shed")
        assert state["status"] == "COMPLETE", state.get("failure")
        drafted = [SELECTOR.search(b["messages"][-1]["content"]) for b in author.chats()]
        assert sorted(d.group(1) for d in drafted if d) == ["facet_design", "facet_steps"]
        assert usual.of("draft") == []
        assert usual.of("plan") and usual.of("answer")  # the personas planned and answered
        with living.read() as root:
            assert isinstance(personas(root)["BRICK"]._slots()["facet_steps"], Method)
        state = run(living, services, MUFFINS, thread="t2")
        assert state["status"] == "COMPLETE", state.get("failure")
        assert state["partials"][0]["text"] == "1386"  # the author's program, run
        assert usual.of("program") == []
    finally:
        living.close()


def test_unset_the_persona_model_writes_as_before(
    image: LivingImage, usual: FakeModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BATOS_AUTHOR_MODEL", raising=False)

    def respond(call: ModelCall) -> str:
        if "format" in call.options:
            return EXAMPLES
        return "```python\ndef double(self, x):\n    return x * 2 + self.bias\n```"

    usual.respond = respond
    assert image.transact(lambda root: jit.JitRunner().send(root["o"], "double", (5,))) == 11
    assert [c.persona for c in usual.calls] == ["BRICK"] * 3
    assert usual.calls[1].options["num_predict"] == jit.DRAFT_MAX_TOKENS


def test_an_embedded_author_runs_without_the_persona_adapter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BATOS_AUTHOR_MODEL", "embedded:test")
    model = author_model("ROBIN", temperature=0.3, seed=7)
    assert isinstance(model, EmbeddedChatModel)
    assert (model.base_model, model.use_adapters, model.temperature, model.seed) == (
        "test",
        False,
        0.3,
        7,
    )
    assert model.resolve()[2] == ()  # the persona's model has an adapter for 'test'
    assert EmbeddedChatModel(persona="ROBIN").resolve()[2]


def test_unset_the_persona_s_own_embedded_model_writes_without_its_adapter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BATOS_AUTHOR_MODEL", raising=False)
    monkeypatch.delenv("BATOS_AUTHOR_ADAPTERS", raising=False)
    monkeypatch.setenv("BATOS_MODEL", "test")
    model = author_model("BABS", temperature=0.4, backend="embedded")
    assert isinstance(model, EmbeddedChatModel)
    assert (model.persona, model.use_adapters, model.temperature) == ("BABS", False, 0.4)
    assert model.resolve()[2] == ()
    monkeypatch.setenv("BATOS_AUTHOR_ADAPTERS", "on")
    voiced = author_model("BABS", backend="embedded")
    assert isinstance(voiced, EmbeddedChatModel) and voiced.use_adapters
    assert voiced.resolve()[2]  # BABS's adapter for the test model


# -- bad configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "url", "error", "hint"),
    [
        ("vllm:coder", "", "'vllm' is not a backend", "ollama, openai"),
        ("qwen2.5-coder:7b", "", "not a backend", "ollama:qwen2.5-coder:7b"),
        ("codellama", "", "neither a shipped model", "BACKEND:MODEL"),
        ("embedded:/no/such.gguf", "", "neither a shipped model", "BACKEND:MODEL"),
        ("ollama:", "", "names no model", "BACKEND:MODEL"),
        ("ollama:coder", "", "no server to run on", "BATOS_AUTHOR_URL"),
        ("openai:coder", "", "no server to run on", "BATOS_OPENAI_BASE_URL"),
        ("openai:coder", "ftp://host/v1", "not an http(s) URL", "BATOS_AUTHOR_URL"),
    ],
)
def test_a_malformed_author_is_a_configuration_error_and_installs_nothing(
    image: LivingImage, monkeypatch: pytest.MonkeyPatch, spec: str, url: str, error: str, hint: str
) -> None:
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.delenv("BATOS_OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("BATOS_AUTHOR_MODEL", spec)
    monkeypatch.setenv("BATOS_AUTHOR_URL", url)
    with pytest.raises(ConfigurationError, match=re.escape(error)) as info:
        image.transact(lambda root: jit.JitRunner().send(root["o"], "double", (5,)))
    assert hint in (info.value.hint or "")
    with image.read() as root:
        assert "double" not in root["o"]._methods


def test_an_unreachable_author_is_a_model_error_and_installs_nothing(
    image: LivingImage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATOS_AUTHOR_MODEL", f"ollama:{CODER}")
    monkeypatch.setenv("BATOS_AUTHOR_URL", "http://127.0.0.1:9")
    with pytest.raises(ModelError, match="Ollama at http://127.0.0.1:9") as info:
        image.transact(lambda root: jit.JitRunner().send(root["o"], "double", (5,)))
    assert "BATOS_AUTHOR_URL" in (info.value.hint or "")
    assert "unset BATOS_AUTHOR_MODEL" in (info.value.hint or "")
    with image.read() as root:
        assert "double" not in root["o"]._methods


def test_a_model_the_author_server_lacks_says_so(author: Author, image: LivingImage) -> None:
    author.server.models = {"something-else"}
    with pytest.raises(ModelError) as info:
        image.transact(lambda root: jit.JitRunner().send(root["o"], "double", (5,)))
    assert CODER in str(info.value)
    hint = info.value.hint or ""
    assert "BATOS_AUTHOR_MODEL" in hint and "batos models build" not in hint
    with image.read() as root:
        assert "double" not in root["o"]._methods


def test_the_author_backend_is_its_setting_s(author: Author) -> None:
    with pytest.raises(ConfigurationError, match="runs where BATOS_AUTHOR_MODEL says"):
        author_model("BRICK", backend="embedded")
    with pytest.raises(ConfigurationError, match="does not take colour"):
        author_model("BRICK", colour="red")


# -- what the commands show ---------------------------------------------------------------------


def test_config_and_models_status_show_the_author(
    author: Author, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # rich's tables: no value cut short
    monkeypatch.setenv("BATOS_AUTHOR_API_KEY", "sk-author")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "BATOS_AUTHOR_MODEL" in out and author.spec in out and author.server.url in out
    assert "sk-author" not in out  # a key is never shown
    assert main(["models", "status"]) == 0
    assert f"author: {author.spec} at {author.server.url}" in capsys.readouterr().out


def test_doctor_reports_the_author(author: Author, monkeypatch: pytest.MonkeyPatch) -> None:
    [found] = check_author()
    assert found.status == "ok" and author.spec in found.detail
    author.server.models = {"something-else"}
    [found] = check_author()
    assert found.status == "warn" and "does not list" in found.detail
    monkeypatch.setenv("BATOS_AUTHOR_URL", "http://127.0.0.1:9")
    [found] = check_author()
    assert found.status == "fail" and "BATOS_AUTHOR_URL" in found.fix
    monkeypatch.delenv("BATOS_AUTHOR_MODEL")
    [found] = check_author()
    assert found.status == "ok" and "own model" in found.detail
