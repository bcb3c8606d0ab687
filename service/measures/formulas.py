"""Retrieval measures of one judged retrieval, and of many at once.

Pure arithmetic on plain numbers and numpy arrays. Nothing from the rest of the project is imported
but the names of the measures (``catalogue``, plain data), so the formulas can be checked on their
own against trec_eval's test outputs and pytrec_eval.

Notation (paper "How important is Recall for Measuring Retrieval Quality?"): the prompt carries
the top ``K`` passages; ``n_p`` of them are relevant and ``n_n = K - n_p`` are not; ``N_p`` is the
number of relevant passages for the query in the whole collection (known only from gold labels)
and ``N^_p`` its estimate, the relevant passages among the top ``2K`` passages sent.

A measure that cannot be computed is ``None`` (``NaN`` in the batch form), never a made-up 0:
- a missing judge label within the top ``K`` voids every judge-based measure;
- a missing label only in the estimation window (after ``K``, up to ``2K``) voids ``f_e`` and
  ``k_over_np_est``, which are the only ones that read the window;
- gold measures exist only when gold labels were sent; ``recall`` needs at least one gold passage.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

# The names, grouped by what each measure reads: a part of the computation voids its group when
# its labels are missing.
from service.measures.catalogue import (
    GOLD_MEASURES,
    MEASURE_NAMES,
    TOP_K_MEASURES,
    WINDOW_MEASURES,
)

GRADE_MAX = 3
CONTEXT_RATING_MAX = 2

FloatArray = NDArray[np.float64]


# ---------------------------------------------------------------------------------------------
# Validation shared by the scalar and batch forms


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"cutoff k must be at least 1, got {k}")


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")


def _check_n_p(n_p: int, k: int) -> None:
    if not 0 <= n_p <= k:
        raise ValueError(f"n_p must lie in [0, k={k}], got {n_p}")


def _check_threshold(threshold: int) -> None:
    if not 0 <= threshold <= GRADE_MAX:
        raise ValueError(f"relevance threshold must lie in [0, {GRADE_MAX}], got {threshold}")


# ---------------------------------------------------------------------------------------------
# Building blocks on plain arrays (rank order; position 0 is rank 1)


def _binary(rel: ArrayLike) -> NDArray[np.bool_]:
    return np.asarray(rel, dtype=bool).reshape(-1)


def _gains(gains: ArrayLike) -> FloatArray:
    values = np.asarray(gains, dtype=np.float64).reshape(-1)
    if np.any(values < 0) or np.any(np.isnan(values)):
        raise ValueError("gains must be non-negative numbers")
    return values


def first_gold_ranks(ranked_ids: Sequence[str], gold_ids: Collection[str]) -> tuple[int, ...]:
    """1-based ranks, as sent, of each gold id's first occurrence.

    Two id-less passages with the same text share a derived id: the repeat keeps its own rank
    (every later passage keeps its position) and is not a second gold passage.
    """
    seen: set[str] = set()
    ranks: list[int] = []
    for rank, passage_id in enumerate(ranked_ids, start=1):
        if passage_id in gold_ids and passage_id not in seen:
            seen.add(passage_id)
            ranks.append(rank)
    return tuple(ranks)


def relevant_in_top(rel: ArrayLike, k: int) -> int:
    """How many of the first ``k`` labels are relevant (a shorter list counts what it has)."""
    _check_k(k)
    return int(np.count_nonzero(_binary(rel)[:k]))


def dcg(gains: ArrayLike, k: int) -> float:
    """Discounted cumulative gain at ``k``: sum over ranks i <= k of g_i / log2(i + 1)."""
    _check_k(k)
    top = _gains(gains)[:k]
    return float(np.sum(top / np.log2(np.arange(2, top.size + 2, dtype=np.float64))))


def ndcg_cut(ranked_gains: ArrayLike, all_relevant_gains: ArrayLike, k: int) -> float:
    """nDCG at ``k`` as trec_eval's ``ndcg_cut.k``: the ideal ranking is built from every judged
    gain of the query (``all_relevant_gains``, any order), sorted descending and cut at ``k``.

    0 when the ideal is 0 (no passage with a positive gain).
    """
    ideal = np.sort(_gains(all_relevant_gains))[::-1]
    ideal_dcg = dcg(ideal, k)
    if ideal_dcg <= 0.0:
        return 0.0
    return dcg(ranked_gains, k) / ideal_dcg


def ndcg_at(gains: ArrayLike, k: int) -> float:
    """nDCG at ``k`` without N_p: the ideal is the same top-``k`` gains sorted descending."""
    _check_k(k)
    top = _gains(gains)[:k]
    return ndcg_cut(top, top, k)


def precision_at(rel: ArrayLike, k: int) -> float:
    """n_p / k; positions past the end of ``rel`` count as non-relevant (trec_eval's P.k)."""
    return relevant_in_top(rel, k) / k


def hit_at(rel: ArrayLike, k: int) -> float:
    """1.0 when any of the first ``k`` is relevant, else 0.0 (trec_eval's success.k)."""
    return 1.0 if relevant_in_top(rel, k) > 0 else 0.0


def reciprocal_rank(rel: ArrayLike, k: int) -> float:
    """1 / rank of the first relevant label within the first ``k``, else 0."""
    _check_k(k)
    hits = np.flatnonzero(_binary(rel)[:k])
    return 1.0 / float(hits[0] + 1) if hits.size else 0.0


def recall_at(rel: ArrayLike, k: int, n_rel: int) -> float | None:
    """n_p / n_rel; ``None`` when the query has no relevant passage (recall is undefined)."""
    if n_rel < 0:
        raise ValueError(f"n_rel must be non-negative, got {n_rel}")
    n_p = relevant_in_top(rel, k)
    if n_rel == 0:
        return None
    if n_p > n_rel:
        raise ValueError(f"{n_p} relevant in the top {k} but only {n_rel} relevant in total")
    return n_p / n_rel


def t_measure(n_p: int, k: int, alpha: float) -> float:
    """T(a) = (1 - a) * n_p - a * n_n / K (paper, Eq. 3).

    n_n / K is divided first, so no relevant passage gives exactly -a whatever K is: a * K / K
    rounds differently for different K, which would split the largest group of equal values.
    """
    _check_k(k)
    _check_n_p(n_p, k)
    _check_alpha(alpha)
    return (1.0 - alpha) * n_p - alpha * ((k - n_p) / k)


def t_u_measure(n_p: int, k: int, alpha: float) -> float:
    """T_u(a) = (1 - a) * n_p - a * n_n, the unnormalised T (paper, Eq. 4)."""
    _check_k(k)
    _check_n_p(n_p, k)
    _check_alpha(alpha)
    return (1.0 - alpha) * n_p - alpha * (k - n_p)


def f_measure(n_p: int, k: int, n_rel: float, alpha: float) -> float:
    """F(a) = n_p / (a*K + (1 - a)*N_p) (paper, Eq. 2); 0 when the denominator is 0.

    ``n_rel`` is N_p for F, or the estimate N^_p for F_e. The denominator is 0 only when a = 0 and
    n_rel = 0, where n_p is 0 as well.
    """
    _check_k(k)
    _check_n_p(n_p, k)
    _check_alpha(alpha)
    if n_rel < 0:
        raise ValueError(f"n_rel must be non-negative, got {n_rel}")
    denominator = alpha * k + (1.0 - alpha) * n_rel
    if denominator <= 0.0:
        return 0.0
    return n_p / denominator


def np_estimate(rel: ArrayLike, k: int) -> tuple[int, int]:
    """(N^_p, window): relevant labels among the top 2K passages sent, and how many that was."""
    _check_k(k)
    labels = _binary(rel)
    window = min(2 * k, labels.size)
    return int(np.count_nonzero(labels[:window])), window


def k_over_np(k: int, n_rel: int) -> float | None:
    """K / N_p, the regime; ``None`` when N_p = 0: the ratio is infinite (no relevant passage
    known), the widest regime possible, which a finite number would misstate."""
    _check_k(k)
    if n_rel < 0:
        raise ValueError(f"n_rel must be non-negative, got {n_rel}")
    return None if n_rel == 0 else k / n_rel


def context_relevance(rating: int | None) -> float | None:
    """The judge's 0-2 rating of the whole top-K context scaled to [0, 1]."""
    if rating is None:
        return None
    if not 0 <= rating <= CONTEXT_RATING_MAX:
        raise ValueError(f"context rating must lie in [0, {CONTEXT_RATING_MAX}], got {rating}")
    return rating / CONTEXT_RATING_MAX


# ---------------------------------------------------------------------------------------------
# One event


@dataclass(frozen=True)
class EventLabels:
    """What the judge (and the gold set, when present) said about one retrieval.

    ``grades``: judge grades 0-3 in rank order for every judged passage, the top ``k`` first and
    then the estimation window (up to ``2k``); ``None`` is a missing label. A ``k`` larger than
    the number of grades means labels are missing in the top ``k``.
    ``gold_relevant``: per ranked passage, whether it is a gold passage; positions past its end
    hold no passage and count as non-gold. ``n_gold``: gold passages of the query (N_p).
    """

    grades: Sequence[int | None]
    k: int
    threshold: int = 2
    context_rating: int | None = None
    gold_relevant: Sequence[bool] | None = None
    n_gold: int | None = None

    def __post_init__(self) -> None:
        _check_k(self.k)
        _check_threshold(self.threshold)
        for grade in self.grades:
            if grade is not None and not 0 <= grade <= GRADE_MAX:
                raise ValueError(f"grades must lie in [0, {GRADE_MAX}], got {grade}")
        context_relevance(self.context_rating)
        if self.n_gold is not None:
            if self.n_gold < 0:
                raise ValueError(f"n_gold must be non-negative, got {self.n_gold}")
            ranked_gold = sum(bool(g) for g in self.gold_relevant or ())
            if ranked_gold > self.n_gold:
                raise ValueError(f"{ranked_gold} gold passages ranked but n_gold={self.n_gold}")


def compute_measures(labels: EventLabels, alpha: float) -> dict[str, float | None]:
    """Every measure of ``MEASURE_NAMES`` for one event, plus ``alpha`` and ``np_window``.

    ``np_window`` is how many passages the N^_p estimate looked at: min(2K, passages judged).
    ``k_over_np_est`` is ``None`` when N^_p = 0 (infinite regime), see ``k_over_np``.
    """
    _check_alpha(alpha)
    k = labels.k
    result: dict[str, float | None] = dict.fromkeys(MEASURE_NAMES)
    window = min(2 * k, len(labels.grades))
    result["alpha"] = alpha
    result["np_window"] = window
    result["context_relevance"] = context_relevance(labels.context_rating)

    top = list(labels.grades[:k])
    if len(top) == k and all(g is not None for g in top):
        gains = np.asarray(top, dtype=np.float64)
        rel = gains >= labels.threshold
        n_p = relevant_in_top(rel, k)
        result["precision"] = precision_at(rel, k)
        result["hit"] = hit_at(rel, k)
        result["rr"] = reciprocal_rank(rel, k)
        result["ndcg"] = ndcg_at(gains, k)
        result["t"] = t_measure(n_p, k, alpha)
        result["t_u"] = t_u_measure(n_p, k, alpha)
        extra = list(labels.grades[k:window])
        if all(g is not None for g in extra):
            window_rel = np.asarray(top + extra, dtype=np.float64) >= labels.threshold
            n_p_est, _ = np_estimate(window_rel, k)
            result["f_e"] = f_measure(n_p, k, n_p_est, alpha)
            result["k_over_np_est"] = k_over_np(k, n_p_est)

    if labels.gold_relevant is not None and labels.n_gold is not None:
        gold = _binary(labels.gold_relevant)
        n_gold = labels.n_gold
        gold_in_top = relevant_in_top(gold, k)
        result["recall"] = recall_at(gold, k, n_gold)
        result["f"] = f_measure(gold_in_top, k, n_gold, alpha)
        result["ndcg_gold"] = ndcg_cut(gold[:k].astype(np.float64), np.ones(min(n_gold, k)), k)
    return result


# ---------------------------------------------------------------------------------------------
# Many events at once (replays, analysis): same numbers as compute_measures, NaN for None


def _row_floats(values: ArrayLike, n: int, name: str) -> FloatArray:
    array: FloatArray = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size != n:
        raise ValueError(f"{name} must have one value per event ({n}), got {array.size}")
    return array


def _row_ints(values: ArrayLike, n: int, name: str) -> NDArray[np.int64]:
    floats = _row_floats(values, n, name)
    if np.any(floats != np.round(floats)):
        raise ValueError(f"{name} must be whole numbers")
    return floats.astype(np.int64)


def _safe_divide(numerator: FloatArray, denominator: FloatArray) -> FloatArray:
    """numerator / denominator where the denominator is positive, else 0."""
    positive = denominator > 0
    return np.where(positive, numerator / np.where(positive, denominator, 1.0), 0.0)


def compute_batch(
    grades: ArrayLike,
    ks: ArrayLike,
    alpha: float,
    *,
    n_sent: ArrayLike | None = None,
    threshold: int = 2,
    context_ratings: ArrayLike | None = None,
    gold_relevant: ArrayLike | None = None,
    n_gold: ArrayLike | None = None,
) -> dict[str, FloatArray]:
    """Vectorised ``compute_measures`` over many events, one row each.

    ``grades``: (n_events, width) floats in rank order, NaN for a missing label or no passage.
    ``ks``: cutoff per event. ``n_sent``: passages per event (default: the full width); grades at
    or after it are ignored. ``context_ratings``: (n_events,) 0-2 or NaN. ``gold_relevant``:
    (n_events, any width) booleans, positions past the width are non-gold; ``n_gold``:
    (n_events,) with NaN for events without gold. Returns float arrays keyed like
    ``compute_measures``, NaN where it gives ``None``.
    """
    _check_alpha(alpha)
    _check_threshold(threshold)
    labels = np.asarray(grades, dtype=np.float64)
    if labels.ndim != 2:
        raise ValueError(f"grades must be 2-dimensional, got shape {labels.shape}")
    n_events, width = labels.shape
    cutoffs = _row_ints(ks, n_events, "ks")
    if n_events and cutoffs.min() < 1:
        raise ValueError("every cutoff k must be at least 1")
    sent = (
        np.full(n_events, width, dtype=np.int64)
        if n_sent is None
        else _row_ints(n_sent, n_events, "n_sent")
    )
    if n_events and (sent.min() < 0 or sent.max() > width):
        raise ValueError(f"n_sent must lie in [0, {width}]")
    finite = labels[~np.isnan(labels)]
    if finite.size and (finite.min() < 0 or finite.max() > GRADE_MAX):
        raise ValueError(f"grades must lie in [0, {GRADE_MAX}]")

    # Columns up to the largest cutoff, so a cutoff past the last passage reads as missing labels.
    span = max(width, int(cutoffs.max()) if n_events else 1)
    padded = np.full((n_events, span), np.nan)
    padded[:, :width] = labels
    position = np.arange(span)
    padded[position[None, :] >= sent[:, None]] = np.nan
    missing = np.isnan(padded)
    in_top = position[None, :] < cutoffs[:, None]
    window = np.minimum(2 * cutoffs, sent)
    in_window = position[None, :] < window[:, None]
    relevant = np.where(missing, False, padded >= threshold)

    k_float = cutoffs.astype(np.float64)
    top_relevant = relevant & in_top
    n_p = top_relevant.sum(axis=1).astype(np.float64)
    first = np.argmax(top_relevant, axis=1).astype(np.float64)
    discount = 1.0 / np.log2(np.arange(2, span + 2, dtype=np.float64))
    gains = np.where(in_top & ~missing, padded, 0.0)
    ideal = -np.sort(-gains, axis=1)
    n_p_est = (relevant & in_window).sum(axis=1).astype(np.float64)

    out: dict[str, FloatArray] = {
        "precision": n_p / k_float,
        "hit": (n_p > 0).astype(np.float64),
        "rr": np.where(n_p > 0, 1.0 / (first + 1.0), 0.0),
        "ndcg": _safe_divide((gains * discount).sum(axis=1), (ideal * discount).sum(axis=1)),
        # Divided first, as in t_measure: no relevant passage is exactly -alpha for every K.
        "t": (1.0 - alpha) * n_p - alpha * ((k_float - n_p) / k_float),
        "t_u": (1.0 - alpha) * n_p - alpha * (k_float - n_p),
        "f_e": _safe_divide(n_p, alpha * k_float + (1.0 - alpha) * n_p_est),
        "k_over_np_est": np.where(
            n_p_est > 0, k_float / np.where(n_p_est > 0, n_p_est, 1.0), np.nan
        ),
    }
    top_missing = (missing & in_top).any(axis=1)
    window_missing = (missing & in_window).any(axis=1) | top_missing
    for name in TOP_K_MEASURES:
        out[name] = np.where(top_missing, np.nan, out[name])
    for name in WINDOW_MEASURES:
        out[name] = np.where(window_missing, np.nan, out[name])

    if context_ratings is None:
        out["context_relevance"] = np.full(n_events, np.nan)
    else:
        ratings = _row_floats(context_ratings, n_events, "context_ratings")
        known = ratings[~np.isnan(ratings)]
        if known.size and (known.min() < 0 or known.max() > CONTEXT_RATING_MAX):
            raise ValueError(f"context ratings must lie in [0, {CONTEXT_RATING_MAX}]")
        out["context_relevance"] = ratings / CONTEXT_RATING_MAX

    out.update(_gold_batch(gold_relevant, n_gold, cutoffs, in_top, discount, alpha))
    out["alpha"] = np.full(n_events, float(alpha))
    out["np_window"] = window.astype(np.float64)
    return out


def _gold_batch(
    gold_relevant: ArrayLike | None,
    n_gold: ArrayLike | None,
    cutoffs: NDArray[np.int64],
    in_top: NDArray[np.bool_],
    discount: FloatArray,
    alpha: float,
) -> dict[str, FloatArray]:
    n_events, span = in_top.shape
    if gold_relevant is None or n_gold is None:
        return {name: np.full(n_events, np.nan) for name in GOLD_MEASURES}
    gold_given = np.asarray(gold_relevant, dtype=bool)
    if gold_given.ndim != 2 or gold_given.shape[0] != n_events:
        raise ValueError(f"gold_relevant must have shape ({n_events}, width)")
    gold = np.zeros((n_events, span), dtype=bool)
    columns = min(span, gold_given.shape[1])
    gold[:, :columns] = gold_given[:, :columns]
    totals = _row_floats(n_gold, n_events, "n_gold")
    has_gold = ~np.isnan(totals)
    n_rel = np.where(has_gold, totals, 0.0)
    if np.any(n_rel != np.round(n_rel)):
        raise ValueError("n_gold must be whole numbers")
    if np.any(n_rel < 0) or np.any(has_gold & (gold_given.sum(axis=1) > n_rel)):
        raise ValueError("n_gold must be non-negative and at least the gold passages ranked")

    k_float = cutoffs.astype(np.float64)
    gold_in_top = (gold & in_top).sum(axis=1).astype(np.float64)
    recall = np.where(n_rel > 0, gold_in_top / np.where(n_rel > 0, n_rel, 1.0), np.nan)
    f = _safe_divide(gold_in_top, alpha * k_float + (1.0 - alpha) * n_rel)
    # The ideal ranking puts all min(N_p, K) gold passages first, each with gain 1.
    ideal_count = np.minimum(n_rel, k_float).astype(np.int64)
    cumulative = np.concatenate(([0.0], np.cumsum(discount)))
    ndcg_gold = _safe_divide(((gold & in_top) * discount).sum(axis=1), cumulative[ideal_count])
    return {
        "recall": np.where(has_gold, recall, np.nan),
        "f": np.where(has_gold, f, np.nan),
        "ndcg_gold": np.where(has_gold, ndcg_gold, np.nan),
    }
