"""The labelling queue on the database: the sample of a window, the next event to label, and the
figures of the labelled part of the sample (the article's arithmetic, the judge's calibration
against the labels, and the labellers' agreement). The pages and the API both call these."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sqlmodel import Session

from service.analysis.agreement import Agreement, agreement
from service.analysis.calibration import JudgeCalibration, calibrate
from service.analysis.dataset import gold_events, label_pairs
from service.analysis.gold import GoldReport, analyze_gold
from service.analysis.gold_sample import draw
from service.store import analysis as repo
from service.store import gold as gold_store
from service.store.analysis import EventWindow
from service.store.gold import SampleCandidate

# The bootstrap intervals of the queue's figures: fewer replicates than the analysis command,
# since the page recomputes them after every label; the Wilson intervals are exact anyway.
QUEUE_REPS = 300


@dataclass(frozen=True)
class QueueState:
    sample: list[SampleCandidate]
    labelled: int  # events of the sample somebody labelled
    mine: set[int]  # event pks of the sample this labeller labelled
    gold: int  # events of the sample that are gold questions (sent with gold or agreed)
    outcomes: dict[str, int]  # agreed outcomes over the sample (and "disagreed")
    report: GoldReport | None
    calibration: list[JudgeCalibration]
    agreement: Agreement
    narrow: int = 0  # events of the window stored without texts (RM_KEEP_TEXTS), not sampled

    def next_for(
        self, after_pk: int | None = None, skip: int | None = None
    ) -> SampleCandidate | None:
        """The first event of the sample this labeller has not labelled, looking from the one
        after ``after_pk`` round to the start; ``skip``: one to pass over (being labelled)."""
        pks = [c.pk for c in self.sample]
        start = pks.index(after_pk) + 1 if after_pk in pks else 0
        for candidate in self.sample[start:] + self.sample[:start]:
            if candidate.pk not in self.mine and candidate.pk != skip:
                return candidate
        return None


def draw_sample(
    session: Session, window: EventWindow, seed: int, target: int
) -> list[SampleCandidate]:
    pool = gold_store.sample_candidates(session, window.conditions(), seed, window.max_events)
    return draw(pool, seed, target)


def queue_state(
    session: Session,
    window: EventWindow,
    *,
    seed: int,
    target: int,
    labeller: str,
    reps: int = QUEUE_REPS,
) -> QueueState:
    sample = draw_sample(session, window, seed, target)
    pks = [c.pk for c in sample]
    labels = gold_store.labels_of(session, pks)
    events = repo.gold_events_in_window(session, window, among=pks)
    ids = repo.passage_ids(session, pks)
    questions = gold_events(events, ids)
    report = analyze_gold(questions, reps=reps) if questions else None
    judged = repo.labelled_judgments(session, [e.pk for e in events])
    outcomes: Counter[str] = Counter()
    for rows in labels.values():
        agreed = gold_store.consensus(None, None, rows)
        outcomes[agreed.outcome or agreed.status] += 1
    return QueueState(
        sample=sample,
        labelled=len(labels),
        mine={pk for pk, rows in labels.items() if any(r.labeller == labeller for r in rows)},
        gold=len(questions),
        outcomes=dict(outcomes),
        report=report,
        calibration=calibrate(label_pairs(events, ids, judged)),
        agreement=agreement(labels, ids),
        narrow=gold_store.narrow_events(session, window.conditions()),
    )


def window_agreement(session: Session, window: EventWindow) -> Agreement:
    """The labellers' agreement over every labelled event of the window."""
    pks = gold_store.labelled_event_pks(session, window.conditions())
    return agreement(gold_store.labels_of(session, pks), repo.passage_ids(session, pks))
