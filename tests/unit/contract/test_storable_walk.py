"""The storable check's quick walk agrees with the walk that names the problem.

``check_body`` passes a body on the quick walk alone; so the quick walk must never pass what the
full walk refuses, and on the plain JSON types a parser produces it should pass what the full walk
passes (else every body would pay for both walks).

Tests ``service.contract.storable``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.contract.storable import (
    MAX_NESTING,
    NotStorableError,
    _check_body,
    _plainly_storable,
    check_body,
)
from tests.support.hostile_values import JSON_VALUE, TEXT, nested

ANY_JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        TEXT,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=20,
)


def _full_walk_passes(value: Any) -> bool:
    try:
        _check_body(value)
    except NotStorableError:
        return False
    return True


@given(st.one_of(ANY_JSON, JSON_VALUE, st.integers(0, 40).map(nested)))
def test_the_quick_walk_passes_exactly_what_the_full_walk_passes(value: Any) -> None:
    assert _plainly_storable(value, 0) == _full_walk_passes(value)


@pytest.mark.parametrize(
    "value",
    [
        {"a": ["ok", {"b": "x\x00"}]},
        {"key\ud800": 1},
        [1, 2**63],
        {"n": float("nan")},
        nested(MAX_NESTING + 1),
        {"deep": nested(MAX_NESTING)},
    ],
)
def test_a_refused_body_is_still_refused_with_where(value: Any) -> None:
    assert not _plainly_storable(value, 0)
    with pytest.raises(NotStorableError):
        check_body(value)


def test_types_the_quick_walk_does_not_know_go_to_the_full_walk() -> None:
    # A tuple is walked as a list by the full walk; the quick one leaves it to that walk.
    assert not _plainly_storable(("a", "b"), 0)
    check_body(("a", "b"))
    with pytest.raises(NotStorableError):
        check_body(("a", "\x00"))
