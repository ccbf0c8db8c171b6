"""What Studio draws for each graph: input forms with the fields a user fills in, choices
where the runtime takes a fixed set, and schemas the server can render on Python 3.11."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest
from servers import serving

from batos.errors import ConfigurationError
from batos.shell.runtime import open_image
from graph import audit, jit, mind
from prototypes.codex import PERSONAS
from store.core.image import LivingImage, acquire_shared, release_shared
from store.core.zeo import free_port

REPO = Path(__file__).resolve().parents[1]


def test_the_jit_form_asks_only_for_the_selector() -> None:
    schema = jit.graph.get_input_jsonschema()
    assert list(schema["properties"]) == ["selector"] and schema["required"] == ["selector"]
    assert {"question", "answer", "status"} <= set(jit.graph.get_output_jsonschema()["properties"])


def test_the_minds_persona_is_a_choice_of_the_codexs_personas() -> None:
    persona = mind.graph.get_context_jsonschema()["properties"]["persona"]
    assert persona["enum"] == list(PERSONAS)


def test_the_audit_graphs_schemas_render() -> None:
    with LivingImage.open("memory://") as image, warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic's "use typing_extensions.TypedDict" warning
        graph = audit.build_graph(image)
        assert graph.get_input_jsonschema()["title"] == "AuditInput"
        schema = graph.get_output_jsonschema()
        assert schema["title"] == "AuditState" and "narrative" in schema["properties"]


def test_the_audit_form_asks_for_nothing_and_takes_no_context() -> None:
    with LivingImage.open("memory://") as image:
        graph = audit.build_graph(image)
        assert graph.get_input_jsonschema()["properties"] == {}
        assert graph.get_context_jsonschema()["properties"] == {}


def test_a_dev_server_detecting_blocking_calls_is_told_to_allow_them_for_zeo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LANGGRAPH_ALLOW_BLOCKING", "false")  # how langgraph dev says it is on
    with pytest.raises(ConfigurationError, match="blocking-call detector") as found:
        acquire_shared("zeo://127.0.0.1:9")
    assert "--allow-blocking" in (found.value.hint or "")
    # other images do no blocking in a loop of their own
    image = acquire_shared("memory://studio-forms")
    try:
        assert image.uri == "memory://studio-forms"
    finally:
        release_shared("memory://studio-forms")


#: Per served graph: the only fields a client may fill in to start a run. Every other state
#: field is written by the graph's nodes.
CLIENT_FIELDS = {"mind": {"messages"}, "jit": {"selector"}, "audit": set()}


@pytest.mark.slow
def test_every_served_graph_has_forms_studio_can_draw(tmp_path: Path) -> None:
    from langgraph_sdk import get_sync_client

    served = json.loads((REPO / "langgraph.json").read_text())["graphs"]
    assert set(served) == set(CLIENT_FIELDS)
    port = free_port()
    env = {
        **os.environ,
        "BATOS_IMAGE": f"file://{tmp_path / 'image' / 'live_image.fs'}",
        "LANGSMITH_TRACING": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "PYTHONPATH": str(REPO),
    }
    command = [sys.executable, "-m", "batos.shell.cli", "serve", "--port", str(port)]
    open_image(env["BATOS_IMAGE"], create=True).close()  # as 'batos init' would
    with serving(
        command, port=port, cwd=REPO, env=env, log_path=tmp_path / "server.log", timeout=180
    ) as base:
        client = get_sync_client(url=base)
        for name in served:
            [assistant] = client.assistants.search(graph_id=name)
            schemas = client.assistants.get_schemas(assistant["assistant_id"])
            for kind in ("input_schema", "output_schema", "context_schema"):
                assert isinstance(schemas[kind], dict), f"{name}: no {kind}"
                assert schemas[kind]["type"] == "object", f"{name}: {kind}"
            fields = set(schemas["input_schema"]["properties"])
            assert fields == CLIENT_FIELDS[name], f"{name} asks for {sorted(fields)}"
            state = set(schemas["state_schema"]["properties"])
            assert CLIENT_FIELDS[name] <= state and set(schemas["output_schema"]["properties"])
        mind_context = client.assistants.get_schemas(
            client.assistants.search(graph_id="mind")[0]["assistant_id"]
        )["context_schema"]["properties"]
        assert mind_context["persona"]["enum"] == list(PERSONAS)
        assert mind_context["depth"]["enum"] == ["auto", "fast", "full"]
