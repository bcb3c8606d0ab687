"""The Prometheus rules and the Alertmanager example, checked with Prometheus's own tools.

promtool checks the rules and the example configuration and runs the unit tests in
``deploy/prometheus/tests/``; amtool checks the Alertmanager example and its routing. Without the
tools these tests skip, except in CI (``CI=true``), where they fail:
``scripts/install-test-tools.sh`` installs them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from deploy import generate
from deploy.config import CONFIG_PATH, load
from tests.support.monitoring import PENDING_METRICS, exported_series
from tests.support.paths import REPO_ROOT
from tests.support.tools import require_tool

REPO = REPO_ROOT
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
UNIT_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
ALERTMANAGER = DEPLOY / "alertmanager" / "alertmanager.yml"
RUNBOOK = DEPLOY / "RUNBOOK.md"

REPLICA_AGGREGATION = "max without(instance, pod) ("


def run(*command: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def rule_list() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rule_list() if "alert" in rule]


# --- the generated file and its source ----------------------------------------------------------
def test_the_rule_file_is_generated_from_the_config() -> None:
    files = generate.outputs(load())
    assert generate.stale({RULES: files[RULES]}) == [], (
        "deploy/prometheus/rules.yml is out of date: run python -m deploy.generate"
    )


def test_regenerating_after_a_config_change_changes_the_rules(tmp_path: Path) -> None:
    changed = tmp_path / "alerting.yaml"
    changed.write_text(CONFIG_PATH.read_text().replace("min_events: 50", "min_events: 70"))
    text = generate.rules_text(load(changed))
    assert text != RULES.read_text()
    assert "increase_short >= 70" in text


def test_the_config_refuses_typos_and_meaningless_settings(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="min_event"):
        load(overrides={"alerts": {"quality_collapse": {"min_event": 5}}})
    with pytest.raises(ValidationError, match="can be negative"):
        load(overrides={"alerts": {"quality_collapse": {"measure": "t"}}})
    with pytest.raises(ValidationError, match="unknown measure"):
        load(overrides={"alerts": {"quality_collapse": {"measure": "ndgc"}}})
    with pytest.raises(ValidationError, match="duration"):
        load(overrides={"windows": {"short": "30 minutes"}})


# --- what every rule must carry -----------------------------------------------------------------
def test_every_alert_has_severity_summary_description_and_a_runbook_entry() -> None:
    headings = {
        line.removeprefix("## ").strip().lower()
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("## ")
    }
    names = [alert["alert"] for alert in alerts()]
    assert len(names) == len(set(names)) == 13
    for alert in alerts():
        assert alert["labels"]["severity"] in {"critical", "warning"}, alert["alert"]
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, alert["alert"]
        assert annotations["summary"], alert["alert"]
        assert annotations["description"], alert["alert"]
        anchor = annotations["runbook_url"].rsplit("#", 1)[1]
        assert anchor == alert["alert"].lower()
        assert anchor in headings, f"no runbook entry for {alert['alert']}"
        assert re.fullmatch(r"\d+[smhdw]", alert["for"]), alert["alert"]


def test_recorded_names_follow_level_metric_operations() -> None:
    for rule in rule_list():
        if "record" in rule:
            level, metric, operation = rule["record"].split(":")
            assert re.fullmatch(r"[a-z_]+", level), rule["record"]
            assert metric.startswith("retrieval_monitor_"), rule["record"]
            assert re.fullmatch(r"[a-z0-9_]+", operation), rule["record"]


def test_raw_series_are_taken_across_replicas_with_max_never_summed() -> None:
    """Every replica exports the same global totals: each raw series must go through the max."""
    raw = re.compile(r"retrieval_monitor_[a-z0-9_]+\{")
    for rule in rule_list():
        expr = rule["expr"]
        for match in raw.finditer(expr):
            # The selector sits either directly in the max, or in one function inside it, or in
            # absent() (which reads presence, not values).
            before = expr[: match.start()]
            direct = before.endswith(REPLICA_AGGREGATION) or before.endswith("absent(")
            in_function = re.search(
                re.escape(REPLICA_AGGREGATION) + r"(rate|increase|delta|deriv)\($", before
            )
            assert direct or in_function, f"{rule.get('record') or rule['alert']}: {expr}"
        assert not re.search(r"sum\s*(by|without)?\s*(\([^)]*\))?\s*\(\s*(rate|increase)", expr), (
            f"a sum straight over raw rates counts each replica: {expr}"
        )


def test_rules_read_only_series_the_service_exports_or_records() -> None:
    recorded = {rule["record"] for rule in rule_list() if "record" in rule}
    exported = exported_series()
    referenced: set[str] = set()
    for rule in rule_list():
        for name in re.findall(r"[a-z_]+:retrieval_monitor_[a-z0-9_]+:[a-z0-9_]+", rule["expr"]):
            assert name in recorded, f"{name} is read but never recorded"
        without_recorded = re.sub(
            r"[a-z_]+:retrieval_monitor_[a-z0-9_]+:[a-z0-9_]+", "", rule["expr"]
        )
        referenced.update(re.findall(r"retrieval_monitor_[a-z0-9_]+", without_recorded))
    unknown = referenced - exported - PENDING_METRICS
    assert not unknown, f"not in service/telemetry/metrics.py: {sorted(unknown)}"
    # The pending families are still pending; once exported, drop them from PENDING_METRICS.
    assert not (PENDING_METRICS & exported)


# --- promtool -----------------------------------------------------------------------------------
def test_promtool_accepts_the_rules() -> None:
    promtool = require_tool("promtool")
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_list())} rules found" in result.stdout


def test_promtool_accepts_the_example_prometheus_config() -> None:
    promtool = require_tool("promtool")
    result = run(promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


@pytest.fixture(scope="module")
def unit_test_runs() -> dict[str, subprocess.CompletedProcess[str]]:
    """Every promtool unit-test file, run side by side (each takes seconds)."""
    promtool = require_tool("promtool")
    started = {
        path.name: subprocess.Popen(
            [promtool, "test", "rules", str(path)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for path in UNIT_TESTS
    }
    results = {}
    for name, process in started.items():
        output, _ = process.communicate(timeout=300)
        results[name] = subprocess.CompletedProcess(process.args, process.returncode, output, "")
    return results


@pytest.mark.parametrize("name", [path.name for path in UNIT_TESTS])
def test_promtool_unit_tests_pass(
    name: str, unit_test_runs: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    result = unit_test_runs[name]
    assert result.returncode == 0, result.stdout
    assert "SUCCESS" in result.stdout


def _alert_cases() -> tuple[set[str], set[str]]:
    """Alerts with a case that must fire, and alerts with cases that must never fire.

    A case that must not fire counts only as a check that the alert never fired over the whole
    run: ``max_over_time(ALERTS{alertname="X", alertstate="firing", ...}[...])`` with no samples.
    """
    fires: set[str] = set()
    quiet: set[str] = set()
    never = re.compile(r'max_over_time\(ALERTS\{[^}]*alertstate="firing"[^}]*\}\[\w+\]\)')
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check.get("exp_alerts"):
                    fires.add(check["alertname"])
            for check in case.get("promql_expr_test", []):
                expr = check["expr"]
                if never.fullmatch(expr) and not check.get("exp_samples"):
                    named = re.search(r'alertname="(\w+)"', expr)
                    quiet.update([named.group(1)] if named else _alerts_in_case(case))
    return fires, quiet


def _alerts_in_case(case: dict[str, Any]) -> set[str]:
    return {check["alertname"] for check in case.get("alert_rule_test", [])}


def test_every_alert_has_a_case_that_fires_and_one_that_must_not() -> None:
    fires, quiet = _alert_cases()
    names = {alert["alert"] for alert in alerts()}
    assert names - fires == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a case that must never fire"


def test_the_unit_tests_catch_a_dropped_minimum_sample(tmp_path: Path) -> None:
    """With the minimum traffic of the rejection alert gone, the sparse case fires: the unit
    tests must notice."""
    promtool = require_tool("promtool")
    loosened = load(overrides={"alerts": {"ingest_rejections": {"min_events": 1}}})
    (tmp_path / "rules.yml").write_text(generate.rules_text(loosened))
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(DEPLOY / "prometheus" / "tests" / "pipeline.yml", tests / "pipeline.yml")
    result = run(promtool, "test", "rules", str(tests / "pipeline.yml"))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert 'namespace="sparse"' in output
    assert "RetrievalMonitorIngestRejectionsHigh" in output


# --- Alertmanager -------------------------------------------------------------------------------
def test_amtool_accepts_the_alertmanager_example() -> None:
    amtool = require_tool("amtool")
    result = run(amtool, "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_amtool_rejects_a_route_to_a_missing_receiver(tmp_path: Path) -> None:
    amtool = require_tool("amtool")
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(ALERTMANAGER.read_text().replace("receiver: pager", "receiver: pagr"))
    result = run(amtool, "check-config", str(broken))
    assert result.returncode != 0
    assert "pagr" in result.stdout + result.stderr


def test_every_alert_routes_to_the_receiver_of_its_severity() -> None:
    amtool = require_tool("amtool")
    receivers = {"critical": "pager", "warning": "tickets"}
    for alert in alerts():
        severity = alert["labels"]["severity"]
        result = run(
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={ALERTMANAGER}",
            f"--verify.receivers={receivers[severity]}",
            f"alertname={alert['alert']}",
            f"severity={severity}",
            "job=retrieval-monitor",
        )
        assert result.returncode == 0, (alert["alert"], result.stdout + result.stderr)
    unrouted = run(
        amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER}", "alertname=Other"
    )
    assert unrouted.stdout.strip() == "default"
