"""Gold marked after the fact, through the API, on both stores: labels per key, tenants apart,
bad input refused with a 4xx, and the analysis taking labels as it takes gold sent with events.

Tests ``service.api.gold``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config.settings import Settings
from service.store.engine import make_engine
from tests.support.environment import make_settings
from tests.support.helpers import bearer, judge, make_event, make_key, ui_app


@pytest.fixture
def keyed(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, store_url, redis_url, auth_required=True)


@pytest.fixture
def api(keyed: Settings) -> Iterator[TestClient]:
    with TestClient(ui_app(keyed)) as client:
        yield client


def post_gold(api: TestClient, key: str, event_id: str, **body: Any) -> Any:
    return api.post(f"/v1/events/{event_id}/gold", json=body, headers=bearer(key))


def test_labels_per_key_replace_and_merge(api: TestClient, keyed: Settings) -> None:
    alice, bob = make_key(keyed, "acme"), make_key(keyed, "acme")
    sent = api.post("/v1/events", json=make_event("q1", n=4, k=2), headers=bearer(alice))
    assert sent.status_code == 202
    first = post_gold(api, alice, "q1", passage_ids=["d3"], answer_correct=False)
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "single"
    assert first.json()["gold_passage_ids"] == ["d3"]
    # Labelling again replaces alice's row; bob's label is a second row.
    assert post_gold(api, alice, "q1", passage_ids=["d2", "d2"]).status_code == 200
    both = post_gold(api, bob, "q1", passage_ids=["d2"], answer_correct=True).json()
    assert len(both["labels"]) == 2
    labellers = [label["labeller"] for label in both["labels"]]
    assert len(set(labellers)) == 2
    assert all(name.startswith("key:") for name in labellers)
    assert both["status"] == "agreed"
    assert both["gold_passage_ids"] == ["d2"]
    assert both["answer_correct"] is True  # only bob gave a verdict
    # Bob changes his mind: a disagreement, which leaves the gold set.
    split = post_gold(api, bob, "q1", passage_ids=["d1"]).json()
    assert split["status"] == "disagreed"
    assert split["gold_passage_ids"] is None
    read = api.get("/v1/events/q1/gold", headers=bearer(alice)).json()
    assert read == split


def test_tenants_apart(api: TestClient, keyed: Settings) -> None:
    ours, theirs = make_key(keyed, "acme"), make_key(keyed, "globex")
    assert api.post("/v1/events", json=make_event("q1"), headers=bearer(ours)).status_code == 202
    assert post_gold(api, theirs, "q1", passage_ids=["d1"]).status_code == 404
    assert api.get("/v1/events/q1/gold", headers=bearer(theirs)).status_code == 404
    assert post_gold(api, ours, "q1", passage_ids=["d1"]).status_code == 200
    agreement = api.get("/v1/gold/agreement", headers=bearer(theirs)).json()
    assert agreement["labelled_events"] == 0
    assert api.get("/v1/gold/agreement", headers=bearer(ours)).json()["labelled_events"] == 1
    assert api.post("/v1/events/q1/gold", json={"passage_ids": ["d1"]}).status_code == 401


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"passage_ids": ["nope"]}, "not among the 4"),
        ({"outcome": "answered"}, "needs passage_ids"),
        ({"outcome": "maybe"}, "outcome"),
        ({"outcome": "not_in_corpus", "passage_ids": ["d1"]}, "drop passage_ids"),
        ({"outcome": "not_retrieved"}, "missing_passage"),
        ({"outcome": "not_retrieved", "missing_passage": {}}, "id or its text"),
        ({"outcome": "not_retrieved", "missing_passage": {"id": "d1"}}, "was sent"),
        ({"passage_ids": ["d1"] * 201}, "at most 200"),
        ({"passage_ids": ["d1"], "labeller": "me"}, "set by the API key"),
        ({"passage_ids": ["d1"], "extra": 1}, "extra"),
        ({"passage_ids": ["d1"], "answer_correct": "perhaps"}, "answer_correct"),
    ],
)
def test_bad_labels_are_refused(
    api: TestClient, keyed: Settings, body: dict[str, Any], message: str
) -> None:
    key = make_key(keyed, "acme")
    assert api.post("/v1/events", json=make_event("q1"), headers=bearer(key)).status_code == 202
    answer = post_gold(api, key, "q1", **body)
    assert answer.status_code == 422, answer.text
    assert message in answer.text
    assert api.get("/v1/events/q1/gold", headers=bearer(key)).json()["labels"] == []


def test_missed_passage_and_causes(api: TestClient, keyed: Settings) -> None:
    key = make_key(keyed, "acme")
    for event_id in ("q1", "q2"):
        body = make_event(event_id, n=4, k=2, query=f"question {event_id}")
        assert api.post("/v1/events", json=body, headers=bearer(key)).status_code == 202
    missed = post_gold(
        api, key, "q1", outcome="not_retrieved", missing_passage={"text": "the real answer"}
    ).json()
    (derived,) = missed["gold_passage_ids"]
    assert derived.startswith("sha256:")
    assert missed["labels"][0]["missing_text"] == "the real answer"
    # A gold miss: the cause tagging takes it.
    cause = api.put(
        "/v1/events/q1/miss-cause", json={"cause": "vocabulary_mismatch"}, headers=bearer(key)
    )
    assert cause.status_code == 200, cause.text
    # The miss's page shows the marked passage as its gold, not sent with the event.
    page = api.get("/ui/misses/q1", headers=bearer(key)).text
    assert "Gold: did not reach the prompt" in page
    assert f"<code>{derived}</code>" in page
    assert "not among the 4 passages the retriever sent" in page
    # "Not in the corpus" is recorded as the miss's cause at once.
    post_gold(api, key, "q2", outcome="not_in_corpus")
    recorded = api.get("/v1/events/q2/miss-cause", headers=bearer(key)).json()
    assert recorded["cause"] == "not_in_corpus"


def test_analysis_takes_labels_as_gold(tmp_path: Path, store_url: str, redis_url: str) -> None:
    """Ten questions, k=2 of 4: five with gold sent (rank 1), five labelled afterwards (three at
    rank 1, two below the cut); answers correct on hits only: ceiling 0.8, conversion 1."""
    settings = make_settings(tmp_path, store_url, redis_url)
    engine = make_engine(settings.database_url)
    with TestClient(ui_app(settings)) as client:
        for i in range(10):
            extra: dict[str, Any] = {"answer_correct": i not in (8, 9)}
            if i < 5:
                extra["gold_passage_ids"] = ["d1"]
            body = make_event(f"q{i}", n=4, k=2, query=f"question {i}", **extra)
            assert client.post("/v1/events", json=body).status_code == 202
            judge(engine, f"q{i}", [3, 0, 0, 0])
        before = client.get("/v1/analysis", params={"since": "1d"}).json()
        assert before["counts"]["gold"] == 5
        for i in range(5, 10):
            gold = ["d1"] if i < 8 else ["d4"]
            answer = client.post(
                f"/v1/events/q{i}/gold", json={"passage_ids": gold, "labeller": "ann"}
            )
            assert answer.status_code == 200, answer.text
        after = client.get("/v1/analysis", params={"since": "1d"}).json()
    engine.dispose()
    assert after["counts"]["gold"] == 10
    assert after["gold"]["ceiling"]["value"] == pytest.approx(0.8)
    assert after["gold"]["conversion"]["value"] == pytest.approx(1.0)
    assert after["gold"]["retrieval_misses"] == 2
    # The judge (grade 3 on rank 1 only) against the labels: it finds every rank-1 gold.
    (calibration,) = after["calibration"]
    assert calibration["confusion"]["true_positive"] == 8


def test_labeller_kappa_on_metrics(tmp_path: Path, store_url: str, redis_url: str) -> None:
    """Two labellers on two events of four passages: they agree on q1 (d1), and on q2 one marks
    d1, the other d2: table [[1, 1], [1, 5]], kappa 1/3, one disagreement."""
    settings = make_settings(tmp_path, store_url, redis_url)
    with TestClient(ui_app(settings)) as client:
        for event_id in ("q1", "q2"):
            body = make_event(event_id, n=4, query=f"question {event_id}")
            assert client.post("/v1/events", json=body).status_code == 202
        for event_id, ann, bob in (("q1", "d1", "d1"), ("q2", "d1", "d2")):
            for who, passage in (("ann", ann), ("bob", bob)):
                body = {"passage_ids": [passage], "labeller": who}
                assert client.post(f"/v1/events/{event_id}/gold", json=body).status_code == 200
        text = client.get("/metrics").text
        agreement = client.get("/v1/gold/agreement").json()
    kappa = re.search(
        r'^retrieval_monitor_gold_labeller_kappa\{tenant="default"\} (\S+)$', text, re.M
    )
    assert kappa is not None, text[-2000:]
    assert float(kappa.group(1)) == pytest.approx(1 / 3)
    assert 'retrieval_monitor_gold_labeller_disagreements{tenant="default"} 1.0' in text
    (pair,) = agreement["pairs"]
    assert (pair["first"], pair["second"]) == ("name:ann", "name:bob")
    assert pair["table"] == [[1, 1], [1, 5]]
    assert agreement["pooled"]["kappa"] == pytest.approx(1 / 3)
