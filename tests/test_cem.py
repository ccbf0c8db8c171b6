"""The CEM's formulas on constructed cycle histories whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from graph import cem


def unit(*xs: float) -> np.ndarray:
    v = np.zeros(384, dtype=np.float32)
    v[: len(xs)] = xs
    return v


def rec(personas=("BRICK",), facets=(), written=(), q=None, a=None) -> dict:
    return {
        "personas": list(personas),
        "facets": list(facets),
        "methods_written": list(written),
        "request_vector": q,
        "response_vector": a,
    }


def test_relevance_is_the_mean_clipped_cosine() -> None:
    records = [
        rec(q=unit(1, 0), a=unit(1, 0)),  # 1
        rec(q=unit(1, 0), a=unit(1, 1)),  # cos 45° = 0.7071
        rec(q=unit(1, 0), a=unit(-1, 0)),  # -1 → 0
        rec(q=None, a=unit(1, 0)),  # skipped
    ]
    assert cem.relevance(records) == pytest.approx((1 + math.sqrt(0.5) + 0) / 3, abs=1e-6)
    assert cem.relevance([rec()]) is None


def test_diversity_one_persona_is_zero_all_four_even_is_one() -> None:
    assert cem.diversity([rec(("BRICK",))] * 5) == 0.0
    even = [rec((p,)) for p in ("BRICK", "ROBIN", "BABS", "ALFRED")]
    assert cem.diversity(even) == pytest.approx(1.0)
    # Two personas evenly: ln 2 / ln 4 = 0.5. Facets: two of four declared, evenly → 0.5.
    two = [rec(("BRICK",), ["BRICK.facet_a"]), rec(("ROBIN",), ["ROBIN.facet_b"])]
    assert cem.diversity(two, facet_space=4) == pytest.approx(0.5)
    assert cem.diversity([]) is None


def test_novelty_repeating_scores_zero_orthogonal_scores_one() -> None:
    same = [rec(a=unit(1, 0)) for _ in range(3)]
    assert cem.novelty(same) == 0.0
    fresh = [rec(a=unit(1, 0, 0)), rec(a=unit(0, 1, 0)), rec(a=unit(0, 0, 1))]
    assert cem.novelty(fresh) == 1.0
    # Second answer at 60° from the first: 1 - 0.5.
    assert cem.novelty([rec(a=unit(1, 0)), rec(a=unit(0.5, math.sqrt(0.75)))]) == pytest.approx(
        0.5, abs=1e-6
    )
    assert cem.novelty([rec(a=unit(1, 0))]) is None


def test_structure_coverage_and_grown_share() -> None:
    records = [
        rec(facets=["BRICK.facet_a", "BRICK.facet_a"], written=["BRICK.facet_a"]),
        rec(facets=["BABS.facet_b"]),
    ]
    # coverage 2/8 = 0.25; grown: 2 of 3 calls served by a written method → (0.25+2/3)/2.
    assert cem.structure(records, 8) == pytest.approx((0.25 + 2 / 3) / 2, abs=1e-6)
    assert cem.structure(records, 8, methods={"BABS.facet_b"}) == pytest.approx(
        (0.25 + 1) / 2, abs=1e-6
    )
    assert cem.structure([rec()], 8) is None


def test_weighted_sum_over_defined_components() -> None:
    records = [rec(("BRICK",), q=unit(1, 0), a=unit(1, 0)), rec(("ROBIN",), a=unit(0, 1))]
    m = cem.compute(records, weights={"H_rel": 1, "H_cog": 1, "H_sol": 2, "H_struc": 1})
    assert m.H_rel == 1.0 and m.H_cog == pytest.approx(0.5) and m.H_sol == 1.0
    assert m.H_struc is None
    assert m.cem == pytest.approx((1 + 0.5 + 2) / 4)
    assert cem.compute([]).cem is None


def test_persona_protocols_show_in_their_components() -> None:
    # BRICK invents (answers unlike earlier ones); ALFRED repeats himself.
    records = [
        rec(("ALFRED",), a=unit(1, 0, 0)),
        rec(("BRICK",), a=unit(0, 1, 0)),
        rec(("ALFRED",), a=unit(1, 0, 0)),
        rec(("BRICK",), a=unit(0, 0, 1)),
    ]
    by = cem.compute(records).by_persona
    assert by["BRICK"]["H_sol_mean"] == 1.0 and by["ALFRED"]["H_sol_mean"] == 0.0
    assert by["BRICK"]["share"] == 0.5 and by["ROBIN"]["share"] == 0.0
    assert by["ALFRED"]["H_cog_term"] == pytest.approx(0.25)
    assert cem.TIES["ROBIN"] == "H_cog" and cem.TIES["BABS"] == "H_sol"


def test_parse_weights_rejects_bad_text() -> None:
    assert cem.parse_weights("1,0,0,0")["H_rel"] == 1.0
    for bad in ("1,2,3", "0,0,0,0", "-1,1,1,1", "a,b,c,d", "nan,1,1,1", "1e308,1e308,1,1"):
        with pytest.raises(ValueError):
            cem.parse_weights(bad)


def test_weights_near_the_float_maximum_are_normalised_to_sum_one() -> None:
    weights = cem.normalised({"H_rel": 1e308, "H_cog": 1e308, "H_sol": 1.0, "H_struc": 1.0})
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["H_rel"] == pytest.approx(weights["H_cog"]) and weights["H_rel"] > 0.4
    assert weights["H_sol"] == pytest.approx(weights["H_struc"]) == pytest.approx(cem.MIN_WEIGHT)


def test_readings_are_compared_like_for_like() -> None:
    weights = cem.DEFAULT_WEIGHTS
    even = [rec((p,), q=unit(1, 0), a=unit(1, 0)) for p in ("BRICK", "ROBIN", "BABS", "ALFRED")]
    before = cem.compute(even, facet_space=8).as_dict()
    assert before["H_struc"] is None and before["H_cog_facets"] is None
    # The same cycles with one facet called all the time: H_struc enters the mean, low, and
    # H_cog averages in a facet entropy of 0.
    after = cem.compute([{**r, "facets": ["BRICK.facet_a"]} for r in even], facet_space=8)
    later = after.as_dict()
    assert later["H_struc"] == pytest.approx(1 / 16) and later["H_cog"] == pytest.approx(0.5)
    assert later["cem"] < before["cem"] - 0.2
    # Nothing that both readings measure alike moved.
    assert cem.change(before, later, weights) == 0.0
    assert cem.changes(before, later) == {"H_rel": 0.0, "H_cog": 0.0, "H_sol": 0.0, "H_struc": None}
    # A reading from before the parts were kept: its persona terms tell them.
    old = {k: v for k, v in later.items() if k not in ("H_cog_personas", "H_cog_facets")}
    assert cem.cog_parts(old) == (pytest.approx(1.0), True)
    assert cem.changes(before, old)["H_cog"] == pytest.approx(0.0, abs=1e-5)
    # Same definition on both sides: H_cog is compared as it is.
    assert cem.changes(later, later)["H_cog"] == 0.0 and not cem.cog_redefined(later, old)
    assert cem.change({"H_rel": 0.5}, {"H_sol": 0.5}, weights) is None
