"""Cohen's kappa between labellers, against a table counted by hand."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.analysis.agreement import agreement, decisions
from service.store.gold import LabelRow

SENT = ["d1", "d2", "d3", "d4"]
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def label(event: int, who: str, *ids: str, outcome: str = "answered") -> LabelRow:
    return LabelRow(event, who, who, outcome, tuple(ids), None, None, WHEN)


def test_kappa_of_a_worked_example() -> None:
    """Three events of four passages, twelve decisions each:
    e1: both mark d1, d2 (2 both, 2 neither); e2: A d1, B d1 d3 (1 both, 1 B only, 2 neither);
    e3: A d1, B d2 (1 A only, 1 B only, 2 neither). Table [[3, 1], [2, 6]]:
    p_o = 9/12, p_e = (4/12)(5/12) + (8/12)(7/12) = 76/144, kappa = (108 - 76) / (144 - 76) = 8/17.
    """
    labels = {
        1: [label(1, "a", "d1", "d2"), label(1, "b", "d1", "d2")],
        2: [label(2, "a", "d1"), label(2, "b", "d1", "d3")],
        3: [label(3, "a", "d1"), label(3, "b", "d2")],
        4: [label(4, "a", "d4")],  # one labeller only: not compared
    }
    found = agreement(labels, dict.fromkeys(labels, SENT))
    (pair,) = found.pairs
    assert (pair.first, pair.second, pair.events, pair.passages) == ("a", "b", 3, 12)
    assert pair.table == [[3, 1], [2, 6]]
    assert pair.kappa.kappa == pytest.approx(8 / 17)
    assert pair.kappa.observed_agreement == pytest.approx(0.75)
    assert pair.kappa.chance_agreement == pytest.approx(76 / 144)
    assert found.pooled.kappa == pytest.approx(8 / 17)
    assert (found.labelled_events, found.shared_events, found.agreed, found.disagreed) == (
        4,
        3,
        1,
        2,
    )


def test_outcomes_without_passages_say_not_relevant_everywhere() -> None:
    assert decisions(label(1, "a", outcome="not_in_corpus"), SENT) == [False] * 4
    # A passage that was not sent is no decision on the sent ones.
    assert decisions(label(1, "a", "elsewhere", outcome="not_retrieved"), SENT) == [False] * 4
    assert decisions(label(1, "a", "d2", "d4"), SENT) == [False, True, False, True]


def test_three_labellers_make_three_pairs_and_pool_them() -> None:
    labels = {1: [label(1, "a", "d1"), label(1, "b", "d1"), label(1, "c", "d2")]}
    found = agreement(labels, {1: SENT})
    assert [(p.first, p.second) for p in found.pairs] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert found.pairs[0].kappa.kappa == pytest.approx(1.0)
    assert found.pooled.n == 3 * len(SENT)  # three pairs, four decisions each
    assert found.disagreed == 1
