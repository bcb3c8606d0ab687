"""Every page template rendered through the app, on an empty store and on one with every kind of
event, so that a name a template uses but nobody passes fails here instead of showing as a blank.

The pages are read as a logged-in tenant (auth on), so the login form is one of them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from jinja2 import UndefinedError
from markupsafe import escape
from sqlalchemy import Engine

from service.config.settings import Settings
from service.measures.catalogue import BY_NAME, LISTED
from service.store.engine import make_engine
from service.ui import pages
from service.ui.render import ENVIRONMENT, TEMPLATES, render
from tests.support.environment import make_settings
from tests.support.helpers import judge, make_event, make_key, ui_app

# Templates that are pages of their own; the others (base, macros, the filters form) are parts.
PAGE_TEMPLATES = {
    p.name for p in TEMPLATES.glob("*.html") if '{% extends "base.html" %}' in p.read_text()
}
# The pages' figures do not matter here, only that each renders; these mix every kind of event.
JUDGED = "judged-with-feedback"
CLASSIFIED_MISS = "miss-classified"
UNCLASSIFIED_MISS = "miss-unclassified"
PENDING = "pending"


class Tour:
    """A logged-in browser that notes which template drew each page it asks for."""

    def __init__(self, client: TestClient, rendered: list[str]) -> None:
        self.client = client
        self.rendered = rendered

    def page(self, url: str, status: int = 200) -> str:
        response = self.client.get(url)
        assert response.status_code == status, (url, response.text[:300])
        assert "text/html" in response.headers["content-type"]
        return response.text


@pytest.fixture
def settings(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, store_url, redis_url, auth_required=True)


@pytest.fixture
def engine(settings: Settings) -> Iterator[Engine]:
    engine = make_engine(settings.database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def key(settings: Settings) -> str:
    return make_key(settings, "acme")


@pytest.fixture
def tour(settings: Settings, key: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tour]:
    rendered: list[str] = []

    def noting_render(template: str, **context: object) -> str:
        rendered.append(template)
        return render(template, **context)

    # The pages draw through the real renderer; the test only notes which template drew each.
    monkeypatch.setattr(pages, "render", noting_render)
    with TestClient(ui_app(settings)) as client:
        login_form = client.get("/ui/login?next=/ui")
        assert login_form.status_code == 200
        refused = client.post("/ui/login", data={"key": "rm_unknown", "next": "/ui"})
        assert refused.status_code == 401
        assert "Unknown or revoked API key" in refused.text
        login = client.post("/ui/login", data={"key": key, "next": "/ui"}, follow_redirects=False)
        assert login.status_code == 303
        yield Tour(client, rendered)


def seed(client: TestClient, engine: Engine, key: str) -> None:
    """A judged event with feedback, two gold misses (one with a recorded cause), and one event
    not judged yet."""
    bearer = {"Authorization": f"Bearer {key}"}
    events = {
        JUDGED: make_event(JUDGED, n=4, k=2, gold_passage_ids=["d1"]),
        CLASSIFIED_MISS: make_event(CLASSIFIED_MISS, n=4, k=2, gold_passage_ids=["d3"]),
        UNCLASSIFIED_MISS: make_event(UNCLASSIFIED_MISS, n=4, k=2, gold_passage_ids=["far"]),
        PENDING: make_event(PENDING, n=3, k=1),
    }
    for body in events.values():
        assert client.post("/v1/events", json=body, headers=bearer).status_code == 202
    for event_id in (JUDGED, CLASSIFIED_MISS, UNCLASSIFIED_MISS):
        judge(engine, event_id, [3, 0, 2, 1], tenant="acme")
    feedback = {"response": "It boils at 100 C.", "response_grade": 4, "answer_correct": True}
    sent = client.post(f"/v1/events/{JUDGED}/feedback", json=feedback, headers=bearer)
    assert sent.status_code in (200, 202)
    cause = {"cause": "other", "note": "the corpus has an older version"}
    recorded = client.put(f"/v1/events/{CLASSIFIED_MISS}/miss-cause", json=cause, headers=bearer)
    assert recorded.status_code == 200
    for event_id, gold in ((JUDGED, {"passage_ids": ["d1"]}), (PENDING, {"passage_ids": ["d1"]})):
        marked = client.post(f"/v1/events/{event_id}/gold", json=gold, headers=bearer)
        assert marked.status_code == 200


def visit_every_page(tour: Tour, event_ids: list[str]) -> None:
    tour.page("/ui")
    tour.page("/ui?window=7d")
    tour.page("/ui/events")
    # A measure outside the list's columns adds one; a bad filter shows its error.
    tour.page("/ui/events?measure=hit&below=2&outcome=miss&gold=yes")
    tour.page("/ui/events?measure=nonsense&below=x&window=nope")
    tour.page("/ui/misses")
    tour.page("/ui/misses?cause=unclassified")
    tour.page("/ui/misses?cause=other&app=shop")
    for event_id in event_ids:
        tour.page(f"/ui/events/{event_id}")
        tour.page(f"/ui/misses/{event_id}")
    tour.page("/ui/label")
    tour.page("/ui/label?seed=5&target=2&app=shop")
    tour.page("/ui/label?since=nonsense&target=x")
    for event_id in event_ids:
        tour.page(f"/ui/label?event={event_id}")
    tour.page("/ui/events/no-such-event", status=404)
    tour.page("/ui/misses/no-such-event", status=404)


def test_the_page_environment_refuses_undefined_names() -> None:
    with pytest.raises(UndefinedError):
        ENVIRONMENT.from_string("<p>{{ nobody_passed_this }}</p>").render()
    # A measure without a title on the pages fails the same way.
    with pytest.raises(UndefinedError):
        ENVIRONMENT.from_string("{{ MEASURE_TITLES['no_such_measure'] }}").render()


def test_every_page_renders_on_an_empty_store(tour: Tour) -> None:
    visit_every_page(tour, [])
    overview = tour.page("/ui")
    assert "No events in this window" in overview
    assert "No event matches these filters" in tour.page("/ui/events")
    assert "No gold miss matches these filters" in tour.page("/ui/misses")
    assert set(tour.rendered) == PAGE_TEMPLATES - {"event.html", "miss.html"}


def test_every_page_renders_with_every_kind_of_event(tour: Tour, engine: Engine, key: str) -> None:
    seed(tour.client, engine, key)
    visit_every_page(tour, [JUDGED, CLASSIFIED_MISS, UNCLASSIFIED_MISS, PENDING])
    assert set(tour.rendered) == PAGE_TEMPLATES

    events = tour.page("/ui/events")
    listed = re.findall(r'<tr data-event-id="([^"]+)"', events)
    assert sorted(listed) == sorted([JUDGED, CLASSIFIED_MISS, UNCLASSIFIED_MISS, PENDING])
    # The list's measure columns are the catalogue's listed measures, by their short titles.
    headers = re.findall(r'<th scope="col" class="num">([^<]*)</th>', events)
    assert headers == [escape(BY_NAME[name].short_title) for name in LISTED]
    judged = tour.page(f"/ui/events/{JUDGED}")
    assert "It boils at 100 C." in judged
    assert "4 of 5" in judged
    assert "not judged yet" in tour.page(f"/ui/events/{PENDING}")
    assert "This event is not a gold miss" in tour.page(f"/ui/misses/{PENDING}")
    classified = tour.page(f"/ui/misses/{CLASSIFIED_MISS}")
    assert "the corpus has an older version" in classified
    assert 'id="next-miss"' in classified
