"""Misses found by labelling, on both stores: the misses page, its counts and the causes API read
gold as the analysis does (labels over the gold sent with an event, disagreements left out), and
the database's conditions give, event by event, what ``consensus`` gives.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config.settings import Settings
from service.store import events as event_store
from service.store import gold as gold_store
from service.store import pages as page_store
from service.store.engine import make_engine, session_scope
from service.store.models import GoldOutcome
from service.ui.filters import parse_filter
from tests.support.environment import make_settings
from tests.support.helpers import bearer, make_event, make_key, ui_app


@pytest.fixture
def keyed(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, store_url, redis_url, auth_required=True)


@pytest.fixture
def api(keyed: Settings) -> Iterator[TestClient]:
    with TestClient(ui_app(keyed)) as client:
        yield client


def send(api: TestClient, key: str, event_id: str, **extra: Any) -> None:
    body = make_event(event_id, n=4, k=2, query=f"question {event_id}", **extra)
    assert api.post("/v1/events", json=body, headers=bearer(key)).status_code == 202


def label(api: TestClient, key: str, event_id: str, **body: Any) -> None:
    answer = api.post(f"/v1/events/{event_id}/gold", json=body, headers=bearer(key))
    assert answer.status_code == 200, answer.text


def listed(page: str) -> set[str]:
    return set(re.findall(r'<tr data-event-id="([^"]+)"', page))


def test_labelled_misses_are_listed_and_counted(api: TestClient, keyed: Settings) -> None:
    alice, bob = make_key(keyed, "acme"), make_key(keyed, "acme")
    other = make_key(keyed, "globex")
    # k=2 of four passages d1..d4 each.
    send(api, alice, "below")  # labelled: d4 answers, rank 4 > k
    send(api, alice, "unsent")  # labelled: a passage that was not sent answers
    send(api, alice, "split")  # two labellers, different passages: no gold
    send(api, alice, "reached")  # labelled: d1 answers, in the prompt
    send(api, alice, "sent", gold_passage_ids=["d3"])  # sent gold below the cut, no label
    send(api, alice, "relabelled", gold_passage_ids=["d3"])  # sent gold missed, label reaches
    send(api, alice, "agreed", gold_passage_ids=["d1"])  # two labellers agree on d4 and d3
    send(api, other, "below")  # the same id in another tenant, a labelled miss there too
    label(api, alice, "below", passage_ids=["d4"])
    label(api, alice, "unsent", outcome="not_retrieved", missing_passage={"id": "kb-9"})
    label(api, alice, "split", passage_ids=["d3"])
    label(api, bob, "split", passage_ids=["d4"])
    label(api, alice, "reached", passage_ids=["d1"])
    label(api, bob, "relabelled", passage_ids=["d2"])
    label(api, alice, "agreed", passage_ids=["d4", "d3"])
    label(api, bob, "agreed", passage_ids=["d3", "d4"])
    label(api, other, "below", passage_ids=["d3"])

    misses = {"below", "unsent", "sent", "agreed"}
    gold_events = misses | {"reached", "relabelled"}
    page = api.get("/ui/misses", params={"window": "all"}, headers=bearer(alice)).text
    assert listed(page) == misses
    # The best rank of the labelled gold, and "not sent" for the passage that was not.
    row = re.search(r'<tr data-event-id="below">.*?</tr>', page, re.S)
    assert row is not None
    assert "4 <span" in row.group(0)
    row = re.search(r'<tr data-event-id="unsent">.*?</tr>', page, re.S)
    assert row is not None
    assert "not sent" in row.group(0)
    summary = re.search(r'id="miss-summary">(.*?)</p>', page, re.S)
    assert summary is not None
    assert f"<strong>{len(misses)}</strong> misses among <strong>{len(gold_events)}</strong>" in (
        summary.group(1)
    )

    causes = {"below": "vocabulary_mismatch", "unsent": "not_in_corpus", "agreed": "other"}
    for event_id, cause in causes.items():
        body = {"cause": cause, "note": "both marked d3 and d4"} if cause == "other" else {}
        answer = api.put(
            f"/v1/events/{event_id}/miss-cause",
            json={"cause": cause, **body},
            headers=bearer(alice),
        )
        assert answer.status_code == 200, answer.text
    # A disagreement is no gold miss: it takes no cause.
    refused = api.put(
        "/v1/events/split/miss-cause", json={"cause": "other", "note": "x"}, headers=bearer(alice)
    )
    assert refused.status_code == 422

    counts = api.get("/v1/misses/causes", headers=bearer(alice)).json()
    assert counts["gold_events"] == len(gold_events)
    assert counts["misses"] == len(misses)
    assert counts["classified"] == len(causes)
    assert counts["unclassified"] == len(misses) - len(causes)
    expected = {cause: list(causes.values()).count(cause) for cause in counts["causes"]}
    assert counts["causes"] == expected
    # The page's cause filter and its counts agree with the API.
    tagged = api.get(
        "/ui/misses",
        params={"window": "all", "cause": "vocabulary_mismatch"},
        headers=bearer(alice),
    ).text
    assert listed(tagged) == {"below"}
    unclassified = api.get(
        "/ui/misses", params={"window": "all", "cause": "unclassified"}, headers=bearer(alice)
    ).text
    assert listed(unclassified) == {"sent"}

    # The other tenant sees its own labelled miss only.
    theirs = api.get("/v1/misses/causes", headers=bearer(other)).json()
    assert (theirs["gold_events"], theirs["misses"], theirs["unclassified"]) == (1, 1, 1)
    their_page = api.get("/ui/misses", params={"window": "all"}, headers=bearer(other)).text
    assert listed(their_page) == {"below"}


def test_the_conditions_agree_with_consensus(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    """Sixty events with random sent gold and zero to three random labels each: the pages' gold
    and gold-reached, computed by the database, are ``consensus`` applied event by event."""
    settings = make_settings(tmp_path, store_url, redis_url)
    chance = random.Random(20261201)
    ids = [f"d{i}" for i in range(1, 5)]
    with TestClient(ui_app(settings)) as client:
        for n in range(60):
            sent = chance.sample(ids, chance.randint(0, 2)) or None
            # Each event its own order and cut, so that a passage reaching one event's prompt
            # says nothing about another's.
            body = make_event(
                f"e{n}", n=4, k=chance.randint(1, 3), query=f"question {n}", gold_passage_ids=sent
            )
            order = chance.sample(ids, len(ids))
            for passage, passage_id in zip(body["passages"], order, strict=True):
                passage["id"] = passage_id
            assert client.post("/v1/events", json=body).status_code == 202
            for who in chance.sample(["ann", "bob", "cy"], chance.choice([0, 1, 2, 2, 3])):
                outcome = chance.choice(list(GoldOutcome))
                gold: dict[str, Any] = {"outcome": outcome.value, "labeller": who}
                if outcome is GoldOutcome.ANSWERED:
                    # Few choices, so that labellers often agree, in any order.
                    gold["passage_ids"] = chance.choice(
                        [["d1"], ["d3"], ["d3", "d4"], ["d4", "d3"]]
                    )
                elif outcome is GoldOutcome.NOT_RETRIEVED:
                    gold["missing_passage"] = {"id": chance.choice(["kb-1", "kb-2"])}
                answer = client.post(f"/v1/events/e{n}/gold", json=gold)
                assert answer.status_code == 200, answer.text
    engine = make_engine(settings.database_url)
    try:
        with session_scope(engine) as session:
            rows = page_store.list_events(
                session, "default", parse_filter({"window": "all"}), page_size=1000
            ).rows
            expected: dict[str, tuple[bool, bool]] = {}
            statuses: set[str] = set()
            labels = gold_store.labels_of(session, [row.pk for row in rows])
            for row in rows:
                event = event_store.find_event(session, "default", row.event_id)
                assert event is not None
                prompt = [p.passage_id for p in event_store.stored_event(session, event).passages]
                merged = gold_store.consensus(event.gold_passage_ids, None, labels.get(row.pk, []))
                statuses.add(merged.status)
                agreed = merged.gold_passage_ids or []
                reached = bool(agreed) and bool(set(agreed) & set(prompt[: event.k]))
                expected[row.event_id] = (bool(agreed), reached)
            found = {row.event_id: (row.has_gold, row.gold_reached) for row in rows}
    finally:
        engine.dispose()
    assert len(found) == 60
    assert found == expected
    # The draw covers every case the rule distinguishes.
    assert statuses == {"unlabelled", "single", "agreed", "disagreed"}
    assert set(expected.values()) == {(False, False), (True, False), (True, True)}
