"""Grafana dashboards (overview, judge, pipeline), built from the same names as the rules.

Panels read the recorded series of ``deploy.rules`` where a window matters (so the dashboards and
the alerts show the same numbers), and raw counters with ``$__rate_interval`` where they only need
a rate. Every panel filters on the configured selector and the dashboard's variables.

The dashboards are assembled with Grafana's typed builders (``grafana-foundation-sdk``), which also
lay the panels out: left to right, a new line when a row of 24 columns is full.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import common as viz
from grafana_foundation_sdk.builders import dashboard as grafana
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import QueryEditorMode

from deploy import rules as r
from deploy.config import MonitoringConfig, seconds
from service.measures.catalogue import BY_NAME, MEASURES

TAG = "retrieval-monitor"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
NS = r.NS

SERIES_LEGEND = "{{app}} / {{retriever}} {{environment}} ({{judge}} {{prompt_version}})"

Bounds = tuple[float | None, float | None]
Item = grafana.Row | Builder[model.Panel]


def _measure_axis(measure: str) -> Bounds:
    """[0, 1] for a measure bounded to it; a free axis for the rest."""
    return (0, 1) if BY_NAME[measure].unit_interval else (None, None)


def _target(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .datasource(DATASOURCE)
        .editor_mode(QueryEditorMode.CODE)
        .expr(expr)
        .legend_format(legend)
        .range()
        .ref_id(ref)
    )


def _thresholds(
    line_at: float | None, below_is_bad: bool | None = False
) -> grafana.ThresholdsConfig:
    """A line at ``line_at``, red on the bad side; ``below_is_bad=None`` marks a boundary only."""
    steps = [model.Threshold(value=None, color="green")]
    if line_at is not None:
        if below_is_bad is None:
            low, high = "blue", "purple"
        else:
            low, high = ("red", "green") if below_is_bad else ("green", "red")
        steps = [model.Threshold(value=None, color=low), model.Threshold(value=line_at, color=high)]
    return grafana.ThresholdsConfig().steps(steps)


def _timeseries(
    title: str,
    description: str,
    targets: Sequence[tuple[str, str]],
    *,
    unit: str = "short",
    bounds: Bounds = (0, None),  # most panels show rates and counts: never below zero
    threshold: float | None = None,
    below_is_bad: bool | None = False,
    width: int = 12,
    height: int = 8,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .targets([_target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(targets)])
        .unit(unit)
        .color_scheme(grafana.FieldColor().mode(model.FieldColorModeId.PALETTE_CLASSIC))
        .thresholds(_thresholds(threshold, below_is_bad))
        .draw_style(common.GraphDrawStyle.LINE)
        .fill_opacity(10)
        .line_interpolation(common.LineInterpolation.LINEAR)
        .line_width(1)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .thresholds_style(
            viz.GraphThresholdsStyleConfig().mode(
                common.GraphThresholdsStyleMode.OFF
                if threshold is None
                else common.GraphThresholdsStyleMode.DASHED
            )
        )
        .legend(
            viz.VizLegendOptions()
            .calcs([])
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            viz.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    low, high = bounds
    if low is not None:
        panel.min(low)
    if high is not None:
        panel.max(high)
    return panel


def _stat(
    title: str,
    description: str,
    expr: str,
    legend: str,
    *,
    unit: str,
    threshold: float,
    below_is_bad: bool,
    width: int = 8,
    height: int = 8,
) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(height)
        .with_target(_target(expr, legend, "A"))
        .unit(unit)
        .color_scheme(grafana.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
        .thresholds(_thresholds(threshold, below_is_bad))
        .reduce_options(viz.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
    )


@dataclass(frozen=True)
class Queries:
    """PromQL fragments with the selector, the replica aggregation and the variables."""

    config: MonitoringConfig

    @property
    def events(self) -> str:
        return (
            f'{{{self.config.selector}, tenant=~"$tenant", environment=~"$environment", '
            f'app=~"$app", retriever=~"$retriever"}}'
        )

    @property
    def judge(self) -> str:
        return f'{{{self.config.selector}, judge=~"$judge"}}'

    @property
    def plain(self) -> str:
        return f"{{{self.config.selector}}}"

    def replicas(self, expr: str) -> str:
        return f"max without({', '.join(self.config.replica_labels)}) ({expr})"

    def rate(self, metric: str, selector: str) -> str:
        return self.replicas(f"rate({metric}{selector}[$__rate_interval])")

    def rate_or_zero(self, metric: str, fallback: str, selector: str) -> str:
        """A rate that reads 0, not "no data", while the family has never been incremented."""
        return f"{self.rate(metric, selector)} or {self.rate(fallback, selector)} * 0"

    def quantile(self, q: float, metric: str, selector: str) -> str:
        return f"histogram_quantile({q}, {self.rate(f'{metric}_bucket', selector)})"


def _variable_query(name: str, label: str, query: str, description: str) -> grafana.QueryVariable:
    return (
        grafana.QueryVariable(name)
        .all_value(".*")
        .datasource(DATASOURCE)
        .description(description)
        .hide(model.VariableHide.DONT_HIDE)
        .include_all(True)
        .label(label)
        .multi(True)
        .query(query)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .regex("")
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )


def variables(
    config: MonitoringConfig, *, judge: bool = False
) -> list[Builder[model.VariableModel]]:
    accepted = f"{NS}_events_accepted_total"
    sel = config.selector
    out: list[Builder[model.VariableModel]] = [
        grafana.DatasourceVariable("datasource")
        .hide(model.VariableHide.DONT_HIDE)
        .label("Data source")
        .type("prometheus")
        .regex(""),
        _variable_query(
            "tenant",
            "Tenant",
            f"label_values({accepted}{{{sel}}}, tenant)",
            "The tenant of the API key that sent the events (default without keys).",
        ),
        _variable_query(
            "environment",
            "Environment",
            f'label_values({accepted}{{{sel}, tenant=~"$tenant"}}, environment)',
            "Events sent without an environment match only 'All'.",
        ),
        _variable_query(
            "app",
            "App",
            f'label_values({accepted}{{{sel}, tenant=~"$tenant", environment=~"$environment"}}, '
            "app)",
            "The application that sent the events.",
        ),
        _variable_query(
            "retriever",
            "Retriever",
            f'label_values({accepted}{{{sel}, tenant=~"$tenant", environment=~"$environment", '
            'app=~"$app"}, retriever)',
            "Retriever name and version as the application reports it.",
        ),
    ]
    if judge:
        out.append(
            _variable_query(
                "judge",
                "Judge",
                f"label_values({NS}_judge_labels_total{{{sel}}}, judge)",
                "The judge model (the local proxy judge has a name of its own).",
            )
        )
    return out


def _dashboard(
    config: MonitoringConfig,
    uid: str,
    title: str,
    description: str,
    items: Sequence[Item],
    *,
    judge_variable: bool = False,
) -> dict[str, Any]:
    """The dashboard as JSON, its panels numbered in order."""
    builder = (
        grafana.Dashboard(title)
        .uid(uid)
        .description(description)
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .live_now(False)
        .refresh("1m")
        .tags([TAG])
        .time("now-24h", "now")
        .version(1)
        .week_start("")
        .link(
            grafana.DashboardLink("retrieval-monitor")
            .as_dropdown(True)
            .icon("external link")
            .include_vars(True)
            .keep_time(True)
            .tags([TAG])
            .target_blank(False)
            .tooltip("The other retrieval-monitor dashboards")
            .type(model.DashboardLinkType.DASHBOARDS)
        )
        .variables(variables(config, judge=judge_variable))
        .annotation(
            grafana.AnnotationQuery()
            .built_in(1)
            .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .name("Annotations & Alerts")
            .type("dashboard")
        )
    )
    for item in items:
        if isinstance(item, grafana.Row):
            builder.with_row(item)
        else:
            builder.with_panel(item)
    board = builder.build()
    for number, panel in enumerate(board.panels or [], start=1):
        panel.id_val = number
    # The model writes the interval variables' fields on every variable; Grafana's schema has
    # them on interval variables only, and none of these is one.
    for variable in board.templating.list_val or []:
        variable.auto = variable.auto_min = variable.auto_count = None
    rendered: dict[str, Any] = json.loads(json.dumps(board, cls=JSONEncoder, sort_keys=True))
    return rendered


def overview(config: MonitoringConfig) -> dict[str, Any]:
    q = Queries(config)
    collapse = config.alerts.quality_collapse
    lead = collapse.measure
    lead_title = BY_NAME[lead].title
    ev = q.events
    items: list[Item] = [
        grafana.Row(f"Lead measure: {lead_title}"),
        _timeseries(
            f"{lead_title}: rolling mean and baseline",
            f"Mean {lead} per event over the short ({config.windows.short}) and long "
            f"({config.windows.long}) windows, and the same short window "
            f"{collapse.baseline_offset} earlier: the baseline the collapse alert compares with.",
            [
                (f"{r.measure_mean(lead, 'short')}{ev}", f"{SERIES_LEGEND} short"),
                (f"{r.measure_mean(lead, 'long')}{ev}", f"{SERIES_LEGEND} long"),
                (f"{r.measure_mean(lead, r.BASELINE)}{ev}", f"{SERIES_LEGEND} baseline"),
            ],
            unit="none",
            bounds=_measure_axis(lead),
            width=16,
        ),
        _stat(
            f"{lead_title} now / baseline",
            f"The short-window mean as a share of its baseline; the collapse alert fires below "
            f"{collapse.min_ratio_to_baseline:.0%} (with at least {collapse.min_events} scored "
            "events in both windows).",
            f"{r.measure_mean(lead, 'short')}{ev}\n/\n{r.measure_mean(lead, r.BASELINE)}{ev}",
            SERIES_LEGEND,
            unit="percentunit",
            threshold=collapse.min_ratio_to_baseline,
            below_is_bad=True,
        ),
        grafana.Row("Traffic and regime"),
        _timeseries(
            "Judged events per second",
            "Events judged and scored, over the short and long windows.",
            [
                (f"{r.judged_rate('short')}{ev}", f"{SERIES_LEGEND} short"),
                (f"{r.judged_rate('long')}{ev}", f"{SERIES_LEGEND} long"),
            ],
            width=8,
        ),
        _timeseries(
            "K / N_p (estimated)",
            "How many passages the prompt carries over how many relevant ones exist (estimated "
            "from the top 2K). Around 1 or below, T tracks answer quality better than nDCG; well "
            "above 1, order matters and nDCG and F_e lead.",
            [(f"{r.measure_mean('k_over_np_est', 'short')}{ev}", SERIES_LEGEND)],
            threshold=1.0,
            below_is_bad=None,
            width=8,
        ),
        _timeseries(
            "Share of events in the narrow regime (K <= N_p)",
            "Events whose estimated K/N_p is at most 1: where T should lead the dashboards.",
            [(f"{r.NARROW_REGIME_RATIO}{ev}", SERIES_LEGEND)],
            unit="percentunit",
            bounds=(0, 1),
            width=8,
        ),
        grafana.Row("All measures (mean per event)"),
        *(
            _timeseries(
                measure.title,
                f"Mean {measure.name} per scored event over the short and long windows.",
                [
                    (f"{r.measure_mean(measure.name, 'short')}{ev}", f"{SERIES_LEGEND} short"),
                    (f"{r.measure_mean(measure.name, 'long')}{ev}", f"{SERIES_LEGEND} long"),
                ],
                unit="none",
                bounds=_measure_axis(measure.name),
                width=6,
                height=7,
            )
            for measure in MEASURES
        ),
        grafana.Row("Smoke alarm and instrument"),
        _timeseries(
            "Context relevance next to gold recall",
            "The judge's reference-free context rating (the smoke alarm) beside recall against "
            "hand-marked gold passages (the instrument), where gold traffic exists.",
            [
                (f"{r.measure_mean('context_relevance', 'short')}{ev}", f"{SERIES_LEGEND} context"),
                (f"{r.measure_mean('recall', 'short')}{ev}", f"{SERIES_LEGEND} gold recall"),
            ],
            unit="none",
            bounds=(0, 1),
        ),
        _timeseries(
            "Gold-labelled events per second",
            "Events that carried gold passage ids (they give recall, F and gold nDCG).",
            [(q.rate(f"{NS}_measure_recall_count", ev), SERIES_LEGEND)],
        ),
        grafana.Row("Judging outcomes"),
        _timeseries(
            "Events without measures, and events that failed",
            "Judged events with a missing label in the top K (no measure is made up), and events "
            "whose judging failed for good.",
            [
                (
                    q.rate_or_zero(
                        f"{NS}_events_missing_measures_total", f"{NS}_events_judged_total", ev
                    ),
                    f"{SERIES_LEGEND} missing measures",
                ),
                (
                    q.rate_or_zero(f"{NS}_events_failed_total", f"{NS}_events_judged_total", ev),
                    f"{SERIES_LEGEND} failed",
                ),
            ],
            width=24,
        ),
    ]
    return _dashboard(
        config,
        "retrieval-monitor-overview",
        "retrieval-monitor / Overview",
        "Retrieval quality per app and retriever, as the judge sees it on live traffic.",
        items,
    )


def judge(config: MonitoringConfig) -> dict[str, Any]:
    q = Queries(config)
    a = config.alerts
    js = q.judge
    gold = f'{{{config.selector}, judge=~"$judge", tenant=~"$tenant"}}'
    labels = f"{NS}_judge_labels_total"
    lead = a.quality_collapse.measure
    items: list[Item] = [
        grafana.Row("Calls"),
        _timeseries(
            "Judge call outcomes per second",
            "Calls by outcome (ok, malformed reply) and failed attempts (429, 5xx, timeouts "
            "after the client's retries).",
            [(f"{r.JUDGE_OUTCOME_RATE}{js}", "{{judge}} {{outcome}}")],
            width=8,
        ),
        _timeseries(
            "Malformed replies and failures (share)",
            f"Share of call outcomes that were malformed or failed, over {config.windows.short}; "
            f"the alert fires above {a.judge_errors.max_ratio:.0%}.",
            [(f"{r.JUDGE_ERROR_RATIO}{js}", "{{judge}}")],
            unit="percentunit",
            bounds=(0, 1),
            threshold=a.judge_errors.max_ratio,
            width=8,
        ),
        _timeseries(
            "Failures per second by reason",
            "Judge calls that failed after the client's own retries, by reason.",
            [(q.rate(f"{NS}_judge_failures_total", js), "{{judge}} {{reason}}")],
            width=8,
        ),
        _timeseries(
            "Judge call latency",
            "Wall time of one judge call: median, 95th and 99th percentile.",
            [
                (q.quantile(p, f"{NS}_judge_latency_seconds", js), f"{{{{judge}}}} p{int(p * 100)}")
                for p in (0.5, 0.95, 0.99)
            ],
            unit="s",
        ),
        _timeseries(
            "Label cache hit ratio",
            "Passage labels served from the label cache (no judge call, no tokens).",
            [(f"{r.JUDGE_CACHE_HIT_RATIO}{js}", "{{judge}}")],
            unit="percentunit",
            bounds=(0, 1),
        ),
        *_cache_panels(config, q),
        grafana.Row("Cost"),
        _timeseries(
            "Tokens per hour by kind",
            "Prompt and completion tokens the judge consumed, per hour.",
            [(f"{q.rate(f'{NS}_judge_tokens_total', js)} * 3600", "{{judge}} {{kind}}")],
        ),
        _timeseries(
            "Token spend per hour against the budget",
            f"All judges' tokens per hour over the short and long windows; the spend alert fires "
            f"above {a.judge_spend.budget_tokens_per_hour} tokens per hour.",
            [
                (
                    f"sum without(judge) ({r.judge_token_rate(role)}{q.plain}) * 3600",
                    f"tokens per hour ({role})",
                )
                for role in r.ROLES
            ],
            threshold=a.judge_spend.budget_tokens_per_hour,
        ),
        _timeseries(
            "Judge budget left per tenant and app",
            "What is left of each capped budget window (RM_BUDGET_*) of a tenant's app: tokens or "
            "dollars. A budget belongs to a tenant's app, so another tenant using the same app "
            "name draws on a budget of its own. At 0 the app's events wait or are skipped "
            "(RM_BUDGET_POLICY).",
            [
                (
                    q.replicas(
                        f'{NS}_judge_budget_remaining{{{config.selector}, tenant=~"$tenant", '
                        'app=~"$app"}'
                    ),
                    "{{tenant}} {{app}} {{window}}",
                )
            ],
            width=24,
        ),
        _timeseries(
            "Labels missing after retries (share)",
            "Passage labels still missing after the malformed-reply retries: their events have "
            "no measures.",
            [
                (
                    f"({q.rate_or_zero(f'{NS}_judge_labels_missing_total', labels, js)})"
                    f"\n/\n({q.rate(labels, js)} > 0)",
                    "{{judge}}",
                )
            ],
            unit="percentunit",
            bounds=(0, 1),
            width=24,
        ),
        grafana.Row("Agreement with gold labels"),
        _timeseries(
            "Agreement with gold labels: kappa, precision, recall",
            "The judge's relevance labels against hand-marked gold passages, over the last day of "
            f"gold events; the drift alert fires when kappa is below {a.judge_drift.min_kappa} or "
            f"{a.judge_drift.max_drop} under its value {a.judge_drift.baseline_offset} earlier "
            f"(with at least {a.judge_drift.min_gold_passages} labelled gold passages).",
            [
                (
                    q.replicas(f"{NS}_judge_gold_{figure}{gold}"),
                    f"{{{{tenant}}}} {{{{judge}}}} {{{{prompt_version}}}} {figure}",
                )
                for figure in ("kappa", "precision", "recall")
            ],
            unit="none",
            bounds=(-1, 1),
            threshold=a.judge_drift.min_kappa,
            below_is_bad=True,
        ),
        _timeseries(
            f"{BY_NAME[lead].title} by judge and prompt version",
            "The lead measure for the selected apps, split by judge and prompt version: a judge "
            "change shows as new series, not as a retrieval change.",
            [(f"{r.measure_mean(lead, 'short')}{q.events}", SERIES_LEGEND)],
            unit="none",
            bounds=_measure_axis(lead),
        ),
    ]
    return _dashboard(
        config,
        "retrieval-monitor-judge",
        "retrieval-monitor / Judge",
        "The LLM judge: calls, failures, latency, tokens, cache and agreement with gold labels.",
        items,
        judge_variable=True,
    )


def _cache_panels(config: MonitoringConfig, q: Queries) -> list[Item]:
    """What the judge's caches answered, and the share of calls and prompt tokens they saved,
    for the selected tenants."""
    selected = f'{config.selector}, tenant=~"$tenant", judge=~"$judge"'
    lookups = f"{NS}_judge_cache_lookups_total"

    def summed(labels: str, metric: str, matchers: str = "") -> str:
        selector = "{" + selected + matchers + "}"
        return f"sum by({labels}) ({q.rate(metric, selector)})"

    def saved_share(saved: str, spent: str, spent_matchers: str = "") -> str:
        kept = summed("judge", saved)
        return f"{kept}\n/\n(({kept} + {summed('judge', spent, spent_matchers)}) > 0)"

    hits = summed("judge, cache", lookups, ', result="hit"')
    return [
        _timeseries(
            "Cache hit ratio by cache",
            "label: grades held for the same query and passage text; context: ratings held for "
            "the same query and top-k set; vector: passages the local judge did not encode again "
            "(their vectors were kept in Redis, or encoded for an earlier event of the slice).",
            [(f"{hits}\n/\n({summed('judge, cache', lookups)} > 0)", "{{judge}} {{cache}}")],
            unit="percentunit",
            bounds=(0, 1),
        ),
        _timeseries(
            "Share of judge calls and prompt tokens the caches saved",
            "Calls and prompt tokens the label cache and the known context ratings made "
            "unnecessary, over those plus the ones spent (tokens saved are estimated as the "
            "budget reserves them).",
            [
                (
                    saved_share(f"{NS}_judge_calls_saved_total", f"{NS}_judge_app_calls_total"),
                    "{{judge}} calls",
                ),
                (
                    saved_share(
                        f"{NS}_judge_tokens_saved_total",
                        f"{NS}_judge_app_tokens_total",
                        ', kind="prompt"',
                    ),
                    "{{judge}} prompt tokens",
                ),
            ],
            unit="percentunit",
            bounds=(0, 1),
        ),
    ]


def pipeline(config: MonitoringConfig) -> dict[str, Any]:
    q = Queries(config)
    a = config.alerts
    ev = q.events
    plain = q.plain
    lag_selector = f'{{{config.selector}, tenant=~"$tenant", app=~"$app"}}'
    tenant = f'{{{config.selector}, tenant=~"$tenant"}}'
    items: list[Item] = [
        grafana.Row("Ingest"),
        _timeseries(
            "Events accepted and duplicates per second",
            "Events accepted and committed, and events sent again with a known event_id.",
            [
                (q.rate(f"{NS}_events_accepted_total", ev), "{{app}} / {{retriever}} accepted"),
                (
                    q.rate_or_zero(
                        f"{NS}_events_duplicate_total", f"{NS}_events_accepted_total", ev
                    ),
                    "{{app}} / {{retriever}} duplicate",
                ),
            ],
        ),
        _timeseries(
            "Rejected events per second by reason",
            "Events refused at ingest: invalid, over a limit, or an event_id reused for another "
            "event.",
            [(q.rate(f"{NS}_events_rejected_total", plain), "{{reason}}")],
        ),
        _timeseries(
            "Rejected share of events sent",
            f"Over {config.windows.short}; the alert fires above "
            f"{a.ingest_rejections.max_ratio:.0%} with at least "
            f"{a.ingest_rejections.min_events} events sent.",
            [(f"{r.REJECTED_RATIO}{plain}", "rejected")],
            unit="percentunit",
            bounds=(0, 1),
            threshold=a.ingest_rejections.max_ratio,
        ),
        _timeseries(
            "Ingest 5xx share",
            f"Server errors on the ingest routes over {config.windows.short}; the alert fires "
            f"above {a.ingest_server_errors.max_ratio:.0%}.",
            [(f"{r.HTTP_SERVER_ERROR_RATIO}{plain}", "5xx")],
            unit="percentunit",
            bounds=(0, 1),
            threshold=a.ingest_server_errors.max_ratio,
        ),
        grafana.Row("Judging pipeline"),
        _timeseries(
            "Judge queue depth",
            "Judge tasks waiting in the queue.",
            [(q.replicas(f"{NS}_queue_depth{plain}"), "{{queue}}")],
            width=8,
        ),
        _timeseries(
            "Events pending",
            "Events accepted and not yet judged, per tenant.",
            [(q.replicas(f"{NS}_events_pending{tenant}"), "{{tenant}}")],
            width=8,
        ),
        _timeseries(
            "Oldest pending event age",
            f"Per tenant; the alert fires above {a.backlog_age.max_age}.",
            [(q.replicas(f"{NS}_oldest_pending_event_age_seconds{tenant}"), "{{tenant}}")],
            unit="s",
            threshold=seconds(a.backlog_age.max_age),
            width=8,
        ),
        _timeseries(
            "Pipeline lag (receipt to export)",
            "Time from an event's receipt to its measures reaching the metrics.",
            [
                (
                    q.quantile(p, f"{NS}_pipeline_lag_seconds", lag_selector),
                    f"{{{{app}}}} p{int(p * 100)}",
                )
                for p in (0.5, 0.95)
            ],
            unit="s",
        ),
        _timeseries(
            "Judged events per second",
            f"Events judged and scored, over {config.windows.short}.",
            [(f"{r.judged_rate('short')}{ev}", SERIES_LEGEND)],
        ),
    ]
    return _dashboard(
        config,
        "retrieval-monitor-pipeline",
        "retrieval-monitor / Pipeline",
        "Ingest, the judge queue and the backlog.",
        items,
    )


@dataclass(frozen=True)
class PanelQuery:
    """One query of one panel, as Grafana sends it (variables not yet substituted)."""

    dashboard: str
    panel: str
    ref: str
    expr: str


def panel_queries(dashboard: dict[str, Any]) -> list[PanelQuery]:
    return [
        PanelQuery(dashboard["uid"], panel["title"], target["refId"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def variable_selectors(dashboard: dict[str, Any]) -> dict[str, str]:
    """The series selector inside each ``label_values(selector, label)`` variable query."""
    selectors = {}
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query", "")
        if variable["type"] == "query" and query.startswith("label_values("):
            selectors[variable["name"]] = query.removeprefix("label_values(").rsplit(",", 1)[0]
    return selectors


DASHBOARDS = {
    "retrieval-monitor-overview.json": overview,
    "retrieval-monitor-judge.json": judge,
    "retrieval-monitor-pipeline.json": pipeline,
}


def render(config: MonitoringConfig) -> dict[str, dict[str, Any]]:
    """Every dashboard by file name."""
    return {name: build(config) for name, build in DASHBOARDS.items()}
