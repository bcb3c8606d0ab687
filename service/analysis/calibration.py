"""The smoke alarm checked against the instrument: how far a judge agrees with the gold labels.

On events that carry gold ids, every passage the judge labelled is a pair: gold-relevant when
its id is among the event's ``gold_passage_ids``, judge-relevant when the judge's grade reached
the relevance threshold. Per judge and prompt version: precision (of the judge's "relevant"
against gold), recall (of the gold passages the judge saw), and Cohen's kappa.

Only retrieved passages are judged, so recall is over the gold passages that were retrieved; and
a gold set marks the passages that answer, not every relevant one, so part of the judge's
"false positives" may be relevant passages nobody marked (the article's caveat on gold sets).
Passages of one event are not independent; the intervals assume they are and are a little
narrow when a judge's errors cluster by query.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from service.analysis import stats
from service.analysis.stats import Estimate, Kappa


@dataclass(frozen=True)
class LabelPair:
    event: int
    judge: str
    prompt_version: str
    judge_relevant: bool
    gold_relevant: bool


@dataclass(frozen=True)
class Confusion:
    true_positive: int = 0
    false_positive: int = 0
    false_negative: int = 0
    true_negative: int = 0

    @property
    def total(self) -> int:
        return self.true_positive + self.false_positive + self.false_negative + self.true_negative

    def table(self) -> list[list[int]]:
        """Rows: judge relevant / not; columns: gold relevant / not."""
        return [
            [self.true_positive, self.false_positive],
            [self.false_negative, self.true_negative],
        ]


@dataclass(frozen=True)
class JudgeCalibration:
    judge: str
    prompt_version: str
    events: int
    passages: int
    confusion: Confusion
    precision: Estimate
    recall: Estimate
    kappa: Kappa


def confusion_of(pairs: Iterable[LabelPair]) -> Confusion:
    tp = fp = fn = tn = 0
    for pair in pairs:
        if pair.judge_relevant and pair.gold_relevant:
            tp += 1
        elif pair.judge_relevant:
            fp += 1
        elif pair.gold_relevant:
            fn += 1
        else:
            tn += 1
    return Confusion(tp, fp, fn, tn)


def calibrate(pairs: Iterable[LabelPair]) -> list[JudgeCalibration]:
    """One calibration per (judge, prompt version), sorted by judge then version."""
    groups: dict[tuple[str, str], list[LabelPair]] = defaultdict(list)
    for pair in pairs:
        groups[(pair.judge, pair.prompt_version)].append(pair)
    out: list[JudgeCalibration] = []
    for (judge, version), members in sorted(groups.items()):
        confusion = confusion_of(members)
        tp, fp, fn = confusion.true_positive, confusion.false_positive, confusion.false_negative
        out.append(
            JudgeCalibration(
                judge=judge,
                prompt_version=version,
                events=len({p.event for p in members}),
                passages=len(members),
                confusion=confusion,
                precision=stats.proportion(tp, tp + fp),
                recall=stats.proportion(tp, tp + fn),
                kappa=stats.cohens_kappa(confusion.table()),
            )
        )
    return out
