"""The CPU router: accuracy on held-out requests, calibration, the chosen rule, the image.

Trains on the shipped codex with the real all-MiniLM-L6-v2 encoder (a few seconds); the held-out
requests in tests/data/router_heldout.toml were written apart from the codex's examples.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import threading
import tomllib
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from batos.errors import RoutingError
from batos.shell.cli import main
from graph.router import (
    FLOOR,
    MARGIN,
    MAX_CHOSEN,
    Route,
    Router,
    choose,
    load_router,
    prefetch_runner_up,
    train_router,
)
from prototypes.codex import PERSONAS, load_codex
from store.core import layout
from store.core.image import LivingImage
from store.knowledge.embeddings import FLOAT32, INT8, Embedder

HELDOUT = Path(__file__).parent / "data" / "router_heldout.toml"
SHIPPED = resources.files("prototypes").joinpath("codex.toml").read_text(encoding="utf-8")


def heldout() -> list[tuple[str, str]]:
    data = tomllib.loads(HELDOUT.read_text(encoding="utf-8"))
    return [(text, name) for name in PERSONAS for text in data[name]["requests"]]


def codex_with(version: int | None = None, extra: dict[str, str] | None = None):
    """The shipped codex at another version, or with one more example for some personas."""
    text = SHIPPED
    shipped = load_codex().version
    if version is not None:
        text = text.replace(f"version = {shipped}", f"version = {version}", 1)
    for name, example in (extra or {}).items():
        header = f"[personas.{name}.router]\nexamples = [\n"
        text = text.replace(header, header + f"  {json.dumps(example)},\n", 1)
    return load_codex(text)


@pytest.fixture(scope="module")
def router() -> Router:
    return train_router(load_codex())


def test_codex_has_enough_varied_examples_and_none_are_held_out():
    codex = load_codex()
    seen = set()
    for spec in codex.personas.values():
        assert len(spec.router_examples) >= 60
        assert len(set(spec.router_examples)) == len(spec.router_examples)
        seen.update(spec.router_examples)
    cases = heldout()
    assert all(sum(1 for _, n in cases if n == p) >= 25 for p in PERSONAS)
    assert not seen & {text for text, _ in cases}


def test_heldout_top1_accuracy_is_above_the_floor(router):
    cases = heldout()
    routes = router.route_many([text for text, _ in cases])
    hits = [r.best == name for r, (_, name) in zip(routes, cases, strict=True)]
    assert sum(hits) / len(hits) >= 0.85
    for persona in PERSONAS:  # no persona is sacrificed for the others
        own = [h for h, (_, name) in zip(hits, cases, strict=True) if name == persona]
        assert sum(own) / len(own) >= 0.7, persona


def test_cross_validation_picked_c_and_temperature_on_training_data(router):
    info = router.info
    assert info["examples"] == sum(len(s.router_examples) for s in load_codex().personas.values())
    assert info["cv_accuracy"] >= 0.85
    assert 0 < info["cv_log_loss"] < math.log(4)  # better than knowing nothing
    assert 0.05 < router.temperature < 20


def test_every_persona_is_ranked_with_probabilities_summing_to_one(router):
    found = router.route("I feel like nobody understands me")
    names = [p for p, _ in found.ranked]
    scores = [s for _, s in found.ranked]
    assert sorted(names) == sorted(PERSONAS)
    assert scores == sorted(scores, reverse=True)
    assert math.isclose(sum(scores), 1.0, abs_tol=1e-5)
    assert all(0 <= s <= 1 for s in scores)
    assert found.best == "ROBIN" and found.chosen[0] == "ROBIN"
    assert found.runner_up == names[1]


def test_route_vector_is_the_int8_encoders_normalised_embedding(router):
    text = "write a function that merges two dictionaries"
    found = router.route(text)
    assert router.embedder.encoder == INT8 == router.info["encoder"]
    assert found.vector.dtype == np.float32 and found.vector.shape == (384,)
    assert math.isclose(float(np.linalg.norm(found.vector)), 1.0, rel_tol=1e-4)
    assert np.allclose(found.vector, Embedder(INT8).encode_one(text), atol=1e-5)


@pytest.mark.parametrize("greeting", ["hi there", "good morning"])
def test_a_plain_greeting_goes_to_robin(router, greeting):
    # Neither text is among the codex's examples; its small-talk examples teach the kind.
    assert greeting not in {t for s in load_codex().personas.values() for t in s.router_examples}
    assert router.route(greeting).best == "ROBIN"


def test_routing_in_a_fresh_process_never_imports_torch(file_uri, router):
    with LivingImage.open(file_uri) as image:
        load_router(image, embedder=router.embedder)
    script = (
        "import sys\n"
        "from graph.router import load_router\n"
        "from store.core.image import LivingImage\n"
        f"with LivingImage.open({file_uri!r}) as image:\n"
        "    found = load_router(image).route('is the heartbeat running?')\n"
        "print(found.best, 'torch' in sys.modules, 'sklearn' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=root
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ALFRED", "False", "False"]


def test_without_the_int8_file_routing_falls_back_to_float32_and_says_so(
    router, tmp_path, monkeypatch, caplog
):
    import graph.router as router_module

    monkeypatch.setenv("BATOS_MODEL_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(router_module, "_embedder", None)  # the process's choice, made afresh
    with caplog.at_level("WARNING", logger="batos.router"):
        fallback = router_module.routing_embedder()
        reader = Router(
            router.personas,
            router.weights,
            router.bias,
            router.temperature,
            codex_version=router.codex_version,
            digest=router.digest,
            info=router.info,
        )
    assert fallback.encoder == FLOAT32 and reader.embedder is fallback
    assert "int8 encoder" in caplog.text and "python -m store.knowledge.encoder_onnx" in caplog.text
    assert "fitted on minilm-int8 vectors but reads requests with minilm-float32" in caplog.text
    assert not (tmp_path / "empty").exists()  # nothing was built on the routing path
    text = "why do I feel so lonely lately?"
    assert reader.route(text).best == router.route(text).best == "ROBIN"


def test_route_many_matches_route_one_by_one(router):
    texts = ["is the heartbeat running?", "who wrote Middlemarch?", "sort this list for me"]
    batched = router.route_many(texts)
    for text, route in zip(texts, batched, strict=True):
        alone = router.route(text)
        assert route.text == text and route.chosen == alone.chosen
        assert [p for p, _ in route.ranked] == [p for p, _ in alone.ranked]
        assert np.allclose([s for _, s in route.ranked], [s for _, s in alone.ranked], atol=1e-4)
    assert batched[0] == batched[0] and len({batched[0], batched[1]}) == 2  # comparable, hashable


def test_a_request_spanning_two_personas_is_answered_by_both():
    ranked = (("BABS", 0.48), ("BRICK", 0.40), ("ALFRED", 0.08), ("ROBIN", 0.04))
    assert choose(ranked) == ("BABS", "BRICK")


@pytest.mark.parametrize(
    ("ranked", "expected"),
    [
        ((("ROBIN", 0.9), ("BRICK", 0.05), ("BABS", 0.03), ("ALFRED", 0.02)), ("ROBIN",)),
        # within the margin but under the floor: not enough on its own
        ((("ROBIN", 0.4), ("BRICK", 0.24), ("BABS", 0.2), ("ALFRED", 0.16)), ("ROBIN",)),
        # over the floor but further than the margin
        ((("ALFRED", 0.7), ("BABS", 0.28), ("BRICK", 0.01), ("ROBIN", 0.01)), ("ALFRED",)),
        # exactly at the margin and the floor: included
        ((("BRICK", 0.45), ("BABS", 0.25), ("ALFRED", 0.2), ("ROBIN", 0.1)), ("BRICK", "BABS")),
        # three close ones: at most MAX_CHOSEN answer
        ((("ROBIN", 0.34), ("BABS", 0.33), ("BRICK", 0.33), ("ALFRED", 0.0)), ("ROBIN", "BABS")),
        ((), ()),
    ],
)
def test_chosen_rule(ranked, expected):
    assert FLOOR == 0.25 and MARGIN == 0.2 and MAX_CHOSEN == 2  # the documented rule
    assert choose(ranked) == expected


def test_chosen_rule_takes_other_limits():
    ranked = (("ROBIN", 0.34), ("BABS", 0.33), ("BRICK", 0.3), ("ALFRED", 0.03))
    assert choose(ranked, most=3) == ("ROBIN", "BABS", "BRICK")
    assert choose(ranked, margin=0.0) == ("ROBIN",)


@pytest.mark.parametrize("bad", ["", "   \n\t", None, 42])
def test_bad_requests_are_refused(router, bad):
    with pytest.raises(RoutingError):
        router.route(bad)
    with pytest.raises(RoutingError):
        router.route_many(["fine", bad])


def test_a_huge_request_is_routed_on_its_beginning(router):
    text = "why do I feel so restless? " * 50_000
    found = router.route(text)
    assert found.best == "ROBIN" and found.text == text


def test_too_few_examples_cannot_train():
    lean = SHIPPED
    start = lean.index("[personas.BABS.router]")
    end = lean.index("]", lean.index("examples = [", start) + len("examples = ["))
    lean = lean[:start] + '[personas.BABS.router]\nexamples = ["find it"' + lean[end:]
    with pytest.raises(RoutingError, match="BABS has 1 router examples"):
        train_router(load_codex(lean))


# --- the router in the image ---------------------------------------------------------------


def _trainings(image: LivingImage) -> int:
    return sum("router: trained" in r.description for r in image.history(100))


def test_stored_with_codex_version_and_reloaded_without_training(file_uri, router):
    codex = load_codex()
    with LivingImage.open(file_uri) as image:
        first = load_router(image, embedder=router.embedder)
        assert load_router(image) is first  # cached on the stored record
        with image.read() as root:
            record = root[layout.ROUTER]
            assert record["codex_version"] == codex.version == first.codex_version
            assert isinstance(record["weights"], bytes)
        assert _trainings(image) == 1
    with LivingImage.open(file_uri) as image:  # a new process would see the same
        again = load_router(image, embedder=router.embedder)
        assert _trainings(image) == 1
    text = "what is the boiling point of mercury?"
    assert again is not first and again.digest == first.digest
    assert np.allclose(
        [s for _, s in again.route(text).ranked], [s for _, s in first.route(text).ranked]
    )


def test_retrained_when_the_codex_version_or_examples_change(file_uri, router):
    shipped = load_codex()
    with LivingImage.open(file_uri) as image:
        first = load_router(image, embedder=router.embedder)
        newer = load_router(image, codex=codex_with(shipped.version + 1))
        assert newer.codex_version == shipped.version + 1
        assert _trainings(image) == 2
        with image.read() as root:
            assert root[layout.ROUTER]["codex_version"] == shipped.version + 1
        edited = codex_with(shipped.version + 1, {"ROBIN": "my garden makes me feel alive"})
        third = load_router(image, codex=edited)
        assert third.digest not in (first.digest, newer.digest)
        assert _trainings(image) == 3
        assert load_router(image, codex=edited) is third


def test_a_router_stored_by_another_process_is_picked_up(file_uri, router):
    with LivingImage.open(file_uri) as image:
        first = load_router(image, embedder=router.embedder)
        other = first.to_record()
        other["bias"] = np.array([9, 0, 0, 0], dtype="<f4").tobytes()  # favours the first persona
        image.transact(lambda root: root.__setitem__(layout.ROUTER, other))
        picked = load_router(image)
        assert picked is not first
        assert picked.route("sort a list").best == first.personas[0]
        assert _trainings(image) == 1  # taken as stored, not trained again


def test_a_damaged_stored_router_is_trained_again(file_uri, router):
    with LivingImage.open(file_uri) as image:
        load_router(image, embedder=router.embedder)

        def damage(root):
            root[layout.ROUTER]["weights"] = b"\x00" * 12

        image.transact(damage)
        repaired = load_router(image, embedder=router.embedder)
        assert repaired.route("is BAT OS healthy?").best == "ALFRED"
        assert _trainings(image) == 2
        with image.read() as root:
            assert len(root[layout.ROUTER]["weights"]) == 4 * 384 * 4


def test_record_checks_refuse_damage(router):
    record = dict(router.to_record())
    Router.from_record(record)
    for key, value in (
        ("personas", ("ROBIN", "BRICK", "BABS", "JOKER")),
        ("temperature", float("nan")),
        ("temperature", -1.0),
        ("bias", b"\x00" * 3),
        ("format", 99),
    ):
        with pytest.raises(RoutingError, match="damaged"):
            Router.from_record({**record, key: value})
    with pytest.raises(RoutingError, match="damaged"):
        Router.from_record({k: v for k, v in record.items() if k != "weights"})


# --- prefetch ------------------------------------------------------------------------------


class FakeEngine:
    """Stands in for batos.models.engine.Engine: records what it was asked to prefetch."""

    def __init__(self, gguf: Path) -> None:
        self.gguf = gguf
        self.asked: list[tuple[Path, ...]] = []

    def prefetch(self, adapters):
        self.asked.append(tuple(adapters))
        thread = threading.Thread(target=lambda: None)
        thread.start()
        return thread


def _route(*ranked: tuple[str, float]) -> Route:
    return Route("text", ranked, choose(ranked), None)


def test_prefetch_loads_the_runner_ups_adapter_on_a_loaded_engine():
    from store.core.model_files import catalog

    eng = FakeEngine(Path("/models") / catalog()["test"].filename)
    other = FakeEngine(Path("/models/custom.gguf"))
    route = _route(("BRICK", 0.6), ("BABS", 0.3), ("ROBIN", 0.05), ("ALFRED", 0.05))
    assert prefetch_runner_up(route, engines=[other, eng]) is not None
    assert [[p.name for p in asked] for asked in eng.asked] == [["babs.gguf"]]
    assert eng.asked[0][0].parent.name == "test" and not other.asked


def test_prefetch_does_nothing_without_a_loaded_engine_or_runner_up():
    from store.core.model_files import catalog

    route = _route(("BRICK", 0.6), ("BABS", 0.3), ("ROBIN", 0.05), ("ALFRED", 0.05))
    assert prefetch_runner_up(route, engines=[]) is None
    custom = FakeEngine(Path("/models/custom.gguf"))  # no trained adapters for a custom GGUF
    assert prefetch_runner_up(route, engines=[custom]) is None and not custom.asked
    lone = FakeEngine(Path("/models") / catalog()["test"].filename)
    assert prefetch_runner_up(_route(("BRICK", 1.0)), engines=[lone]) is None


def test_prefetch_in_a_process_without_a_model_loads_nothing():
    script = (
        "import sys\n"
        "from graph.router import Route, prefetch_runner_up\n"
        "route = Route('t', (('BRICK', 0.6), ('BABS', 0.4)), ('BRICK', 'BABS'))\n"
        "assert prefetch_runner_up(route) is None\n"
        "assert 'batos.models.engine' not in sys.modules and 'llama_cpp' not in sys.modules\n"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr


def test_prefetch_never_fails_the_route(monkeypatch):
    from store.core.model_files import catalog

    monkeypatch.setenv("BATOS_MODELFILES", "/nonexistent/modelfiles")
    eng = FakeEngine(Path("/models") / catalog()["test"].filename)
    route = _route(("BRICK", 0.6), ("BABS", 0.3), ("ROBIN", 0.05), ("ALFRED", 0.05))
    assert prefetch_runner_up(route, engines=[eng]) is None and not eng.asked


@pytest.mark.model
def test_prefetch_puts_the_adapter_in_ram_of_the_real_engine(router):
    from batos.models.engine import engine
    from store.core.model_files import model_path

    eng = engine(model_path("test"))
    route = router.route("find the paper that first described CRISPR")
    thread = prefetch_runner_up(route)
    assert thread is not None
    thread.join(timeout=60)
    assert f"{route.runner_up.lower()}.gguf" in [p.name for p in eng.loaded_adapters()]


# --- batos route ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image_arg(tmp_path_factory) -> list[str]:
    """One image for the command's tests: its router is trained once, on the first route."""
    uri = f"file://{tmp_path_factory.mktemp('route') / 'live_image.fs'}"
    assert main(["--image", uri, "init"]) == 0
    return ["--image", uri]


def test_cli_route_json_lines(capsys, image_arg):
    capsys.readouterr()
    texts = ["why does my chest ache when I think of her?", "how tall is Mont Blanc?"]
    assert main([*image_arg, "route", "--json", *texts]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["text"] for line in lines] == texts
    for line in lines:
        assert sorted(p["persona"] for p in line["personas"]) == sorted(PERSONAS)
        scores = [p["score"] for p in line["personas"]]
        assert scores == sorted(scores, reverse=True)
        assert math.isclose(sum(scores), 1.0, abs_tol=1e-3)
        assert line["chosen"][0] == line["personas"][0]["persona"]
    assert [line["personas"][0]["persona"] for line in lines] == ["ROBIN", "BABS"]


def test_cli_route_table_and_files(capsys, image_arg, tmp_path, monkeypatch):
    requests = tmp_path / "requests.txt"
    requests.write_text("write a linked list in C\n\n   \nwhat did the last audit find?\n")
    assert main([*image_arg, "route", "--file", str(requests)]) == 0
    out = capsys.readouterr().out
    assert "write a linked list in C" in out and "ALFRED" in out and "codex version" in out
    monkeypatch.setattr("sys.stdin", io.StringIO("who painted Guernica?\n"))
    assert main([*image_arg, "route", "--json", "-f", "-", "and one more"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["text"] for line in lines] == ["and one more", "who painted Guernica?"]


def test_cli_route_errors(capsys, image_arg, tmp_path, monkeypatch):
    from batos.shell.cli import route as route_cli

    def fails(*argv: str, match: str) -> None:
        assert main([*image_arg, "route", *argv]) == RoutingError.exit_code
        captured = capsys.readouterr()
        assert match in " ".join(captured.err.split()) and not captured.out

    fails("", match="request 1 is empty")
    fails(match="no request given")
    fails("--file", str(tmp_path / "missing.txt"), match="cannot read requests")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    fails("--file", str(binary), match="not UTF-8")
    monkeypatch.setattr(route_cli, "MAX_FILE_BYTES", 100)
    big = tmp_path / "big.txt"
    big.write_text("how do I sort?\n" * 20)
    fails("--file", str(big), match="the most read is 100")
    monkeypatch.setattr("sys.stdin", io.StringIO("x" * 101))
    fails("--file", "-", match="more than 100 characters")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    fails("--file", str(empty), match="no request given")


def test_cli_route_needs_an_existing_image(capsys, tmp_path):
    missing = f"file://{tmp_path / 'nowhere' / 'live_image.fs'}"
    assert main(["--image", missing, "route", "hello"]) == 3
    assert "batos --image" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_priors_in_the_image_shift_the_route_and_their_undo_takes_it_back(file_uri, router):
    from graph.router import MAX_PRIOR

    text = "what is the boiling point of mercury?"
    with LivingImage.open(file_uri) as image:
        plain = load_router(image, embedder=router.embedder)
        before = dict(plain.route(text).ranked)
        low = min(before, key=before.get)
        image.transact(lambda root: root.__setitem__(layout.ROUTER_PRIORS, {}), note="room")

        def raise_prior(root):
            root[layout.ROUTER_PRIORS] = {low: 99.0, "NOBODY": 5.0}

        image.transact(raise_prior, note="prior")
        shifted = load_router(image)
        assert shifted.priors == {low: MAX_PRIOR}  # clipped; unknown personas ignored
        after = dict(shifted.route(text).ranked)
        assert after[low] > before[low] and shifted.embedder is plain.embedder
        image.undo(next(r.tid for r in image.history(5) if r.description == "prior"))
        back = dict(load_router(image).route(text).ranked)
        assert back == pytest.approx(before)
