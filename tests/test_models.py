"""The chat-model factory, backend selection, and the embedded backend on the test model."""

from __future__ import annotations

import threading

import pytest
from fakes import ScriptedChatModel
from langchain_core.messages import HumanMessage, SystemMessage

from batos.errors import ConfigurationError, ModelError
from batos.models import (
    backends,
    chat_model,
    register_backend,
    select_backend,
    unregister_backend,
)
from batos.models.base import ExceptionTable, PersonaChatModel, with_system
from batos.models.embedded import EmbeddedChatModel, adapter_paths, message_dicts
from batos.models.engine import FairLock, Sampling, engine
from batos.models.modelfile import adapter_path
from prototypes.codex import load_codex
from store.core.model_files import model_path


@pytest.fixture(autouse=True)
def no_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.delenv("BATOS_OPENAI_BASE_URL", raising=False)


def test_embedded_is_the_fallback() -> None:
    assert select_backend() == "embedded"
    model = chat_model("robin")
    assert isinstance(model, EmbeddedChatModel) and model.persona == "ROBIN"


def test_an_openai_endpoint_comes_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATOS_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OLLAMA_HOST", "http://127.0.0.1:9")
    assert select_backend() == "openai"
    model = chat_model("BRICK", temperature=0.0)
    assert model.model_name == "batos-brick"
    assert model.persona_system == load_codex().persona("BRICK").identity
    assert model.temperature == 0.0


def test_a_dead_openai_endpoint_is_a_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATOS_OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    model = chat_model("BABS", timeout=2)
    model.max_retries = 0
    with pytest.raises(ModelError, match="OpenAI-compatible endpoint"):
        model.invoke("hello")


class _Flaky(RuntimeError):
    """What an outside backend's client raises."""


class ScriptedPersonaChat(PersonaChatModel, ScriptedChatModel):
    """An outside backend: a scripted model behind the persona seam."""

    def exception_table(self) -> ExceptionTable:
        return {
            RuntimeError: lambda exc: ModelError(f"scripted backend failed: {exc}"),
            _Flaky: lambda exc: ModelError(f"scripted backend is flaky: {exc}", hint="retry"),
        }


def test_an_outside_backend_registers_like_the_built_in_ones() -> None:
    built: list[tuple[str, float, dict]] = []

    def factory(persona, timeout, options):
        built.append((persona.name, timeout, options))
        return ScriptedPersonaChat(persona_system=persona.identity).enqueue(
            "one", _Flaky("socket closed"), "two", ValueError("not in the table")
        )

    register_backend("scripted", factory, lambda: True, before="embedded")
    try:
        assert [b.name for b in backends()] == ["openai", "ollama", "scripted", "embedded"]
        assert select_backend() == "scripted"
        model = chat_model("robin", temperature=0.2, timeout=3)
        assert built == [("ROBIN", 3.0, {"temperature": 0.2})]
        # The persona's SYSTEM goes first, unless the call brings its own.
        assert model.invoke("hi").content == "one"
        system = model.history[-1][0]
        assert isinstance(system, SystemMessage)
        assert system.content == load_codex().persona("ROBIN").identity
        # The most specific entry of the table wins; the original is the cause.
        with pytest.raises(ModelError, match="flaky: socket closed") as info:
            model.invoke([SystemMessage("Be brief."), HumanMessage("hi")])
        assert isinstance(info.value.__cause__, _Flaky) and info.value.hint == "retry"
        assert [m.content for m in model.history[-1]] == ["Be brief.", "hi"]
        # A backend without streaming streams its whole reply as one chunk.
        assert [c.content for c in model.stream("again")] == ["two"]
        with pytest.raises(ValueError, match="not in the table"):
            model.invoke("hi")
    finally:
        unregister_backend("scripted")
    assert select_backend() == "embedded"
    with pytest.raises(ConfigurationError, match="unknown backend 'scripted'"):
        chat_model("ROBIN", backend="scripted")


def test_bad_options_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="unknown backend"):
        chat_model("ROBIN", backend="gpt")
    with pytest.raises(ConfigurationError, match="does not take colour"):
        chat_model("ROBIN", colour="red")
    with pytest.raises(ConfigurationError, match="unknown persona"):
        chat_model("JOKER")


def test_a_system_message_replaces_the_modelfile_system() -> None:
    assert message_dicts([HumanMessage("hi")], "You are X.") == [
        {"role": "system", "content": "You are X."},
        {"role": "user", "content": "hi"},
    ]
    assert message_dicts([SystemMessage("Be brief."), HumanMessage("hi")], "You are X.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


def test_adapters_off_serves_every_persona_on_its_system_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    robin = EmbeddedChatModel(persona="ROBIN").persona_model()
    assert adapter_paths(robin, "default") == (adapter_path("default", "ROBIN"),)
    monkeypatch.setenv("BATOS_ADAPTERS", "off")
    assert adapter_paths(robin, "default") == ()
    monkeypatch.setenv("BATOS_ADAPTERS", "no")
    with pytest.raises(ConfigurationError, match="BATOS_ADAPTERS"):
        adapter_paths(robin, "default")


class _Handshake(threading.Condition):
    """The lock's condition, telling the test each time a caller starts waiting on it.

    A waiter takes its ticket and then waits, under this condition: once ``queued`` is
    released the waiter holds its place in the line, with no sleep to guess how long it takes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.queued = threading.Semaphore(0)

    def wait(self, timeout: float | None = None) -> bool:
        self.queued.release()
        return super().wait(timeout)


def test_fair_lock_serves_in_arrival_order_and_skips_who_gave_up() -> None:
    lock = FairLock()
    handshake = lock._cond = _Handshake()
    lock.acquire()
    order: list[int] = []

    def waiter(i: int) -> None:
        lock.acquire()
        order.append(i)
        lock.release()

    # Started in reverse, each only once the one before is in line: arrival order is 3, 2, 1, 0.
    threads = []
    for i in reversed(range(4)):
        threads.append(threading.Thread(target=waiter, args=(i,)))
        threads[-1].start()
        assert handshake.queued.acquire(timeout=10), f"waiter {i} never queued"
    assert lock.waiting == 5  # the holder and four in line
    assert lock.acquire(timeout=0.01) is False  # gives up; must not block the others
    lock.release()
    for thread in threads:
        thread.join(timeout=5)
    assert order == [3, 2, 1, 0]
    assert lock.acquire(timeout=1) is True


@pytest.mark.model
def test_embedded_invoke_and_stream_carry_usage() -> None:
    model = chat_model("BRICK", temperature=0, num_predict=8)
    reply = model.invoke("Say hello.")
    assert reply.content and reply.usage_metadata["output_tokens"] <= 8
    assert reply.usage_metadata["input_tokens"] > 20  # the Modelfile SYSTEM is in the prompt
    chunks = list(model.stream("Say hello."))
    assert "".join(str(c.content) for c in chunks) == reply.content
    streamed = chunks[-1].usage_metadata
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert streamed[key] == reply.usage_metadata[key]
    # The second call finds the first one's prompt in the prefix cache.
    cached = reply.usage_metadata.get("input_token_details", {}).get("cache_read", 0)
    assert streamed["input_token_details"]["cache_read"] >= cached
    assert len([c for c in chunks if c.content]) > 1


@pytest.mark.model
def test_text_no_encoding_holds_reaches_the_model_well_formed() -> None:
    # A file name that is not UTF-8 is read with surrogateescape ("caf\udce9.txt"); cited as
    # a passage's source it made every request that retrieved it fail in the tokenizer.
    odd = "The passage comes from caf\udce9.txt and \ud800 half a pair."
    [message] = with_system([HumanMessage(odd)], "")
    assert message.content == "The passage comes from caf\ufffd.txt and \ufffd half a pair."
    assert with_system([HumanMessage([{"type": "text", "text": odd}])], "")[0].content == [
        {"type": "text", "text": message.content}
    ]
    model = chat_model("BABS", temperature=0, num_predict=4)
    assert model.invoke([HumanMessage(odd)]).usage_metadata["output_tokens"] > 0
    eng = engine(model_path("test"))
    assert eng.prompt_tokens([{"role": "user", "content": odd}])  # the engine's own guard


@pytest.mark.model
def test_prompt_longer_than_the_context_is_refused_and_the_model_stays_usable() -> None:
    eng = engine(model_path("test"))
    with pytest.raises(ModelError, match="the context holds 4096"):
        list(eng.generate([{"role": "user", "content": "word " * 5000}]))
    pieces = list(
        eng.generate(
            [{"role": "user", "content": "Say hi."}],
            sampling=Sampling(temperature=0, num_predict=4),
        )
    )
    assert pieces[-1].completion_tokens > 0


@pytest.mark.model
def test_concurrent_callers_share_one_model_one_at_a_time() -> None:
    model = chat_model("ALFRED", temperature=0, num_predict=4)
    results: list[str] = []

    def call() -> None:
        results.append(str(model.invoke("Status?").content))

    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 3 and len(set(results)) == 1


@pytest.mark.model
async def test_embedded_async_streaming() -> None:
    model = chat_model("ROBIN", temperature=0, num_predict=4)
    pieces = [c.content async for c in model.astream("Hello")]
    assert "".join(str(p) for p in pieces)
