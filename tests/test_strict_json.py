"""The one strict JSON reader every boundary uses: JSON in, the same values out; what JSON
does not allow (NaN, infinities, numbers past a float) refused with the literal named."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prototypes.bounded import NotStrictJSON, strict_json

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**99), max_value=10**99)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_any_json_reads_as_pythons_reader_reads_it(value) -> None:
    text = json.dumps(value)
    assert strict_json(text) == json.loads(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("NaN", "NaN is not a JSON value"),
        ('{"a": [-Infinity]}', "-Infinity is not a JSON value"),
        ("[1e400]", "1e400 is beyond the largest number a float holds"),
        ("-2.5E+999", "-2.5E+999 is beyond"),
        ("9" * 101, "an integer of over 100 digits"),
    ],
)
def test_what_json_does_not_allow_is_refused_by_name(text: str, why: str) -> None:
    with pytest.raises(NotStrictJSON) as refused:
        strict_json(text)
    assert why in str(refused.value) and isinstance(refused.value, ValueError)


def test_the_digit_bound_is_the_callers() -> None:
    assert strict_json("9" * 101, max_int_digits=None) == int("9" * 101)
    assert strict_json("-" + "9" * 100) == -int("9" * 100)
    assert strict_json("[1, 2]", parse_int=lambda literal: int(literal) * 10) == [10, 20]
    assert math.isfinite(strict_json("1.7976931348623157e308"))


def test_nesting_too_deep_still_raises_recursion_error() -> None:
    with pytest.raises(RecursionError):
        strict_json("[" * 100_000)
