"""The analysis on synthetic traffic whose answers are known: a planted correlation, a planted
alpha, a planted regime, and the article's 50 questions with their recall and conversion.

Tests ``service.analysis.calibration``, ``service.analysis.compare``,
``service.analysis.correlation`` and ``service.analysis.gold``.
"""

from __future__ import annotations

import ast
import math
from datetime import UTC, datetime

import numpy as np
import pytest

from service.analysis import stats
from service.analysis.calibration import LabelPair, calibrate
from service.analysis.compare import SideData, compare, paired_ceiling
from service.analysis.correlation import (
    REFERENCE_FREE,
    JudgedTraffic,
    correlate,
    np_counts,
    regime_distribution,
    regime_masks,
)
from service.analysis.dataset import gold_events, judged_traffic, label_pairs
from service.analysis.gold import GoldEvent, analyze_gold, predicted_accuracy
from service.measures.formulas import f_measure, ndcg_at, t_measure, t_u_measure
from service.store.analysis import AnalysisEvent, GoldJudgment
from tests.support.paths import REPO_ROOT

NOW = datetime(2025, 1, 1, tzinfo=UTC)


def traffic(
    grades: np.ndarray,
    ks: np.ndarray,
    response: np.ndarray,
    *,
    gold: np.ndarray | None = None,
    n_gold: np.ndarray | None = None,
) -> JudgedTraffic:
    n = grades.shape[0]
    return JudgedTraffic(
        grades=grades,
        ks=ks.astype(np.int64),
        n_sent=np.minimum(2 * ks, grades.shape[1]).astype(np.int64),
        context_ratings=np.full(n, np.nan),
        response_grades=response.astype(float),
        gold_relevant=np.zeros(grades.shape, dtype=bool) if gold is None else gold,
        n_gold=np.full(n, np.nan) if n_gold is None else n_gold.astype(float),
    )


def random_lists(
    rng: np.random.Generator, n: int, k_low: int = 1, k_high: int = 12
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ks, grades (n, 2*max k), n_p in the top k): each event has its own share of relevant."""
    ks = rng.integers(k_low, k_high + 1, n)
    grades = np.full((n, 2 * int(ks.max())), np.nan)
    share = rng.uniform(0.05, 0.95, n)
    for row, k in enumerate(ks):
        grades[row, : 2 * k] = np.where(rng.random(2 * k) < share[row], 3.0, 0.0)
    n_p = np.array([int((grades[row, :k] >= 2).sum()) for row, k in enumerate(ks)])
    return ks, grades, n_p


def to_five_grades(score: np.ndarray) -> np.ndarray:
    """A 1-5 response grade by quintile of a latent score, as a grader's scale would cut it."""
    cuts = np.quantile(score, [0.2, 0.4, 0.6, 0.8])
    return 1.0 + np.searchsorted(cuts, score, side="right")


# ---------------------------------------------------------------------------------------------
# Correlations


def test_a_planted_correlation_is_recovered_by_all_three_coefficients() -> None:
    # For a bivariate normal with correlation rho: Spearman = (6/pi) asin(rho/2) and
    # Kendall tau = (2/pi) asin(rho).
    rho = 0.6
    rng = np.random.default_rng(0)
    x, y = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], size=20000).T
    assert stats.pearson(x, y) == pytest.approx(rho, abs=0.015)
    assert stats.spearman(x, y) == pytest.approx(6 / math.pi * math.asin(rho / 2), abs=0.015)
    assert stats.kendall_tau_b(x, y) == pytest.approx(2 / math.pi * math.asin(rho), abs=0.015)


@pytest.mark.parametrize("planted", [0.1, 0.3, 0.6, 0.9])
def test_the_alpha_that_generated_the_grades_maximises_spearman(planted: float) -> None:
    rng = np.random.default_rng(int(planted * 100))
    ks, grades, n_p = random_lists(rng, 1500)
    for name, measure in (("t", t_measure), ("t_u", t_u_measure)):
        response = np.array(
            [measure(int(a), int(k), planted) for a, k in zip(n_p, ks, strict=True)]
        )
        row = correlate(traffic(grades, ks, response), reps=20).row(name, "all")
        curve = np.asarray(row.spearman_by_alpha)
        at_planted = curve[round(planted / 0.05)]
        assert at_planted == pytest.approx(1.0), name
        assert row.spearman == pytest.approx(1.0), name
        assert row.alpha_plateau is not None
        assert row.alpha_plateau[0] <= planted <= row.alpha_plateau[1], name
    # T_u's ranking moves with alpha for every K, so it pins alpha to one grid step; T's only
    # moves through K, and its plateau is wide at low alpha (reported, not hidden).
    t_u = correlate(traffic(grades, ks, ks * 0.0 + n_p - planted * ks), reps=20).row("t_u", "all")
    assert t_u.alpha == pytest.approx(planted, abs=0.05)


def test_the_alpha_of_f_is_recovered_on_gold_traffic() -> None:
    rng = np.random.default_rng(42)
    ks, grades, n_p = random_lists(rng, 1200)
    gold = np.nan_to_num(grades, nan=0.0) >= 2
    listed = gold.sum(axis=1)
    n_gold = listed + rng.integers(0, 6, len(ks))
    planted = 0.7
    response = np.array(
        [
            f_measure(int(a), int(k), int(g), planted)
            for a, k, g in zip(n_p, ks, n_gold, strict=True)
        ]
    )
    report = correlate(traffic(grades, ks, response, gold=gold, n_gold=n_gold), reps=20)
    row = report.row("f", "all")
    assert row.spearman == pytest.approx(1.0)
    assert row.alpha == pytest.approx(planted, abs=0.05)
    # Gold N_p decides the regime of every event here.
    assert report.regimes.from_gold == len(ks)


def test_a_planted_alpha_survives_coarse_noisy_grades() -> None:
    rng = np.random.default_rng(8)
    ks, grades, n_p = random_lists(rng, 3000)
    planted = 0.3
    latent = n_p - planted * ks
    response = to_five_grades(latent / latent.std() + rng.normal(0, 0.3, len(ks)))
    row = correlate(traffic(grades, ks, response), reps=20).row("t_u", "all")
    assert row.alpha == pytest.approx(planted, abs=0.1)
    assert row.alpha_plateau is not None
    assert row.alpha_plateau[0] <= planted <= row.alpha_plateau[1]
    assert 0.7 < row.spearman < 1.0
    assert set(np.unique(response)) == {1.0, 2.0, 3.0, 4.0, 5.0}


def _regime_traffic(rng: np.random.Generator) -> JudgedTraffic:
    """400 narrow events (K < N_p, grade follows T) and 600 wide ones (K >= N_p, grade
    follows the order of the top K: nDCG), with gold N_p so the split is exact."""
    rows: list[np.ndarray] = []
    ks: list[int] = []
    n_gold: list[int] = []
    latent: list[float] = []
    width = 24
    for _ in range(400):
        k = int(rng.integers(2, 7))
        labels = np.full(width, np.nan)
        labels[: 2 * k] = np.where(rng.random(2 * k) < rng.uniform(0.1, 0.9), 3.0, 0.0)
        hits = int((labels[:k] >= 2).sum())
        rows.append(labels)
        ks.append(k)
        n_gold.append(k + int(rng.integers(1, 6)) + int((labels[k : 2 * k] >= 2).sum()))
        latent.append(t_measure(hits, k, 0.5) + rng.normal(0, 0.25))
    for _ in range(600):
        k = int(rng.integers(8, 13))
        labels = np.full(width, np.nan)
        labels[: 2 * k] = rng.integers(0, 4, 2 * k).astype(float)
        rows.append(labels)
        ks.append(k)
        n_gold.append(int(rng.integers(1, 4)))
        latent.append(ndcg_at(labels[:k], k) * 4 + rng.normal(0, 0.1))
    grades = np.vstack(rows)
    k_array = np.array(ks)
    narrow = np.arange(len(ks)) < 400
    response = np.empty(len(ks))
    score = np.asarray(latent)
    response[narrow] = to_five_grades(score[narrow])
    response[~narrow] = to_five_grades(score[~narrow])
    # The judge agrees with gold on the narrow events; the wide ones retrieved no gold passage.
    gold = (np.nan_to_num(grades) >= 2) & narrow[:, None]
    return traffic(grades, k_array, response, gold=gold, n_gold=np.array(n_gold))


def test_narrow_and_wide_traffic_each_get_their_measure() -> None:
    report = correlate(_regime_traffic(np.random.default_rng(3)), reps=300)
    assert report.regimes.narrow == 400
    assert report.regimes.wide == 600
    narrow = {m: report.row(m, "narrow").spearman for m in ("t", "ndcg", "precision")}
    wide = {m: report.row(m, "wide").spearman for m in ("t", "ndcg", "precision")}
    lead_narrow = max(REFERENCE_FREE, key=lambda m: report.row(m, "narrow").spearman)
    assert lead_narrow == "t"
    assert narrow["t"] > narrow["ndcg"] + 0.15
    assert wide["ndcg"] > wide["t"] + 0.3
    rec = report.recommendation
    assert (rec.regime, rec.measure, rec.basis) == ("wide", "ndcg", "data")
    assert rec.margin is not None
    assert rec.margin.low > 0
    # The wide events here sit at K/N_p of 2.7 to 12: the paper's nDCG territory.
    assert rec.paper_expects == "ndcg"
    assert "agrees with the paper" in rec.text
    # F with gold needs no alpha grid to be reported, and both other coefficients come along.
    f_row = report.row("f", "narrow")
    assert f_row.n == 400
    assert not math.isnan(f_row.kendall)
    assert not math.isnan(f_row.pearson)


def test_too_few_grades_fall_back_to_the_paper() -> None:
    rng = np.random.default_rng(1)
    ks, grades, _n_p = random_lists(rng, 200, 3, 3)
    response = np.full(len(ks), np.nan)
    response[:10] = rng.integers(1, 6, 10)
    report = correlate(traffic(grades, ks, response), reps=20)
    rec = report.recommendation
    assert rec.basis == "paper"
    assert rec.measure in ("t", "ndcg")
    assert "only 10 events carry a response grade" in rec.text
    assert report.graded_events == 10


def test_np_comes_from_gold_when_known_else_from_the_top_2k() -> None:
    grades = np.array(
        [
            [3, 0, 3, 3, np.nan, np.nan],  # k=2: N^_p = 3 in the top 4 -> narrow
            [0, 3, 0, 0, np.nan, np.nan],  # k=2: N^_p = 1 -> wide
            [3, 0, np.nan, 3, np.nan, np.nan],  # k=2: a window label missing -> unknown
            [0, 0, 0, 0, 0, 0],  # k=3: no relevant -> wide, K/N_p infinite
            [3, 3, 0, 0, np.nan, np.nan],  # k=2 with 5 gold passages -> narrow from gold
        ],
        dtype=float,
    )
    ks = np.array([2, 2, 2, 3, 2])
    n_gold = np.array([np.nan, np.nan, np.nan, np.nan, 5.0])
    t = traffic(grades, ks, np.full(5, np.nan), n_gold=n_gold)
    n_p, from_gold = np_counts(t)
    assert n_p[[0, 1, 3, 4]].tolist() == [3.0, 1.0, 0.0, 5.0]
    assert math.isnan(n_p[2])
    assert from_gold.tolist() == [False, False, False, False, True]
    masks = regime_masks(t)
    assert masks["narrow"].tolist() == [True, False, False, False, True]
    assert masks["wide"].tolist() == [False, True, False, True, False]
    dist = regime_distribution(t)
    assert (dist.narrow, dist.wide, dist.unknown, dist.no_relevant) == (2, 2, 1, 1)
    assert sum(b.count for b in dist.bins) == 4


# ---------------------------------------------------------------------------------------------
# Gold traffic: the article's 50 questions


def article_questions(recall_at_10: int = 43, recall_at_50: int = 44) -> list[GoldEvent]:
    """Rank 1 for 22, 2 for 9, 3 for 5, 4 for 2, 5 for 1, outside the top five for 11; 31
    answers correct, all of them among the 39 questions whose passage reached the prompt."""
    found = [1] * 22 + [2] * 9 + [3] * 5 + [4] * 2 + [5]
    found += [7] * (recall_at_10 - 39) + [30] * (recall_at_50 - recall_at_10)
    ranks: list[int | None] = [*found, *([None] * (50 - len(found)))]
    events = []
    for index, rank in enumerate(ranks):
        correct = rank is not None and rank <= 5 and index < 31
        events.append(
            GoldEvent(
                k=5,
                depth=50,
                gold_ranks=() if rank is None else (rank,),
                n_gold=1,
                answer_correct=correct,
                query=f"q{index}",
            )
        )
    return events


def test_the_articles_arithmetic_on_its_50_questions() -> None:
    report = analyze_gold(article_questions(), reps=500)
    at = {p.cutoff: p for p in report.curve}
    assert at[5].hit.value == pytest.approx(0.78)
    assert at[5].recall.value == pytest.approx(0.78)  # one gold passage per question
    assert report.mrr.value == pytest.approx(28.8667 / 50, abs=1e-4)  # 0.577
    assert report.ceiling.value == pytest.approx(0.78)
    assert report.ceiling.se == pytest.approx(0.0586, abs=5e-5)
    assert report.conversion.value == pytest.approx(31 / 39)  # 0.795
    assert report.observed_accuracy.value == pytest.approx(0.62)
    assert report.predicted_accuracy.value == pytest.approx(0.78 * 31 / 39)
    assert report.predicted_accuracy.low < 0.62 < report.predicted_accuracy.high
    assert (report.retrieval_misses, report.generation_misses) == (11, 8)
    assert report.correct_without_gold == 0
    # "Recall at five somewhere between 0.66 and 0.90": Wilson gives 0.648 to 0.872.
    assert report.ceiling.low == pytest.approx(0.648, abs=0.001)
    assert report.ceiling.high == pytest.approx(0.872, abs=0.001)
    assert any("retrieval is the larger gap" in n for n in report.diagnosis)


def test_the_curve_says_whether_to_widen_or_to_rerank() -> None:
    flat = analyze_gold(article_questions(43, 44), reps=200)  # 0.78, 0.86, 0.88
    assert [round(p.hit.value, 2) for p in flat.curve] == [0.44, 0.72, 0.78, 0.86, 0.86, 0.88]
    buried = analyze_gold(article_questions(43, 48), reps=200)  # recall@50 = 0.96
    assert any("found and buried" in n for n in buried.diagnosis)
    assert not any(
        "found and buried" in n for n in analyze_gold(article_questions(39, 40), reps=200).diagnosis
    )


def test_the_curve_stops_where_the_events_stop_carrying() -> None:
    shallow = [GoldEvent(k=5, depth=10, gold_ranks=(), n_gold=1) for _ in range(5)]
    deep = [GoldEvent(k=5, depth=50, gold_ranks=(40,), n_gold=2) for _ in range(5)]
    report = analyze_gold(shallow + deep, reps=100)
    at = {p.cutoff: p for p in report.curve}
    assert at[10].hit.n == 10
    assert at[10].hit.value == 0.0
    # Only the five deep events count at 50: a shallow miss is not known to stay a miss.
    assert at[50].hit.n == 5
    assert at[50].hit.value == 1.0
    assert at[50].recall.value == pytest.approx(0.5)
    assert report.with_feedback == 0
    assert report.conversion.n == 0


def test_first_stage_against_after_rerank_recall() -> None:
    events = (
        [
            GoldEvent(
                k=5, depth=5, gold_ranks=(2,), n_gold=1, first_stage_depth=50, first_stage_found=1
            )
            for _ in range(30)
        ]
        + [
            GoldEvent(
                k=5, depth=5, gold_ranks=(), n_gold=1, first_stage_depth=50, first_stage_found=1
            )
            for _ in range(15)
        ]
        + [
            GoldEvent(
                k=5, depth=5, gold_ranks=(), n_gold=1, first_stage_depth=50, first_stage_found=0
            )
            for _ in range(5)
        ]
    )
    staged = analyze_gold(events, reps=100).first_stage
    assert staged is not None
    assert staged.first_stage_hit.value == pytest.approx(0.9)
    assert staged.prompt_hit.value == pytest.approx(0.6)
    assert staged.dropped == 15
    assert staged.median_depth == 50


def test_a_retriever_change_predicted_from_the_old_conversion() -> None:
    # The article: recall@5 0.78 -> 0.86 with conversion 0.795 predicts 0.86 x 0.795 = 68.4%.
    before = article_questions()
    after = [
        GoldEvent(
            k=5,
            depth=50,
            gold_ranks=(1,) if i < 43 else (),
            n_gold=1,
            answer_correct=i < 32,
            query=f"q{i}",
        )
        for i in range(50)
    ]
    predicted = predicted_accuracy(after, conversion_from=before, reps=500)
    assert predicted.value == pytest.approx(0.86 * 31 / 39)
    assert predicted.value == pytest.approx(0.684, abs=0.001)
    empty = traffic(np.full((0, 1), np.nan), np.zeros(0, dtype=int), np.zeros(0))
    report = compare(
        SideData("A", empty, before),
        SideData("B", empty, after),
        alpha=0.5,
        cutoffs=(5, 10),
        reps=300,
    )
    ceiling = next(q for q in report.quantities if q.name == "ceiling")
    assert ceiling.test.difference == pytest.approx(0.08)
    assert not ceiling.test.real  # 50 questions a side cannot show 8 points either
    assert ceiling.test.minimum_detectable > 0.2
    # observed 32/50 = 0.64 sits inside the predicted interval: nothing else moved.
    assert report.observed_b.value == pytest.approx(0.64)
    assert not any("something besides retrieval" in n for n in report.notes)


def test_the_same_questions_paired_need_fewer_of_them() -> None:
    # 60 questions under both retrievers: B fixes 8 misses of A and breaks none.
    a = [
        GoldEvent(k=5, depth=5, gold_ranks=(1,) if i < 40 else (), n_gold=1, query=f"q{i}")
        for i in range(60)
    ]
    b = [
        GoldEvent(k=5, depth=5, gold_ranks=(1,) if i < 48 else (), n_gold=1, query=f"q{i}")
        for i in range(60)
    ]
    paired = paired_ceiling(a, b)
    assert paired is not None
    assert paired.test.real
    assert paired.test.p_value == pytest.approx(2 / 2**8)
    unpaired = stats.two_proportion_test(40, 60, 48, 60)
    assert not unpaired.real
    assert paired_ceiling(a[:5], b[:5]) is None


# ---------------------------------------------------------------------------------------------
# Judge calibration


def test_calibration_counts_the_judge_against_gold() -> None:
    cells = [(True, True, 30), (True, False, 10), (False, True, 5), (False, False, 55)]
    pairs = [
        LabelPair(event=i % 20, judge="llm", prompt_version="v1", judge_relevant=j, gold_relevant=g)
        for (j, g, count) in cells
        for i in range(count)
    ]
    pairs.append(LabelPair(0, "llm", "v2", True, True))
    first, second = calibrate(pairs)
    assert (first.judge, first.prompt_version, first.passages, first.events) == (
        "llm",
        "v1",
        100,
        20,
    )
    assert first.precision.value == pytest.approx(0.75)
    assert first.recall.value == pytest.approx(30 / 35)
    assert first.kappa.kappa == pytest.approx((0.85 - 0.53) / 0.47)
    assert first.precision.low < 0.75 < first.precision.high
    assert second.prompt_version == "v2"
    assert math.isnan(second.kappa.kappa)


# ---------------------------------------------------------------------------------------------
# Stored rows to arrays


def _event(pk: int, k: int, count: int, gold: list[str] | None, **extra: object) -> AnalysisEvent:
    values: dict[str, object] = {
        "pk": pk,
        "k": k,
        "passage_count": count,
        "candidates": None,
        "gold_passage_ids": gold,
        "response_grade": None,
        "answer_correct": None,
        "received_at": NOW,
    }
    values.update(extra)
    return AnalysisEvent(**values)  # type: ignore[arg-type]


def test_stored_rows_become_label_matrices_gold_questions_and_pairs() -> None:
    events = [
        _event(1, 2, 5, ["b", "z"], response_grade=4, candidates=[{"id": "z"}, {"id": "b"}]),
        _event(2, 1, 2, None, response_grade=2),
        _event(3, 2, 3, [], answer_correct=True),  # an empty gold list is not gold traffic
        _event(4, 1, 1, None),  # never judged
    ]
    ids = {1: ["a", "b", "c", "d", "e"], 2: ["x", "y"], 3: ["p", "q", "r"]}
    grades: dict[int, dict[int, int | None]] = {
        1: {1: 3, 2: 0, 3: None, 4: 2},
        2: {1: 1, 2: 2},
        3: {1: 0, 2: 0, 3: 0},
    }
    t = judged_traffic(events, grades, {1: 2, 2: None}, ids, threshold=2)
    assert t.size == 3
    assert t.n_sent.tolist() == [4, 2, 3]  # at most 2k are judged
    assert np.array_equal(t.grades[0], [3, 0, np.nan, 2], equal_nan=True)
    assert t.gold_relevant[0].tolist() == [False, True, False, False]
    assert t.n_gold[0] == 2
    assert math.isnan(t.n_gold[1])
    assert t.context_ratings[0] == 2
    assert math.isnan(t.context_ratings[1])
    assert t.response_grades[:2].tolist() == [4.0, 2.0]

    (question,) = gold_events(events, ids)
    assert (question.k, question.depth, question.gold_ranks, question.n_gold) == (2, 5, (2,), 2)
    assert (question.first_stage_depth, question.first_stage_found) == (2, 2)

    judgments = [
        GoldJudgment(1, "llm", "v1", 1, True),
        GoldJudgment(1, "llm", "v1", 2, False),
        GoldJudgment(2, "llm", "v1", 1, True),  # not a gold event
        GoldJudgment(1, "llm", "v1", 9, True),  # no such rank
    ]
    pairs = label_pairs(events, ids, judgments)
    assert [(p.judge_relevant, p.gold_relevant) for p in pairs] == [(True, False), (False, True)]


PURE_MODULES = ("stats", "correlation", "gold", "compare", "calibration")


@pytest.mark.parametrize("name", PURE_MODULES)
def test_the_analysis_math_reads_no_database(name: str) -> None:
    """Arrays in, numbers out: the statistics never import the database layer."""
    source = (REPO_ROOT / "service" / "analysis" / f"{name}.py").read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    project = {m for m in imported if m.split(".")[0] in ("service", "workers")}
    allowed = {f"service.analysis.{m}" for m in PURE_MODULES} | {
        "service.analysis",
        "service.measures.catalogue",
        "service.measures.formulas",
    }
    assert project <= allowed, project - allowed
    assert not {m for m in imported if m.split(".")[0] in ("sqlalchemy", "sqlmodel")}
