"""The schemas of effects and stored records (``graph.records``): a commit whose effect has a
field of the wrong type is refused before anything is written, also when a server client
writes it into a thread's state; a malformed record already in the image is skipped with a
warning by every reader — ``batos cycles``, the CEM window, the audit, ``batos audit report``
— which goes on with the others."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from BTrees.OOBTree import OOBTree
from fakes import FakeEmbedder, FakeModels, FakeRouter, ScriptedChatModel, image_digest
from test_mind import responder

from batos.errors import CheckpointError
from batos.shell.cli import main
from batos.shell.runtime import open_image
from graph import audit, cem, cycle
from graph.mind import MindServices, build_graph, run_config
from store.checkpoint import effects
from store.checkpoint.saver import ZODBSaver
from store.core import layout
from store.core.image import LivingImage


def services() -> MindServices:
    return MindServices(
        models=FakeModels(responder()), router=FakeRouter(("ROBIN",)), embedder=FakeEmbedder()
    )


@pytest.fixture
def image(file_uri: str) -> Iterator[LivingImage]:
    """A file image with two committed cycles, for the CLI and the audit to read."""
    living = open_image(file_uri, create=True)
    with ZODBSaver(living) as saver:
        graph = build_graph(services(), checkpointer=saver)
        for n, text in enumerate(("hello there", "hello again")):
            state = graph.invoke({"messages": [("user", text)]}, run_config(f"t{n}"))
            assert state["status"] == "COMPLETE", state.get("failure")
    yield living
    living.close()


def a_commit(image: LivingImage) -> dict[str, Any]:
    """A genuine commit, as the mind writes it (the last cycle's, under a new id)."""
    with ZODBSaver(image) as saver:
        graph = build_graph(services(), checkpointer=saver)
        commit = copy.deepcopy(graph.get_state(run_config("t1")).values["commit"])
    return {**commit, "id": "another-commit"}


def with_record(commit: dict[str, Any], **fields: Any) -> dict[str, Any]:
    found = copy.deepcopy(commit)
    (effect,) = [e for e in found["effects"] if e["kind"] == "cycle_record"]
    effect["record"].update(fields)
    return found


BAD_RECORDS = [
    ({"personas": 5}, "record.personas: Input should be a valid list"),
    ({"started": "yesterday"}, "record.started: Input should be a valid number"),
    ({"tokens": {"input": "12", "output": 3}}, "record.tokens.input: Input should be a valid"),
    ({"depth": "fast"}, "record.depth: Input should be a valid dictionary"),
    ({"seconds": float("nan")}, "record.seconds: Input should be a finite number"),
    ({"facets": [1, 2]}, "record.facets.0: Input should be a valid string"),
    ({"request_vector": [0.1, 0.2]}, "record.request_vector: List should have at least 384"),
    ({"response": "x" * 9000}, "record.response: String should have at most 8000"),
]


@pytest.mark.parametrize("fields,message", BAD_RECORDS, ids=[next(iter(f)) for f, _ in BAD_RECORDS])
def test_a_cycle_record_of_the_wrong_types_is_refused(image, fields, message) -> None:
    with pytest.raises(CheckpointError) as refused:
        effects.check(with_record(a_commit(image), **fields), cycle.EFFECT_KINDS)
    assert message in refused.value.message and "nothing was written" in refused.value.message
    assert refused.value.hint


BAD_EFFECTS = [
    ({"kind": "persona_stats", "persona": "ROBIN", "model_calls": True}, "model_calls"),
    ({"kind": "persona_stats", "persona": "ROBIN", "facets": {"facet_x": -1}}, "facets.facet_x"),
    ({"kind": "persona_stats", "persona": 7}, "persona: Input should be a valid string"),
    ({"kind": "catalog_retrieved", "chunks": [1, "2"]}, "chunks.1"),
    ({"kind": "memory", "namespace": [], "key": "k", "value": {}}, "namespace: List should"),
    ({"kind": "memory", "namespace": ["a"], "key": "k", "value": []}, "value: Input should"),
    ({"kind": "install_method", "persona": "ROBIN", "selector": "facet_x"}, "source: Field"),
    ({"kind": "catalog_retrieved", "chunks": [], "extra": 1}, "extra: Extra inputs"),
]


@pytest.mark.parametrize("effect,message", BAD_EFFECTS)
def test_every_effect_kind_is_checked_against_its_schema(effect, message) -> None:
    with pytest.raises(CheckpointError) as refused:
        effects.check({"id": "c1", "effects": [effect]}, cycle.EFFECT_KINDS)
    assert message in refused.value.message, refused.value.message


def test_a_record_may_carry_new_fields_within_the_size_bound(image) -> None:
    commit = a_commit(image)
    newer = with_record(commit, citations=[{"chunk": 3, "source": "a.md"}], answer_cut=True)
    assert effects.check(newer, cycle.EFFECT_KINDS)["id"] == "another-commit"
    huge = with_record(commit, citations=["x" * cycle.MAX_RECORD_BYTES])
    with pytest.raises(CheckpointError, match="the record is over"):
        image.transact(
            lambda root: effects.apply_commit(
                root, effects.check(huge, cycle.EFFECT_KINDS), ("t", "", ""), cycle.EFFECT_KINDS
            )
        )
    not_json = with_record(commit, later_field={"when": object()})
    with pytest.raises(CheckpointError, match="not plain JSON data"):
        image.transact(
            lambda root: effects.apply_commit(
                root, effects.check(not_json, cycle.EFFECT_KINDS), ("t", "", ""), cycle.EFFECT_KINDS
            )
        )


def test_a_server_client_writing_a_bad_commit_into_state_changes_nothing(image) -> None:
    before = image_digest(image.db, exclude=("checkpoints",))
    bad = with_record(a_commit(image), personas=5)
    with ZODBSaver(image) as saver:
        graph = build_graph(services(), checkpointer=saver)
        with pytest.raises(CheckpointError, match="record.personas"):
            graph.update_state(run_config("t1"), {"commit": bad}, as_node="complete")
    assert image_digest(image.db, exclude=("checkpoints",)) == before
    with image.read() as root:
        assert len(cycle.recent(root)) == 2


def plant(image: LivingImage, key: Any, where: str, value: Any) -> None:
    """Write a record straight into the image, around every check (a hand edit, an old bug)."""

    def write(root: Any) -> None:
        found = root.get(where)
        if found is None:
            from BTrees.IOBTree import IOBTree

            found = root[where] = IOBTree() if isinstance(key, int) else OOBTree()
        found[key] = value

    image.transact(write, note=f"test: a malformed {where} record")


def malformed_cycle(image: LivingImage) -> dict[str, Any]:
    with image.read() as root:
        good = dict(root[layout.CYCLES].values()[0])
    return {**good, "personas": 5, "started": "yesterday", "tokens": {"input": "many"}}


def test_a_malformed_cycle_record_is_skipped_by_every_reader(image, capsys, caplog) -> None:
    plant(image, "zzzz-malformed", layout.CYCLES, malformed_cycle(image))
    plant(image, "zzzz-older", layout.CYCLES, {"personas": ["BRICK"], "facets": []})
    caplog.set_level(logging.WARNING, logger="batos.records")
    with image.read() as root:
        listed = cycle.recent(root, 10)
        assert [r["id"] for r in listed][:1] == ["zzzz-older"]  # older, fewer fields: kept
        assert "zzzz-malformed" not in {r["id"] for r in listed} and len(listed) == 3
        assert cycle.get(root, "zzzz-malformed") is None
        assert cycle.vectors(root, "zzzz-malformed") == (None, None)
        assert len(cem.window(root, 10)) == 3
    assert "cycle record 'zzzz-malformed' is malformed and was skipped" in caplog.text
    assert "personas: Input should be a valid list" in caplog.text
    uri = image.uri
    image.close()
    for argv in (["cycles"], ["cycles", "--json"], ["cycles", "-n", "1"]):
        code = main(["--image", uri, *argv])
        out, err = capsys.readouterr()
        assert code == 0 and "Traceback" not in out + err, err
    code = main(["--image", uri, "cycles", "--json"])
    rows = json.loads(capsys.readouterr().out)["committed"]
    assert len(rows) == 3 and "zzzz-malformed" not in {r["id"] for r in rows}


def alfred(persona: str, **options: Any) -> ScriptedChatModel:
    return ScriptedChatModel().enqueue(*(["Steady."] if persona == "ALFRED" else []))


def test_the_audit_goes_on_past_malformed_records(image, capsys, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="batos.records")
    first = audit.run(image, alfred)
    plant(image, "zzzz-malformed", layout.CYCLES, malformed_cycle(image))
    plant(image, 99, layout.AUDIT_REPORTS, {**first, "id": 99, "metrics": {"cycles": "two"}})
    plant(image, 7, layout.MISSIONS, {"id": 7, "status": "pending", "hypothesis": 3})
    second = audit.run(image, alfred)
    assert second["metrics"]["cycles"] == 2  # the malformed cycle is not counted
    assert second["previous"] == first["id"]  # the newest well-formed report
    for fragment in ("cycle record 'zzzz-malformed'", "audit report 99", "mission 7"):
        assert fragment in caplog.text
    uri = image.uri
    image.close()
    for argv in (["audit", "report"], ["audit", "report", "--json"], ["audit", "show", "1"]):
        code = main(["--image", uri, *argv])
        out, err = capsys.readouterr()
        assert code == 0 and "Traceback" not in out + err, (argv, err)
    code = main(["--image", uri, "audit", "show", "99"])
    out, err = capsys.readouterr()
    assert code != 0 and "audit report 99 is malformed" in " ".join(err.split())


def test_what_a_cycle_degraded_is_typed_in_its_record(image) -> None:
    commit = a_commit(image)
    good = with_record(
        commit,
        degraded=[{"where": "facet", "what": "BRICK.facet_steps", "reason": "not written"}],
        truncated=True,
        cited=["a.md:0-10"],
    )
    assert effects.check(good, cycle.EFFECT_KINDS)["id"] == "another-commit"
    twice = {"where": "facet", "what": "BRICK.facet_steps", "reason": "not written", "times": 2}
    assert effects.check(with_record(commit, degraded=[twice]), cycle.EFFECT_KINDS)
    for bad in (
        {"degraded": [{"where": "facet"}]},
        {"degraded": [{**twice, "times": 1}]},
        {"degraded": [{**twice, "times": "2"}]},
        {"degraded": "everything"},
        {"truncated": "yes"},
        {"cited": [3]},
    ):
        with pytest.raises(CheckpointError, match="record"):
            effects.check(with_record(commit, **bad), cycle.EFFECT_KINDS)
