"""Stored events shaped into what the pure analysis takes: label matrices, gold questions and
judge/gold label pairs. No SQL here (that is ``service.store.analysis``), no statistics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from service.analysis.calibration import LabelPair
from service.analysis.correlation import JudgedTraffic
from service.analysis.gold import GoldEvent
from service.measures.formulas import first_gold_ranks
from service.store.analysis import AnalysisEvent, GoldJudgment


def _or_nan(value: int | None) -> float:
    return np.nan if value is None else float(value)


def judged_traffic(
    events: Sequence[AnalysisEvent],
    grades: Mapping[int, Mapping[int, int | None]],
    ratings: Mapping[int, int | None],
    passage_ids: Mapping[int, Sequence[str]],
    threshold: int,
) -> JudgedTraffic:
    """One row per event the judge labelled; ranks it did not label read as missing.

    Only the top 2k passages are judged, so the matrices are that wide at most. A passage
    counts as gold at its first occurrence only, so a repeated id cannot count twice.
    """
    judged = [e for e in events if e.pk in grades]
    sent = np.array([min(e.passage_count, 2 * e.k) for e in judged], dtype=np.int64)
    width = int(sent.max()) if judged else 1
    matrix = np.full((len(judged), width), np.nan)
    gold = np.zeros((len(judged), width), dtype=bool)
    n_gold = np.full(len(judged), np.nan)
    for row, event in enumerate(judged):
        for rank, grade in grades[event.pk].items():
            if 1 <= rank <= sent[row] and grade is not None:
                matrix[row, rank - 1] = grade
        if event.has_gold:
            wanted = set(event.gold_passage_ids or ())
            n_gold[row] = len(wanted)
            for rank in first_gold_ranks(passage_ids.get(event.pk, []), wanted):
                if rank <= sent[row]:
                    gold[row, rank - 1] = True
    return JudgedTraffic(
        grades=matrix,
        ks=np.array([e.k for e in judged], dtype=np.int64),
        n_sent=sent,
        context_ratings=np.array([_or_nan(ratings.get(e.pk)) for e in judged]),
        response_grades=np.array([_or_nan(e.response_grade) for e in judged]),
        gold_relevant=gold,
        n_gold=n_gold,
        threshold=threshold,
    )


def gold_events(
    events: Sequence[AnalysisEvent],
    passage_ids: Mapping[int, Sequence[str]],
    queries: Mapping[int, str] | None = None,
) -> list[GoldEvent]:
    """Every event with at least one gold id, as a gold question."""
    out: list[GoldEvent] = []
    for event in events:
        if not event.has_gold:
            continue
        wanted = set(event.gold_passage_ids or ())
        ranked = passage_ids.get(event.pk, [])
        ranks = first_gold_ranks(ranked, wanted)
        stage_depth = stage_found = None
        if event.candidates:
            candidate_ids = [str(c.get("id")) for c in event.candidates]
            stage_depth = len(candidate_ids)
            stage_found = len(wanted.intersection(candidate_ids))
        out.append(
            GoldEvent(
                k=min(event.k, max(len(ranked), 1)),
                depth=max(len(ranked), 1),
                gold_ranks=ranks,
                n_gold=len(wanted),
                answer_correct=event.answer_correct,
                first_stage_depth=stage_depth,
                first_stage_found=stage_found,
                query=(queries or {}).get(event.pk, ""),
            )
        )
    return out


def label_pairs(
    events: Sequence[AnalysisEvent],
    passage_ids: Mapping[int, Sequence[str]],
    judgments: Sequence[GoldJudgment],
) -> list[LabelPair]:
    """Judge label against gold label for every labelled passage of a gold event."""
    gold = {e.pk: set(e.gold_passage_ids or ()) for e in events if e.has_gold}
    pairs: list[LabelPair] = []
    for judgment in judgments:
        wanted = gold.get(judgment.event_pk)
        ranked = passage_ids.get(judgment.event_pk, [])
        if wanted is None or not 1 <= judgment.rank <= len(ranked):
            continue
        pairs.append(
            LabelPair(
                event=judgment.event_pk,
                judge=judgment.judge,
                prompt_version=judgment.prompt_version,
                judge_relevant=judgment.relevant,
                gold_relevant=ranked[judgment.rank - 1] in wanted,
            )
        )
    return pairs
