"""The article's arithmetic on gold traffic: the recall curve, MRR, the retrieval ceiling, the
conversion rate, and the end-to-end accuracy they predict next to the one observed.

Definitions (one event = one question with hand-marked gold passages):
- hit@c: the share of questions with at least one gold passage in the top c ("could possibly
  be answered"); recall@c: the mean share of each question's gold passages in the top c. With
  one gold passage per question, as in the article, the two are the same number.
- the curve reaches a cutoff c only with the events that sent at least c passages: counting a
  shorter list would count its hits and not its misses.
- ceiling: hit at the k the prompt carries (each event's own k); MRR is at that k too.
- conversion: correct answers among questions whose gold passage reached the prompt;
  predicted accuracy: ceiling x conversion; observed: correct answers among all questions.
  Predicted and observed accuracy are both taken on the questions with an answer verdict (the
  ceiling of the prediction too), so when every right answer had its gold passage in the prompt,
  as the article's model assumes, the two are the same number; their ``n`` says on how many.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from service.analysis import stats
from service.analysis.stats import Estimate, FloatArray, IntArray

CUTOFFS: tuple[int, ...] = (1, 3, 5, 10, 20, 50)
# A gap in the curve (or between first stage and prompt) worth acting on, per the article's
# "recall at 50 came back at 0.96" example: 8 points is large, 2 points is noise.
GAP_POINTS = 0.05


@dataclass(frozen=True)
class GoldEvent:
    """A gold question as the retriever served it.

    ``gold_ranks``: 1-based ranks of the gold passages among the ``depth`` passages sent;
    ``first_stage_found``: gold passages among the ``first_stage_depth`` first-stage candidates
    (both None when the event sent no candidates).
    """

    k: int
    depth: int
    gold_ranks: tuple[int, ...]
    n_gold: int
    answer_correct: bool | None = None
    first_stage_depth: int | None = None
    first_stage_found: int | None = None
    query: str = ""

    def __post_init__(self) -> None:
        if self.n_gold < 1:
            raise ValueError("a gold event needs at least one gold passage")
        if len(self.gold_ranks) > self.n_gold:
            raise ValueError("more gold passages ranked than the event has")
        if any(not 1 <= r <= self.depth for r in self.gold_ranks):
            raise ValueError(f"gold ranks must lie in [1, depth={self.depth}]")

    def found_within(self, cutoff: int) -> int:
        return sum(1 for r in self.gold_ranks if r <= cutoff)

    @property
    def in_prompt(self) -> bool:
        return self.found_within(self.k) > 0

    @property
    def reciprocal_rank(self) -> float:
        first = min(self.gold_ranks, default=None)
        return 1.0 / first if first is not None and first <= self.k else 0.0


@dataclass(frozen=True)
class CurvePoint:
    cutoff: int
    hit: Estimate
    recall: Estimate


@dataclass(frozen=True)
class FirstStage:
    """Recall of the first-stage candidates next to recall in the prompt, on the same events:
    the first is a retrieval problem, the gap between them a ranking problem."""

    events: int
    median_depth: float
    first_stage_hit: Estimate
    first_stage_recall: Estimate
    prompt_hit: Estimate
    prompt_recall: Estimate
    dropped: int  # gold found by the first stage, none of it in the prompt


@dataclass(frozen=True)
class GoldReport:
    events: int
    median_k: float
    curve: list[CurvePoint]
    mrr: Estimate
    ceiling: Estimate
    ceiling_recall: Estimate
    with_feedback: int
    conversion: Estimate
    observed_accuracy: Estimate
    predicted_accuracy: Estimate
    retrieval_misses: int
    generation_misses: int
    correct_without_gold: int
    first_stage: FirstStage | None
    diagnosis: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Arrays:
    hit_at_k: FloatArray
    correct: FloatArray  # 1/0, NaN without feedback

    @classmethod
    def of(cls, events: Sequence[GoldEvent]) -> _Arrays:
        return cls(
            hit_at_k=np.array([float(e.in_prompt) for e in events]),
            correct=np.array(
                [np.nan if e.answer_correct is None else float(e.answer_correct) for e in events]
            ),
        )


def _count(values: FloatArray) -> int:
    return int(np.count_nonzero(values == 1.0))


def ceiling_and_conversion(
    events: Sequence[GoldEvent],
) -> tuple[Estimate, Estimate, Estimate]:
    """(ceiling, conversion, observed accuracy), each a proportion with Wilson's interval."""
    arrays = _Arrays.of(events)
    fed = ~np.isnan(arrays.correct)
    reached = fed & (arrays.hit_at_k == 1.0)
    return (
        stats.proportion(_count(arrays.hit_at_k), len(events)),
        stats.proportion(_count(arrays.correct[reached]), int(reached.sum())),
        stats.proportion(_count(arrays.correct[fed]), int(fed.sum())),
    )


def predicted_accuracy(
    events: Sequence[GoldEvent],
    *,
    conversion_from: Sequence[GoldEvent] | None = None,
    reps: int = stats.BOOTSTRAP_REPS,
    seed: int = 0,
) -> Estimate:
    """ceiling x conversion, with a bootstrap interval (a product of two proportions has no
    simple closed form). ``conversion_from``: take the conversion rate from other events, as
    the article does to predict a retriever change from the old conversion rate.

    The ceiling is taken on the questions with an answer verdict only, the ones the observed
    accuracy counts, so prediction and observation speak of the same questions (``n``).
    """
    own = _Arrays.of([e for e in events if e.answer_correct is not None])
    other = _Arrays.of(conversion_from) if conversion_from is not None else own
    n_own, n_other = own.hit_at_k.size, other.hit_at_k.size
    if n_own == 0 or n_other == 0:
        return Estimate.empty("bootstrap")

    def conversion(rows: IntArray) -> float:
        correct = other.correct[rows]
        reached = ~np.isnan(correct) & (other.hit_at_k[rows] == 1.0)
        return float(correct[reached].mean()) if reached.any() else stats.NAN

    everything = np.arange(n_other, dtype=np.int64)
    value = float(own.hit_at_k.mean()) * conversion(everything)
    rng = np.random.default_rng(seed)
    replicates = np.empty(reps)
    for rep in range(reps):
        ceiling = float(own.hit_at_k[rng.integers(0, n_own, n_own)].mean())
        replicates[rep] = ceiling * conversion(rng.integers(0, n_other, n_other))
    finite = replicates[np.isfinite(replicates)]
    se = float(finite.std(ddof=1)) if finite.size > 1 else stats.NAN
    low, high = stats.percentile_interval(replicates)
    return Estimate(value, se, low, high, n_own, "bootstrap")


def recall_curve(
    events: Sequence[GoldEvent],
    cutoffs: Sequence[int] = CUTOFFS,
    *,
    reps: int = stats.BOOTSTRAP_REPS,
    seed: int = 0,
) -> list[CurvePoint]:
    """hit@c and recall@c for every cutoff that at least one event sent enough passages for."""
    points: list[CurvePoint] = []
    for cutoff in sorted(set(cutoffs)):
        deep = [e for e in events if e.depth >= cutoff]
        if not deep:
            continue
        hits = sum(1 for e in deep if e.found_within(cutoff) > 0)
        recalls = [e.found_within(cutoff) / e.n_gold for e in deep]
        points.append(
            CurvePoint(
                cutoff=cutoff,
                hit=stats.proportion(hits, len(deep)),
                recall=stats.mean_estimate(recalls, reps=reps, seed=seed),
            )
        )
    return points


def first_stage(
    events: Sequence[GoldEvent], *, reps: int = stats.BOOTSTRAP_REPS, seed: int = 0
) -> FirstStage | None:
    staged = [
        e for e in events if e.first_stage_depth is not None and e.first_stage_found is not None
    ]
    if not staged:
        return None
    found = [e.first_stage_found or 0 for e in staged]
    in_prompt = [e.found_within(e.k) for e in staged]
    return FirstStage(
        events=len(staged),
        median_depth=float(np.median([e.first_stage_depth or 0 for e in staged])),
        first_stage_hit=stats.proportion(sum(1 for f in found if f > 0), len(staged)),
        first_stage_recall=stats.mean_estimate(
            [f / e.n_gold for f, e in zip(found, staged, strict=True)], reps=reps, seed=seed
        ),
        prompt_hit=stats.proportion(sum(1 for p in in_prompt if p > 0), len(staged)),
        prompt_recall=stats.mean_estimate(
            [p / e.n_gold for p, e in zip(in_prompt, staged, strict=True)], reps=reps, seed=seed
        ),
        dropped=sum(1 for f, p in zip(found, in_prompt, strict=True) if f > 0 and p == 0),
    )


def analyze_gold(
    events: Sequence[GoldEvent],
    cutoffs: Sequence[int] = CUTOFFS,
    *,
    reps: int = stats.BOOTSTRAP_REPS,
    seed: int = 0,
) -> GoldReport:
    """Everything the article computes on its 50 questions, with intervals."""
    ceiling, conversion, observed = ceiling_and_conversion(events)
    arrays = _Arrays.of(events)
    fed = ~np.isnan(arrays.correct)
    reached = arrays.hit_at_k == 1.0
    right = arrays.correct == 1.0
    report = GoldReport(
        events=len(events),
        median_k=float(np.median([e.k for e in events])) if events else stats.NAN,
        curve=recall_curve(events, cutoffs, reps=reps, seed=seed),
        mrr=stats.mean_estimate([e.reciprocal_rank for e in events], reps=reps, seed=seed),
        ceiling=ceiling,
        ceiling_recall=stats.mean_estimate(
            [e.found_within(e.k) / e.n_gold for e in events], reps=reps, seed=seed
        ),
        with_feedback=int(fed.sum()),
        conversion=conversion,
        observed_accuracy=observed,
        predicted_accuracy=predicted_accuracy(events, reps=reps, seed=seed),
        retrieval_misses=int(np.count_nonzero(fed & ~reached)),
        generation_misses=int(np.count_nonzero(fed & reached & ~right)),
        correct_without_gold=int(np.count_nonzero(fed & ~reached & right)),
        first_stage=first_stage(events, reps=reps, seed=seed),
    )
    report.diagnosis.extend(diagnose(report))
    return report


def diagnose(report: GoldReport) -> list[str]:
    """The article's readings of the numbers, as sentences (empty when nothing stands out)."""
    notes: list[str] = []
    if report.events == 0:
        return notes
    ceiling = report.ceiling
    detectable = stats.minimum_detectable_difference(ceiling.value, ceiling.n, ceiling.n)
    notes.append(
        f"ceiling {ceiling.value:.3f}, 95% interval [{ceiling.low:.3f}, {ceiling.high:.3f}], "
        f"from {ceiling.n} questions; a comparison with another {ceiling.n} questions would "
        f"detect a change of {detectable:.2f} or more 80% of the time (at the 5% level), and "
        "would usually miss smaller ones"
    )
    predicted = report.predicted_accuracy
    if report.with_feedback and report.with_feedback < report.events:
        notes.append(
            f"predicted and observed accuracy are on the {predicted.n} questions with an answer "
            f"verdict, of {report.events} gold questions"
        )
    if report.with_feedback:
        retrieval, generation = report.retrieval_misses, report.generation_misses
        larger = "retrieval" if retrieval > generation else "generation"
        if retrieval != generation:
            notes.append(
                f"{retrieval} answers failed because retrieval missed, {generation} with the "
                f"evidence in the prompt: {larger} is the larger gap to work on"
            )
        if report.correct_without_gold:
            notes.append(
                f"{report.correct_without_gold} answers were right with no gold passage in the "
                "prompt: the model knew, or the gold set misses passages that answer"
            )
    deepest = [p for p in report.curve if p.cutoff > report.median_k]
    if deepest and not math.isnan(ceiling.value):
        far = deepest[-1]
        gap = far.hit.value - ceiling.value
        if gap >= GAP_POINTS:
            notes.append(
                f"hit@{far.cutoff} is {gap:.2f} above the ceiling at k={report.median_k:g}: "
                "the gold passages are found and buried; a reranker (or a larger k) is next"
            )
        else:
            notes.append(
                f"hit@{far.cutoff} adds only {max(gap, 0.0):.2f} over the ceiling: widening the "
                "net is nearly exhausted; reranking and the misses themselves are where the "
                "remaining points are"
            )
    staged = report.first_stage
    if staged is not None:
        lost = staged.first_stage_hit.value - staged.prompt_hit.value
        if lost >= GAP_POINTS:
            notes.append(
                f"the first stage finds gold for {staged.first_stage_hit.value:.2f} of questions "
                f"but only {staged.prompt_hit.value:.2f} reach the prompt: a ranking problem"
            )
        else:
            notes.append(
                f"the rerank keeps what the first stage finds ({staged.prompt_hit.value:.2f} of "
                f"{staged.first_stage_hit.value:.2f}): misses are a retrieval problem"
            )
    return notes
