"""The synthetic workload, the BEIR loader, and the events a replay builds from them.

Tests ``service.replay.beir`` and ``service.replay.replay``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from service.replay.beir import BeirDataset, Document, load_beir
from service.replay.bm25 import Bm25Index
from service.replay.replay import ReplayConfig, build_event, replay_event_id
from service.replay.workload import generate_workload

FILES = ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv")


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_workload(tmp_path_factory.mktemp("workload"), n_queries=200, seed=7)


@pytest.fixture(scope="module")
def dataset(workload: Path) -> BeirDataset:
    return load_beir(workload)


@pytest.fixture(scope="module")
def index(dataset: BeirDataset) -> Bm25Index:
    return Bm25Index.build({doc_id: doc.full_text for doc_id, doc in dataset.corpus.items()})


def test_workload_is_a_loadable_beir_dataset(dataset: BeirDataset) -> None:
    assert len(dataset.queries) == 200
    assert len(dataset.corpus) > 5 * len(dataset.queries)
    for qid, judged in dataset.qrels.items():
        assert qid in dataset.queries
        assert judged
        assert all(doc in dataset.corpus for doc in judged)
        assert set(judged.values()) <= {1, 2}
    # Every template placeholder was filled and the text reads as sentences.
    for doc in dataset.corpus.values():
        assert "{" not in doc.text
        assert "}" not in doc.text
        assert doc.text[0].isupper()
        assert doc.text.endswith(".")
    for text in dataset.queries.values():
        assert "{" not in text
        assert text[0].isupper()
        assert text.endswith("?")
        assert "the the" not in text.lower()


def test_workload_has_several_relevant_passages_for_some_queries(dataset: BeirDataset) -> None:
    relevant_counts = Counter(
        sum(grade > 0 for grade in judged.values()) for judged in dataset.qrels.values()
    )
    assert relevant_counts[1] > 0
    assert sum(n for size, n in relevant_counts.items() if size >= 2) >= 30
    assert max(relevant_counts) >= 3


def test_workload_mixes_every_kind_of_question(workload: Path) -> None:
    kinds = Counter(
        json.loads(line)["metadata"]["kind"]
        for line in (workload / "queries.jsonl").read_text().splitlines()
    )
    assert set(kinds) == {"direct", "paraphrase", "descriptive", "list"}
    assert all(count >= 10 for count in kinds.values()), kinds


def test_bm25_on_the_workload_both_hits_and_misses(
    dataset: BeirDataset, index: Bm25Index, workload: Path
) -> None:
    kinds = {
        record["_id"]: record["metadata"]["kind"]
        for record in map(json.loads, (workload / "queries.jsonl").read_text().splitlines())
    }
    hits: dict[str, list[bool]] = {}
    for qid, text in dataset.queries.items():
        top = {doc for doc, _ in index.search(text, top_n=10)}
        relevant = {doc for doc, grade in dataset.qrels[qid].items() if grade > 0}
        hits.setdefault(kinds[qid], []).append(bool(top & relevant))
    overall = [hit for per_kind in hits.values() for hit in per_kind]
    hit_rate = sum(overall) / len(overall)
    assert 0.3 < hit_rate < 0.97, hit_rate
    # Questions in the passages' own words are found; reworded ones are missed far more often.
    direct = sum(hits["direct"]) / len(hits["direct"])
    paraphrase = sum(hits["paraphrase"]) / len(hits["paraphrase"])
    assert direct > 0.9, direct
    assert paraphrase < direct - 0.15, (direct, paraphrase)


def test_workload_is_deterministic(tmp_path: Path) -> None:
    first = generate_workload(tmp_path / "a", n_queries=60, seed=3)
    second = generate_workload(tmp_path / "b", n_queries=60, seed=3)
    other = generate_workload(tmp_path / "c", n_queries=60, seed=4)
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes()
    assert (first / "corpus.jsonl").read_bytes() != (other / "corpus.jsonl").read_bytes()


def test_workload_rejects_a_query_count_out_of_range(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_queries"):
        generate_workload(tmp_path, n_queries=0)


def write_beir(folder: Path, qrels: str) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        '{"_id": "a", "title": "Alpha", "text": "first passage"}\n'
        '{"_id": "b", "text": "second passage"}\n'
        '{"_id": "c", "title": "", "text": "third passage"}\n'
    )
    (folder / "queries.jsonl").write_text(
        '{"_id": "q1", "text": "which passage is first"}\n'
        '{"_id": "q2", "text": "a query nobody judged"}\n'
    )
    (folder / "qrels" / "test.tsv").write_text(qrels)
    return folder


def test_load_beir_keeps_judged_queries_only(tmp_path: Path) -> None:
    folder = write_beir(tmp_path, "query-id\tcorpus-id\tscore\nq1\ta\t2\nq1\tb\t0\nq9\tc\t1\n")
    dataset = load_beir(folder)
    assert dataset.queries == {"q1": "which passage is first"}
    assert dataset.qrels == {"q1": {"a": 2, "b": 0}}
    assert dataset.corpus["a"] == Document("a", "Alpha", "first passage")
    assert dataset.corpus["a"].full_text == "Alpha\nfirst passage"
    assert dataset.corpus["b"].full_text == "second passage"


def test_load_beir_names_what_is_missing(tmp_path: Path) -> None:
    folder = write_beir(tmp_path, "query-id\tcorpus-id\tscore\nq1\ta\t1\n")
    with pytest.raises(FileNotFoundError, match=r"dev\.tsv"):
        load_beir(folder, split="dev")
    (folder / "queries.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"queries\.jsonl"):
        load_beir(folder)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_beir(tmp_path / "nowhere")


def test_load_beir_reports_malformed_lines(tmp_path: Path) -> None:
    folder = write_beir(tmp_path, "query-id\tcorpus-id\tscore\nq1\ta\n")
    with pytest.raises(ValueError, match=r"test\.tsv:2"):
        load_beir(folder)


def test_build_event_carries_the_window_k_and_gold(dataset: BeirDataset, index: Bm25Index) -> None:
    qid = next(iter(dataset.queries))
    query = dataset.queries[qid]
    cfg = ReplayConfig(base_url="http://unused", k=5, gold=True, environment="staging")
    hits = index.search(query, top_n=cfg.passages_per_event)
    event = build_event(qid, query, hits, dataset, cfg)

    assert event["event_id"] == replay_event_id("replay", qid, 7)
    assert event["app"] == "replay"
    assert event["retriever"] == "bm25"
    assert event["environment"] == "staging"
    assert event["query"] == query
    assert event["k"] == 5
    assert len(event["passages"]) == 10 == cfg.passages_per_event
    assert [p["id"] for p in event["passages"]] == [doc for doc, _ in hits]
    assert [p["score"] for p in event["passages"]] == [score for _, score in hits]
    first = dataset.corpus[hits[0][0]]
    assert event["passages"][0]["text"] == f"{first.title}\n{first.text}"
    assert event["gold_passage_ids"] == sorted(dataset.qrels[qid])
    # A resend must be identical for the API to call it a duplicate, so nothing varies by run.
    assert build_event(qid, query, hits, dataset, cfg) == event

    plain = build_event(qid, query, hits, dataset, ReplayConfig(base_url="x", k=5, window=7))
    assert "gold_passage_ids" not in plain
    assert "environment" not in plain
    assert len(plain["passages"]) == 7


def test_build_event_gold_ids_exclude_non_relevant_and_k_shrinks(tmp_path: Path) -> None:
    folder = write_beir(tmp_path, "query-id\tcorpus-id\tscore\nq1\ta\t2\nq1\tb\t0\nq1\tc\t1\n")
    dataset = load_beir(folder)
    cfg = ReplayConfig(base_url="http://unused", k=10, gold=True)
    event = build_event("q1", "which passage", [("b", 1.5), ("a", 0.5)], dataset, cfg)
    assert event["gold_passage_ids"] == ["a", "c"]
    assert event["k"] == 2
    with pytest.raises(ValueError, match="no passage"):
        build_event("q1", "which passage", [], dataset, cfg)


def test_build_event_is_valid_for_the_api_schema(dataset: BeirDataset, index: Bm25Index) -> None:
    schemas = pytest.importorskip("service.contract.schemas")
    cfg = ReplayConfig(base_url="http://unused", gold=True)
    for qid in list(dataset.queries)[:20]:
        hits = index.search(dataset.queries[qid], top_n=cfg.passages_per_event)
        schemas.EventIn.model_validate(build_event(qid, dataset.queries[qid], hits, dataset, cfg))


def test_event_ids_are_stable_and_differ_by_app_query_and_seed() -> None:
    base = replay_event_id("replay", "q-1", 7)
    assert base == replay_event_id("replay", "q-1", 7)
    others = {
        replay_event_id("demo", "q-1", 7),
        replay_event_id("replay", "q-2", 7),
        replay_event_id("replay", "q-1", 8),
    }
    assert base not in others
    assert len(others) == 3
    assert re.fullmatch(r"[A-Za-z0-9._:\-]+", base)


def test_replay_config_rejects_inconsistent_settings() -> None:
    with pytest.raises(ValueError, match="window"):
        ReplayConfig(base_url="x", k=10, window=5)
    with pytest.raises(ValueError, match="rate"):
        ReplayConfig(base_url="x", rate=-1)
    with pytest.raises(ValueError, match="k must"):
        ReplayConfig(base_url="x", k=0)
    assert ReplayConfig(base_url="x", k=4).passages_per_event == 8
