"""Randomised cross-checks: our measures against pytrec_eval, and against the paper's equations
written out again here in a different (but equivalent) form."""

from __future__ import annotations

import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

from service.measures.formulas import (
    EventLabels,
    compute_measures,
    hit_at,
    ndcg_at,
    ndcg_cut,
    precision_at,
    recall_at,
    reciprocal_rank,
)

TOLERANCE = 1e-9
CUTOFFS = (1, 2, 3, 5, 10, 25)


def evaluate(
    qrels: dict[str, int], run: dict[str, float], measures: set[str], relevance_level: int = 1
) -> dict[str, float]:
    evaluator = pytrec_eval.RelevanceEvaluator({"q": qrels}, measures, relevance_level)
    result: dict[str, float] = evaluator.evaluate({"q": run})["q"]
    return result


def trec_order(run: dict[str, float]) -> list[str]:
    """Score descending, ties by docno descending, as trec_eval ranks a run."""
    return sorted(run, key=lambda docno: (run[docno], docno), reverse=True)


@st.composite
def judged_runs(draw: st.DrawFn) -> tuple[dict[str, int], dict[str, float]]:
    """A query's qrels (levels 0-3, some relevant docs never retrieved) and a run (some docs not
    judged; scores drawn from a small set so ties happen)."""
    pool = [f"d{i:02d}" for i in range(draw(st.integers(1, 30)))]
    judged = draw(st.lists(st.sampled_from(pool), unique=True, min_size=1))
    qrels = {docno: draw(st.integers(0, 3)) for docno in judged}
    retrieved = draw(st.lists(st.sampled_from(pool), unique=True, min_size=1))
    run = {docno: float(draw(st.integers(0, 8))) / 4 for docno in retrieved}
    return qrels, run


@settings(max_examples=200, deadline=None)
@given(case=judged_runs(), relevance_level=st.integers(1, 3))
def test_cutoff_measures_match_pytrec_eval(
    case: tuple[dict[str, int], dict[str, float]], relevance_level: int
) -> None:
    qrels, run = case
    cut = ",".join(map(str, CUTOFFS))
    theirs = evaluate(
        qrels,
        run,
        {f"ndcg_cut.{cut}", f"P.{cut}", f"recall.{cut}", f"success.{cut}", "recip_rank"},
        relevance_level,
    )
    ranked = trec_order(run)
    levels = [qrels.get(docno, 0) for docno in ranked]
    rel = [level >= relevance_level for level in levels]
    n_rel = sum(level >= relevance_level for level in qrels.values())
    ideal = [level for level in qrels.values() if level > 0]

    assert reciprocal_rank(rel, len(ranked)) == pytest.approx(theirs["recip_rank"], abs=TOLERANCE)
    for k in CUTOFFS:
        # nDCG gains are the graded levels whatever the relevance threshold, as in trec_eval.
        assert ndcg_cut(levels, ideal, k) == pytest.approx(theirs[f"ndcg_cut_{k}"], abs=TOLERANCE)
        assert precision_at(rel, k) == pytest.approx(theirs[f"P_{k}"], abs=TOLERANCE)
        assert hit_at(rel, k) == theirs[f"success_{k}"]
        recall = recall_at(rel, k, n_rel)
        if n_rel == 0:
            # trec_eval prints 0 for a query without relevant documents; recall is undefined.
            assert recall is None
            assert theirs[f"recall_{k}"] == 0.0
        else:
            assert recall == pytest.approx(theirs[f"recall_{k}"], abs=TOLERANCE)


@settings(max_examples=200, deadline=None)
@given(grades=st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_np_free_ndcg_is_ndcg_cut_on_the_judged_top_k(grades: list[int]) -> None:
    k = len(grades)
    docnos = [f"p{rank:02d}" for rank in range(k)]
    qrels = dict(zip(docnos, grades, strict=True))
    run = {docno: float(k - rank) for rank, docno in enumerate(docnos)}
    theirs = evaluate(qrels, run, {f"ndcg_cut.{k}"})[f"ndcg_cut_{k}"]
    assert ndcg_at(grades, k) == pytest.approx(theirs, abs=TOLERANCE)
    assert compute_measures(EventLabels(grades=grades, k=k), 0.5)["ndcg"] == pytest.approx(
        theirs, abs=TOLERANCE
    )


@st.composite
def gold_events(draw: st.DrawFn) -> tuple[EventLabels, dict[str, int], dict[str, float]]:
    n_sent = draw(st.integers(1, 15))
    k = draw(st.integers(1, n_sent))
    gold = draw(st.lists(st.booleans(), min_size=n_sent, max_size=n_sent))
    unretrieved_gold = draw(st.integers(0, 5))
    docnos = [f"p{rank:02d}" for rank in range(n_sent)]
    qrels = {docno: 1 for docno, is_gold in zip(docnos, gold, strict=True) if is_gold}
    qrels.update({f"u{i}": 1 for i in range(unretrieved_gold)})
    qrels.setdefault(docnos[0], 0)  # trec_eval needs a judged document for the query
    run = {docno: float(n_sent - rank) for rank, docno in enumerate(docnos)}
    labels = EventLabels(
        grades=[0] * n_sent, k=k, gold_relevant=gold, n_gold=sum(gold) + unretrieved_gold
    )
    return labels, qrels, run


@settings(max_examples=200, deadline=None)
@given(case=gold_events())
def test_gold_measures_match_pytrec_eval(
    case: tuple[EventLabels, dict[str, int], dict[str, float]],
) -> None:
    labels, qrels, run = case
    k = labels.k
    theirs = evaluate(qrels, run, {f"ndcg_cut.{k}", f"recall.{k}", f"P.{k}", "set_F"})
    ours = compute_measures(labels, 0.5)
    assert ours["ndcg_gold"] == pytest.approx(theirs[f"ndcg_cut_{k}"], abs=TOLERANCE)
    if labels.n_gold:
        assert ours["recall"] == pytest.approx(theirs[f"recall_{k}"], abs=TOLERANCE)
    else:
        assert ours["recall"] is None
    if k == len(run):
        # set_F (beta 1) over the whole run is F at alpha 0.5 when K is everything sent.
        assert ours["f"] == pytest.approx(theirs["set_F"], abs=TOLERANCE)


# --- the paper's equations, written independently --------------------------------------------


def harmonic_f(n_p: int, k: int, n_rel: int, alpha: float) -> float:
    """Eq. 1: F = 1 / (a / P + (1 - a) / R); 0 without any relevant passage in the top K."""
    if n_p == 0:
        return 0.0
    precision, recall = n_p / k, n_p / n_rel
    return 1.0 / (alpha / precision + (1.0 - alpha) / recall)


@st.composite
def complete_events(draw: st.DrawFn) -> EventLabels:
    k = draw(st.integers(1, 8))
    grades = draw(st.lists(st.integers(0, 3), min_size=k, max_size=3 * k))
    gold = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    return EventLabels(
        grades=grades,
        k=k,
        threshold=draw(st.integers(1, 3)),
        gold_relevant=gold,
        n_gold=sum(gold) + draw(st.integers(0, 4)),
    )


@settings(max_examples=500, deadline=None)
@given(
    labels=complete_events(),
    alpha=st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0, 1)),
)
def test_t_t_u_f_f_e_follow_the_paper(labels: EventLabels, alpha: float) -> None:
    k = labels.k
    relevant = [grade is not None and grade >= labels.threshold for grade in labels.grades]
    n_p = relevant[:k].count(True)
    precision = n_p / k
    ours = compute_measures(labels, alpha)

    # Eq. 3 with n_n / K = 1 - P; Eq. 4 with (1 - a) n_p - a (K - n_p) = n_p - a K.
    assert ours["t"] == pytest.approx((1 - alpha) * n_p - alpha * (1 - precision), abs=TOLERANCE)
    assert ours["t_u"] == pytest.approx(n_p - alpha * k, abs=TOLERANCE)

    window = relevant[: 2 * k]
    n_p_est = window.count(True)
    assert ours["np_window"] == len(window)
    assert ours["k_over_np_est"] == (k / n_p_est if n_p_est else None)
    assert ours["f_e"] == pytest.approx(harmonic_f(n_p, k, n_p_est, alpha), abs=TOLERANCE)

    assert labels.gold_relevant is not None
    assert labels.n_gold is not None
    n_gold_top = list(labels.gold_relevant[:k]).count(True)
    expected_f = harmonic_f(n_gold_top, k, labels.n_gold, alpha)
    assert ours["f"] == pytest.approx(expected_f, abs=TOLERANCE)
