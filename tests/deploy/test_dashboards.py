"""The Grafana dashboards: generated from the config, valid against Grafana's published schema
(@grafana/schema, type-checked with TypeScript), every query valid PromQL over series that the
service exports or the rules record, and the provisioning files in shape.

The schema check needs node and the npm packages of tests/deploy/grafana_schema
(``scripts/install-test-tools.sh``); without them it skips, except in CI where it fails.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import dashboards as boards
from deploy import generate, rules
from deploy.config import load
from service.telemetry.metrics import MEASURE_BUCKETS
from tests.support.monitoring import PENDING_METRICS, TEST_VALUES, exported_series, substitute
from tests.support.paths import REPO_ROOT
from tests.support.tools import require_tool

REPO = REPO_ROOT
DASHBOARD_DIR = REPO / "deploy" / "grafana" / "dashboards"
PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
SCHEMA_DIR = Path(__file__).resolve().parent / "grafana_schema"
CHECKER = SCHEMA_DIR / "node_modules" / ".cache" / "grafana-schema-check" / "check.js"
RECORDED = re.compile(r"[a-z_]+:retrieval_monitor_[a-z0-9_]+:[a-z0-9_]+")


def shipped() -> dict[str, dict[str, Any]]:
    return {
        path.name: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))
    }


def all_queries() -> list[boards.PanelQuery]:
    return [query for board in shipped().values() for query in boards.panel_queries(board)]


@pytest.fixture(scope="module")
def schema_checker() -> Path:
    """The schema check program, compiled once for the module."""
    node = require_tool("node")
    tsc = SCHEMA_DIR / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        pytest.skip(
            "tests/deploy/grafana_schema has no node_modules: run scripts/install-test-tools.sh"
        )
    built = subprocess.run(
        [node, str(tsc), "-p", "tsconfig.json"],
        cwd=SCHEMA_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return CHECKER


def check_schema(checker: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("node"), str(checker), *map(str, files)],
        cwd=SCHEMA_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )


# --- generated from one source ------------------------------------------------------------------
def test_the_dashboards_are_generated_from_the_config() -> None:
    files = generate.outputs(load())
    dashboards = {path: text for path, text in files.items() if path.parent == DASHBOARD_DIR}
    assert {path.name for path in dashboards} == set(boards.DASHBOARDS)
    assert generate.stale(dashboards) == [], "run python -m deploy.generate"
    assert {path.name for path in DASHBOARD_DIR.glob("*.json")} == set(boards.DASHBOARDS)


# --- Grafana's schema ---------------------------------------------------------------------------
def test_the_dashboards_conform_to_grafanas_published_schema(schema_checker: Path) -> None:
    files = sorted(DASHBOARD_DIR.glob("*.json"))
    result = check_schema(schema_checker, *files)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(files)} dashboard(s) checked, 0 problem(s)" in result.stdout


def test_the_schema_check_finds_what_is_wrong(schema_checker: Path, tmp_path: Path) -> None:
    board = shipped()["retrieval-monitor-judge.json"]
    board["refresh_rate"] = "1m"  # not a dashboard field
    timeseries = next(p for p in board["panels"] if p["type"] == "timeseries")
    timeseries["gridPos"]["w"] = "12"  # a string where the schema wants a number
    timeseries["options"]["tooltip"]["mode"] = "multiple"  # not one of the enum's values
    timeseries["fieldConfig"]["defaults"]["custom"]["lineWidht"] = 2  # a typo in custom config
    del board["templating"]["list"][1]["name"]  # a variable must have a name
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(board))
    result = check_schema(schema_checker, broken)
    errors = result.stderr
    assert result.returncode == 1
    assert "'\"refresh_rate\"' does not exist" in errors
    assert "Type 'string' is not assignable to type 'number'" in errors
    assert '"multiple"' in errors
    assert "'\"lineWidht\"' does not exist" in errors
    assert "Property 'name' is missing" in errors


# --- the queries --------------------------------------------------------------------------------
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses every panel query and every variable's selector (as recording rules)."""
    promtool = require_tool("promtool")
    exprs = [substitute(query.expr, TEST_VALUES) for query in all_queries()]
    for board in shipped().values():
        exprs += [substitute(s, TEST_VALUES) for s in boards.variable_selectors(board).values()]
    assert not [expr for expr in exprs if "$" in expr], "a variable was left unsubstituted"
    group = {
        "name": "queries",
        "rules": [{"record": f"panel:query:{i}", "expr": e} for i, e in enumerate(exprs)],
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_queries_read_recorded_series_that_exist_and_exported_metrics() -> None:
    loaded = yaml.safe_load(generate.RULES_PATH.read_text())
    recorded = {rule["record"] for g in loaded["groups"] for rule in g["rules"] if "record" in rule}
    exported = exported_series()
    texts = [query.expr for query in all_queries()]
    texts += [s for board in shipped().values() for s in boards.variable_selectors(board).values()]
    for text in texts:
        for name in RECORDED.findall(text):
            assert name in recorded, f"{name} is not recorded by deploy/prometheus/rules.yml"
        raw = set(re.findall(r"retrieval_monitor_[a-z0-9_]+", RECORDED.sub("", text)))
        assert raw <= exported | PENDING_METRICS, f"unknown series in {text}"


def test_every_query_filters_on_the_selector_and_takes_replicas_with_max() -> None:
    selector = load().selector
    for query in all_queries():
        for selected in re.findall(r"(?:retrieval_monitor_|:)[a-z0-9_]+\{[^}]*\}", query.expr):
            assert selector in selected, f"{query.dashboard} / {query.panel}: {selected}"
        for match in re.finditer(r"\b(rate|increase)\(retrieval_monitor_", query.expr):
            before = query.expr[: match.start()]
            assert before.endswith("max without(instance, pod) ("), (
                f"{query.dashboard} / {query.panel}: {query.expr}"
            )


def test_the_dashboards_cover_what_each_audience_needs() -> None:
    by_uid = {board["uid"]: board for board in shipped().values()}
    texts = {uid: "\n".join(q.expr for q in boards.panel_queries(b)) for uid, b in by_uid.items()}
    lead = load().alerts.quality_collapse.measure
    overview = texts["retrieval-monitor-overview"]
    for name in (
        rules.measure_mean(lead, "short"),
        rules.measure_mean(lead, "long"),
        rules.measure_mean(lead, rules.BASELINE),
        rules.judged_rate("short"),
        rules.NARROW_REGIME_RATIO,
        rules.measure_mean("k_over_np_est", "short"),
        *(rules.measure_mean(measure, "short") for measure in MEASURE_BUCKETS),
    ):
        assert name in overview, name
    # The smoke alarm next to the instrument: one panel holds both.
    assert any(
        rules.measure_mean("context_relevance", "short") in "".join(t["expr"] for t in p["targets"])
        and rules.measure_mean("recall", "short") in "".join(t["expr"] for t in p["targets"])
        for p in by_uid["retrieval-monitor-overview"]["panels"]
        if "targets" in p
    )
    for name in (
        rules.JUDGE_OUTCOME_RATE,
        rules.JUDGE_ERROR_RATIO,
        rules.JUDGE_CACHE_HIT_RATIO,
        rules.judge_token_rate("short"),
        "retrieval_monitor_judge_tokens_total",
        "retrieval_monitor_judge_failures_total",
        "retrieval_monitor_judge_latency_seconds_bucket",
        "retrieval_monitor_judge_gold_kappa",
    ):
        assert name in texts["retrieval-monitor-judge"], name
    for name in (
        "retrieval_monitor_events_accepted_total",
        "retrieval_monitor_events_rejected_total",
        rules.REJECTED_RATIO,
        "retrieval_monitor_queue_depth",
        "retrieval_monitor_oldest_pending_event_age_seconds",
        "retrieval_monitor_pipeline_lag_seconds_bucket",
    ):
        assert name in texts["retrieval-monitor-pipeline"], name


def test_every_dashboard_has_the_variables_and_uses_the_datasource_variable() -> None:
    for name, board in shipped().items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        expected = {"datasource", "tenant", "environment", "app", "retriever"}
        if board["uid"] == "retrieval-monitor-judge":
            expected.add("judge")
        assert set(variables) == expected, name
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for variable in expected - {"datasource"}:
            # "All" must also match series without the label (events without an environment).
            assert variables[variable]["allValue"] == ".*"
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
                assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    for name, board in shipped().items():
        ids = [panel["id"] for panel in board["panels"]]
        assert len(ids) == len(set(ids)), name
        taken: set[tuple[int, int]] = set()
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, (name, panel["title"])
            cells = {
                (x, y)
                for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])
            }
            assert not cells & taken, (name, panel["title"])
            taken |= cells


# --- provisioning -------------------------------------------------------------------------------
def test_the_provisioning_files_point_grafana_at_prometheus_and_the_dashboards() -> None:
    datasources = yaml.safe_load(
        (PROVISIONING / "datasources" / "retrieval-monitor.yaml").read_text()
    )
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus"
    assert source["access"] == "proxy"
    assert source["url"].startswith("http")
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "retrieval-monitor.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert Path(provider["options"]["path"]).is_absolute()
    # The dashboards pick the data source through their variable, so any name works.
    for board in shipped().values():
        assert "uid" in board
        assert board["uid"].startswith("retrieval-monitor-")
