"""The replay retriever: tokenizer, BM25 scores checked by hand, and quality on SciFact."""

from __future__ import annotations

import math
import time

import pytest

from service.replay.beir import load_beir
from service.replay.bm25 import Bm25Index, light_stem, tokenize
from tests.support.paths import shared_data_dir

SCIFACT = shared_data_dir() / "scifact"

TINY = {
    "d1": "Cats chase mice",
    "d2": "Dogs chase cats and cats run",
    "d3": "Birds sing",
}


def test_tokenize_lowercases_splits_unicode_and_drops_stopwords() -> None:
    assert tokenize("The Café of Ünïcode_words, and 42 mice!", stem=False) == [
        "café",
        "ünïcode",
        "words",
        "42",
        "mice",
    ]


def test_light_stem_conflates_inflections_and_keeps_short_or_latin_words() -> None:
    assert {light_stem(w) for w in ("increase", "increased", "increases", "increasing")} == {
        "increas"
    }
    assert light_stem("studies") == light_stem("study")
    assert light_stem("running") == light_stem("run")
    assert light_stem("cells") == light_stem("cell")
    assert light_stem("analysis") == "analysis"
    assert light_stem("virus") == "virus"
    assert light_stem("class") == "class"
    assert light_stem("gas") == "gas"
    assert light_stem("il6") == "il6"


def test_score_matches_the_formula_worked_by_hand() -> None:
    index = Bm25Index.build(TINY, k1=0.9, b=0.4, stem=False)
    # Tokens: d1 = cats chase mice (3), d2 = dogs chase cats cats run (5, "and" is a stopword),
    # d3 = birds sing (2); N = 3, average length 10/3.
    # "cats" is in 2 documents: idf = ln(1 + (3 - 2 + 0.5) / (2 + 0.5)) = ln(1.6).
    # d2 (tf 2, length 5): norm = 0.9 * (0.6 + 0.4 * 5 / (10/3)) = 0.9 * 1.2 = 1.08
    #   score = ln(1.6) * 2 * 1.9 / (2 + 1.08)
    # d1 (tf 1, length 3): norm = 0.9 * (0.6 + 0.4 * 3 / (10/3)) = 0.9 * 0.96 = 0.864
    #   score = ln(1.6) * 1 * 1.9 / (1 + 0.864)
    expected_d2 = math.log(1.6) * 3.8 / 3.08
    expected_d1 = math.log(1.6) * 1.9 / 1.864
    hits = index.search("cats", top_n=10)
    assert [doc for doc, _ in hits] == ["d2", "d1"]
    assert hits[0][1] == pytest.approx(expected_d2, rel=1e-12)
    assert hits[1][1] == pytest.approx(expected_d1, rel=1e-12)

    # Scores add over query terms: "chase" is also in 2 documents, tf 1 in both.
    chase_d1 = math.log(1.6) * 1.9 / 1.864
    chase_d2 = math.log(1.6) * 1.9 / (1 + 1.08)
    both = dict(index.search("chase cats", top_n=10))
    assert both["d1"] == pytest.approx(expected_d1 + chase_d1, rel=1e-12)
    assert both["d2"] == pytest.approx(expected_d2 + chase_d2, rel=1e-12)


def test_textbook_parameters_give_their_own_score() -> None:
    index = Bm25Index.build(TINY, k1=1.2, b=0.75, stem=False)
    # d3: "sing" in 1 document: idf = ln(1 + 2.5 / 1.5); length 2: norm = 1.2 * (0.25 + 0.45).
    expected = math.log(1 + 2.5 / 1.5) * 2.2 / (1 + 1.2 * (0.25 + 0.75 * 2 / (10 / 3)))
    ((doc, score),) = index.search("sing", top_n=1)
    assert doc == "d3"
    assert score == pytest.approx(expected, rel=1e-12)


def test_search_truncates_breaks_ties_by_corpus_order_and_ignores_unknown_terms() -> None:
    docs = {f"d{i}": "same words here" for i in range(5)} | {"other": "nothing alike"}
    index = Bm25Index.build(docs)
    assert [doc for doc, _ in index.search("words", top_n=3)] == ["d0", "d1", "d2"]
    assert index.search("unknownterm", top_n=3) == []
    assert index.search("the of and", top_n=3) == []
    assert index.search("words", top_n=0) == []
    assert len(index.search("words alike", top_n=50)) == 6


def test_stemming_lets_inflected_queries_match() -> None:
    docs = {"a": "The patients were treated with vaccines", "b": "A study of rivers"}
    assert Bm25Index.build(docs).search("treating a patient", top_n=2)[0][0] == "a"
    assert Bm25Index.build(docs, stem=False).search("treating a patient", top_n=2) == []


def test_build_rejects_an_empty_corpus_and_bad_parameters() -> None:
    with pytest.raises(ValueError, match="empty corpus"):
        Bm25Index.build({})
    with pytest.raises(ValueError, match="0 <= b <= 1"):
        Bm25Index.build(TINY, b=1.5)


def ndcg_at_10(ranked: list[str], qrels: dict[str, int]) -> float:
    """Binary gains; the ideal ranking puts every relevant document of the qrels first."""
    relevant = {doc for doc, grade in qrels.items() if grade > 0}
    dcg = sum(1 / math.log2(rank + 2) for rank, doc in enumerate(ranked[:10]) if doc in relevant)
    ideal = sum(1 / math.log2(rank + 2) for rank in range(min(len(relevant), 10)))
    return dcg / ideal if ideal else 0.0


@pytest.mark.shared_data
@pytest.mark.skipif(not SCIFACT.is_dir(), reason=f"SciFact not found at {SCIFACT}")
def test_scifact_ndcg_at_10_is_that_of_plain_bm25() -> None:
    dataset = load_beir(SCIFACT)
    assert len(dataset.queries) == 300
    started = time.perf_counter()
    index = Bm25Index.build({doc_id: doc.full_text for doc_id, doc in dataset.corpus.items()})
    build_seconds = time.perf_counter() - started

    started = time.perf_counter()
    runs = {qid: index.search(text, top_n=10) for qid, text in dataset.queries.items()}
    search_seconds = (time.perf_counter() - started) / len(runs)

    mean_ndcg = sum(
        ndcg_at_10([doc for doc, _ in runs[qid]], dataset.qrels[qid]) for qid in runs
    ) / len(runs)
    # Published BM25 figures on SciFact are 0.665 (BEIR, Elasticsearch) to 0.679 (Pyserini flat).
    assert 0.60 <= mean_ndcg <= 0.72, mean_ndcg
    # 5,183 abstracts; generous bounds for a shared machine (measured: ~0.7 s and ~0.2 ms).
    assert build_seconds < 10, build_seconds
    assert search_seconds < 0.02, search_seconds
