"""Run an analysis or a comparison on the database: load a window, hand the arrays to the pure
modules, assemble the report. The API and the command line both call these two functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sqlmodel import Session

from service.analysis.calibration import calibrate
from service.analysis.compare import ComparisonReport, SideData, compare
from service.analysis.correlation import JudgedTraffic, correlate
from service.analysis.dataset import gold_events, judged_traffic, label_pairs
from service.analysis.gold import CUTOFFS, GoldEvent, analyze_gold
from service.analysis.report import AnalysisReport, Counts, Scope
from service.store import analysis as repo
from service.store.analysis import AnalysisEvent, EventWindow, JudgeCount

DEFAULT_MAX_EVENTS = 50_000
# Gold events are read apart from the event budget, up to this many.
MAX_GOLD_EVENTS = 50_000


@dataclass(frozen=True)
class AnalysisRequest:
    """What to analyse. ``judge``/``prompt_version`` pick whose labels the measures use;
    unset, the judge and version that scored most events of the window."""

    window: EventWindow
    judge: str | None = None
    prompt_version: str | None = None
    relevance_threshold: int = 2
    alpha: float = 0.5
    cutoffs: tuple[int, ...] = CUTOFFS
    reps: int = 1000
    seed: int = 0
    # Gold events are read apart from the window's event budget, up to this many.
    max_gold_events: int = MAX_GOLD_EVENTS


@dataclass(frozen=True)
class _Side:
    events: list[AnalysisEvent]
    truncated: bool
    judges: list[JudgeCount]
    chosen: JudgeCount | None
    traffic: JudgedTraffic
    gold: list[GoldEvent]
    passage_ids: dict[int, list[str]]


def choose_judge(
    judges: Sequence[JudgeCount], judge: str | None, prompt_version: str | None
) -> JudgeCount | None:
    """The busiest (judge, prompt version) matching the given names, if any."""
    for candidate in judges:  # already sorted busiest first
        if judge is not None and candidate.judge != judge:
            continue
        if prompt_version is not None and candidate.prompt_version != prompt_version:
            continue
        return candidate
    return None


def _load(
    session: Session,
    request: AnalysisRequest,
    *,
    chosen: JudgeCount | None = None,
    with_queries: bool = False,
) -> _Side:
    events, truncated = repo.events_in_window(session, request.window)
    if truncated:
        # Gold traffic is scarce and precious: keep all of it even when live traffic fills
        # the event budget.
        known = {e.pk for e in events}
        gold_window = replace(request.window, max_events=request.max_gold_events)
        events += [e for e in repo.gold_events_in_window(session, gold_window) if e.pk not in known]
    judges = repo.judges_in_window(session, request.window)
    if chosen is None:
        chosen = choose_judge(judges, request.judge, request.prompt_version)
    pks = [e.pk for e in events]
    grades: dict[int, dict[int, int | None]] = {}
    ratings: dict[int, int | None] = {}
    if chosen is not None:
        grades = repo.grades_by_event(session, pks, chosen.judge, chosen.prompt_version)
        ratings = repo.context_ratings(session, pks, chosen.judge, chosen.prompt_version)
    # Passage ids matter only where gold ids are compared with them.
    gold_pks = [e.pk for e in events if e.has_gold]
    ids = repo.passage_ids(session, gold_pks)
    queries = repo.queries(session, gold_pks) if with_queries else None
    return _Side(
        events=events,
        truncated=truncated,
        judges=judges,
        chosen=chosen,
        traffic=judged_traffic(events, grades, ratings, ids, request.relevance_threshold),
        gold=gold_events(events, ids, queries),
        passage_ids=ids,
    )


def run_analysis(session: Session, request: AnalysisRequest) -> AnalysisReport:
    side = _load(session, request)
    traffic, notes = side.traffic, []
    if request.judge is not None and side.chosen is None:
        notes.append(
            f"judge {request.judge!r}"
            + (f" with prompt {request.prompt_version!r}" if request.prompt_version else "")
            + " scored no event in this window"
        )
    correlation = None
    if traffic.size:
        correlation = correlate(
            traffic, default_alpha=request.alpha, reps=request.reps, seed=request.seed
        )
    gold = (
        analyze_gold(side.gold, request.cutoffs, reps=request.reps, seed=request.seed)
        if side.gold
        else None
    )
    gold_pks = [e.pk for e in side.events if e.has_gold]
    pairs = label_pairs(side.events, side.passage_ids, repo.labelled_judgments(session, gold_pks))
    if not side.events:
        notes.append("no events in this window")
    elif not traffic.size:
        notes.append("no event of this window is judged yet")
    return AnalysisReport(
        scope=Scope(
            since=request.window.since,
            until=request.window.until,
            app=request.window.app,
            retriever=request.window.retriever,
            judge=side.chosen.judge if side.chosen else None,
            prompt_version=side.chosen.prompt_version if side.chosen else None,
            relevance_threshold=request.relevance_threshold,
            alpha=request.alpha,
        ),
        counts=Counts(
            events=len(side.events),
            judged=traffic.size,
            graded=sum(1 for e in side.events if e.response_grade is not None),
            gold=len(side.gold),
            gold_with_feedback=sum(1 for g in side.gold if g.answer_correct is not None),
            truncated=side.truncated,
            judges=side.judges,
        ),
        correlation=correlation,
        gold=gold,
        calibration=calibrate(pairs),
        notes=notes,
    )


def run_comparison(
    session: Session,
    baseline: AnalysisRequest,
    candidate: AnalysisRequest,
    labels: tuple[str, str],
) -> ComparisonReport:
    """B (``candidate``) against A (``baseline``), both read with the same judge."""
    first = _load(session, baseline, with_queries=True)
    chosen = first.chosen
    if chosen is None:
        judges = repo.judges_in_window(session, candidate.window)
        chosen = choose_judge(judges, candidate.judge, candidate.prompt_version)
        if chosen is not None:
            first = _load(session, baseline, chosen=chosen, with_queries=True)
    second = _load(session, candidate, chosen=chosen, with_queries=True)
    return compare(
        SideData(labels[0], first.traffic, first.gold),
        SideData(labels[1], second.traffic, second.gold),
        alpha=baseline.alpha,
        cutoffs=baseline.cutoffs,
        reps=baseline.reps,
        seed=baseline.seed,
    )
