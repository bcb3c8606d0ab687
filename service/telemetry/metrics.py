"""Every exported metric, defined once.

Names follow ``retrieval_monitor_<subsystem>_<name>_<unit>``; counters end in ``_total``. The values
live in Redis (see ``service.telemetry.aggregates``) so that every API process and replica
reports the same global numbers: dashboards and rules aggregate across instances with ``max``, never
``sum``.

Families (labels in brackets; "event labels" are tenant, app, retriever, environment, bounded by
the label-set cap of ``service.telemetry.cardinality``; the judge's own families describe the
shared judge and carry no tenant):
- retrieval_monitor_measure_<measure> histogram [event labels, judge, prompt_version]
  for every measure of the catalogue (``service.measures.catalogue``), with its buckets
- retrieval_monitor_events_accepted_total [event labels]
- retrieval_monitor_events_duplicate_total [event labels]
- retrieval_monitor_events_rejected_total [tenant, reason]
- retrieval_monitor_label_sets_overflow_total [tenant]: accepted events exported under the
  __overflow__ label set
- retrieval_monitor_events_judged_total [event labels, judge, prompt_version]
- retrieval_monitor_events_failed_total [event labels, judge, prompt_version]
- retrieval_monitor_events_missing_measures_total [event labels, judge,
  prompt_version]: judged events whose top-k had a missing label, so no measure was computed
- retrieval_monitor_feedback_total [event labels]
- retrieval_monitor_http_responses_total [route, status_class]
- retrieval_monitor_judge_calls_total [judge, outcome]  (outcome: ok, malformed, error)
- retrieval_monitor_judge_tokens_total [judge, kind]  (kind: prompt, completion)
- retrieval_monitor_judge_failures_total [judge, reason]
- retrieval_monitor_judge_labels_missing_total [judge]
- retrieval_monitor_judge_labels_total [judge]
- retrieval_monitor_judge_cache_hits_total [judge]
- retrieval_monitor_judge_cache_lookups_total [tenant, judge, cache, result]  (cache: label,
  context, vector; result: hit, miss): what the label cache, the context ratings it holds and
  the local judge's shared passage vectors answered (``judged_export``)
- retrieval_monitor_judge_calls_saved_total [tenant, judge],
  retrieval_monitor_judge_tokens_saved_total [tenant, judge]: judge calls and (estimated)
  prompt tokens the label cache saved; beside judge_app_calls and judge_app_tokens they give
  the share saved
- retrieval_monitor_judge_output_mode_total [judge, mode]: answered judge calls by how the reply
  was constrained (json_schema, json_object_schema, json_object, text); the mode in use is the one
  that grows
- retrieval_monitor_judge_latency_seconds histogram [judge]
- retrieval_monitor_pipeline_lag_seconds histogram [tenant, app]: from receipt to the measures'
  export
- retrieval_monitor_events_sampled_total [event labels, reason]  (reason: gold,
  sampled): events chosen for judging; divided by events_accepted it is the sampled share
- retrieval_monitor_events_skipped_total [event labels, reason]  (reason:
  unsampled, budget, shed): events that will not be judged, and why
- retrieval_monitor_events_deferred_total [event labels, reason]  (reason: budget):
  judge attempts put off until a budget window resets
- retrieval_monitor_judge_app_calls_total [tenant, app, judge],
  retrieval_monitor_judge_app_tokens_total [tenant, app, judge, kind],
  retrieval_monitor_judge_cost_dollars_total [tenant, app, judge]: spend per app
  (dollars from the price table in settings)
- retrieval_monitor_signal_{empty,short}_retrievals_total [event labels]
- retrieval_monitor_signal_{top_score,score_gap,duplicate_ratio,passage_length_characters}
  histograms [event labels]: judge-free signals of every accepted event
- retrieval_monitor_queue_depth gauge [queue]
- retrieval_monitor_oldest_pending_event_age_seconds gauge [tenant]
- retrieval_monitor_events_pending gauge [tenant]: every tenant with an active key, and the
  default tenant, have a series (0 when nothing waits)
- retrieval_monitor_judge_budget_remaining gauge [tenant, app, window]  (window: tokens_per_hour,
  tokens_per_day, dollars_per_hour, dollars_per_day): only windows with a cap
- retrieval_monitor_judge_gold_{kappa,precision,recall,passages} gauges [tenant, judge,
  prompt_version]: the judge's agreement with each tenant's gold labels over the last day
  (service.analysis.gauges)

Families without a tenant describe machinery every tenant shares (``SHARED_FAMILIES`` says why,
for each); every other family carries the tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from service.measures.catalogue import MEASURES, UNIT_BUCKETS

NAMESPACE = "retrieval_monitor"

# Every series of a tenant's events carries the tenant (from its API key; "default" without keys),
# so no tenant's events can move another's series, whatever app names they use.
MeasureLabels = ("tenant", "app", "retriever", "environment", "judge", "prompt_version")
EventLabels = ("tenant", "app", "retriever", "environment")

# One histogram per measure of the catalogue, with the catalogue's buckets.
MEASURE_BUCKETS: dict[str, tuple[float, ...]] = {m.name: m.buckets for m in MEASURES}

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LAG_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

SCORE_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)
GAP_BUCKETS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
LENGTH_BUCKETS = (50.0, 100.0, 200.0, 400.0, 800.0, 1600.0, 3200.0, 6400.0, 12800.0)

Kind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class Family:
    name: str  # without the namespace and, for counters, without _total
    kind: Kind
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @property
    def full_name(self) -> str:
        return f"{NAMESPACE}_{self.name}"


def _counter(name: str, help_text: str, labels: tuple[str, ...]) -> Family:
    return Family(name, "counter", help_text, labels)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        *(
            Family(
                f"measure_{measure}",
                "histogram",
                f"Per-event {measure} of the judged top-k passages.",
                MeasureLabels,
                buckets,
            )
            for measure, buckets in MEASURE_BUCKETS.items()
        ),
        _counter("events_accepted", "Events accepted and committed.", EventLabels),
        _counter("events_duplicate", "Events sent again with a known event_id.", EventLabels),
        _counter(
            "events_rejected",
            "Events refused at ingest, by reason (only callers already identified).",
            ("tenant", "reason"),
        ),
        _counter(
            "label_sets_overflow",
            "Accepted events exported under the __overflow__ label set (past a label-set cap).",
            ("tenant",),
        ),
        _counter("events_judged", "Events judged and scored.", MeasureLabels),
        _counter("events_failed", "Events whose judging failed for good.", MeasureLabels),
        _counter(
            "events_missing_measures",
            "Judged events with a missing label in the top k (their measures are missing).",
            MeasureLabels,
        ),
        _counter("feedback", "Feedback (response grades, correctness) received.", EventLabels),
        _counter(
            "http_responses",
            "HTTP answers by route template and status class (2xx..5xx).",
            ("route", "status_class"),
        ),
        _counter("judge_calls", "Calls to the judge, by outcome.", ("judge", "outcome")),
        _counter("judge_tokens", "Tokens the judge consumed, by kind.", ("judge", "kind")),
        _counter("judge_failures", "Judge failures, by reason.", ("judge", "reason")),
        _counter("judge_labels", "Passage labels the judge produced.", ("judge",)),
        _counter("judge_labels_missing", "Passage labels missing after retries.", ("judge",)),
        _counter("judge_cache_hits", "Passage labels served from the label cache.", ("judge",)),
        _counter(
            "judge_cache_lookups",
            "Judge cache look-ups by cache (label, context, vector) and result (hit, miss).",
            ("tenant", "judge", "cache", "result"),
        ),
        _counter(
            "judge_calls_saved",
            "Judge calls the label cache made unnecessary.",
            ("tenant", "judge"),
        ),
        _counter(
            "judge_tokens_saved",
            "Judge prompt tokens the label cache made unnecessary (estimated).",
            ("tenant", "judge"),
        ),
        _counter(
            "judge_output_mode",
            "Answered judge calls by output mode (json_schema, json_object_schema, json_object, "
            "text).",
            ("judge", "mode"),
        ),
        _counter(
            "events_sampled", "Events chosen for judging, by reason.", (*EventLabels, "reason")
        ),
        _counter(
            "events_skipped", "Events that will not be judged, by reason.", (*EventLabels, "reason")
        ),
        _counter(
            "events_deferred",
            "Judge attempts put off until a budget window resets.",
            (*EventLabels, "reason"),
        ),
        _counter("judge_app_calls", "Judge calls per app.", ("tenant", "app", "judge")),
        _counter(
            "judge_app_tokens", "Judge tokens per app, by kind.", ("tenant", "app", "judge", "kind")
        ),
        _counter(
            "judge_cost_dollars", "Judge spend per app, in dollars.", ("tenant", "app", "judge")
        ),
        _counter("signal_empty_retrievals", "Events with no passage in the top k.", EventLabels),
        _counter(
            "signal_short_retrievals",
            "Events with fewer top-k passages than the short-retrieval bound.",
            EventLabels,
        ),
        Family(
            "signal_top_score",
            "histogram",
            "The retriever's own score of its first passage.",
            EventLabels,
            SCORE_BUCKETS,
        ),
        Family(
            "signal_score_gap",
            "histogram",
            "The retriever's score of the first passage minus that of the k-th.",
            EventLabels,
            GAP_BUCKETS,
        ),
        Family(
            "signal_duplicate_ratio",
            "histogram",
            "Share of top-k passages that nearly repeat a higher-ranked one.",
            EventLabels,
            UNIT_BUCKETS,
        ),
        Family(
            "signal_passage_length_characters",
            "histogram",
            "Length of each top-k passage.",
            EventLabels,
            LENGTH_BUCKETS,
        ),
        Family(
            "judge_latency_seconds",
            "histogram",
            "Wall time of one judge call.",
            ("judge",),
            LATENCY_BUCKETS,
        ),
        Family(
            "pipeline_lag_seconds",
            "histogram",
            "Time from an event's receipt to its measures being exported.",
            ("tenant", "app"),
            LAG_BUCKETS,
        ),
    ]
}

QUEUE_DEPTH = Family("queue_depth", "gauge", "Judge tasks waiting in the queue.", ("queue",))
OLDEST_PENDING_AGE = Family(
    "oldest_pending_event_age_seconds",
    "gauge",
    "Age of the tenant's oldest event not yet judged (0 when none waits).",
    ("tenant",),
)
BUDGET_REMAINING = Family(
    "judge_budget_remaining",
    "gauge",
    "What is left of a tenant's app's judge budget in the current window (tokens or dollars).",
    ("tenant", "app", "window"),
)
EVENTS_PENDING = Family(
    "events_pending", "gauge", "The tenant's events accepted and not yet judged.", ("tenant",)
)


# The families without a tenant label, each with the reason: they describe machinery every tenant
# shares, where a per-tenant split would either be unknown or say nothing about the tenant.
SHARED_FAMILIES: dict[str, str] = {
    "http_responses": "HTTP answers are counted before the caller is known (a 401 or a 413 has "
    "no tenant); the figure is the API's health",
    **{
        name: "the judge endpoint is one for every tenant: its calls, failures, latency and "
        "output mode are its health; each tenant's share of the spend is in judge_app_*"
        for name in (
            "judge_calls",
            "judge_tokens",
            "judge_failures",
            "judge_labels",
            "judge_labels_missing",
            "judge_cache_hits",
            "judge_output_mode",
            "judge_latency_seconds",
        )
    },
    "queue_depth": "the Celery queues are shared: a task names an event, not a tenant, and "
    "counting per tenant would mean reading every queued message; the pending events per tenant "
    "come from the database instead (events_pending)",
}
