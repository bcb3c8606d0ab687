"""Calibrating the local judge on a tenant's own gold traffic.

The gold queries of a window are split in two halves at random (reproducibly, by ``seed``); the
three similarity thresholds are fitted on one half (``threshold_fit.fit_thresholds``) and the
other half says how well they agree with the gold labels: precision, recall, F1 and Cohen's kappa
per grade threshold, with intervals that resample whole queries. The thresholds the judge uses
now are scored on the same held-out half, so the two can be told apart.

A query is its text: the same question sent twice is one query and lands in one half.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlmodel import Session

from service.analysis.report import to_jsonable
from service.analysis.threshold_fit import Agreement, agreement, fit_thresholds, split_queries
from service.store import calibration as calibration_store
from service.store.analysis import EventWindow
from service.store.calibration import GoldSimilarity, local_prompt_version

# Ten queries a half: fewer, and the held-out kappa's interval spans most of [0, 1].
MIN_QUERIES = 20
GRADES = (1, 2, 3)


class NotEnoughGoldError(ValueError):
    """Too little gold traffic to fit and check thresholds; the message says what is needed."""


@dataclass(frozen=True)
class GradeAgreement:
    grade: int  # relevant = grade >= this
    fitted: Agreement
    current: Agreement


@dataclass(frozen=True)
class LocalCalibration:
    encoder_version: str
    queries: int
    fitted_queries: int
    held_out_queries: int
    passages: int
    gold_passages: int
    current_thresholds: tuple[float, float, float]
    thresholds: tuple[float, float, float]
    prompt_version: str
    held_out: list[GradeAgreement]
    seed: int

    def at(self, grade: int) -> GradeAgreement:
        return next(row for row in self.held_out if row.grade == grade)


def grades_of(similarities: np.ndarray, thresholds: Sequence[float]) -> np.ndarray:
    """Grade 0-3 per similarity: how many of the ascending thresholds it reaches."""
    return np.searchsorted(np.asarray(thresholds, dtype=np.float64), similarities, side="right")


def calibrate_local_judge(
    rows: Sequence[GoldSimilarity],
    *,
    encoder_version: str,
    current_thresholds: tuple[float, float, float],
    seed: int = 0,
    reps: int = 1000,
) -> LocalCalibration:
    """Fit on one half of the gold queries, report on the other; ``NotEnoughGoldError`` when the
    window cannot support that."""
    queries = sorted({row.query for row in rows})
    if len(queries) < MIN_QUERIES:
        raise NotEnoughGoldError(
            f"{len(queries)} gold queries with local-judge labels in this window; calibrating "
            f"needs at least {MIN_QUERIES} (half to fit the thresholds, half to check them). "
            "Send more gold traffic (gold_passage_ids), let the local judge label it, or widen "
            "the window."
        )
    fit_half, held_half = split_queries(queries, seed)
    similarity = np.array([row.similarity for row in rows], dtype=np.float64)
    gold = np.array([row.gold for row in rows], dtype=bool)
    in_fit = np.array([row.query in fit_half for row in rows], dtype=bool)
    fit_gold = gold[in_fit]
    if not fit_gold.any() or fit_gold.all():
        raise NotEnoughGoldError(
            "the fitting half holds no "
            + ("gold passage" if not fit_gold.any() else "passage that is not gold")
            + " among the judged passages: fitting needs both; the gold ids must match the "
            "ids of passages the retriever sent"
        )
    thresholds = fit_thresholds(similarity[in_fit], fit_gold)
    held = ~in_fit
    numbering = {query: index for index, query in enumerate(sorted(held_half))}
    query_index = np.array([numbering[row.query] for row in rows if row.query in held_half])
    fitted_grades = grades_of(similarity[held], thresholds)
    current_grades = grades_of(similarity[held], current_thresholds)
    held_out = [
        GradeAgreement(
            grade=grade,
            fitted=agreement(fitted_grades >= grade, gold[held], query_index, reps=reps, seed=seed),
            current=agreement(
                current_grades >= grade, gold[held], query_index, reps=reps, seed=seed
            ),
        )
        for grade in GRADES
    ]
    return LocalCalibration(
        encoder_version=encoder_version,
        queries=len(queries),
        fitted_queries=len(fit_half),
        held_out_queries=len(held_half),
        passages=len(rows),
        gold_passages=int(gold.sum()),
        current_thresholds=current_thresholds,
        thresholds=thresholds,
        prompt_version=local_prompt_version(encoder_version, thresholds),
        held_out=held_out,
        seed=seed,
    )


def render(report: LocalCalibration, applied: bool) -> str:
    """The calibration as a terminal table."""
    lines = [
        f"local judge ({report.encoder_version}) on {report.queries} gold queries, "
        f"{report.passages} judged passages ({report.gold_passages} gold)",
        f"fitted on {report.fitted_queries} queries, checked on the other "
        f"{report.held_out_queries} (seed {report.seed})",
        "thresholds now:    " + ", ".join(f"{t:g}" for t in report.current_thresholds),
        "thresholds fitted: " + ", ".join(f"{t:g}" for t in report.thresholds),
        "",
        "held-out agreement with gold (95% intervals, resampling queries)",
        f"{'relevant':<12}{'thresholds':<12}{'precision':<22}{'recall':<22}{'kappa':<22}",
    ]
    for row in report.held_out:
        for name, figures in (("now", row.current), ("fitted", row.fitted)):
            lines.append(
                f"{'grade >= ' + str(row.grade):<12}{name:<12}"
                f"{figures.precision.format():<22}{figures.recall.format():<22}"
                f"{figures.kappa.format():<22}"
            )
    lines.append("")
    if applied:
        lines.append(
            f"applied: workers label with prompt version {report.prompt_version} from now on"
        )
    else:
        lines.append(f"not applied (--apply labels from now on as {report.prompt_version})")
    return "\n".join(lines)


@dataclass(frozen=True)
class CalibrationOutcome:
    report: LocalCalibration
    applied: bool


def run_local_calibration(
    session: Session,
    window: EventWindow,
    *,
    configured_thresholds: tuple[float, float, float],
    seed: int = 0,
    reps: int = 1000,
    apply: bool = False,
    now: datetime,
) -> CalibrationOutcome:
    """Read the window's gold similarities, fit and check, and store the fit when ``apply``.

    "Now" is the calibration applied last for the encoder, else the configured thresholds.
    The caller commits.
    """
    rows, encoders = calibration_store.gold_similarities(session, window)
    if not rows:
        raise NotEnoughGoldError(
            f"no gold event in this window has local-judge labels; calibrating needs at least "
            f"{MIN_QUERIES} gold queries labelled by the local judge"
            + (f" (encoders seen: {', '.join(encoders)})" if encoders else "")
        )
    encoder_version = encoders[0]
    applied_before = calibration_store.applied_calibration(session, encoder_version)
    current = (
        _three(applied_before.thresholds) if applied_before is not None else configured_thresholds
    )
    report = calibrate_local_judge(
        rows, encoder_version=encoder_version, current_thresholds=current, seed=seed, reps=reps
    )
    if apply:
        calibration_store.save_calibration(
            session,
            tenant=window.tenant or "default",
            encoder_version=encoder_version,
            thresholds=report.thresholds,
            prompt_version=report.prompt_version,
            fitted_queries=report.fitted_queries,
            held_out_queries=report.held_out_queries,
            held_out_kappa=_finite(report.at(2).fitted.kappa.value),
            report=to_jsonable(report),
            now=now,
        )
    return CalibrationOutcome(report, apply)


def _three(values: Sequence[float]) -> tuple[float, float, float]:
    first, second, third = (float(v) for v in values)
    return first, second, third


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
