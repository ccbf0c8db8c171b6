"""What Studio draws for each graph: input forms with the fields a user fills in, choices
where the runtime takes a fixed set, and schemas the server can render on Python 3.11."""

from __future__ import annotations

import warnings

from graph import audit, jit, mind
from prototypes.codex import PERSONAS
from store.core.image import LivingImage


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
        schema = graph.get_input_jsonschema()
        assert schema["title"] == "AuditState" and "metrics" in schema["properties"]
        assert "narrative" in graph.get_output_jsonschema()["properties"]
