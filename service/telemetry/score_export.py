"""What one scored event adds to the shared aggregates: written by the worker that scored it,
and recomputed from the database when the aggregates must be rebuilt."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.measures.catalogue import MEASURES
from service.telemetry.aggregates import Delta


@dataclass(frozen=True)
class ExportLabels:
    tenant: str
    app: str
    retriever: str
    environment: str
    judge: str
    prompt_version: str
    judged_passages: int


def done_key(event_pk: int, judge: str, prompt_version: str) -> str:
    """The marker that makes an event's export happen once, whoever does it."""
    return f"{event_pk}:{judge}:{prompt_version}"


def score_delta(
    who: ExportLabels, score: Mapping[str, Any], run: Mapping[str, Any] | None
) -> Delta:
    """``score`` and ``run`` are the column values of the scores and judge_runs rows."""
    labels = {
        "tenant": who.tenant,
        "app": who.app,
        "retriever": who.retriever,
        "environment": who.environment,
        "judge": who.judge,
        "prompt_version": who.prompt_version,
    }
    delta = Delta()
    delta.inc("events_judged", labels)
    any_measure = False
    for measure in MEASURES:
        value = score[measure.name]
        if value is not None:
            delta.observe(f"measure_{measure.name}", labels, float(value))
            # Context relevance and the gold measures exist even when the judge's labels are
            # missing; only a measure from those labels says the event was scored.
            any_measure = any_measure or measure.from_judge_labels
    if not any_measure:
        delta.inc("events_missing_measures", labels)
    if run is None:
        return delta
    judge = {"judge": who.judge}
    missing, malformed = run["missing_labels"], run["malformed_replies"]
    delta.inc("judge_labels", judge, who.judged_passages - missing)
    if missing:
        delta.inc("judge_labels_missing", judge, missing)
    if run["cache_hits"]:
        delta.inc("judge_cache_hits", judge, run["cache_hits"])
    ok_calls = run["calls"] - malformed
    if ok_calls > 0:
        delta.inc("judge_calls", {**judge, "outcome": "ok"}, ok_calls)
    if malformed:
        delta.inc("judge_calls", {**judge, "outcome": "malformed"}, malformed)
    if run["prompt_tokens"]:
        delta.inc("judge_tokens", {**judge, "kind": "prompt"}, run["prompt_tokens"])
    if run["completion_tokens"]:
        delta.inc("judge_tokens", {**judge, "kind": "completion"}, run["completion_tokens"])
    return delta
