"""The labelling sample: the same seed draws the same events, strata share the target, no
question comes twice."""

from __future__ import annotations

from collections import Counter

from service.analysis.gold_sample import allocate, draw, normalised
from service.store.gold import SampleCandidate


def candidates() -> list[SampleCandidate]:
    out = []
    for i in range(60):
        retriever = "bm25" if i < 40 else "dense"
        out.append(SampleCandidate(i + 1, f"e{i}", "shop", retriever, f"Question {i % 50}"))
    # The same question again, spelled differently.
    out.append(SampleCandidate(100, "dup", "shop", "bm25", "  question   3 "))
    return out


def test_the_same_seed_draws_the_same_sample_in_any_row_order() -> None:
    rows = candidates()
    first = [c.event_id for c in draw(rows, seed=7, target=20)]
    assert first == [c.event_id for c in draw(list(reversed(rows)), seed=7, target=20)]
    assert first != [c.event_id for c in draw(rows, seed=8, target=20)]
    assert len(first) == 20


def test_no_question_twice_and_strata_share_the_target() -> None:
    picked = draw(candidates(), seed=1, target=25)
    questions = [normalised(c.query) for c in picked]
    assert len(set(questions)) == len(questions)
    # 50 distinct questions: "Question 40".."49" are asked by both retrievers, so the dense
    # stratum keeps only the ones bm25's copies did not take first; shares follow the sizes.
    by_stratum = Counter(c.retriever for c in picked)
    everything = draw(candidates(), seed=1, target=1000)
    sizes = Counter(c.retriever for c in everything)
    assert len(everything) == 50
    assert dict(by_stratum) == allocate(dict(sizes), 25)
    # Interleaved: the first two events come from the two strata.
    assert {picked[0].retriever, picked[1].retriever} == {"bm25", "dense"}


def test_allocation_by_largest_remainder() -> None:
    assert allocate({"a": 30, "b": 20}, 10) == {"a": 6, "b": 4}
    assert allocate({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}
    assert allocate({"a": 3, "b": 2}, 50) == {"a": 3, "b": 2}
    assert allocate({"a": 3}, 0) == {"a": 0}
    assert sum(allocate({"a": 7, "b": 5, "c": 3}, 11).values()) == 11
