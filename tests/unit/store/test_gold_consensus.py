"""The rule that turns labels into the gold the analysis uses.

Tests ``service.store.gold``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from service.store.gold import LabelRow, consensus

WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def label(who: str, *ids: str, outcome: str = "answered", correct: bool | None = None) -> LabelRow:
    return LabelRow(1, who, who, outcome, tuple(ids), None, correct, WHEN)


def test_unlabelled_keeps_what_the_event_was_sent_with() -> None:
    agreed = consensus(["d1"], True, [])
    assert (agreed.status, agreed.gold_passage_ids, agreed.answer_correct) == (
        "unlabelled",
        ["d1"],
        True,
    )


def test_labels_replace_sent_gold_and_agreement_keeps_it() -> None:
    single = consensus(["d1"], None, [label("a", "d3", correct=False)])
    assert (single.status, single.gold_passage_ids, single.answer_correct) == (
        "single",
        ["d3"],
        False,
    )
    both = consensus(None, True, [label("a", "d3", "d2"), label("b", "d2", "d3")])
    assert (both.status, both.gold_passage_ids, both.answer_correct) == (
        "agreed",
        ["d2", "d3"],
        True,  # no labeller judged the answer: the event's feedback stands
    )


def test_disagreement_leaves_the_gold_set() -> None:
    split = consensus(["d1"], None, [label("a", "d1"), label("b", "d2")])
    assert (split.status, split.gold_passage_ids) == ("disagreed", None)
    other = consensus(None, None, [label("a", "d1"), label("b", outcome="ambiguous")])
    assert other.status == "disagreed"


def test_correctness_only_when_the_labellers_agree_on_it() -> None:
    mixed = consensus(None, True, [label("a", "d1", correct=True), label("b", "d1", correct=False)])
    assert (mixed.status, mixed.answer_correct) == ("agreed", None)
    one = consensus(None, None, [label("a", "d1", correct=True), label("b", "d1")])
    assert one.answer_correct is True


def test_outcomes_without_gold_make_no_gold_question() -> None:
    for outcome in ("not_in_corpus", "ambiguous"):
        agreed = consensus(["d1"], None, [label("a", outcome=outcome)])
        assert (agreed.status, agreed.gold_passage_ids, agreed.outcome) == ("single", None, outcome)
    missed = consensus(None, None, [label("a", "sha256:abc", outcome="not_retrieved")])
    assert missed.gold_passage_ids == ["sha256:abc"]
