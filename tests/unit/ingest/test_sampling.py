"""The sampling decision: deterministic, nested across rates, near the configured share."""

from __future__ import annotations

import itertools
import random

from service.ingest.sampling import decide, rate_for, sample_point

IDS = [f"req-{i}" for i in range(20_000)]


def sampled(rate: float, ids: list[str] = IDS) -> set[str]:
    return {i for i in ids if decide(i, "app", "r", False, rate, {}).judge}


def test_a_lower_rate_sample_is_a_subset_of_a_higher_one() -> None:
    rates = [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0]
    samples = [sampled(rate) for rate in rates]
    for lower, higher in itertools.pairwise(samples):
        assert lower <= higher
    assert samples[0] == set()
    assert samples[-1] == set(IDS)


def test_subset_holds_for_random_rate_pairs_and_ids() -> None:
    rng = random.Random(7)
    ids = [f"{rng.getrandbits(64):x}" for _ in range(2_000)]
    for _ in range(50):
        a, b = sorted(rng.random() for _ in range(2))
        assert sampled(a, ids) <= sampled(b, ids)


def test_share_is_close_to_the_rate() -> None:
    for rate in (0.01, 0.1, 0.5):
        share = len(sampled(rate)) / len(IDS)
        # Binomial standard error at n = 20000 is at most 0.0036; four of them.
        assert abs(share - rate) < 0.015, (rate, share)


def test_decision_is_deterministic_and_depends_only_on_the_id() -> None:
    assert sample_point("abc") == sample_point("abc")
    assert 0.0 <= sample_point("abc") < 1.0
    first = decide("req-1", "a", "r", False, 0.3, {})
    assert first == decide("req-1", "a", "r", False, 0.3, {})
    # The same id under another app at the same rate gets the same answer.
    assert decide("req-1", "b", "x", False, 0.3, {}).judge == first.judge


def test_gold_is_always_judged() -> None:
    decision = decide("req-1", "a", "r", True, 0.0, {})
    assert decision.judge
    assert decision.reason == "gold"
    unsampled = [i for i in IDS[:100] if not decide(i, "a", "r", False, 0.0, {}).judge]
    assert len(unsampled) == 100


def test_most_specific_rate_wins() -> None:
    rates = {"bot": 0.2, "bot/hybrid": 0.7}
    assert rate_for("bot", "hybrid", 1.0, rates) == 0.7
    assert rate_for("bot", "bm25", 1.0, rates) == 0.2
    assert rate_for("other", "hybrid", 0.4, rates) == 0.4
    assert rate_for("bot", "x", 1.0, {"bot": 3.0}) == 1.0  # clamped
    assert decide("req-1", "bot", "bm25", False, 1.0, rates).rate == 0.2
