"""What every route's query parameters may hold, checked once before routing.

A query parameter reaches filters, the database and numeric code; a value none of them can take
used to surface as a 503 with Retry-After (a client retried it forever): a NUL in a filter on
PostgreSQL, a negative seed in numpy. So, for every route, pages included:

- the query string, once percent-decoded, is UTF-8 text (which also rules out lone surrogates),
  every name and value without a NUL and at most ``MAX_QUERY_TEXT_CHARS`` long, and there are at
  most ``MAX_QUERY_FIELDS`` of them: ``QueryParamsGuard`` answers 422 otherwise;
- numbers are declared with their ranges in the routes' ``Query`` annotations, from the types
  below, so FastAPI answers 422 and the OpenAPI document states the range;
- windows are parsed and bounded by ``service.analysis.window`` (a ValueError there is a 422).
"""

from __future__ import annotations

import json
from typing import Annotated
from urllib.parse import parse_qsl

from fastapi import Query
from starlette.types import ASGIApp, Receive, Scope, Send

from service.contract.asgi_answer import send_answer
from service.contract.storable import text_problem

# Longer than any app, retriever, judge name, moment or page address a filter compares with.
MAX_QUERY_TEXT_CHARS = 1000
MAX_QUERY_FIELDS = 64
# numpy's generators take seeds in [0, 2**32).
MAX_SEED = 2**32 - 1

Seed = Annotated[
    int, Query(ge=0, le=MAX_SEED, description="Seed of the query split and the intervals.")
]


def _shown(name: str) -> str:
    shown = name[:40] + ("..." if len(name) > 40 else "")
    return shown.encode("utf-8", "backslashreplace").decode("utf-8")


def query_problem(query_string: bytes) -> tuple[str, str] | None:
    """(parameter, what is wrong) for the first query parameter no route can take, or None."""
    if not query_string:
        return None
    try:
        fields = parse_qsl(
            query_string.decode("latin-1"),
            keep_blank_values=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_QUERY_FIELDS,
        )
    except UnicodeDecodeError:
        return "", "the query string is not UTF-8 text (or holds a lone surrogate)"
    except ValueError:
        return "", f"the query string has more than {MAX_QUERY_FIELDS} parameters"
    for name, value in fields:
        for part, text in (("name", name), ("value", value)):
            problem = text_problem(text)
            if problem is not None:
                return _shown(name), f"the {part} {problem}"
            if len(text) > MAX_QUERY_TEXT_CHARS:
                return _shown(name), f"the {part} is longer than {MAX_QUERY_TEXT_CHARS} characters"
    return None


class QueryParamsGuard:
    """Answers 422 to a request whose query string holds a value no route can take."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = query_problem(scope.get("query_string", b"")) if scope["type"] == "http" else None
        if found is None:
            await self.app(scope, receive, send)
            return
        name, problem = found
        message = f"query parameter {name!r}: {problem}" if name else problem
        # The shape of the application's other 422 answers: a message and where it applies.
        where = ["query", name] if name else ["query"]
        error = {"loc": where, "msg": problem, "type": "value_error"}
        payload = json.dumps({"detail": message, "errors": [error]}).encode()
        await send_answer(send, 422, payload)
