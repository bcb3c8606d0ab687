"""Prometheus recording and alert rules, rendered from the monitoring configuration.

Recorded names follow ``level:metric:operations``. The level says which labels survive:
``app_retriever`` keeps app, retriever, environment, judge and prompt_version (a judge or prompt
change starts new series instead of moving old ones); ``judge`` keeps the judge; ``job`` keeps only
target labels.
Every level drops the replica labels with ``max``: each replica exports the same global totals.
The operation names the window's role (``mean_short``), not its length, so dashboards survive a
change of window in the configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deploy.config import MonitoringConfig, seconds
from service.measures.catalogue import BY_NAME, MEASURE_NAMES

NS = "retrieval_monitor"
ROLES = ("short", "long")
BASELINE = "baseline"

TENANT = "{{ $labels.tenant }}"
APP = "{{ $labels.app }}"
RETRIEVER = "{{ $labels.retriever }}"
ENVIRONMENT = "{{ $labels.environment }}"
JUDGE = "{{ $labels.judge }}"
PROMPT = "{{ $labels.prompt_version }}"
VALUE = "{{ $value | humanize }}"
# Measures and kappa are small numbers; humanize would print 0.125 as "125m".
SCORE = '{{ $value | printf "%.3f" }}'
PERCENT = "{{ $value | humanizePercentage }}"


# --- recorded series: the names dashboards and alerts read -------------------------------------
def measure_mean(measure: str, role: str) -> str:
    return f"app_retriever:{NS}_measure_{measure}:mean_{role}"


def measure_count_increase(measure: str, role: str) -> str:
    return f"app_retriever:{NS}_measure_{measure}_count:increase_{role}"


def judged_rate(role: str) -> str:
    return f"app_retriever:{NS}_events_judged:rate_{role}"


NARROW_REGIME_RATIO = f"app_retriever:{NS}_measure_k_over_np_est_narrow:ratio_short"
JUDGE_OUTCOME_RATE = f"judge_outcome:{NS}_judge_attempts:rate_short"
JUDGE_ATTEMPT_RATE = f"judge:{NS}_judge_attempts:rate_short"
JUDGE_ERROR_RATIO = f"judge:{NS}_judge_errors:ratio_short"
JUDGE_CACHE_HIT_RATIO = f"judge:{NS}_judge_cache_hits:ratio_short"
ACCEPTED_RATE = f"job:{NS}_events_accepted:rate_short"
REJECTED_RATE = f"job:{NS}_events_rejected:rate_short"
RECEIVED_RATE = f"job:{NS}_events_received:rate_short"
REJECTED_RATIO = f"job:{NS}_events_rejected:ratio_short"
HTTP_RESPONSE_RATE = f"job:{NS}_http_responses:rate_short"
HTTP_SERVER_ERROR_RATIO = f"job:{NS}_http_server_errors:ratio_short"


TOP_SCORE_MEAN = f"app_retriever:{NS}_signal_top_score:mean_short"
TOP_SCORE_BASELINE = f"app_retriever:{NS}_signal_top_score:mean_baseline"
TOP_SCORE_COUNT = f"app_retriever:{NS}_signal_top_score:increase_short"
TOP_SCORE_COUNT_BASELINE = f"app_retriever:{NS}_signal_top_score:increase_baseline"
EMPTY_RATIO = f"app_retriever:{NS}_signal_empty_retrievals:ratio_short"
EMPTY_RATIO_BASELINE = f"app_retriever:{NS}_signal_empty_retrievals:ratio_baseline"
ACCEPTED_INCREASE = f"app_retriever:{NS}_events_accepted:increase_short"
SAMPLED_RATIO = f"app_retriever:{NS}_events_sampled:ratio_short"


def judge_token_rate(role: str) -> str:
    return f"judge:{NS}_judge_tokens:rate_{role}"


# K <= N^_p: the paper's narrow regime, where T tracks answer quality better than nDCG.
NARROW_REGIME_BOUND = "1.0"


@dataclass(frozen=True)
class Promql:
    """Expression pieces that carry the configured selector and replica labels."""

    config: MonitoringConfig

    def select(self, metric: str, *matchers: str) -> str:
        return f"{metric}{{{', '.join([self.config.selector, *matchers])}}}"

    def across_replicas(self, expr: str) -> str:
        return f"max without({', '.join(self.config.replica_labels)}) ({expr})"

    def rate(self, metric: str, window: str, *matchers: str, offset: str = "") -> str:
        shift = f" offset {offset}" if offset else ""
        return self.across_replicas(f"rate({self.select(metric, *matchers)}[{window}]{shift})")

    def delta(self, metric: str, window: str, *matchers: str, offset: str = "") -> str:
        shift = f" offset {offset}" if offset else ""
        return self.across_replicas(f"delta({self.select(metric, *matchers)}[{window}]{shift})")

    def increase(self, metric: str, window: str, *matchers: str, offset: str = "") -> str:
        shift = f" offset {offset}" if offset else ""
        return self.across_replicas(f"increase({self.select(metric, *matchers)}[{window}]{shift})")

    def window(self, role: str) -> str:
        window: str = getattr(self.config.windows, role)
        return window


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _record(name: str, expr: str) -> dict[str, Any]:
    return {"record": name, "expr": expr}


def _mean(q: Promql, measure: str, window: str, offset: str = "") -> str:
    metric = f"{NS}_measure_{measure}"
    if BY_NAME[measure].signed:
        # rate() reads every decrease as a counter reset, and the _sum of a measure that goes
        # negative decreases. delta() takes the sum as it is; a real reset makes the count's
        # delta negative, and "> 0" then drops the windows that straddle it.
        total = q.delta(f"{metric}_sum", window, offset=offset)
        count = q.delta(f"{metric}_count", window, offset=offset)
    else:
        total = q.rate(f"{metric}_sum", window, offset=offset)
        count = q.rate(f"{metric}_count", window, offset=offset)
    # No scored event in the window: no value, rather than 0/0.
    return f"{total}\n/\n({count} > 0)"


def _narrow_regime_ratio(q: Promql, window: str) -> str:
    bound = f'le="{NARROW_REGIME_BOUND}"'
    narrow = q.rate(f"{NS}_measure_k_over_np_est_bucket", window, bound)
    scored = q.rate(f"{NS}_measure_k_over_np_est_count", window)
    return f"{narrow}\n/ ignoring(le)\n({scored} > 0)"


def measure_rules(q: Promql) -> list[dict[str, Any]]:
    collapse = q.config.alerts.quality_collapse
    short = q.window("short")
    rules = [
        _record(measure_mean(measure, role), _mean(q, measure, q.window(role)))
        for measure in MEASURE_NAMES
        for role in ROLES
    ]
    lead = collapse.measure
    lead_count = f"{NS}_measure_{lead}_count"
    rules += [
        _record(measure_mean(lead, BASELINE), _mean(q, lead, short, collapse.baseline_offset)),
        _record(measure_count_increase(lead, "short"), q.increase(lead_count, short)),
        _record(
            measure_count_increase(lead, BASELINE),
            q.increase(lead_count, short, offset=collapse.baseline_offset),
        ),
        _record(NARROW_REGIME_RATIO, _narrow_regime_ratio(q, short)),
    ]
    rules += [
        _record(judged_rate(role), q.rate(f"{NS}_events_judged_total", q.window(role)))
        for role in ROLES
    ]
    return rules


def judge_rules(q: Promql) -> list[dict[str, Any]]:
    short = q.window("short")
    calls = q.rate(f"{NS}_judge_calls_total", short)
    failures = q.rate(f"{NS}_judge_failures_total", short)
    labels = q.rate(f"{NS}_judge_labels_total", short)
    hits = q.rate(f"{NS}_judge_cache_hits_total", short)
    return [
        # Calls by outcome plus failed attempts as one more outcome: a judge that fails every
        # call (429, 5xx, timeouts) records no call outcome at all, and must still count.
        _record(
            JUDGE_OUTCOME_RATE,
            f'{calls}\nor\nsum without(reason) (label_replace({failures}, "outcome", "failed", '
            f'"", ""))',
        ),
        _record(JUDGE_ATTEMPT_RATE, f"sum without(outcome) ({JUDGE_OUTCOME_RATE})"),
        _record(
            JUDGE_ERROR_RATIO,
            f'(sum without(outcome) ({JUDGE_OUTCOME_RATE}{{outcome!="ok"}}) '
            f"or {JUDGE_ATTEMPT_RATE} * 0)\n/\n({JUDGE_ATTEMPT_RATE} > 0)",
        ),
        *(
            _record(
                judge_token_rate(role),
                f"sum without(kind) ({q.rate(f'{NS}_judge_tokens_total', q.window(role))})",
            )
            for role in ROLES
        ),
        _record(JUDGE_CACHE_HIT_RATIO, f"({hits} or {labels} * 0)\n/\n({labels} > 0)"),
    ]


def ingest_rules(q: Promql) -> list[dict[str, Any]]:
    short = q.window("short")
    routes = f'route=~"{q.config.alerts.ingest_server_errors.routes}"'
    accepted = q.rate(f"{NS}_events_accepted_total", short)
    rejected = q.rate(f"{NS}_events_rejected_total", short)
    responses = q.rate(f"{NS}_http_responses_total", short, routes)
    errors = q.rate(f"{NS}_http_responses_total", short, routes, 'status_class="5xx"')
    # "x or y * 0": a family that has never been incremented has no series; count it as 0.
    rejected_or_zero = f"({REJECTED_RATE} or {ACCEPTED_RATE} * 0)"
    accepted_or_zero = f"({ACCEPTED_RATE} or {REJECTED_RATE} * 0)"
    return [
        _record(ACCEPTED_RATE, f"sum without(app, retriever, environment) ({accepted})"),
        _record(REJECTED_RATE, f"sum without(reason) ({rejected})"),
        _record(RECEIVED_RATE, f"{rejected_or_zero}\n+\n{accepted_or_zero}"),
        _record(REJECTED_RATIO, f"{rejected_or_zero}\n/\n({RECEIVED_RATE} > 0)"),
        _record(HTTP_RESPONSE_RATE, f"sum without(route, status_class) ({responses})"),
        _record(
            HTTP_SERVER_ERROR_RATIO,
            f"(sum without(route, status_class) ({errors}) or {HTTP_RESPONSE_RATE} * 0)"
            f"\n/\n({HTTP_RESPONSE_RATE} > 0)",
        ),
    ]


def signal_rules(q: Promql) -> list[dict[str, Any]]:
    """The judge-free signals, per app, retriever and environment (recorded in the ingest group,
    since they are computed at ingest)."""
    a = q.config.alerts
    short = q.window("short")
    shift, empty = a.retriever_score_shift, a.empty_retrievals
    top = f"{NS}_signal_top_score"

    def mean(offset: str = "") -> str:
        total = q.rate(f"{top}_sum", short, offset=offset)
        return f"{total}\n/\n({q.rate(f'{top}_count', short, offset=offset)} > 0)"

    def empty_ratio(offset: str = "") -> str:
        accepted = q.rate(f"{NS}_events_accepted_total", short, offset=offset)
        empties = q.rate(f"{NS}_signal_empty_retrievals_total", short, offset=offset)
        return f"({empties} or {accepted} * 0)\n/\n({accepted} > 0)"

    sampled = q.rate(f"{NS}_events_sampled_total", short)
    accepted = q.rate(f"{NS}_events_accepted_total", short)
    return [
        _record(TOP_SCORE_MEAN, mean()),
        _record(TOP_SCORE_BASELINE, mean(shift.baseline_offset)),
        _record(TOP_SCORE_COUNT, q.increase(f"{top}_count", short)),
        _record(
            TOP_SCORE_COUNT_BASELINE,
            q.increase(f"{top}_count", short, offset=shift.baseline_offset),
        ),
        _record(EMPTY_RATIO, empty_ratio()),
        _record(EMPTY_RATIO_BASELINE, empty_ratio(empty.baseline_offset)),
        _record(ACCEPTED_INCREASE, q.increase(f"{NS}_events_accepted_total", short)),
        # The share of traffic a judged figure rests on (gold and sampled events).
        _record(
            SAMPLED_RATIO,
            f"(sum without(reason) ({sampled}) or {accepted} * 0)\n/\n({accepted} > 0)",
        ),
    ]


def signal_alerts(q: Promql) -> list[dict[str, Any]]:
    a = q.config.alerts
    short = q.window("short")
    shift, empty = a.retriever_score_shift, a.empty_retrievals
    where = f'{APP} / {RETRIEVER} (tenant {TENANT}, environment "{ENVIRONMENT}")'
    return [
        _alert(
            q,
            "RetrievalMonitorRetrieverScoreShift",
            f"{TOP_SCORE_MEAN}\n"
            f"and abs({TOP_SCORE_MEAN} - {TOP_SCORE_BASELINE})\n"
            f"  > {_number(shift.max_relative_change)} * abs({TOP_SCORE_BASELINE})\n"
            f"and {TOP_SCORE_COUNT} >= {shift.min_events}\n"
            f"and {TOP_SCORE_COUNT_BASELINE} >= {shift.min_events}",
            shift.for_,
            shift.severity,
            f"The retriever's scores moved for {APP} / {RETRIEVER}",
            f"The mean score the retriever gives its first passage over the last {short} is "
            f"{SCORE} for {where}, more than "
            f"{_number(round(shift.max_relative_change * 100, 2))}% away from the same window "
            f"{shift.baseline_offset} earlier (at least {shift.min_events} events in both).",
        ),
        _alert(
            q,
            "RetrievalMonitorEmptyRetrievalsJump",
            f"{EMPTY_RATIO} > {_number(empty.max_ratio)}\n"
            f"and {EMPTY_RATIO} > {_number(empty.min_factor_over_baseline)} * "
            f"{EMPTY_RATIO_BASELINE}\n"
            f"and {ACCEPTED_INCREASE} >= {empty.min_events}",
            empty.for_,
            empty.severity,
            f"Many empty retrievals for {APP} / {RETRIEVER}",
            f"{PERCENT} of the events over the last {short} had no passage in the top k for "
            f"{where}: over {_number(empty.max_ratio * 100)}% and "
            f"{_number(empty.min_factor_over_baseline)} times the share "
            f"{empty.baseline_offset} earlier.",
        ),
    ]


def _alert(
    q: Promql,
    name: str,
    expr: str,
    settings_for: str,
    severity: str,
    summary: str,
    description: str,
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": settings_for,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{q.config.runbook_url}#{name.lower()}",
        },
    }


def alert_rules(q: Promql) -> list[dict[str, Any]]:
    a = q.config.alerts
    short = q.window("short")
    short_seconds = _number(seconds(short))
    collapse = a.quality_collapse
    lead = collapse.measure
    stalled = a.judging_stalled
    grow = a.queue_growing
    drift = a.judge_drift
    kappa = q.across_replicas(q.select(f"{NS}_judge_gold_kappa"))
    kappa_before = q.across_replicas(
        f"{q.select(f'{NS}_judge_gold_kappa')} offset {drift.baseline_offset}"
    )
    gold_passages = q.across_replicas(q.select(f"{NS}_judge_gold_passages"))
    depth = q.select(f"{NS}_queue_depth")
    overflow = q.select(f"{NS}_label_sets_overflow_total")
    overflowed = q.across_replicas(f"increase({overflow}[{short}])")
    where = (
        f'{APP} / {RETRIEVER} (tenant {TENANT}, environment "{ENVIRONMENT}", '
        f"judge {JUDGE} {PROMPT})"
    )
    return [
        _alert(
            q,
            "RetrievalMonitorQualityCollapse",
            f"(\n  {measure_mean(lead, 'short')}\n"
            f"  < {_number(collapse.min_ratio_to_baseline)} * {measure_mean(lead, BASELINE)}\n)\n"
            f"and {measure_count_increase(lead, 'short')} >= {collapse.min_events}\n"
            f"and {measure_count_increase(lead, BASELINE)} >= {collapse.min_events}",
            collapse.for_,
            collapse.severity,
            f"Retrieval quality collapsed for {APP} / {RETRIEVER}",
            f"Mean {lead} over the last {short} is {SCORE} for {where}, below "
            f"{_number(round(collapse.min_ratio_to_baseline * 100, 2))}% of the same window "
            f"{collapse.baseline_offset} earlier (at least {collapse.min_events} scored events in "
            f"both windows).",
        ),
        _alert(
            q,
            "RetrievalMonitorJudgingStalled",
            # The judge pipeline is shared by every tenant: stalled for one is stalled for all.
            "(\n  sum without(tenant, app, retriever, environment) "
            f"({q.increase(f'{NS}_events_accepted_total', stalled.window)}) > 0\n)\n"
            "and (\n  sum without(tenant) "
            f"({q.across_replicas(q.select(f'{NS}_events_pending'))}) > 0\n)\n"
            "unless (\n  sum without(tenant, app, retriever, environment, judge, prompt_version) "
            f"({q.increase(f'{NS}_events_judged_total', stalled.window)}) > 0\n)",
            stalled.for_,
            stalled.severity,
            "Events arrive but none is judged",
            f"{VALUE} events were accepted in the last {stalled.window} and events are waiting, "
            f"but no event was judged in that time (job {{{{ $labels.job }}}}).",
        ),
        _alert(
            q,
            "RetrievalMonitorMetricsAbsent",
            f"absent({q.select(f'{NS}_events_pending')})",
            a.metrics_absent.for_,
            a.metrics_absent.severity,
            "retrieval-monitor metrics are absent",
            f"No {NS}_events_pending series matches {q.config.selector}: the service is down or "
            "not scraped, and every other retrieval-monitor alert is blind.",
        ),
        _alert(
            q,
            "RetrievalMonitorBacklogTooOld",
            f"{q.across_replicas(q.select(f'{NS}_oldest_pending_event_age_seconds'))} "
            f"> {_number(seconds(a.backlog_age.max_age))}",
            a.backlog_age.for_,
            a.backlog_age.severity,
            f"Events of tenant {TENANT} wait too long to be judged",
            f"The oldest event of tenant {TENANT} not yet judged was received "
            "{{ $value | humanizeDuration }} ago "
            f"(bound {a.backlog_age.max_age}). One tenant alone: its budget may be spent "
            "(judge_budget_remaining); every tenant: the judge or the workers.",
        ),
        _alert(
            q,
            "RetrievalMonitorQueueGrowing",
            f"{q.across_replicas(f'deriv({depth}[{grow.window}])')} * 60 > 0\n"
            f"and {q.across_replicas(depth)} > {grow.min_depth}",
            grow.for_,
            grow.severity,
            "The judge queue keeps growing",
            "Queue {{ $labels.queue }} has grown over the last "
            f"{grow.window} (by {VALUE} tasks a minute) and holds more than "
            f"{grow.min_depth} tasks.",
        ),
        _alert(
            q,
            "RetrievalMonitorJudgeErrorsHigh",
            f"{JUDGE_ERROR_RATIO} > {_number(a.judge_errors.max_ratio)}\n"
            f"and {JUDGE_ATTEMPT_RATE} * {short_seconds} >= {a.judge_errors.min_attempts}",
            a.judge_errors.for_,
            a.judge_errors.severity,
            f"Judge {JUDGE} fails or replies malformed too often",
            f"{PERCENT} of the judge's call outcomes over the last {short} were malformed replies "
            f"or failed calls (bound {_number(a.judge_errors.max_ratio * 100)}%).",
        ),
        _alert(
            q,
            "RetrievalMonitorJudgeSpendOverBudget",
            f"sum without(judge) ({judge_token_rate('short')}) * 3600 "
            f"> {a.judge_spend.budget_tokens_per_hour}",
            a.judge_spend.for_,
            a.judge_spend.severity,
            "Judge token spend is over budget",
            f"The judges consume {VALUE} tokens per hour (rate over the last {short}), over the "
            f"budget of {a.judge_spend.budget_tokens_per_hour}.",
        ),
        _alert(
            q,
            "RetrievalMonitorIngestRejectionsHigh",
            f"{REJECTED_RATIO} > {_number(a.ingest_rejections.max_ratio)}\n"
            f"and {RECEIVED_RATE} * {short_seconds} >= {a.ingest_rejections.min_events}",
            a.ingest_rejections.for_,
            a.ingest_rejections.severity,
            f"Many events of tenant {TENANT} are rejected at ingest",
            f"{PERCENT} of the events tenant {TENANT} sent over the last {short} were rejected "
            f"(bound {_number(a.ingest_rejections.max_ratio * 100)}%).",
        ),
        _alert(
            q,
            "RetrievalMonitorIngestServerErrors",
            f"{HTTP_SERVER_ERROR_RATIO} > {_number(a.ingest_server_errors.max_ratio)}\n"
            f"and {HTTP_RESPONSE_RATE} * {short_seconds} >= {a.ingest_server_errors.min_responses}",
            a.ingest_server_errors.for_,
            a.ingest_server_errors.severity,
            "The ingest API answers with server errors",
            f"{PERCENT} of the answers on the ingest routes over the last {short} were 5xx "
            f"(bound {_number(a.ingest_server_errors.max_ratio * 100)}%).",
        ),
        _alert(
            q,
            "RetrievalMonitorJudgeDrift",
            f"(\n  {kappa} < {_number(drift.min_kappa)}\n  or\n"
            f"  {kappa} < {kappa_before} - {_number(drift.max_drop)}\n)\n"
            f"and {gold_passages} >= {drift.min_gold_passages}",
            drift.for_,
            drift.severity,
            f"Judge {JUDGE} {PROMPT} agrees less with the gold labels of tenant {TENANT}",
            f"Cohen's kappa of judge {JUDGE} (prompt {PROMPT}) against the gold labels of "
            f"tenant {TENANT} is {SCORE}: "
            f"below {_number(drift.min_kappa)} or more than {_number(drift.max_drop)} under its "
            f"value {drift.baseline_offset} earlier. Retrieval measures judged by it are suspect.",
        ),
        _alert(
            q,
            "RetrievalMonitorLabelSetsOverflow",
            f"{overflowed} > 0",
            a.label_sets_overflow.for_,
            a.label_sets_overflow.severity,
            f"Tenant {TENANT} sends more label sets than the cap",
            f"{VALUE} events of tenant {TENANT} over the last {short} carried an (app, retriever, "
            "environment) past the label-set cap; they are stored and judged, but exported "
            "under __overflow__, so their own series do not move.",
        ),
    ]


def render(config: MonitoringConfig) -> dict[str, Any]:
    """The rule file as a dict ready for YAML."""
    q = Promql(config)
    return {
        "groups": [
            {"name": "retrieval-monitor-measures", "rules": measure_rules(q)},
            {"name": "retrieval-monitor-judge", "rules": judge_rules(q)},
            {"name": "retrieval-monitor-ingest", "rules": [*ingest_rules(q), *signal_rules(q)]},
            {"name": "retrieval-monitor-alerts", "rules": [*alert_rules(q), *signal_alerts(q)]},
        ]
    }
