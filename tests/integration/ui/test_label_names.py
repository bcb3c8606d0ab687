"""Who labels on /ui/label: without API keys the "you are" name, kept in a cookie, tells two
people apart (so their agreement can be computed); with keys the key's identity wins and no name
is asked or taken.

Tests ``service.ui.label_page`` and ``service.auth.labellers``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.config.settings import Settings
from service.store.migrate import upgrade
from service.ui.label_page import LABELLER_COOKIE
from tests.support.environment import make_settings
from tests.support.helpers import make_event, make_key, ui_app

QUEUE = "/ui/label?since=2000-01-01T00:00:00%2B00:00&until=2100-01-01T00:00:00%2B00:00&seed=0"


def keep_name(client: TestClient, name: str) -> str:
    """Type ``name`` in "you are" and keep it, as the page's form does; the cookie's value."""
    answer = client.post(
        "/ui/label/labeller", data={"name": name, "back": QUEUE}, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == QUEUE
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    return client.cookies[LABELLER_COOKIE]


def page_labeller(page: str) -> str | None:
    """The name the page's script sends as ``labeller``, or None when it sends none."""
    found = re.search(r'id="label-form"[^>]*?data-labeller="([^"]*)"', page)
    return None if found is None else found.group(1)


def label_as_page(client: TestClient, event_id: str, passage: str) -> None:
    """Save a label as static/label.js does: the page's labeller name, if any, in the body."""
    page = client.get(QUEUE + f"&event={event_id}").text
    body: dict[str, object] = {"outcome": "answered", "passage_ids": [passage]}
    name = page_labeller(page)
    if name is not None:
        body["labeller"] = name
    answer = client.post(f"/v1/events/{event_id}/gold", json=body)
    assert answer.status_code == 200, answer.text


def mine(page: str) -> int:
    found = re.search(r"you labelled (\d+)", page)
    assert found is not None
    return int(found.group(1))


def test_two_named_labellers_without_keys(settings: Settings) -> None:
    """Ann and Bob, in two browsers with no key: they agree on q1 (d1) and differ on q2 (d1
    against d2). Decisions on 8 passages: [[1, 1], [1, 5]], kappa 1/3 (as in test_gold_api)."""
    app = ui_app(settings)
    with TestClient(app) as ann:
        # A second browser: its own cookie jar, on the app the first one started.
        bob = TestClient(app)
        for event_id in ("q1", "q2"):
            body = make_event(event_id, n=4, query=f"question {event_id}")
            assert ann.post("/v1/events", json=body).status_code == 202
        before = ann.get(QUEUE).text
        assert 'id="labeller-form"' in before
        assert page_labeller(before) is None  # no name yet: the labels would be anonymous
        keep_name(ann, "Ann Lee")
        keep_name(bob, "bob")
        page = ann.get(QUEUE).text
        assert 'value="Ann Lee"' in page
        assert page_labeller(page) == "Ann Lee"
        for event_id, ann_marks, bob_marks in (("q1", "d1", "d1"), ("q2", "d1", "d2")):
            label_as_page(ann, event_id, ann_marks)
            label_as_page(bob, event_id, bob_marks)
        # Each sees their own labels as theirs.
        assert mine(ann.get(QUEUE).text) == 2
        keep_name(bob, "carol")
        assert mine(bob.get(QUEUE).text) == 0
        agreement = ann.get("/v1/gold/agreement", params={"since": "1d"}).json()
        labels = ann.get("/v1/events/q2/gold").json()["labels"]
        # An empty name forgets the cookie: labels are anonymous again.
        answer = ann.post(
            "/ui/label/labeller", data={"name": "", "back": QUEUE}, follow_redirects=False
        )
        assert answer.status_code == 303
        assert LABELLER_COOKIE not in ann.cookies
        assert page_labeller(ann.get(QUEUE).text) is None
    (pair,) = agreement["pairs"]
    assert (pair["first"], pair["second"]) == ("name:Ann Lee", "name:bob")
    assert pair["table"] == [[1, 1], [1, 5]]
    assert agreement["pooled"]["kappa"] == pytest.approx(1 / 3)
    assert agreement["disagreed"] == 1
    assert {(label["labeller"], label["labeller_name"]) for label in labels} == {
        ("name:Ann Lee", "Ann Lee"),
        ("name:bob", "bob"),
    }


@pytest.mark.parametrize(
    ("fields", "headers", "status", "message"),
    [
        ({"name": "x" * 101}, {}, 422, "at most 100"),
        ({"name": "a\x00b"}, {}, 422, "NUL"),
        ({"name": "ann"}, {"origin": "https://elsewhere.example"}, 403, "cross-site"),
    ],
)
def test_bad_names_are_refused(
    settings: Settings,
    fields: dict[str, str],
    headers: dict[str, str],
    status: int,
    message: str,
) -> None:
    with TestClient(ui_app(settings)) as client:
        answer = client.post(
            "/ui/label/labeller", data=fields, headers=headers, follow_redirects=False
        )
        assert answer.status_code == status, answer.text
        assert message in answer.text
        assert LABELLER_COOKIE not in client.cookies
        # A cookie set by hand that no form would keep is ignored, not sent as the labeller.
        client.cookies.set(LABELLER_COOKIE, "x" * 300, path="/ui")
        assert page_labeller(client.get(QUEUE).text) is None


def test_with_keys_the_key_says_who_labels(tmp_path: Path, sqlite_url: str, redis_url: str) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, auth_required=True)
    key = make_key(settings, "acme")
    bearer = {"Authorization": f"Bearer {key}"}
    with TestClient(ui_app(settings)) as client:
        assert client.post("/v1/events", json=make_event("q1"), headers=bearer).status_code == 202
        refused = client.post(
            "/ui/label/labeller", data={"name": "eve"}, headers=bearer, follow_redirects=False
        )
        assert refused.status_code == 409
        # A name cookie left from before keys were turned on changes nothing.
        client.cookies.set(LABELLER_COOKIE, "eve", path="/ui")
        page = client.get(QUEUE, headers=bearer).text
        assert 'id="label-form"' in page
        assert 'id="labeller-form"' not in page
        assert page_labeller(page) is None
        saved = client.post(
            "/v1/events/q1/gold", json={"passage_ids": ["d1"]}, headers=bearer
        ).json()
        assert mine(client.get(QUEUE, headers=bearer).text) == 1
    (label,) = saved["labels"]
    assert label["labeller"].startswith("key:")
