"""``analyze --compare-windows --baseline`` on two gold sets: a set labelled in the tool on one
retriever's traffic, exported (``gold export``), replayed through the replay's BM25 retriever with
its gold (``replay --gold``), and the two windows compared. The figures it prints are checked
against ones computed here from the known gold and the ranks each retriever sent.

Tests ``service.cli.gold``, ``service.cli.replay`` and ``service.cli.window_options``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.cli.analyze import add_analyze_command
from service.config.settings import Settings
from service.primitives.clock import utcnow
from service.replay.beir import load_beir
from service.replay.replay import ReplayConfig, replay_event_id, run_replay
from tests.support.environment import make_settings
from tests.support.helpers import gold_export, make_event, ui_app
from tests.support.live import LiveServer

K = 2
NEXT_APP = "next-retriever"
SEED = 7  # the replay's default seed, which names its event ids
ANIMALS = [
    "otter",
    "heron",
    "badger",
    "marten",
    "plover",
    "stoat",
    "vole",
    "curlew",
    "shrew",
    "egret",
    "lynx",
    "ibex",
    "newt",
]


@pytest.fixture
def settings(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, store_url, redis_url)


def analyze(settings: Settings, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_analyze_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analyze", *argv])
    result: int = args.handler(args, settings)
    return result


def first_set(client: TestClient) -> dict[str, int]:
    """Thirteen questions of four passages, k = 2, sent without gold and labelled afterwards:
    the answering passage at rank 1 for even questions, rank 3 (below the cut) for odd ones;
    two labellers disagree on the last, which leaves the set. The gold rank of each question."""
    ranks: dict[str, int] = {}
    for i, animal in enumerate(ANIMALS):
        answer_rank = 1 if i % 2 == 0 else 3
        body = make_event(f"q{i}", n=4, k=K, query=f"where does the {animal} live")
        for rank, passage in enumerate(body["passages"], start=1):
            passage["id"] = f"q{i}-p{rank}"
            passage["text"] = (
                f"the {animal} lives by the river"
                if rank == answer_rank
                else f"unrelated note {i} {rank} on the weather"
            )
        assert client.post("/v1/events", json=body).status_code == 202
        gold = {"passage_ids": [f"q{i}-p{answer_rank}"], "labeller": "ann"}
        assert client.post(f"/v1/events/q{i}/gold", json=gold).status_code == 200
        if i == len(ANIMALS) - 1:
            other = {"passage_ids": [f"q{i}-p4"], "labeller": "bob"}
            assert client.post(f"/v1/events/q{i}/gold", json=other).status_code == 200
        else:
            ranks[f"q{i}"] = answer_rank
    return ranks


def figures(ranks: list[int | None]) -> tuple[float, float]:
    """(ceiling, MRR@k) from the first gold rank of each question (None: not sent)."""
    in_prompt = [r is not None and r <= K for r in ranks]
    reciprocal = [1.0 / r if r is not None and r <= K else 0.0 for r in ranks]
    return sum(in_prompt) / len(ranks), sum(reciprocal) / len(ranks)


def quantity(report: dict[str, Any], name: str) -> dict[str, Any]:
    found = [q["test"] for q in report["quantities"] if q["name"] == name]
    assert found, [q["name"] for q in report["quantities"]]
    test: dict[str, Any] = found[0]
    return test


def test_baseline_compares_two_exported_gold_sets(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = utcnow() - timedelta(seconds=1)
    with TestClient(ui_app(settings)) as client:
        first_ranks = first_set(client)
    time.sleep(0.01)  # the replay's events are received after this moment
    middle = utcnow()
    out = tmp_path / "gold-set"
    exported = gold_export(
        settings, "--out", str(out), "--since", start.isoformat(), "--until", middle.isoformat()
    )
    assert exported == 0
    qrels = load_beir(out).qrels
    assert set(qrels) == set(first_ranks)  # the disagreement left the set

    # The second set: the same questions through the replay's BM25 retriever, with their gold.
    second_ranks: dict[str, int | None] = {}
    with LiveServer(settings) as server:
        report = run_replay(
            ReplayConfig(
                base_url=server.url,
                dataset=out,
                k=K,
                rate=0,
                gold=True,
                app=NEXT_APP,
                progress=False,
                seed=SEED,
            )
        )
        assert (report.accepted, report.rejected, report.failed) == (len(qrels), 0, 0)
        for query_id, gold in qrels.items():
            event_id = replay_event_id(NEXT_APP, query_id, SEED)
            event = httpx.get(f"{server.url}/v1/events/{event_id}").json()
            assert set(event["gold_passage_ids"]) == set(gold)
            sent = [p["id"] for p in sorted(event["passages"], key=lambda p: p["rank"])]
            second_ranks[query_id] = next((r for r, p in enumerate(sent, 1) if p in gold), None)
    end = utcnow() + timedelta(seconds=1)
    capsys.readouterr()  # what the export and the replay printed

    window = ["--since", middle.isoformat(), "--until", end.isoformat()]
    baseline = ["--baseline", start.isoformat(), middle.isoformat()]
    assert analyze(settings, "--compare-windows", *window, *baseline, "--json") == 0
    compared = json.loads(capsys.readouterr().out)
    assert analyze(settings, "--compare-windows", *window, *baseline) == 0
    table = capsys.readouterr().out

    ceiling_a, mrr_a = figures(list(first_ranks.values()))
    ceiling_b, mrr_b = figures(list(second_ranks.values()))
    assert (ceiling_a, mrr_a) == (0.5, 0.5)  # six of twelve at rank 1, six below the cut
    assert ceiling_b > ceiling_a  # the texts make BM25 rank the answer first
    assert compared["a"]["gold_events"] == len(first_ranks)
    assert compared["b"]["gold_events"] == len(second_ranks)
    ceiling = quantity(compared, "ceiling")
    assert (ceiling["a"], ceiling["b"]) == (pytest.approx(ceiling_a), pytest.approx(ceiling_b))
    assert (ceiling["n_a"], ceiling["n_b"]) == (len(first_ranks), len(second_ranks))
    assert ceiling["difference"] == pytest.approx(ceiling_b - ceiling_a)
    # The two-proportion z test with the pooled proportion, computed here.
    n_a, n_b = len(first_ranks), len(second_ranks)
    pooled = (ceiling_a * n_a + ceiling_b * n_b) / (n_a + n_b)
    z = (ceiling_b - ceiling_a) / math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    assert ceiling["p_value"] == pytest.approx(math.erfc(abs(z) / math.sqrt(2)), rel=1e-6)
    mrr = quantity(compared, "mrr")
    assert (mrr["a"], mrr["b"]) == (pytest.approx(mrr_a), pytest.approx(mrr_b))
    # The same twelve questions on both sides: the ceiling is also tested paired.
    paired = compared["paired_ceiling"]
    assert paired is not None
    # McNemar's exact test on the discordant questions: in the prompt on one side only.
    only_b = sum(1 for q, r in first_ranks.items() if r > K and (second_ranks[q] or K + 1) <= K)
    only_a = sum(1 for q, r in first_ranks.items() if r <= K and (second_ranks[q] or K + 1) > K)
    discordant = only_a + only_b
    tail = sum(math.comb(discordant, i) for i in range(min(only_a, only_b) + 1))
    assert paired["test"]["p_value"] == pytest.approx(min(1.0, 2 * tail / 2**discordant))
    assert (paired["test"]["a"], paired["test"]["b"]) == (
        pytest.approx(ceiling_a),
        pytest.approx(ceiling_b),
    )
    # The table names both windows and prints the same ceilings.
    assert f"{start:%Y-%m-%d %H:%M} .. {middle:%Y-%m-%d %H:%M}" in table
    ceiling_line = next(line for line in table.splitlines() if line.strip().startswith("ceiling"))
    assert f"{ceiling_a:.3f}" in ceiling_line
    assert f"{ceiling_b:.3f}" in ceiling_line
