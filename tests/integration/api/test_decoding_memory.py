"""The worst body of every state-changing route, sent with a valid key to a real `serve` process
on its default limits: the process's peak resident memory grows by less than the in-flight
budget for each, and every answer is a 4xx or 2xx.

What makes a body worst is its count of items, not its size (``service/contract/json_shape.py``):
the bodies are the most empty objects the limits let through, as a flat array, inside every list
field the route's model declares (read from the application), as deep as allowed, each also
gzip-compressed; /v1/traces gets the same in OTLP/JSON and as protobuf empty spans. Raising
``RM_MAX_BODY_ITEMS`` (the count on the bytes) or removing ``CountedBody``'s check (the count of
a list before its items are validated) makes this test fail.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.api.app import create_app
from service.config.settings import Settings
from tests.support.environment import make_settings
from tests.support.otlp_bodies import empty_spans_request
from tests.support.routes import RouteAddress, body_models, state_changing_routes
from tests.support.served import Served, serve_with_key

MIB = 1024 * 1024
DEFAULTS = Settings()
BUDGET = DEFAULTS.max_inflight_body_bytes
# The item count of a filled body is kept this far below the limit, for the envelope's own.
ENVELOPE_ITEMS = 16

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")


def empty_objects(prefix: bytes, suffix: bytes) -> bytes:
    """``prefix`` + as many ``{}`` as the item and byte limits let through + ``suffix``: each
    ``{}`` after the first is two items (an object, and a member after the first)."""
    count = min(
        (DEFAULTS.max_body_items - ENVELOPE_ITEMS) // 2,
        (DEFAULTS.max_body_bytes - len(prefix) - len(suffix)) // 3,
    )
    return prefix + b",".join([b"{}"] * count) + suffix


def deepest() -> bytes:
    depth = DEFAULTS.max_body_depth
    return b"[" * depth + b"]" * depth


def valid_batch() -> bytes:
    """A batch of valid events with as many one-word passages as the item limit lets through:
    the most objects a body can make the service build and store."""
    events = DEFAULTS.max_batch_events
    per_event = min(
        DEFAULTS.max_passages, (DEFAULTS.max_body_items // events - ENVELOPE_ITEMS) // 3
    )
    passages = ",".join(f'{{"id":"p{rank}","text":"w{rank}"}}' for rank in range(per_event))
    event = '{{"event_id":"worst-{n}","app":"a","retriever":"r","query":"q","passages":[%s]}}'
    body = ",".join(event.format(n=n) % passages for n in range(events))
    return f'{{"events":[{body}]}}'.encode()


def worst_bodies(route: RouteAddress, model_fields: list[str]) -> Iterator[tuple[str, bytes, str]]:
    """(name, body, content type) of the worst bodies for ``route``."""
    json = "application/json"
    yield "flat array", empty_objects(b"[", b"]"), json
    yield "deepest", deepest(), json
    for field in model_fields:
        yield f"{field} filled", empty_objects(b'{"' + field.encode() + b'":[', b"]}"), json
    if route.path == "/v1/events/batch":
        yield "valid events", valid_batch(), json
    if route.path == "/v1/traces":
        spans = DEFAULTS.max_body_items - ENVELOPE_ITEMS  # a field each
        nested = empty_objects(b'{"resourceSpans":[{"scopeSpans":[{"spans":[', b"]}]}]}")
        yield "OTLP/JSON spans", nested, json
        yield "protobuf spans", empty_spans_request(spans), "application/x-protobuf"


def list_fields(model: type) -> list[str]:
    fields = getattr(model, "model_fields", {})
    return [name for name, field in fields.items() if "list" in str(field.annotation)]


@pytest.fixture
def served(tmp_path: Path, redis_url: str) -> Iterator[Served]:
    with serve_with_key(tmp_path / "served", redis_url) as server:
        yield server


def test_the_worst_body_of_every_route_stays_within_the_inflight_budget(
    served: Served, tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    app = create_app(make_settings(tmp_path, sqlite_url, redis_url))
    models = body_models(app)
    routes = state_changing_routes(app)
    assert any(route.path == "/v1/traces" for route in routes)
    growth: dict[str, int] = {}
    statuses: dict[str, int] = {}
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {served.key}"}) as client:
        for route in routes:
            fields = list_fields(models[route]) if route in models else []
            url = served.url + route.url(event_id="probe")
            for name, body, content_type in worst_bodies(route, fields):
                for encoding in ("identity", "gzip"):
                    sent = gzip.compress(body, 1) if encoding == "gzip" else body
                    before = served.rss()
                    served.reset_peak()
                    answer = client.request(
                        route.method,
                        url,
                        content=sent,
                        headers={"Content-Type": content_type, "Content-Encoding": encoding},
                    )
                    label = f"{route.method} {route.path} {name} ({encoding}, {len(sent)} B)"
                    growth[label] = served.peak_rss() - before
                    statuses[label] = answer.status_code
    print("\npeak resident growth per worst body (MiB):")
    for label, grew in sorted(growth.items(), key=lambda item: -item[1]):
        print(f"  {grew / MIB:7.1f}  {statuses[label]}  {label}")
    assert not [label for label, status in statuses.items() if status >= 500], statuses
    over = {label: grew for label, grew in growth.items() if grew >= BUDGET}
    assert not over, f"over the in-flight budget of {BUDGET / MIB:.0f} MiB: {over}"
