"""What one scored event adds to the shared aggregates: written by the worker that scored it,
and recomputed from the database when the aggregates must be rebuilt."""

from __future__ import annotations

from dataclasses import dataclass

from service.aggregates import Delta
from service.metrics import MEASURE_BUCKETS
from service.models import JudgeRun, Score

# Measures present even when the judge's labels are missing (they do not come from those labels).
_NOT_FROM_LABELS = {"context_relevance", "recall", "f", "ndcg_gold"}


@dataclass(frozen=True)
class ExportLabels:
    app: str
    retriever: str
    environment: str
    judge: str
    prompt_version: str
    judged_passages: int


def done_key(event_pk: int, judge: str, prompt_version: str) -> str:
    """The marker that makes an event's export happen once, whoever does it."""
    return f"{event_pk}:{judge}:{prompt_version}"


def score_delta(who: ExportLabels, score: Score, run: JudgeRun | None) -> Delta:
    labels = {
        "app": who.app,
        "retriever": who.retriever,
        "environment": who.environment,
        "judge": who.judge,
        "prompt_version": who.prompt_version,
    }
    delta = Delta()
    delta.inc("events_judged", labels)
    any_measure = False
    for measure in MEASURE_BUCKETS:
        value = getattr(score, measure)
        if value is not None:
            delta.observe(f"measure_{measure}", labels, float(value))
            any_measure = any_measure or measure not in _NOT_FROM_LABELS
    if not any_measure:
        delta.inc("events_missing_measures", labels)
    if run is None:
        return delta
    judge = {"judge": who.judge}
    delta.inc("judge_labels", judge, who.judged_passages - run.missing_labels)
    if run.missing_labels:
        delta.inc("judge_labels_missing", judge, run.missing_labels)
    if run.cache_hits:
        delta.inc("judge_cache_hits", judge, run.cache_hits)
    ok_calls = run.calls - run.malformed_replies
    if ok_calls > 0:
        delta.inc("judge_calls", {**judge, "outcome": "ok"}, ok_calls)
    if run.malformed_replies:
        delta.inc("judge_calls", {**judge, "outcome": "malformed"}, run.malformed_replies)
    if run.prompt_tokens:
        delta.inc("judge_tokens", {**judge, "kind": "prompt"}, run.prompt_tokens)
    if run.completion_tokens:
        delta.inc("judge_tokens", {**judge, "kind": "completion"}, run.completion_tokens)
    return delta
