"""Tool proxies: methods written through the JIT gate that build requests, sent by the host
within the policy, against real HTTP services on loopback."""

from __future__ import annotations

import ast
import json
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fakes import ScriptedChatModel
from tool_services import BOMB_BYTES, HOSTILE_SECONDS, SLOW_SECONDS, WEATHER_KEY, service

from batos import settings
from batos.errors import (
    AuditRejected,
    ConfigurationError,
    MissionFailed,
    SandboxViolation,
    ToolCallFailed,
    ToolRefused,
)
from batos.shell.runtime import open_image
from graph import jit
from prototypes import kernel, tools, trust
from prototypes.trust import MethodUntrusted
from prototypes.uvm import Method
from store.core.image import LivingImage

WEATHER = (
    "def today(self, city):\n"
    "    return request('GET', '{base}/weather', params={{'city': city}},\n"
    "                   secret_headers={{'X-Api-Key': 'env:WEATHER_API_KEY'}})\n"
)
#: The same as a model must write it: a written tool method answers with what it read.
WEATHER_READS = (
    "def today(self, city, response=None):\n"
    "    if response is None:\n"
    "        return request('GET', '{base}/weather', params={{'city': city}},\n"
    "                       secret_headers={{'X-Api-Key': 'env:WEATHER_API_KEY'}})\n"
    "    return response['json']\n"
)


@pytest.fixture
def base(monkeypatch) -> Iterator[tuple[str, list]]:
    """The loopback service, allowed (GET and POST) with the weather key for it alone."""
    with service() as (url, seen):
        where = url.removeprefix("http://")
        monkeypatch.setenv("BATOS_TOOLS_ALLOW", f"{url}/GET+POST")
        monkeypatch.setenv("BATOS_TOOLS_SECRETS", f"WEATHER_API_KEY@{where}")
        monkeypatch.setenv("WEATHER_API_KEY", WEATHER_KEY)
        monkeypatch.setenv("BATOS_JIT_DRAFTS", "1")
        yield url, seen


@pytest.fixture
def image() -> Iterator[LivingImage]:
    living = open_image("memory://")
    yield living
    living.close()


@pytest.fixture
def enabled() -> Iterator[None]:
    yield
    jit.disable()


def with_tool(image: LivingImage, name: str, selector: str, source: str) -> None:
    """A proxy with a method added by hand: through the same gate, no model needed."""

    def add(root: Any) -> None:
        proxy = tools.open_proxy(root["objects"]["tools"], name)
        kernel.add_method(proxy, selector, source)

    image.transact(add)


def call(image: LivingImage, name: str, selector: str, *args: Any) -> Any:
    return image.transact(
        lambda root: getattr(root["objects"]["tools"]._slots()[name], selector)(*args)
    )


def test_a_missing_tool_and_method_are_written_and_the_host_calls_the_service(
    image, base, enabled
) -> None:
    url, seen = base
    image.transact(
        lambda root: root["objects"]["tools"].intents.__setitem__(
            "weather", f"Weather by city at {url}/weather?city=NAME, key in the X-Api-Key header"
        )
    )
    model = ScriptedChatModel().enqueue("```python\n" + WEATHER_READS.format(base=url) + "```")
    jit.enable(model)
    answer = image.transact(lambda root: root["objects"]["tools"].weather.today("Oslo"))
    assert answer == {"city": "Oslo", "temp_c": 6, "sky": "clear"}
    # The model was told the capability and what the policy allows; no examples were asked.
    prompt = model.history[0][-1].content
    assert "request(method, url" in prompt and url.removeprefix("http://") in prompt
    assert "env:WEATHER_API_KEY" in prompt and model.calls == 1
    # The key went to the service, read from the environment; the image never holds it.
    assert seen[-1][2]["X-Api-Key"] == WEATHER_KEY
    with image.read() as root:
        proxy = root["objects"]["tools"]._slots()["weather"]
        method = proxy._slots()["today"]
        assert isinstance(method, Method) and method.compiler == tools.TOOL_COMPILER
        assert kernel.is_generated(method) and "Weather by city" in proxy.about
    storage = image.db.storage
    records = b"".join(r.data or b"" for txn in storage.iterator() for r in txn)
    assert WEATHER_KEY.encode() not in records
    # Installed: the next call sends again, with no model.
    again = image.transact(lambda root: root["objects"]["tools"].weather.today("Bergen"))
    assert again["city"] == "Bergen" and model.calls == 1


def test_a_draft_outside_the_policy_goes_back_with_the_hint_and_nothing_is_sent(
    image, base, enabled, monkeypatch
) -> None:
    url, seen = base
    wrong = WEATHER_READS.format(base="https://api.example.com")
    model = ScriptedChatModel().enqueue(
        f"```python\n{wrong}```", "```python\n" + WEATHER_READS.format(base=url) + "```"
    )
    # The trust gate at its default: the refused draft is the host's rule, not a wrong one.
    monkeypatch.delenv("BATOS_JIT_TRUST", raising=False)
    runner = jit.enable(model, attempts=2)
    assert runner.trust == "setting" and trust.threshold() == 0.3
    answer = image.transact(lambda root: root["objects"]["tools"].weather.today("Rome"))
    assert answer["city"] == "Rome"
    feedback = model.history[1][-1].content
    assert "host api.example.com (https, port 443) is not in tools_allow" in feedback
    assert url.removeprefix("http://") in feedback  # the allowed services, to choose from
    assert all("example.com" not in path for _, path, _ in seen)
    with image.read() as root:
        verdict = root["objects"]["tools"].weather._slots()["today"].audit["trust"]
    # Without the rule the score would be 1/2 x 0.5 = 0.25, under the threshold.
    assert verdict["policy_refused"] == 1 and verdict["drafts"] == 2
    assert verdict["trusted"] and verdict["score"] == 0.5


def test_a_written_tool_method_must_read_the_answer(image, base, enabled, monkeypatch) -> None:
    """Drafts that return the whole answer agree whenever they build one request, whatever
    the caller asked for: such a draft goes back with the rule, and nothing is sent for it."""
    url, seen = base
    model = ScriptedChatModel().enqueue(
        "```python\n" + WEATHER.format(base=url) + "```",
        "```python\n" + WEATHER_READS.format(base=url) + "```",
    )
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    jit.enable(model, attempts=2)
    assert image.transact(lambda root: root["objects"]["tools"].weather.today("Oslo"))["sky"]
    assert tools.READ_RULE in model.history[1][-1].content
    assert len(seen) == 2  # the second draft's trial, then its real call


def test_a_draft_with_a_malformed_request_still_counts_against_trust(
    image, base, enabled, monkeypatch
) -> None:
    """Only the policy's refusals stand aside: a request of the wrong shape is a wrong draft."""
    url, _ = base
    malformed = "def today(self, city):\n    return {'url': city}\n"
    model = ScriptedChatModel().enqueue(
        f"```python\n{malformed}```", "```python\n" + WEATHER_READS.format(base=url) + "```"
    )
    monkeypatch.delenv("BATOS_JIT_TRUST", raising=False)
    jit.enable(model, attempts=2)
    with pytest.raises(MethodUntrusted) as refused:
        image.transact(lambda root: root["objects"]["tools"].weather.today("Rome"))
    assert "score 0.25" in str(refused.value)


def test_every_draft_refused_leaves_the_image_unchanged(image, base, enabled) -> None:
    forged = (
        "def today(self, city, response=None):\n"
        "    return request('GET', '{base}/weather', headers={{'Authorization': 'Bearer x'}})\n"
    )
    model = ScriptedChatModel().enqueue(
        "```python\n" + forged.format(base=base[0]) + "```",
        "```python\ndef today(self, city, response=None):\n    return {'url': city}\n```",
    )
    jit.enable(model, attempts=2)

    def send(root: Any) -> None:
        root["objects"]["tools"].weather.today("Oslo")

    with pytest.raises(MissionFailed) as failed:
        image.transact(send)
    text = str(failed.value)
    assert "may not be set by value" in text and "must return request(...)" in text
    with image.read() as root:
        assert "weather" not in root["objects"]["tools"]._slots()


def test_a_slow_service_times_out_with_what_to_do(image, base, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_TOOLS_TIMEOUT", "0.3")
    with_tool(
        image, "lag", "wait", f"def wait(self):\n    return request('GET', '{base[0]}/slow')\n"
    )
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "lag", "wait")
    assert "did not answer within 0.3 s" in failed.value.message
    assert "BATOS_TOOLS_TIMEOUT" in failed.value.hint
    assert SLOW_SECONDS > 0.3 * 3  # the service really was slower than the limit


def test_garbage_is_a_clear_parse_error(image, base) -> None:
    with_tool(
        image, "junk", "read", f"def read(self):\n    return request('GET', '{base[0]}/garbage')\n"
    )
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "junk", "read")
    assert "not JSON" in failed.value.message and "<html>" in failed.value.message
    assert "expect='text'" in failed.value.hint
    # Read as text, the same body is data.
    with_tool(
        image,
        "junk",
        "read_text",
        f"def read_text(self):\n    return request('GET', '{base[0]}/garbage', expect='text')\n",
    )
    assert call(image, "junk", "read_text")["text"].startswith("<html>")


def test_a_redirect_off_the_allow_list_is_refused_and_one_on_it_followed(image, base) -> None:
    url, seen = base
    with_tool(
        image,
        "hop",
        "go",
        "def go(self, where):\n"
        f"    return request('GET', '{url}/' + where,\n"
        "                   secret_headers={'X-Api-Key': 'env:WEATHER_API_KEY'})\n",
    )
    with pytest.raises(ToolRefused) as refused:
        call(image, "hop", "go", "away")
    assert "redirected to http://localhost:" in refused.value.message
    assert "not in tools_allow" in refused.value.message
    assert "BATOS_TOOLS_ALLOW=" in refused.value.hint
    assert [path for _, path, _ in seen] == ["/away"]  # the refused hop was never asked
    moved = call(image, "hop", "go", "moved")
    assert moved["json"]["city"] == "Moved" and moved["url"].endswith("city=Moved")


def test_a_flood_stops_at_the_byte_limit(image, base, monkeypatch) -> None:
    monkeypatch.setenv("BATOS_TOOLS_MAX_BYTES", "100000")
    with_tool(
        image, "big", "all", f"def all(self):\n    return request('GET', '{base[0]}/flood')\n"
    )
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "big", "all")
    assert "over 100000 bytes" in failed.value.message


def test_secrets_go_only_where_tools_secrets_says(image, base, monkeypatch) -> None:
    url, seen = base
    source = (
        "def peek(self):\n"
        f"    return request('GET', '{url}/echo', secret_params={{'k': 'env:HOME'}})\n"
    )
    with_tool(image, "leak", "peek", source)
    with pytest.raises(ToolRefused) as refused:
        call(image, "leak", "peek")
    assert "secret HOME is not in tools_secrets" in refused.value.message and not seen
    monkeypatch.delenv("WEATHER_API_KEY")
    with_tool(image, "weather", "today", WEATHER.format(base=url))
    with pytest.raises(ToolRefused) as unset:
        call(image, "weather", "today", "Oslo")
    assert "WEATHER_API_KEY is not set" in unset.value.message and not seen


def test_a_secret_listed_by_host_alone_goes_over_https_only(image, base, monkeypatch) -> None:
    """``NAME@HOST`` means https, as ``HOST`` does in tools_allow: the key is not sent in clear
    text to the same host's plain-http port; naming the port lets it go there."""
    url, seen = base
    monkeypatch.setenv("BATOS_TOOLS_SECRETS", "WEATHER_API_KEY@127.0.0.1")
    with_tool(image, "weather", "today", WEATHER.format(base=url))
    with pytest.raises(ToolRefused) as refused:
        call(image, "weather", "today", "Oslo")
    assert "only be sent to 127.0.0.1 over https (port 443)" in refused.value.message
    port = url.rsplit(":", 1)[1]
    assert f"BATOS_TOOLS_SECRETS='WEATHER_API_KEY@127.0.0.1:{port}'" in refused.value.hint
    assert not seen
    monkeypatch.setenv("BATOS_TOOLS_SECRETS", f"WEATHER_API_KEY@127.0.0.1:{port}")
    assert call(image, "weather", "today", "Oslo")["json"]["city"] == "Oslo"


def test_a_post_sends_its_json_body_and_a_method_outside_the_allow_list_is_refused(
    image, base, monkeypatch
) -> None:
    url, _ = base
    source = (
        f"def note(self, text):\n    return request('POST', '{url}/echo', json={{'t': text}})\n"
    )
    with_tool(image, "notes", "note", source)
    assert call(image, "notes", "note", "hi")["json"] == {
        "method": "POST",
        "query": {},
        "body": {"t": "hi"},
    }
    monkeypatch.setenv("BATOS_TOOLS_ALLOW", url)  # GET only
    with pytest.raises(ToolRefused) as refused:
        call(image, "notes", "note", "hi")
    assert "POST is not allowed" in refused.value.message
    assert f"BATOS_TOOLS_ALLOW='{url},{url}/POST'" in refused.value.hint


def test_generated_code_cannot_call_a_tool_itself(image, base) -> None:
    with_tool(image, "weather", "today", WEATHER.format(base=base[0]))

    def add(root: Any) -> None:
        kernel.add_method(
            root["objects"]["brick"],
            "sneak",
            "def sneak(self, tools):\n    return tools.weather.today('Oslo')\n",
        )

    image.transact(add)
    with pytest.raises(SandboxViolation) as refused:
        image.transact(lambda root: root["objects"]["brick"].sneak(root["objects"]["tools"]))
    assert "only by the host" in str(refused.value) and not base[1]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"url": "x"}, "must return request(...)"),
        (tools.request("GET", "ftp://h/x"), "not an http:// or https:// URL"),
        (tools.request("GET", "https://u:p@h/x"), "may not hold a user or password"),
        (tools.request("TRACE", "https://h/x"), "the method must be one of"),
        (tools.request("GET", "https://h/x", headers={"Cookie": "a"}), "may not be set"),
        (tools.request("GET", "https://h/x", headers={"X": "a\r\nB: c"}), "line break"),
        (tools.request("GET", "https://h/x", secret_params={"k": "hunter2"}), "'env:NAME'"),
        (tools.request("GET", "https://h/" + "x" * 3000), "at most 2048"),
        (tools.request("GET", "https://h/x", params={str(i): i for i in range(40)}), "over 32"),
        (tools.request("POST", "https://h/x", json={"a": {1, 2}}), "not JSON"),
        (tools.request("GET", "https://h/x", expect="xml"), "expect must be"),
    ],
)
def test_a_hostile_request_description_is_refused_with_the_reason(value, why) -> None:
    with pytest.raises(ValueError, match=None) as refused:
        tools.read_request(value)
    assert why in str(refused.value)


def test_the_allow_list_setting_is_checked_when_it_is_read(monkeypatch) -> None:
    from batos import settings
    from batos.errors import ConfigurationError

    monkeypatch.setenv("BATOS_TOOLS_ALLOW", "API.Example.com, http://127.0.0.1:8080/get+post")
    assert settings.get_str("tools_allow") == (
        "https://api.example.com/GET,http://127.0.0.1:8080/GET+POST"
    )
    for bad in ("ftp://h", "h/TRACE", "bad host", "h\n/GET", "http://h:99999", "h:0"):
        monkeypatch.setenv("BATOS_TOOLS_ALLOW", bad)
        with pytest.raises(ConfigurationError):
            settings.get_str("tools_allow")
    for bad in ("lower@h", "KEY\n@h"):
        monkeypatch.setenv("BATOS_TOOLS_SECRETS", bad)
        with pytest.raises(ConfigurationError):
            settings.get_str("tools_secrets")


def test_a_host_no_allow_list_entry_can_name_gets_no_entry_to_add(monkeypatch) -> None:
    """A redirect to 'http://exa mple.com/' was refused with the hint to add
    'http://exa%20mple.com:80', a value the setting then refused at every command."""
    from batos import settings

    monkeypatch.setenv("BATOS_TOOLS_ALLOW", "http://127.0.0.1:8080")
    policy = tools.ToolPolicy.from_settings()
    for url in ("http://exa%20mple.com/", "http://ex_ample.com/"):
        with pytest.raises(ToolRefused) as refused:
            policy.check("GET", url)
        assert "no allow-list entry can name it" in refused.value.hint
        assert "BATOS_TOOLS_ALLOW=" not in refused.value.hint
    with pytest.raises(ToolRefused) as refused:
        policy.check("GET", "http://example.org:8081/")
    suggested = refused.value.hint.split("BATOS_TOOLS_ALLOW='", 1)[1].split("'", 1)[0]
    monkeypatch.setenv("BATOS_TOOLS_ALLOW", suggested)
    assert "http://example.org:8081/GET" in settings.get_str("tools_allow")  # one it takes


def test_an_answer_is_plain_bounded_data(image, base) -> None:
    with_tool(image, "weather", "today", WEATHER.format(base=base[0]))
    answer = call(image, "weather", "today", "Oslo")
    assert set(answer) == {"status", "url", "headers", "json"}
    assert json.loads(json.dumps(answer)) == answer
    assert all(len(v) <= 1024 for v in answer["headers"].values())


def test_batos_tools_lists_shows_adds_and_removes_undoably(capsys, file_uri, base) -> None:
    from batos.shell.cli import main

    def run(*argv: str) -> tuple[int, str]:
        code = main(["--image", file_uri, *argv])
        return code, capsys.readouterr().out

    assert run("init")[0] == 0
    code, out = run("tools", "add", "weather", "--about", f"Weather at {base[0]}/weather")
    assert code == 0 and "declared tools.weather" in out
    assert run("tools", "add", "weather", "--about", "  ")[0] == 2  # nothing to write from
    for name in ("class", "x" * 65, "_private"):  # no method could be called through it
        assert run("tools", "add", name, "--about", "Weather at https://example.org")[0] == 2
    assert run("tools", "add", "long", "--about", "w" * 2001)[0] == 2  # in every prompt
    code, out = run("tools", "add", "weather", "--about", f"Weather at {base[0]}/weather")
    assert code == 0 and "declared already, as it is" in out
    code, out = run("tools", "add", "weather", "--about", f"Forecasts at {base[0]}/weather")
    assert code == 0 and "its description was 'Weather at" in " ".join(out.split())
    assert run("tools", "add", "weather", "--about", f"Weather at {base[0]}/weather")[0] == 0
    source = WEATHER.format(base=base[0])

    def write(root: Any) -> None:  # as a model would have: a method it generated
        kernel.add_method(root["objects"]["tools"].weather, "today", source, author="BABS")

    with LivingImage.open(file_uri) as img:
        img.transact(write)
    code, out = run("send", "tools.weather", "today", '"Oslo"', "--json")
    assert code == 0 and json.loads(out)["json"]["city"] == "Oslo"
    code, out = run("tools", "--json")
    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["weather"]
    assert rows[0]["methods"][0]["selector"] == "today"
    code, out = run("tools", "show", "weather")
    assert code == 0 and "secret_headers" in out and "Weather at" in out
    code, out = run("methods", "reject", "tools.weather", "today", "--reason", "wrong city")
    assert code == 0 and "rejected tools.weather.today" in out
    with LivingImage.open(file_uri) as img:  # written again, as the next draft would be
        img.transact(write)
    code, out = run("tools", "remove", "weather")
    flat = " ".join(out.split())
    assert code == 0 and "removed tools.weather and 1 method(s)" in flat
    # the rejected method's record goes with it: nothing could restore it on a removed tool
    assert "and 1 record(s) of its rejected methods" in flat
    assert json.loads(run("methods", "--rejected", "--json")[1]) == []
    assert main(["--image", file_uri, "tools", "show", "weather"]) == 4
    capsys.readouterr()
    with LivingImage.open(file_uri) as img:
        tid = img.history(1)[0].tid
    assert run("undo", tid)[0] == 0
    code, out = run("tools", "--json")
    assert [r["name"] for r in json.loads(out)] == ["weather"]
    assert len(json.loads(run("methods", "--rejected", "--json")[1])) == 1


def test_babs_uses_a_tool_inside_a_facet(image, base) -> None:
    """A facet names the call as data; the host makes it and the answer joins the
    instruction. A failing call degrades the facet to the persona, with the reason."""
    from graph import facets
    from prototypes.incarnation import personas

    with_tool(image, "weather", "today", WEATHER.format(base=base[0]))
    facet = (
        "def facet_research(self, query):\n"
        "    return {'instruction': 'Answer from the weather data: ' + query,\n"
        "            'tool': {'name': 'weather', 'selector': 'today', 'args': ['Oslo']}}\n"
    )
    image.transact(lambda root: kernel.add_method(personas(root)["BABS"], "facet_research", facet))

    def prepare(root: Any) -> facets.Prepared:
        return facets.prepare(
            root,
            "BABS",
            "facet_research",
            "is it cold in Oslo?",
            models=lambda persona, **options: ScriptedChatModel(),  # nothing to write: it exists
            attempts=1,
            cycle_id="c1",
            writers=facets.FacetWriters(),
        )

    with image.read() as root:
        prepared = prepare(root)
    assert not prepared.degraded
    text = prepared.instruction.text
    assert text.startswith("Answer from the weather data: is it cold in Oslo?")
    assert 'The tool tools.weather.today("Oslo") answered:' in text and '"temp_c": 6' in text
    base[1].clear()
    image.transact(lambda root: delattr(root["objects"]["tools"].weather, "today"))
    with image.read() as root:
        prepared = prepare(root)
    assert "has no method 'today' yet" in prepared.degraded
    assert "is it cold in Oslo?" in prepared.instruction.text and not base[1]


# -- the reading phase: a method that reads the answer, as data, in the sandbox ---------------

READING = (
    "def temperature(self, city, response=None):\n"
    "    if response is None:\n"
    "        return request('GET', '{base}/weather', params={{'city': city}},\n"
    "                       secret_headers={{'X-Api-Key': 'env:WEATHER_API_KEY'}})\n"
    "    {read}\n"
)


def reading(base: str, read: str) -> str:
    return READING.format(base=base, read=read)


def test_a_method_that_reads_the_answer_gives_the_caller_one_field(image, base) -> None:
    url, seen = base
    with_tool(image, "weather", "temperature", reading(url, "return response['json']['temp_c']"))
    assert call(image, "weather", "temperature", "Oslo") == 6  # len("Oslo") + 2
    assert len(seen) == 1  # one request; the reading phase sent nothing
    # What it reads is the answer a method without a reading phase returns, as plain data.
    with_tool(
        image, "weather", "raw", reading(url, "return response").replace("temperature", "raw")
    )
    whole = call(image, "weather", "raw", "Oslo")
    assert set(whole) == {"status", "url", "headers", "json"} and whole["status"] == 200
    assert json.loads(json.dumps(whole)) == whole


def test_a_reading_phase_that_raises_names_the_method_and_quotes_little(image, base) -> None:
    url, _ = base
    with_tool(image, "weather", "temperature", reading(url, "return response['json']['temp']"))
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "weather", "temperature", "Oslo")
    message = failed.value.message
    assert "tools.weather.temperature could not read the service's answer" in message
    assert "(status 200)" in message and "KeyError" in message and "'temp'" in message
    # An exception that carries the whole answer, many times over, is quoted within bounds.
    loud = "raise ValueError(json.dumps(response) * 500)"
    source = "import json\n" + reading(url, loud)
    with_tool(image, "weather", "temperature", source)
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "weather", "temperature", "Oslo")
    assert "ValueError" in failed.value.message
    assert len(failed.value.message) <= tools.MAX_READ_ERROR_CHARS + 200


@pytest.mark.parametrize(
    ("read", "why"),
    [
        ("return 'x' * 500000", f"over {tools.MAX_READ_CHARS} characters"),
        ("return [response['json']] * 5000", f"over {tools.MAX_READ_NODES} values"),
        ("return self", "holds a UvmObject, which is not JSON"),
        ("return {1, 2}", "holds a set, which is not JSON"),
    ],
)
def test_what_a_reading_phase_returns_is_bounded_json_data(image, base, read, why) -> None:
    with_tool(image, "weather", "temperature", reading(base[0], read))
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "weather", "temperature", "Oslo")
    assert failed.value.message.startswith("tools.weather.temperature read the answer")
    assert why in failed.value.message and "JSON data" in failed.value.hint


def test_a_reading_phase_cannot_make_requests_or_reach_the_client(image, base) -> None:
    url, seen = base
    with_tool(image, "weather", "today", WEATHER.format(base=url))
    again = f"return request('GET', '{url}/echo')"
    with_tool(image, "weather", "temperature", reading(url, again))
    with pytest.raises(SandboxViolation) as refused:
        call(image, "weather", "temperature", "Oslo")
    assert "cannot make a request while it reads" in str(refused.value)
    assert "tools.weather.temperature was stopped" in str(refused.value)
    # Nor by calling a tool method: that is the host's to do.
    with_tool(image, "weather", "temperature", reading(url, "return self.today('Bergen')"))
    with pytest.raises(SandboxViolation) as refused:
        call(image, "weather", "temperature", "Oslo")
    assert "only by the host" in str(refused.value)
    assert [path for _, path, _ in seen] == ["/weather?city=Oslo"] * 2  # the first phases
    # The client and its library are out of reach: the gate refuses the code.
    for reach in ("import httpx\n", "from prototypes import tool_client\n"):
        with pytest.raises(AuditRejected):
            with_tool(image, "weather", "sneak", reach + reading(url, "return 1"))


def test_the_answer_read_is_the_hosts_never_the_callers(image, base) -> None:
    url, seen = base
    with_tool(image, "weather", "temperature", reading(url, "return response['json']['temp_c']"))
    forged = {"status": 200, "json": {"temp_c": 99}}
    with pytest.raises(ToolRefused, match="only the host passes"):
        call(image, "weather", "temperature", "Oslo", forged)
    with pytest.raises(ToolRefused, match="only the host passes"):
        image.transact(
            lambda root: root["objects"]["tools"].weather.temperature("Oslo", response=forged)
        )
    assert not seen


def test_the_trial_holds_a_draft_to_the_reading_protocol(image, base, enabled, monkeypatch) -> None:
    url, seen = base
    model = ScriptedChatModel().enqueue(
        "```python\n" + reading(url, "return 1").replace("response=None", "response") + "```",
        "```python\n" + reading(url, f"return request('GET', '{url}/echo')") + "```",
        "```python\n" + reading(url, "return response['json']['temp_c']") + "```",
    )
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")  # three drafts, two wrong: this is the feedback
    jit.enable(model, attempts=3)
    answer = image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo"))
    assert answer == 6
    assert "needs the default None" in model.history[1][-1].content
    assert "request(...) cannot be called once the response is given" in (
        model.history[2][-1].content
    )
    # The first two drafts were refused before any request was sent; the third's GET was sent
    # once to try its reading on the real answer, and once more by the installed method.
    assert [path for _, path, _ in seen] == ["/weather?city=Oslo"] * 2
    # The prompt told the model the protocol.
    assert "response=None" in model.history[0][-1].content


def test_a_draft_that_misreads_the_real_answer_is_shown_it(
    image, base, enabled, monkeypatch
) -> None:
    """A GET draft is tried on the service's real answer: a wrong field path fails there, and
    the next draft is shown the body it should have read."""
    url, seen = base
    model = ScriptedChatModel().enqueue(
        "```python\n" + reading(url, "return response['json']['current']['temp']") + "```",
        "```python\n" + reading(url, "return response['json']['temp_c']") + "```",
    )
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    jit.enable(model, attempts=2)
    answer = image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo"))
    assert answer == 6
    feedback = model.history[1][-1].content
    assert "reading the service's real answer" in feedback and "KeyError" in feedback
    assert 'the service answered status 200 with: {"city": "Oslo", "temp_c": 6' in feedback
    # Both drafts build one request: it was sent once for both trials, then by the method.
    assert [path for _, path, _ in seen] == ["/weather?city=Oslo"] * 2


def test_drafts_that_read_the_same_value_agree_however_they_spell_the_request(
    image, base, enabled, monkeypatch
) -> None:
    url, seen = base
    in_url = reading(url, "return response['json']['temp_c']").replace(
        f"'{url}/weather', params={{'city': city}}",
        f"'{url}/weather?city=' + city",
    )
    assert "params" not in in_url
    other_field = reading(url, "return response['json']['sky']")
    model = ScriptedChatModel().enqueue(
        "```python\n" + reading(url, "return response['json']['temp_c']") + "```",
        "```python\n" + in_url + "```",
        "```python\n" + other_field + "```",
    )
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "3")
    monkeypatch.setenv("BATOS_JIT_TRUST", "0.3")
    jit.enable(model, attempts=2)
    answer = image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo"))
    assert answer == 6
    with image.read() as root:
        verdict = root["objects"]["tools"].weather._slots()["temperature"].audit["trust"]
    # Two spellings of one request read the same value; the draft reading another does not
    # join them.
    assert verdict["support"] == 2 and verdict["drafts"] == 3 and verdict["groups"] == 2
    assert [m for m, _, _ in seen] == ["GET"] * 3  # two distinct requests tried, one call


def test_a_draft_with_too_few_parameters_is_told_before_the_argument_lands_in_response(
    image, base, enabled, monkeypatch
) -> None:
    url, seen = base
    no_city = (
        "def temperature(self, response=None):\n"
        "    if response is None:\n"
        f"        return request('GET', '{url}/weather')\n"
        "    return response['json']['temp_c']\n"
    )
    model = ScriptedChatModel().enqueue(
        f"```python\n{no_city}```",
        "```python\n" + reading(url, "return response['json']['temp_c']") + "```",
    )
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    jit.enable(model, attempts=2)
    assert image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo")) == 6
    feedback = model.history[1][-1].content
    assert "it is called with 1 argument(s), ['Oslo'], but takes 0 before response" in feedback


def test_split_tool_drafts_draw_a_second_batch_before_refusing(
    image, base, enabled, monkeypatch
) -> None:
    url, seen = base
    temp, sky, city = (
        "```python\n" + reading(url, f"return response['json'][{field!r}]") + "```"
        for field in ("temp_c", "sky", "city")
    )
    model = ScriptedChatModel().enqueue(temp, sky, city, temp, temp, temp)
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "3")
    monkeypatch.setenv("BATOS_JIT_TRUST", "0.3")
    jit.enable(model, attempts=3)
    assert image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo")) == 6
    with image.read() as root:
        verdict = root["objects"]["tools"].weather._slots()["temperature"].audit["trust"]
    # 1 of 3 (score 1/6) drew three more drafts; 4 of 6 reading one value score 1/3.
    assert model.calls == 6 and verdict["support"] == 4 and verdict["drafts"] == 6
    # The second batch was shown what the service answered the first one's request.
    shown = '/weather?city=Oslo answered: {"city": "Oslo", "temp_c": 6, "sky": "clear"}'
    assert shown in model.history[3][-1].content and shown not in model.history[0][-1].content
    assert len(seen) == 2  # one request shared by every trial, then the real call


@pytest.mark.parametrize("setting", ["off", "post"])
def test_a_trial_sends_nothing_that_could_change_the_service_or_when_told_not_to(
    image, base, enabled, monkeypatch, setting
) -> None:
    url, seen = base
    source = reading(url, "return response['json']['temp_c']")
    if setting == "post":
        source = source.replace("request('GET'", "request('POST'")
    else:
        monkeypatch.setenv("BATOS_TOOLS_TRIAL_SEND", "off")
    model = ScriptedChatModel().enqueue("```python\n" + source + "```")
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    jit.enable(model, attempts=1)
    image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo"))
    assert len(seen) == 1  # only the installed method's own call


def test_a_service_that_fails_in_a_trial_is_the_drafts_finding(
    image, base, enabled, monkeypatch
) -> None:
    url, seen = base
    garbage = reading(url, "return response['json']").replace("/weather'", "/garbage'")
    model = ScriptedChatModel().enqueue("```python\n" + garbage + "```")
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    jit.enable(model, attempts=1)
    with pytest.raises(MissionFailed) as failed:
        image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo"))
    said = " ".join(failed.value.findings)
    assert "its request was sent to try it, and" in said and "JSON" in said
    assert len(seen) == 1
    with image.read() as root:
        proxy = root["objects"]["tools"]._slots().get("weather")
        assert proxy is None or "temperature" not in proxy._slots()


def test_a_facet_gets_the_value_a_tool_read(image, base) -> None:
    from graph import facets
    from prototypes.incarnation import personas

    with_tool(
        image, "weather", "temperature", reading(base[0], "return response['json']['temp_c']")
    )
    facet = (
        "def facet_research(self, query):\n"
        "    return {'instruction': 'Answer: ' + query,\n"
        "            'tool': {'name': 'weather', 'selector': 'temperature', 'args': ['Oslo']}}\n"
    )
    image.transact(lambda root: kernel.add_method(personas(root)["BABS"], "facet_research", facet))
    with image.read() as root:
        prepared = facets.prepare(
            root,
            "BABS",
            "facet_research",
            "is it cold?",
            models=lambda persona, **options: ScriptedChatModel(),
            attempts=1,
            cycle_id="c1",
            writers=facets.FacetWriters(),
        )
    assert prepared.instruction.text.endswith(
        'The tool tools.weather.temperature("Oslo") answered: 6'
    )


def test_no_answer_carries_a_secret_the_request_sent(image, base, monkeypatch) -> None:
    """The final URL holds a secret parameter and a service may echo it back; the answer goes
    on to a reading phase and into prompts, so each secret is written as its name."""
    url, seen = base
    where = url.removeprefix("http://")
    monkeypatch.setenv("BATOS_TOOLS_SECRETS", f"WEATHER_API_KEY@{where}")
    source = (
        "def echo(self, response=None):\n"
        "    if response is None:\n"
        f"        return request('GET', '{url}/echo',\n"
        "                       secret_params={'k': 'env:WEATHER_API_KEY'})\n"
        "    return response\n"
    )
    with_tool(image, "mirror", "echo", source)
    answer = call(image, "mirror", "echo")
    assert WEATHER_KEY in seen[-1][1]  # the service did get the key, in its query
    assert WEATHER_KEY not in json.dumps(answer)
    assert answer["json"]["query"] == {"k": "env:WEATHER_API_KEY"}
    assert answer["url"].endswith("k=env:WEATHER_API_KEY")


def test_the_prompt_example_uses_the_services_own_allowed_address(monkeypatch) -> None:
    monkeypatch.setenv("BATOS_TOOLS_ALLOW", "api.one.test,http://127.0.0.1:8080")
    policy = tools.ToolPolicy.from_settings()
    about = "Rates: GET http://127.0.0.1:8080/rates?base=CODE answers JSON"
    assert jit.example_base(policy, about) == "http://127.0.0.1:8080"
    # An address the policy does not allow is never the example's: the first allowed one is.
    assert jit.example_base(policy, "at https://elsewhere.test/v1") == "http://127.0.0.1:8080"
    assert jit.example_base(policy, "'https://api.one.test/v2'") == "https://api.one.test"
    text = jit.tool_text(jit.prompts()["tool_task"], about)
    assert 'request("GET", "http://127.0.0.1:8080/v2/quote"' in text
    assert "api.example.org" not in text
    monkeypatch.setenv("BATOS_TOOLS_ALLOW", "")
    assert jit.example_base(tools.ToolPolicy.from_settings(), about) == jit.EXAMPLE_BASE


def test_a_draft_that_reads_the_answer_on_the_first_call_is_told_the_rule(
    image, base, enabled, monkeypatch
) -> None:
    url, _ = base
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")  # the repair is what is tested here
    image.transact(
        lambda root: root["objects"]["tools"].intents.__setitem__(
            "weather", f"Weather by city at {url}/weather?city=NAME, answers JSON {{temp_c}}"
        )
    )
    wrong = (
        "def temp(self, city, response=None):\n"
        f"    request('GET', '{url}/weather', params={{'city': city}})\n"
        "    return response['json']['temp_c']\n"
    )
    right = (
        "def temp(self, city, response=None):\n"
        "    if response is None:\n"
        f"        return request('GET', '{url}/weather', params={{'city': city}},\n"
        "                       secret_headers={'X-Api-Key': 'env:WEATHER_API_KEY'})\n"
        "    return response['json']['temp_c']\n"
    )
    model = ScriptedChatModel().enqueue(f"```python\n{wrong}```", f"```python\n{right}```")
    jit.enable(model)
    assert image.transact(lambda root: root["objects"]["tools"].weather.temp("Oslo")) == 6
    repair = model.history[1][-1].content
    assert tools.FIRST_CALL_RULE in repair and "NoneType" in repair
    assert f"{url}/v2/quote" in model.history[0][-1].content  # the example on its own address


def test_a_request_assigned_to_response_is_returned_instead() -> None:
    slip = (
        "def rate(self, base, response=None):\n"
        "    if response is None:\n"
        "        response = request('GET', 'http://h/rates', params={'base': base})\n"
        "    return response['json']['rates']['USD']\n"
    )
    fixed = jit.with_request_returned(slip, "rate")
    assert "        return request('GET', 'http://h/rates', params={'base': base})\n" in fixed
    assert fixed.replace("return request", "response = request") == slip
    # Through extract_code, as a model's reply comes in.
    assert jit.extract_code(f"```python\n{slip}```", "rate") == fixed
    spread = slip.replace("request('GET', ", "request(\n            'GET', ")
    assert "        return request(\n            'GET'" in jit.with_request_returned(spread, "rate")
    # Left alone: another name, a request outside that test, a value that starts on another
    # line, code that does not parse, another method.
    cases = (
        (slip.replace("response = request", "answer = request"), "rate"),
        (slip.replace("if response is None:", "if base:"), "rate"),
        (
            slip.replace("response = request(", "response = (\n            request(").replace(
                "{'base': base})\n", "{'base': base}))\n"
            ),
            "rate",
        ),
        ("def rate(self:\n", "rate"),
        (slip, "other"),
    )
    for kept, selector in cases:
        assert jit.with_request_returned(kept, selector) == kept
    ast.parse(cases[2][0])  # it is left alone for its shape, not for failing to parse


def test_a_draft_that_assigns_its_request_is_installed_as_meant(
    image, base, enabled, monkeypatch
) -> None:
    url, seen = base
    slip = reading(url, "return response['json']['temp_c']").replace(
        "        return request(", "        response = request("
    )
    model = ScriptedChatModel().enqueue(f"```python\n{slip}```")
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    jit.enable(model, attempts=1)
    assert image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo")) == 6


def test_a_draft_that_writes_this_calls_values_into_its_request_goes_back(
    image, base, enabled, monkeypatch
) -> None:
    url, seen = base
    fixed = reading(url, "return response['json']['temp_c']").replace(
        "params={'city': city}", "params={'city': 'Oslo'}"
    )
    assert "'Oslo'" in fixed
    model = ScriptedChatModel().enqueue(
        f"```python\n{fixed}```",
        "```python\n" + reading(url, "return response['json']['temp_c']") + "```",
    )
    monkeypatch.setenv("BATOS_JIT_TRUST", "off")
    jit.enable(model, attempts=2)
    assert image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo")) == 6
    assert tools.ARGUMENTS_RULE in model.history[1][-1].content
    assert len(seen) == 2  # nothing was sent for the first draft


def test_arguments_are_perturbed_within_their_kind() -> None:
    assert tools.perturbed(("9780141439518", "EUR", "usd", 7, 2.5, True, "")) == (
        "9780141439519",
        "EUS",
        "use",
        8,
        3.5,
        False,
        "x",
    )
    assert tools.perturbed(("Oslo!", "z9")) == ("Oslo!x", "z0")
    assert tools.perturbed(([1], {"a": 1}, None)) is None
    assert tools.perturbed(()) is None


def test_an_untrusted_tool_method_is_refused_without_asking(image, base, monkeypatch) -> None:
    url, _ = base
    asked: list[dict] = []
    model = ScriptedChatModel().enqueue(
        *(
            "```python\n" + reading(url, f"return response['json'][{field!r}]") + "```"
            for field in ("temp_c", "sky", "city", "sky", "city", "temp_c")
        )
    )
    monkeypatch.setenv("BATOS_JIT_DRAFTS", "3")
    runner = jit.JitRunner(model, trust=0.3, ask=lambda q: asked.append(q) or {})
    kernel.install_handler(runner)
    try:
        with pytest.raises(MethodUntrusted, match="not trusted enough"):
            image.transact(lambda root: root["objects"]["tools"].weather.temperature("Oslo"))
    finally:
        jit.disable()
    assert not asked and model.calls == 6


# -- hostile services and hostile requests ------------------------------------------------------


def get_tool(image: LivingImage, base: str, path: str, **kw: str) -> None:
    """A proxy ``h`` whose method ``go`` GETs ``path`` with the given request keywords."""
    extra = "".join(f", {k}={v}" for k, v in kw.items())
    source = f"def go(self):\n    return request('GET', '{base}{path}'{extra})\n"
    with_tool(image, "h", "go", source)


@pytest.mark.parametrize("path", ["/processing", "/dribble"])
def test_the_deadline_holds_when_every_read_gets_data_in_time(
    image, base, monkeypatch, path
) -> None:
    """httpx's timeout holds per read: a service sending ``102 Processing``, or one header
    line, every 0.1 s never trips it. The call's deadline does, on every read."""
    monkeypatch.setenv("BATOS_TOOLS_TIMEOUT", "1")
    get_tool(image, base[0], path)
    started = time.monotonic()
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "h", "go")
    took = time.monotonic() - started
    assert "did not answer within 1 s" in failed.value.message
    assert took < HOSTILE_SECONDS / 2  # cut off at the deadline, not when the service gave up


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compression_bomb_stops_at_the_limit_without_inflating(
    image, base, monkeypatch, encoding
) -> None:
    monkeypatch.setenv("BATOS_TOOLS_MAX_BYTES", "100000")
    get_tool(image, base[0], f"/bomb?enc={encoding}")
    tracemalloc.start()
    try:
        with pytest.raises(ToolCallFailed) as failed:
            call(image, "h", "go")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "over 100000 bytes" in failed.value.message
    assert peak < BOMB_BYTES // 8  # one bounded piece at a time, never the whole 64 MiB
    assert base[1][-1][2]["Accept-Encoding"] == "identity"  # it was asked for unencoded


@pytest.mark.parametrize("encoding", ["gzip, gzip", "zstd"])
def test_an_encoding_not_asked_for_is_refused_unread(image, base, encoding) -> None:
    get_tool(image, base[0], f"/bomb?enc={quote(encoding)}")
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "h", "go")
    assert f"an encoding it was not asked for (Content-Encoding '{encoding}')" in (
        failed.value.message
    )


@pytest.mark.parametrize("split", ["", "&split=1"])
@pytest.mark.parametrize("form", ["gzip", "deflate", "raw"])
def test_a_small_compressed_answer_sent_anyway_is_read(image, base, form, split) -> None:
    """Raw deflate too: some servers send it as "deflate", and httpx read it. Which of the
    two a deflate answer is was read from its first piece alone: one of a byte read as raw."""
    get_tool(image, base[0], f"/gzipped?form={form}{split}")
    assert call(image, "h", "go")["json"] == {"packed": True}


def test_a_secret_in_a_number_or_a_header_name_is_handled(image, base, monkeypatch) -> None:
    """Scrubbing the raw text broke a JSON number that held the secret's digits; header names
    were not scrubbed at all; a secret of digits echoed as a number of its own went on as
    it was."""
    monkeypatch.setenv("WEATHER_API_KEY", "12345")
    get_tool(image, base[0], "/keyed", secret_headers="{'X-Api-Key': 'env:WEATHER_API_KEY'}")
    answer = call(image, "h", "go")
    # a number holding the digits among others is data; one that is the secret is named
    assert answer["json"] == {"n": 9123456, "echo": ["env:WEATHER_API_KEY"]}
    assert "x-seen-env:WEATHER_API_KEY" in answer["headers"]
    assert "12345" not in json.dumps(answer["headers"])


def test_no_error_carries_a_secret_and_nothing_is_cut_before_it_is_scrubbed(
    image, base, monkeypatch
) -> None:
    """An error quotes the answer or the redirect; a service can pad an echo so that a cut
    to length falls inside the secret. Every secret is written as its name first."""
    url, seen = base
    key = {"secret_headers": "{'X-Api-Key': 'env:WEATHER_API_KEY'}"}
    get_tool(image, url, "/echotext", **key)
    with pytest.raises(ToolCallFailed) as failed:  # a 200 that is not JSON quotes its body
        call(image, "h", "go")
    assert "key=env:WEATHER_API_KEY" in failed.value.message
    assert WEATHER_KEY in seen[-1][2]["X-Api-Key"]  # the service did get it
    monkeypatch.setenv("BATOS_TOOLS_SECRETS", f"WEATHER_API_KEY@{url.removeprefix('http://')}")
    get_tool(image, url, "/away-with-query", secret_params="{'k': 'env:WEATHER_API_KEY'}")
    with pytest.raises(ToolRefused) as refused:  # the refused redirect names its target
        call(image, "h", "go")
    assert "k=env:WEATHER_API_KEY" in refused.value.message
    for cut in range(1010, 1024):  # every cut that could fall inside the key
        get_tool(image, url, f"/echotext?status=400&pad={'x' * (cut - 4)}", **key)
        answer = call(image, "h", "go")
        assert answer["status"] == 400 and not any(
            WEATHER_KEY[:n] in answer["text"][-n:] for n in range(3, len(WEATHER_KEY) + 1)
        ), answer["text"][-30:]


def test_a_secret_that_no_request_can_carry_is_refused_without_its_value(
    image, base, monkeypatch
) -> None:
    monkeypatch.setenv("WEATHER_API_KEY", WEATHER_KEY + "\n")
    with_tool(image, "weather", "today", WEATHER.format(base=base[0]))
    with pytest.raises(ToolRefused) as refused:
        call(image, "weather", "today", "Oslo")
    said = f"{refused.value.message} {refused.value.hint}"
    assert "secret WEATHER_API_KEY holds a character" in said and WEATHER_KEY not in said
    assert not base[1]  # nothing was sent


@pytest.mark.parametrize(
    ("path", "expected"),
    [("/charset?cs=rot13", {"a": 1}), ("/charset?cs=idna", {"a": 1})],
)
def test_a_charset_that_is_no_text_encoding_is_read_as_utf8(image, base, path, expected) -> None:
    get_tool(image, base[0], path)
    assert call(image, "h", "go")["json"] == expected


@pytest.mark.parametrize(
    ("path", "why"),
    [("/nan", "NaN is not a JSON value"), ("/overflow", "1e400 is beyond the largest number")],
)
def test_a_json_answer_that_is_no_number_is_refused(image, base, path, why) -> None:
    get_tool(image, base[0], path)
    with pytest.raises(ToolCallFailed) as failed:
        call(image, "h", "go")
    assert why in failed.value.message


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (tools.request("GET", "https://h/x", headers={"X-Note": "caf\u00e9"}), "printable ASCII"),
        (tools.request("GET", "https://h/x\ty"), "control characters"),
        (tools.request("GET", "https://h/x\x7f"), "control characters"),
        (tools.request("GET", "https://h/x", params={"q": "a\ud800"}), "lone surrogate"),
        (tools.request("POST", "https://h/x", json={"a\udfff": 1}), "lone surrogate"),
        (tools.request("POST", "https://h/x", json=["\ud800"]), "lone surrogate"),
        *[
            (tools.request("GET", "https://h/x", headers={name: "DELETE"}), "the client's")
            for name in (
                "X-HTTP-Method-Override",
                "x-method-override",
                "X-Forwarded-Host",
                "Forwarded",
                "Upgrade",
                "Accept-Encoding",
                "Expect",
                "TE",
                "Proxy-Connection",
            )
        ],
        (
            tools.request("GET", "https://h/x", secret_headers={"Upgrade": "env:K"}),
            "carries no secret",
        ),
        (tools.request("POST", "https://h/x", params={"_method": "DELETE"}), "override"),
        (tools.request("POST", "https://h/x", json={"_METHOD": "PUT", "a": 1}), "override"),
    ],
)
def test_a_request_httpx_cannot_send_or_that_gets_around_the_policy_is_refused(value, why) -> None:
    with pytest.raises(ValueError) as refused:
        tools.read_request(value)
    assert why in str(refused.value)


@pytest.mark.parametrize("value", ["inf", "1e12", "nan", "0", "-1"])
def test_a_tool_timeout_that_is_no_bound_is_refused_when_read(monkeypatch, value) -> None:
    """inf and 1e12 used to pass, and every call then failed in the clock ("timestamp out of
    range"), blamed on the method; every time limit among the settings is held to a week."""
    monkeypatch.setenv("BATOS_TOOLS_TIMEOUT", value)
    with pytest.raises(ConfigurationError) as refused:
        tools.ToolPolicy.from_settings()
    assert "BATOS_TOOLS_TIMEOUT" in str(refused.value)
    for name in (
        "tx_retry_seconds",
        "sandbox_seconds",
        "learning_train_seconds",
        "heartbeat_lease_seconds",
        "catalog_commit_seconds",
    ):
        monkeypatch.setenv(f"BATOS_{name.upper()}", value)
        with pytest.raises(ConfigurationError, match="at most 604800"):
            settings.get_float(name)
    monkeypatch.setenv("BATOS_AUDIT_DECAY", "inf")
    with pytest.raises(ConfigurationError, match="positive number"):
        settings.get_float("audit_decay")
