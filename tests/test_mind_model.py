"""The mind end to end on the real test model (SmolLM2-135M through llama.cpp), on a fresh
image whose facets are not written: every kind of request ends COMPLETE, degraded where a
part could not serve, never FAILED while an answer can be given."""

from __future__ import annotations

import pytest

from batos.shell.runtime import ask, open_image

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.mark.parametrize(
    ("request_text", "depth"),
    [
        ("how do I plan a vegetable garden?", "full"),  # the README's example
        ("A bakery sells 36 muffins a day at $2.75 each. How much in two weeks?", None),
        ("hello there", None),
    ],
)
def test_requests_complete_on_the_test_model(file_uri: str, request_text: str, depth) -> None:
    with open_image(file_uri, create=True) as image:
        state = ask(request_text, image=image, depth=depth)
    assert state["status"] == "COMPLETE", state.get("failure")
    assert state["response"].strip()
    cycle = state["cycle"]
    for entry in cycle["degraded"]:  # each degradation says where, what and why
        assert entry["where"] and entry["what"] and entry["reason"]
    if "muffins" in request_text:
        assert cycle["compute"] is True
        [partial] = [p for p in state["partials"] if p["facet"] == "compute"]
        assert partial["kind"] == "computed"  # right, or degraded with its reason
        assert partial["ok"] or "could not be run" in partial["degraded"]
