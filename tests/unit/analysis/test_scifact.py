"""The gold arithmetic on real retrievals: BM25 over SciFact with its qrels as gold ids, checked
against trec_eval's own definitions (pytrec_eval) and against simulated answers whose
conversion rate is known."""

from __future__ import annotations

import numpy as np
import pytest
import pytrec_eval

from service.analysis.gold import GoldEvent, analyze_gold
from service.replay.beir import load_beir
from service.replay.bm25 import Bm25Index
from tests.support.paths import shared_data_dir

K = 5
DEPTH = 20
CONVERSION = 0.8
LUCKY = 0.05


SCIFACT = shared_data_dir() / "scifact"

pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.skipif(not SCIFACT.is_dir(), reason=f"SciFact not found at {SCIFACT}"),
]


def test_scifact_gold_arithmetic_agrees_with_trec_eval_and_a_planted_conversion() -> None:
    dataset = load_beir(SCIFACT)
    index = Bm25Index.build({doc_id: doc.full_text for doc_id, doc in dataset.corpus.items()})
    rng = np.random.default_rng(0)
    events: list[GoldEvent] = []
    run: dict[str, dict[str, float]] = {}
    for query_id, text in sorted(dataset.queries.items()):
        ranked = [doc for doc, _ in index.search(text, top_n=DEPTH)]
        gold = {doc for doc, grade in dataset.qrels[query_id].items() if grade > 0}
        ranks = tuple(i + 1 for i, doc in enumerate(ranked) if doc in gold)
        in_prompt = any(r <= K for r in ranks)
        events.append(
            GoldEvent(
                k=K,
                depth=len(ranked),
                gold_ranks=ranks,
                n_gold=len(gold),
                answer_correct=bool(rng.random() < (CONVERSION if in_prompt else LUCKY)),
            )
        )
        # Distinct descending scores so trec_eval keeps the retriever's order.
        run[query_id] = {doc: float(DEPTH - i) for i, doc in enumerate(ranked[:K])}

    report = analyze_gold(events, cutoffs=(1, 5, 10, 20), reps=500)
    evaluator = pytrec_eval.RelevanceEvaluator(
        dataset.qrels, {"recall.5", "success.1,5", "recip_rank"}
    )
    per_query = evaluator.evaluate(run).values()
    trec = {
        name: float(np.mean([q[name] for q in per_query]))
        for name in ("recall_5", "success_1", "success_5", "recip_rank")
    }
    at = {p.cutoff: p for p in report.curve}
    assert report.events == 300
    assert report.ceiling.value == pytest.approx(trec["success_5"])
    assert report.ceiling_recall.value == pytest.approx(trec["recall_5"])
    assert at[1].hit.value == pytest.approx(trec["success_1"])
    assert report.mrr.value == pytest.approx(trec["recip_rank"])
    # Several claims have more than one gold abstract, so recall sits below the hit rate.
    assert report.ceiling_recall.value < report.ceiling.value
    # BM25 on SciFact: most gold abstracts that reach the top 20 are already in the top 5.
    hits = [p.hit.value for p in report.curve]
    assert hits == sorted(hits)
    assert 0.6 < report.ceiling.value < 0.85

    # The simulated answers are one draw: the planted rate must be within three standard errors
    # of the estimate (the 95% interval misses it one draw in twenty by design).
    assert abs(report.conversion.value - CONVERSION) < 3 * report.conversion.se
    assert report.conversion.n == sum(1 for e in events if e.in_prompt)
    assert report.predicted_accuracy.value == pytest.approx(
        report.ceiling.value * report.conversion.value
    )
    # Answers right without the evidence lift the observed accuracy above the prediction.
    lucky = report.correct_without_gold / report.events
    assert report.observed_accuracy.value == pytest.approx(report.predicted_accuracy.value + lucky)
