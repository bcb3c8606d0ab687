"""What a 422 says about a body's errors: the first few, in words, and how many there were.

A hostile body can be made of errors (every item of a long list invalid); naming each one would
make the answer, and the memory building it, grow with the body. So at most
``MAX_REPORTED_ERRORS`` are named and the rest counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from service.contract.count_limits import TOO_MANY_ITEMS

MAX_REPORTED_ERRORS = 20


def reported_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The first ``MAX_REPORTED_ERRORS`` errors as ``loc``/``msg``/``type``, printable: a
    location can hold the client's own keys, escaped so no lone surrogate reaches the answer."""
    return [
        {
            "loc": [p if isinstance(p, int) else _printable(str(p)) for p in e.get("loc", ())],
            "msg": _printable(str(e.get("msg", ""))),
            "type": e.get("type", ""),
        }
        for e in errors[:MAX_REPORTED_ERRORS]
    ]


def errors_summary(errors: Sequence[Mapping[str, Any]], empty_loc: str = "") -> str:
    """One line naming the first errors, ``where: what``, and saying how many more there were."""
    named = reported_errors(errors)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or empty_loc}: {e['msg']}" for e in named]
    if len(errors) > len(named):
        parts.append(f"and {len(errors) - len(named)} more errors")
    return "; ".join(parts)


def breaks_a_count_limit(errors: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the body was refused for a list longer than its limit (a limit, not malformed)."""
    return any(e.get("type") == TOO_MANY_ITEMS for e in errors)


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
