"""The labelled gold set exported as a BEIR dataset: it reads back through the replay's BEIR
reader with the gold the analysis uses, and ``replay`` runs a retriever over it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.config.settings import Settings
from service.primitives.hashing import text_hash
from service.replay.beir import load_beir
from service.replay.replay import ReplayConfig, run_replay
from service.store import events as event_store
from tests.support.environment import make_settings
from tests.support.helpers import gold_export, make_event, ui_app
from tests.support.live import LiveServer

MISSING_TEXT = "the passage that answers, which the retriever never sent"


def label(client: TestClient, event_id: str, who: str, **body: Any) -> None:
    answer = client.post(f"/v1/events/{event_id}/gold", json={**body, "labeller": who})
    assert answer.status_code == 200, answer.text


@pytest.fixture
def settings(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, store_url, redis_url)


def seed(client: TestClient) -> None:
    """Seven events of four passages (ids ``<event>-d1`` ..), k = 2, each another kind of gold."""
    for i in range(7):
        body = make_event(f"e{i}", n=4, k=2, query=f"question number {i}")
        for passage in body["passages"]:
            passage["id"] = f"e{i}-{passage['id']}"
            passage["text"] = f"text {passage['id']} of question {i}"
        if i == 0:
            body["gold_passage_ids"] = ["e0-d1"]  # sent with the event
        assert client.post("/v1/events", json=body).status_code == 202
    label(client, "e1", "ann", passage_ids=["e1-d3", "e1-d2"])
    label(client, "e2", "ann", outcome="not_retrieved", missing_passage={"text": MISSING_TEXT})
    label(client, "e3", "ann", outcome="not_retrieved", missing_passage={"id": "doc-elsewhere"})
    label(client, "e4", "ann", outcome="not_in_corpus")
    label(client, "e5", "ann", passage_ids=["e5-d1"])
    label(client, "e5", "bob", passage_ids=["e5-d2"])  # a disagreement: not gold
    label(client, "e6", "ann", passage_ids=["e6-d4"])
    label(client, "e6", "bob", passage_ids=["e6-d4"])  # agreed


def test_export_round_trips_through_the_beir_reader(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestClient(ui_app(settings)) as client:
        seed(client)
    out = tmp_path / "gold-set"
    assert gold_export(settings, "--out", str(out), "--since", "1d") == 0
    printed = capsys.readouterr().out
    assert "5 queries" in printed
    assert "1 gold passages have no text" in printed

    dataset = load_beir(out)
    missing_id = event_store.passage_key(None, text_hash(MISSING_TEXT))
    assert dataset.qrels == {
        "e0": {"e0-d1": 1},
        "e1": {"e1-d2": 1, "e1-d3": 1},
        "e2": {missing_id: 1},
        "e3": {"doc-elsewhere": 1},
        "e6": {"e6-d4": 1},
    }
    assert dataset.queries == {q: f"question number {q[1]}" for q in dataset.qrels}
    # Every passage sent with the five questions, and the pasted text of the missed one.
    sent = {f"e{i}-d{r}" for i in (0, 1, 2, 3, 6) for r in range(1, 5)}
    assert set(dataset.corpus) == sent | {missing_id}
    assert dataset.corpus["e1-d3"].text == "text e1-d3 of question 1"
    assert dataset.corpus[missing_id].text == MISSING_TEXT
    agreement = json.loads((out / "agreement.json").read_text())
    assert (agreement["shared_events"], agreement["agreed"], agreement["disagreed"]) == (2, 1, 1)
    # ann and bob agree on e6 (4 of 4 decisions) and differ on e5's d1 and d2:
    # table [[1, 1], [1, 5]], kappa 1/3.
    assert agreement["pooled"]["kappa"] == pytest.approx(1 / 3)


def test_replay_runs_on_the_exported_set(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with TestClient(ui_app(settings)) as client:
        seed(client)
    out = tmp_path / "gold-set"
    assert gold_export(settings, "--out", str(out), "--since", "1d", "--app", "shop") == 0
    with LiveServer(settings) as server:
        report = run_replay(
            ReplayConfig(
                base_url=server.url,
                dataset=out,
                k=2,
                rate=0,
                gold=True,
                app="next-retriever",
                progress=False,
            )
        )
        assert (report.accepted, report.rejected, report.failed) == (5, 0, 0)
        analysis = httpx.get(
            f"{server.url}/v1/analysis", params={"since": "1d", "app": "next-retriever"}
        ).json()
    # The replayed questions are gold questions of their own, ready for analyze --baseline.
    assert analysis["counts"]["gold"] == 5
    assert analysis["gold"]["ceiling"]["n"] == 5


def test_bad_window_is_refused(settings: Settings, tmp_path: Path) -> None:
    assert gold_export(settings, "--out", str(tmp_path / "x"), "--since", "yesterday") == 2
