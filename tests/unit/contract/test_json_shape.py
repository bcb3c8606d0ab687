"""The item count and depth of a JSON body read from its bytes agree with the decoded value's,
for any JSON value (strings with quotes, backslashes and structural characters included), on
both the quick path (upper bounds) and the exact one."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service.contract.json_shape import json_shape

TRICKY_TEXT = st.text(alphabet=st.sampled_from(list('ab"\\,[]{}:é\u2028\U0001f600 ')), max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TRICKY_TEXT, inner, max_size=5),
    max_leaves=40,
)


def decoded_shape(value: Any) -> tuple[int, int]:
    """Items (containers, and members or elements after the first) and depth, by walking."""
    if isinstance(value, dict | list):
        children = list(value.values()) if isinstance(value, dict) else value
        walked = [decoded_shape(child) for child in children]
        items = 1 + max(len(children) - 1, 0) + sum(items for items, _ in walked)
        return items, 1 + max((depth for _, depth in walked), default=0)
    return 0, 0


@settings(max_examples=300, derandomize=True)
@given(JSON_VALUES, st.booleans())
def test_the_exact_figures_are_the_decoded_values(value: Any, ascii_only: bool) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    shape = json_shape(body, max_items=0, max_depth=0)  # limits of 0 force the exact path
    items, depth = decoded_shape(value)
    if items:
        assert (shape.items, shape.depth) == (items, depth)


@settings(max_examples=300, derandomize=True)
@given(JSON_VALUES)
def test_the_quick_figures_are_upper_bounds(value: Any) -> None:
    body = json.dumps(value).encode()
    shape = json_shape(body, max_items=10**9, max_depth=10**9)
    items, depth = decoded_shape(value)
    assert shape.items >= items
    assert shape.depth >= depth


def test_a_body_over_a_limit_is_measured_exactly_across_slices() -> None:
    count = 400_000  # more characters than one slice of the exact walk
    flat = b"[" + b",".join([b'{"k":"[,{"}'] * count) + b"]"
    assert json_shape(flat, max_items=10, max_depth=100).items == 1 + count + (count - 1)
    deep = b'{"a":"' + b"[" * 10 + b'"}' + b"[" * 300_000 + b"]" * 300_000
    assert json_shape(deep, max_items=10**9, max_depth=10).depth == 300_000
