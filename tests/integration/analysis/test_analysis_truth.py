"""The analysis on inputs where it used to bend the truth: repeated passage texts, questions
without an answer verdict, float noise in T, empty and repeated gold lists; and a randomized
check of the gold arithmetic against figures recomputed here from the planned ground truth.

Events go in through the API and are judged by the real judging code against the test's
OpenAI-compatible server, on SQLite and PostgreSQL.

Tests ``service.analysis.dataset`` and ``service.store.analysis``.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from service.analysis import stats
from service.analysis.correlation import ALPHA_GRID, JudgedTraffic, correlate
from service.analysis.dataset import gold_events
from service.analysis.gold import analyze_gold, diagnose
from service.api.app import create_app
from service.config.settings import Settings
from service.measures.formulas import compute_batch, t_measure
from service.store.analysis import AnalysisEvent
from service.store.engine import session_scope
from service.store.models import Event
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from workers import judging
from workers.judge import make_judge


def derived_id(text: str) -> str:
    """The id the service gives a passage sent without one: its text's hash, shortened."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.fixture
def judged_api(
    tmp_path: Path, store_url: str, redis_url: str, fake_llm: FakeLLM
) -> Iterator[tuple[TestClient, Settings]]:
    settings = make_settings(
        tmp_path,
        store_url,
        redis_url,
        judge_base_url=fake_llm.base_url,
        judge_model="fake-judge",
        judge_max_retries=0,
    )
    with TestClient(create_app(settings)) as client:
        yield client, settings


def judge_all(settings: Settings) -> None:
    runtime = Runtime(settings)
    with session_scope(runtime.engine) as session:
        pks = [pk for pk in session.exec(select(Event.id)).all() if pk is not None]
    result = judging.judge_events(runtime, make_judge(settings, runtime.redis), pks)
    assert set(result.outcomes.values()) == {"judged"}, result.outcomes


def post(client: TestClient, event: dict[str, Any]) -> None:
    response = client.post("/v1/events", json={"app": "shop", "retriever": "bm25", **event})
    assert response.status_code == 202, response.text


def gold_report(client: TestClient) -> dict[str, Any]:
    response = client.get("/v1/analysis", params={"since": "1d"})
    assert response.status_code == 200, response.text
    gold: dict[str, Any] = response.json()["gold"]
    return gold


# ---------------------------------------------------------------------------------------------
# 1. Ranks are the positions sent


def test_repeated_texts_keep_every_passage_at_the_rank_it_was_sent(
    judged_api: tuple[TestClient, Settings],
) -> None:
    client, settings = judged_api
    # Two id-less passages with one text share a derived id; the gold passage comes third,
    # past k=2, and must stay third.
    post(
        client,
        {
            "event_id": "repeat-before-gold",
            "query": "who wrote the iliad",
            "k": 2,
            "passages": [{"text": "Bread needs yeast."}] * 2 + [{"text": "Homer wrote it."}],
            "gold_passage_ids": [derived_id("Homer wrote it.")],
            "answer_correct": False,
        },
    )
    # The gold passage itself sent twice: one gold passage, found at rank 1.
    post(
        client,
        {
            "event_id": "gold-repeated",
            "query": "where was troy",
            "k": 1,
            "passages": [{"text": "Troy was in Anatolia."}] * 2 + [{"text": "Unrelated."}],
            "gold_passage_ids": [derived_id("Troy was in Anatolia.")],
            "answer_correct": True,
        },
    )
    judge_all(settings)

    missed = client.get("/v1/events/repeat-before-gold").json()
    assert [p["rank"] for p in missed["passages"]] == [1, 2, 3]
    assert missed["measures"]["recall"] == 0.0
    found = client.get("/v1/events/gold-repeated").json()
    assert found["status"] == "judged"
    assert found["measures"]["recall"] == 1.0
    assert found["measures"]["ndcg_gold"] == 1.0
    assert [p["gold"] for p in found["passages"]] == [True, False, False]

    gold = gold_report(client)
    assert gold["events"] == 2
    assert gold["ceiling"]["value"] == 0.5  # the event's own recall says the same
    assert gold["mrr"]["value"] == 0.5
    curve = {point["cutoff"]: point["hit"]["value"] for point in gold["curve"]}
    assert curve == {1: 0.5, 3: 1.0}


# ---------------------------------------------------------------------------------------------
# 2. Predicted and observed accuracy on the same questions


def test_predicted_accuracy_equals_observed_when_the_data_fits_the_model(
    judged_api: tuple[TestClient, Settings],
) -> None:
    client, _ = judged_api
    # Every right answer had its gold passage in the prompt (the article's model). The questions
    # without a verdict all missed, so a ceiling over every question would be too low.
    plan = [(1, True), (1, True), (1, False), (2, True), (None, False)] + [(None, None)] * 5
    for index, (gold_rank, correct) in enumerate(plan):
        texts = [f"passage {index}-{r}" for r in range(1, 4)]
        gold_text = texts[gold_rank - 1] if gold_rank is not None else f"unsent {index}"
        post(
            client,
            {
                "event_id": f"q{index}",
                "query": f"question {index}",
                "k": 2,
                "passages": [{"text": t} for t in texts],
                "gold_passage_ids": [derived_id(gold_text)],
                **({} if correct is None else {"answer_correct": correct}),
            },
        )

    gold = gold_report(client)
    assert gold["events"] == 10
    assert gold["with_feedback"] == 5
    assert gold["observed_accuracy"]["value"] == pytest.approx(3 / 5)
    assert gold["predicted_accuracy"]["value"] == pytest.approx(3 / 5)
    assert gold["predicted_accuracy"]["n"] == 5
    assert any("on the 5 questions with an answer verdict" in n for n in gold["diagnosis"])


# ---------------------------------------------------------------------------------------------
# 3. Equal values are equal, and ties survive rounding


def test_no_relevant_passage_is_exactly_minus_alpha_for_every_k() -> None:
    for alpha in ALPHA_GRID:
        for k in range(1, 101):
            assert t_measure(0, k, alpha) == -alpha
    ks = np.arange(1, 101)
    grades = np.zeros((ks.size, 100))
    for alpha in ALPHA_GRID:
        batch = compute_batch(grades, ks, alpha)
        assert set(batch["t"].tolist()) == {-alpha}


def test_float_noise_does_not_split_a_tie_when_ranking() -> None:
    exact = np.array([-0.7, -0.7, -0.7, 0.3, 1.3])
    noisy = np.array([-0.7, -0.6999999999999998, -0.7, 0.3, 1.3])
    grades = np.array([2.0, 1.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(stats.rankdata(noisy), [2.0, 2.0, 2.0, 4.0, 5.0])
    assert stats.spearman(noisy, grades) == stats.spearman(exact, grades)
    assert stats.kendall_tau_b(noisy, grades) == stats.kendall_tau_b(exact, grades)
    boot_noisy = stats.bootstrap_spearman([noisy], grades, reps=50, seed=3)
    boot_exact = stats.bootstrap_spearman([exact], grades, reps=50, seed=3)
    np.testing.assert_array_equal(boot_noisy, boot_exact)


def test_the_chosen_alpha_does_not_depend_on_how_k_rounds() -> None:
    # Events that differ only in K and have no relevant passage tie in T at every alpha; the
    # best alpha and its Spearman must be those of the same traffic with one K for all of them.
    rng = np.random.default_rng(7)
    n = 240
    ks = rng.choice([3, 6, 12, 24], size=n)
    width = int(ks.max()) * 2
    relevant = rng.random((n, width)) < 0.15
    relevant[: n // 2] = False  # a large group without any relevant passage
    grades_matrix = np.where(relevant, 3.0, 0.0)
    n_p = (relevant & (np.arange(width)[None, :] < ks[:, None])).sum(axis=1)
    answers = np.clip(1 + n_p + rng.integers(0, 2, size=n), 1, 5).astype(np.float64)

    def traffic(cutoffs: np.ndarray) -> JudgedTraffic:
        return JudgedTraffic(
            grades=grades_matrix,
            ks=cutoffs.astype(np.int64),
            n_sent=np.full(n, width, dtype=np.int64),
            context_ratings=np.full(n, np.nan),
            response_grades=answers,
            gold_relevant=np.zeros_like(relevant),
            n_gold=np.full(n, np.nan),
        )

    report = correlate(traffic(ks), default_alpha=0.5, reps=50, seed=0)
    t_row = report.row("t", "all")
    t_values = [
        compute_batch(grades_matrix, ks, a, n_sent=np.full(n, width))["t"] for a in ALPHA_GRID
    ]
    expected = [stats.spearman(values, answers) for values in t_values]
    best = int(np.argmax(np.round(expected, 12)))
    assert t_row.alpha == ALPHA_GRID[best]
    assert t_row.spearman == pytest.approx(expected[best], abs=1e-12)
    # The no-relevant group is one tie: every member gets the same T at the chosen alpha.
    chosen = t_values[best][: n // 2]
    assert np.unique(chosen).size == 1


# ---------------------------------------------------------------------------------------------
# 4. Empty and repeated gold lists; what the diagnosis numbers are


def test_an_empty_gold_list_is_refused_with_a_reason(
    judged_api: tuple[TestClient, Settings],
) -> None:
    client, _ = judged_api
    response = client.post(
        "/v1/events",
        json={
            "app": "shop",
            "retriever": "bm25",
            "query": "anything",
            "passages": [{"text": "a passage"}],
            "gold_passage_ids": [],
        },
    )
    assert response.status_code == 422
    assert "gold_passage_ids is empty" in response.text
    batch = client.post(
        "/v1/events/batch",
        json={
            "events": [
                {
                    "app": "shop",
                    "retriever": "bm25",
                    "query": "anything",
                    "passages": [{"text": "a passage"}],
                    "gold_passage_ids": [],
                }
            ]
        },
    )
    assert "gold_passage_ids is empty" in batch.text


def test_a_repeated_gold_id_counts_once(judged_api: tuple[TestClient, Settings]) -> None:
    client, settings = judged_api
    post(
        client,
        {
            "event_id": "twice",
            "query": "who wrote the iliad",
            "k": 2,
            "passages": [
                {"id": "d1", "text": "Homer wrote it."},
                {"id": "d2", "text": "Bread needs yeast."},
                {"id": "d3", "text": "Troy was in Anatolia."},
            ],
            "gold_passage_ids": ["d1", "d1", "d9"],
            "answer_correct": True,
        },
    )
    judge_all(settings)
    event = client.get("/v1/events/twice").json()
    assert event["gold_passage_ids"] == ["d1", "d9"]
    assert event["measures"]["recall"] == 0.5
    # F(alpha) = n_p / (alpha * K + (1 - alpha) * N_p) with N_p = 2, not 3.
    alpha = event["measures"]["alpha"]
    assert event["measures"]["f"] == pytest.approx(1 / (alpha * 2 + (1 - alpha) * 2))
    gold = gold_report(client)
    assert gold["ceiling_recall"]["value"] == 0.5


def test_the_diagnosis_says_what_the_detectable_difference_is() -> None:
    events = [
        AnalysisEvent(i, 3, 5, None, [f"g{i}"], None, None, datetime.now(UTC)) for i in range(40)
    ]
    ids = {
        i: [f"g{i}" if i % 2 == 0 else f"x{i}"] + [f"n{i}-{r}" for r in range(4)] for i in range(40)
    }
    report = analyze_gold(gold_events(events, ids), reps=50)
    first = diagnose(report)[0]
    detectable = stats.minimum_detectable_difference(0.5, 40, 40)
    assert f"detect a change of {detectable:.2f} or more 80% of the time" in first
    assert "noise" not in first


# ---------------------------------------------------------------------------------------------
# The gold arithmetic against ground truth planned here


def test_gold_figures_match_the_planted_truth_on_random_traffic() -> None:
    rng = random.Random(2026)
    for trial in range(25):
        events: list[AnalysisEvent] = []
        ids: dict[int, list[str]] = {}
        truth: list[tuple[int, int | None, bool | None]] = []  # (k, first gold rank, correct)
        conversion, luck = rng.uniform(0.3, 0.95), rng.uniform(0.0, 0.3)
        for pk in range(rng.randint(5, 60)):
            depth = rng.randint(1, 12)
            k = rng.randint(1, depth)
            # Texts drawn from a small pool, so derived ids repeat within an event.
            ranked = [f"sha256:pool{rng.randint(0, 6)}" for _ in range(depth)]
            gold_ids = rng.sample([f"sha256:pool{i}" for i in range(10)], rng.randint(1, 3))
            gold_ids += rng.sample(gold_ids, rng.randint(0, 1))  # sometimes a repeat
            first = next((r for r, pid in enumerate(ranked, 1) if pid in gold_ids), None)
            reached = first is not None and first <= k
            correct: bool | None = None
            if rng.random() < 0.7:
                correct = rng.random() < (conversion if reached else luck)
            events.append(
                AnalysisEvent(pk, k, depth, None, gold_ids, None, correct, datetime.now(UTC))
            )
            ids[pk] = ranked
            truth.append((k, first, correct))

        report = analyze_gold(gold_events(events, ids), reps=20, seed=trial)

        hits = [first is not None and first <= k for k, first, _ in truth]
        assert report.ceiling.value == pytest.approx(sum(hits) / len(truth))
        mrr = sum(1 / first for k, first, _ in truth if first is not None and first <= k)
        assert report.mrr.value == pytest.approx(mrr / len(truth))
        judged = [(hit, c) for (_, _, c), hit in zip(truth, hits, strict=True) if c is not None]
        reached_answers = [c for hit, c in judged if hit]
        if reached_answers:
            assert report.conversion.value == pytest.approx(
                sum(reached_answers) / len(reached_answers)
            )
        else:
            assert math.isnan(report.conversion.value)
        if judged and reached_answers:
            ceiling_judged = sum(hit for hit, _ in judged) / len(judged)
            expected = ceiling_judged * sum(reached_answers) / len(reached_answers)
            assert report.predicted_accuracy.value == pytest.approx(expected)
            assert report.predicted_accuracy.n == len(judged)
            # Right answers without the gold passage are exactly the gap to the observed one.
            lucky = sum(1 for hit, c in judged if c and not hit)
            assert report.observed_accuracy.value == pytest.approx(expected + lucky / len(judged))
