"""A fuzz harness over every route, against a real `serve` process with API keys required.

Hypothesis (a fixed seed, a bounded number of examples) sends generated hostile requests to every
route the application has (read from ``app.routes``), with the key and without: bodies that are
events with hostile values, batches of them, arbitrary JSON, deep nesting, lists of empty objects
past every count, random bytes, gzip of any of these, protobuf spans; query parameters named as the
route declares them (read from its OpenAPI document) and not, with hostile text; path parameters
that name an accepted event or hostile text. It asserts that no answer is a 5xx, that `/healthz`
answers 200 throughout (polled from another thread), that the process's resident memory grows by
less than ``RSS_BOUND`` over the whole run, and that every event an answer accepted still reads
back 200, as JSON and as its page. On both stores.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from service.api.app import create_app
from service.config.settings import Settings
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.hostile_values import BUDGET, JSON_VALUE, TEXT, events, nested
from tests.support.otlp_bodies import empty_spans_request
from tests.support.routes import RouteAddress, every_route
from tests.support.served import Served, serve_with_key

MIB = 1024 * 1024
DEFAULTS = Settings()
# The in-flight budget, the caches' byte budgets (28 MiB together) and the allocator's slack.
RSS_BOUND = DEFAULTS.max_inflight_body_bytes + 64 * MIB
HEALTH_TIMEOUT_SECONDS = 30.0
EXAMPLES = 400

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")

JSON_BODY = "application/json"


def _raw(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _empty_objects(count: int) -> bytes:
    return b"[" + b",".join([b"{}"] * count) + b"]"


EVENT_BODIES: st.SearchStrategy[tuple[bytes, str]] = st.one_of(
    st.builds(make_event, st.integers(0, 10**6).map("fz-valid-{}".format), query=TEXT).map(
        lambda e: (_raw(e), JSON_BODY)
    ),
    st.integers(0, 10**6).flatmap(lambda n: events(n)).map(lambda e: (_raw(e), JSON_BODY)),
    st.lists(st.integers(0, 10**6).flatmap(lambda n: events(n)), max_size=4).map(
        lambda items: (_raw({"events": items}), JSON_BODY)
    ),
)
BODIES: st.SearchStrategy[tuple[bytes, str]] = st.one_of(
    JSON_VALUE.map(lambda v: (_raw(v), JSON_BODY)),
    st.integers(1, 400).map(lambda depth: (_raw(nested(depth)), JSON_BODY)),
    st.integers(0, 2 * DEFAULTS.max_body_items).map(lambda n: (_empty_objects(n), JSON_BODY)),
    st.binary(max_size=300).map(lambda raw: (raw, JSON_BODY)),
    st.integers(0, 2 * DEFAULTS.max_body_items).map(
        lambda n: (empty_spans_request(n), "application/x-protobuf")
    ),
    st.just((b"", JSON_BODY)),
)


def declared_query_parameters(app_openapi: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for path, operations in app_openapi["paths"].items():
        for method, operation in operations.items():
            names = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
            out[(method.upper(), path)] = names
    return out


class HealthWatch:
    """Polls /healthz from its own thread and keeps every answer that was not a 200."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.failures: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=HEALTH_TIMEOUT_SECONDS + 5)

    def _run(self) -> None:
        with httpx.Client(timeout=HEALTH_TIMEOUT_SECONDS) as client:
            while not self._stop.wait(0.5):
                try:
                    status = client.get(f"{self.url}/healthz").status_code
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                    continue
                self.polls += 1
                if status != 200:
                    self.failures.append(f"status {status}")


@pytest.fixture
def served(tmp_path: Path, redis_url: str, store_url: str) -> Iterator[Served]:
    with serve_with_key(tmp_path / "served", redis_url, store_url) as server:
        yield server


def accepted_ids(route: RouteAddress, answer: httpx.Response) -> list[str]:
    """The event ids an answer says were stored (now or before)."""
    if route != RouteAddress("POST", "/v1/events/batch") and route != RouteAddress(
        "POST", "/v1/events"
    ):
        return []
    if answer.status_code not in (200, 202):
        return []
    body = answer.json()
    results = body.get("results", [body])
    return [r["event_id"] for r in results if r.get("status") in ("accepted", "duplicate")]


def test_hostile_requests_to_every_route_never_fail_the_service(
    served: Served, tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    app = create_app(make_settings(tmp_path, sqlite_url, redis_url))
    routes = every_route(app)
    ingest = [RouteAddress("POST", "/v1/events"), RouteAddress("POST", "/v1/events/batch")]
    assert set(ingest) <= set(routes)
    statuses: Counter[int] = Counter()
    declared = declared_query_parameters(app.openapi())
    accepted: set[str] = set()
    server_errors: list[str] = []
    keyed = {"Authorization": f"Bearer {served.key}"}
    client = httpx.Client(base_url=served.url, timeout=120)

    @hypothesis_settings(BUDGET, max_examples=EXAMPLES)
    @given(
        # Half the requests go to the two ingest routes with mostly valid events, so that
        # something is accepted and read back; the rest go anywhere with anything.
        route=st.one_of(st.sampled_from(ingest), st.sampled_from(routes)),
        body=st.one_of(EVENT_BODIES, BODIES),
        compressed=st.booleans(),
        with_key=st.sampled_from([True, True, True, False]),
        parameters=st.dictionaries(st.one_of(st.just("since"), TEXT), TEXT, max_size=3),
        named_values=st.lists(TEXT, max_size=3),
        path_value=st.one_of(st.just("accepted"), TEXT),
    )
    def one_request(
        route: RouteAddress,
        body: tuple[bytes, str],
        compressed: bool,
        with_key: bool,
        parameters: dict[str, str],
        named_values: list[str],
        path_value: str,
    ) -> None:
        content, content_type = body
        headers = {"Content-Type": content_type, **(keyed if with_key else {})}
        if compressed:
            content = gzip.compress(content, 1)
            headers["Content-Encoding"] = "gzip"
        names = declared.get((route.method, route.path), [])
        query = {**parameters, **dict(zip(names, named_values, strict=False))}
        value = next(iter(sorted(accepted)), "none") if path_value == "accepted" else path_value
        # Percent-encoded from its UTF-8 bytes, lone surrogates included: the server gets them.
        value = quote(value.encode("utf-8", "surrogatepass"), safe="")
        url = route.url(event_id=value, name=value)
        send_body = route.method not in ("GET", "HEAD", "OPTIONS", "DELETE")
        try:
            answer = client.request(
                route.method,
                url,
                params={
                    k.encode("utf-8", "surrogatepass").decode("utf-8", "replace"): v.encode(
                        "utf-8", "surrogatepass"
                    ).decode("utf-8", "replace")
                    for k, v in query.items()
                },
                content=content if send_body else None,
                headers=headers,
            )
        except httpx.InvalidURL:
            return  # a path the client itself cannot send
        if answer.status_code >= 500:
            server_errors.append(
                f"{route.method} {url} -> {answer.status_code} {answer.text[:200]}"
            )
        statuses[answer.status_code] += 1
        accepted.update(accepted_ids(route, answer))

    with client, HealthWatch(served.url) as health:
        client.get("/healthz")
        baseline = served.rss()
        one_request()
        grown = served.rss() - baseline
        reads = {
            event_id: (
                client.get(f"/v1/events/{event_id}", headers=keyed).status_code,
                client.get(f"/ui/events/{event_id}", headers=keyed).status_code,
            )
            for event_id in sorted(accepted)
        }
    print(
        f"\n{len(accepted)} events accepted, RSS grew {grown / MIB:.1f} MiB, "
        f"/healthz polled {health.polls} times; answers by status: {dict(sorted(statuses.items()))}"
    )
    assert not server_errors, server_errors[:10]
    assert not health.failures, health.failures[:10]
    assert grown < RSS_BOUND, f"RSS grew {grown / MIB:.0f} MiB >= {RSS_BOUND / MIB:.0f} MiB"
    assert accepted, "no generated event was accepted: the harness sends nothing valid"
    unreadable = {event_id: got for event_id, got in reads.items() if got != (200, 200)}
    assert not unreadable, unreadable
