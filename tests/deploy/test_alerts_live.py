"""Live: the shipped rules in a real Prometheus that scrapes a running retrieval-monitor, and a
real Alertmanager that delivers the page to a webhook.

The service runs for real: the API under uvicorn on a loopback port, a Celery worker process
judging through the OpenAI-compatible test server, SQLite and Redis. Healthy traffic first, then
collapsing traffic; the collapse alert must go pending, then firing in Prometheus's API, and reach
the Alertmanager's critical receiver. Time is compressed only through the rules' settings (windows
of seconds, a 1s scrape and evaluation interval); every sample is a real scrape.

Afterwards every dashboard query runs against this Prometheus and must return data, except the
queries listed in NO_DATA_YET (metrics the service does not export yet).
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import uvicorn
import yaml

from deploy import dashboards as boards
from deploy import generate, rules
from deploy.config import load
from service.api.app import create_app
from service.config.settings import Settings
from service.process.embedded import free_port
from service.store.migrate import upgrade
from tests.support.environment import REDIS_URL, make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.live import WorkerFactory
from tests.support.monitoring import TEST_VALUES, substitute
from tests.support.paths import REPO_ROOT
from tests.support.tools import require_tool

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# A database of its own on the test Redis server: the suite's other tests flush database 15,
# and this test runs long enough to meet one of them when tests run side by side.
LIVE_REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + "/13"

ALERT = "RetrievalMonitorQualityCollapse"
ALERTMANAGER = REPO_ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
# Minutes become seconds. The baseline offset must outlast detection: once the collapse reaches
# the baseline window, the alert resolves by design.
COMPRESSED: dict[str, Any] = {
    "windows": {"short": "8s", "long": "20s"},
    "alerts": {
        "quality_collapse": {"baseline_offset": "30s", "min_events": 10, "for": "5s"},
    },
}
SCRAPE_SECONDS = 1
RATE_INTERVAL = "5s"  # what Grafana's $__rate_interval is at a 1s scrape interval, rounded up

# Dashboard queries that cannot return data yet, with the metric they wait for. The test fails
# if any other query is empty, and also if one of these starts returning data (then remove it).
NO_DATA_YET: dict[tuple[str, str, str], str] = {}

APP, RETRIEVER, ENVIRONMENT, JUDGE = "live-app", "bm25-live", "test", "fake-judge"
# Healthy results: grades of the six passages in rank order (K = 4, two more estimate N_p).
HEALTHY_GRADES = (3, 2, 0, 3, 1, 2)
HEALTHY_TEXTS = tuple(
    f"healthy passage {rank}: a paragraph that answers the question well" for rank in range(6)
)
K = 4
GOLD = ["p0", "p3"]


def expected_ndcg(grades: tuple[int, ...], k: int) -> float:
    top = grades[:k]
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(top))
    ideal = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(top, reverse=True)))
    return dcg / ideal


# --- the webhook receiver that stands for the pager -------------------------------------------
@dataclass
class Delivery:
    path: str
    at: float
    body: dict[str, Any]


@dataclass
class Webhook:
    url: str
    deliveries: list[Delivery] = field(default_factory=list)


@contextmanager
def webhook_receiver() -> Iterator[Webhook]:
    hook = Webhook(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            hook.deliveries.append(Delivery(self.path, time.monotonic(), body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


# --- the service, Prometheus and Alertmanager -------------------------------------------------
@contextmanager
def serve_app(settings: Settings) -> Iterator[str]:
    """The API over real HTTP (Prometheus must scrape it), in a thread of this process."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the API did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@contextmanager
def run_server(command: list[str], log: Path, ready_url: str) -> Iterator[None]:
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(
                lambda: process.poll() is None and http_ok(ready_url),
                60,
                f"{command[0]} did not become ready",
                log,
            )
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def wait_until(check: Any, timeout: float, message: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    detail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise AssertionError(f"{message} within {timeout}s\n{detail}")


@dataclass
class Prometheus:
    url: str
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))

    def _get(self, path: str, **params: Any) -> Any:
        response = self.http.get(f"{self.url}{path}", params=params)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._get("/api/v1/query", query=expr)["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        data = self._get("/api/v1/query_range", query=expr, start=start, end=end, step=1)
        result: list[dict[str, Any]] = data["result"]
        return result

    def series(self, selector: str, start: float) -> list[dict[str, str]]:
        found: list[dict[str, str]] = self._get(
            "/api/v1/series", **{"match[]": selector, "start": start}
        )
        return found

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [
            a for a in self._get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name
        ]

    def rule_groups(self) -> set[str]:
        return {group["name"] for group in self._get("/api/v1/rules")["groups"]}

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


def prometheus_config(app_port: int, alertmanager_port: int) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_SECONDS}s",
            "evaluation_interval": f"{SCRAPE_SECONDS}s",
        },
        "rule_files": ["rules.yml"],
        "alerting": {
            "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]
        },
        "scrape_configs": [
            {
                # The rules select this job name (deploy/alerting.yaml).
                "job_name": "retrieval-monitor",
                "static_configs": [{"targets": [f"127.0.0.1:{app_port}"]}],
            }
        ],
    }


def alertmanager_config(webhook: Webhook) -> dict[str, Any]:
    """The shipped example, delivering to this test's receiver, without the long waits."""
    config: dict[str, Any] = yaml.safe_load(ALERTMANAGER.read_text())
    config["route"].update(group_wait="1s", group_interval="1s")
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            assert hook["url"].startswith("http://127.0.0.1:5001/"), hook["url"]
            hook["url"] = hook["url"].replace("http://127.0.0.1:5001", webhook.url)
    return config


# --- traffic ----------------------------------------------------------------------------------
def healthy_event(number: int, twin: bool) -> dict[str, Any]:
    # The twin repeats the query and passages under another id: its labels come from the cache.
    return {
        "event_id": f"healthy-{number}{'-twin' if twin else ''}",
        "app": APP,
        "retriever": RETRIEVER,
        "environment": ENVIRONMENT,
        "query": f"live question {number}: what do the healthy passages say",
        "passages": [{"id": f"p{i}", "text": text} for i, text in enumerate(HEALTHY_TEXTS)],
        "k": K,
        "gold_passage_ids": GOLD,
    }


def collapsed_event(number: int) -> dict[str, Any]:
    return {
        "event_id": f"collapsed-{number}",
        "app": APP,
        "retriever": RETRIEVER,
        "environment": ENVIRONMENT,
        "query": f"live question {number} after the index broke",
        "passages": [
            {"id": f"p{i}", "text": f"unrelated filler {number}-{i} that answers nothing"}
            for i in range(6)
        ],
        "k": K,
        "gold_passage_ids": GOLD,
    }


@contextmanager
def running(traffic: Traffic) -> Iterator[Traffic]:
    traffic.start()
    try:
        yield traffic
    finally:
        traffic.stop.set()
        traffic.join(timeout=15)


def is_judged(base_url: str, event_id: str) -> bool:
    response = httpx.get(f"{base_url}/v1/events/{event_id}", timeout=5)
    return response.status_code == 200 and response.json()["status"] == "judged"


class Traffic(threading.Thread):
    """Two events every half second: healthy ones (and a cached twin) or collapsed ones."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.http = httpx.Client(base_url=base_url, timeout=10)
        self.collapsed = threading.Event()
        self.stop = threading.Event()
        self.sent = 0
        self.errors: list[str] = []

    def run(self) -> None:
        number = 0
        while not self.stop.is_set():
            if self.collapsed.is_set():
                batch = [collapsed_event(number), collapsed_event(number + 1)]
                number += 2
            else:
                batch = [healthy_event(number, False), healthy_event(number, True)]
                number += 1
            response = self.http.post("/v1/events/batch", json={"events": batch})
            if response.status_code != 200 or response.json()["accepted"] != len(batch):
                self.errors.append(f"{response.status_code}: {response.text[:300]}")
            self.sent += len(batch)
            self.stop.wait(0.5)
        self.http.close()


def exercise_the_other_series(base_url: str, fake_llm: FakeLLM) -> None:
    """Rejections, a duplicate, a failed judge call and malformed replies, so that the panels
    that show them have data."""
    with httpx.Client(base_url=base_url, timeout=10) as client:
        for i in range(3):
            bad = {"app": APP, "retriever": RETRIEVER, "passages": [], "event_id": f"bad-{i}"}
            assert client.post("/v1/events", json=bad).status_code == 422
        again = healthy_event(0, False)
        assert client.post("/v1/events", json=again).status_code == 200  # a duplicate
    fake_llm.set_fault("http_500", count=1)
    wait_until(
        lambda: fake_llm.stats()["faults_served"].get("http_500") == 1, 30, "no judge call failed"
    )
    fake_llm.set_fault("malformed_json", count=3)
    wait_until(
        lambda: fake_llm.stats()["faults_served"].get("malformed_json") == 3,
        30,
        "no malformed replies served",
    )


# --- the test ---------------------------------------------------------------------------------
@pytest.fixture
def live_settings(tmp_path: Path, fake_llm: FakeLLM) -> Iterator[Settings]:
    client = redis.Redis.from_url(LIVE_REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"no Redis at {LIVE_REDIS_URL} ({exc})")
    client.flushdb()
    database = f"sqlite:///{tmp_path / 'live.db'}"
    upgrade(database)
    # Grades follow the passage text, not the moment of judging: a backlog cannot blur phases.
    grades = zip(HEALTHY_TEXTS, HEALTHY_GRADES, strict=True)
    fake_llm.set_labels({(None, text): grade for text, grade in grades}, default_grade=0)
    yield make_settings(
        tmp_path,
        database,
        LIVE_REDIS_URL,
        judge_base_url=fake_llm.base_url,
        judge_model=JUDGE,
        judge_max_retries=0,
        judge_timeout_seconds=5,
        # A cap far above the test's use, so the budget-left panel has a series to show.
        budget_overrides={APP: {"tokens_per_day": 1e12}},
    )
    client.flushdb()
    client.close()


def test_a_collapse_pages_through_prometheus_and_alertmanager(
    tmp_path: Path,
    live_settings: Settings,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
) -> None:
    prometheus_bin = require_tool("prometheus")
    alertmanager_bin = require_tool("prometheus-alertmanager")
    rules_dir = tmp_path / "prometheus"
    rules_dir.mkdir()
    (rules_dir / "rules.yml").write_text(generate.rules_text(load(overrides=COMPRESSED)))
    lead = load().alerts.quality_collapse.measure
    label_filter = f'{{app="{APP}", retriever="{RETRIEVER}"}}'
    mean_short = f"{rules.measure_mean(lead, 'short')}{label_filter}"
    baseline = f"{rules.measure_mean(lead, rules.BASELINE)}{label_filter}"
    baseline_events = f"{rules.measure_count_increase(lead, rules.BASELINE)}{label_filter}"
    healthy = expected_ndcg(HEALTHY_GRADES, K)

    worker_factory(live_settings).start()
    with (
        webhook_receiver() as webhook,
        serve_app(live_settings) as base_url,
        running(Traffic(base_url)) as traffic,
    ):
        # Before Prometheus's first scrape: the service computes the gold-agreement gauges at a
        # scrape and keeps them for a minute, so judged gold events must exist by then.
        exercise_the_other_series(base_url, fake_llm)
        wait_until(lambda: is_judged(base_url, "healthy-1"), 60, "no event was judged")
        prompt_version = httpx.get(f"{base_url}/v1/events/healthy-1").json()["prompt_version"]

        am_port, prom_port = free_port(), free_port()
        (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(webhook)))
        app_port = int(base_url.rsplit(":", 1)[1])
        (rules_dir / "prometheus.yml").write_text(
            yaml.safe_dump(prometheus_config(app_port, am_port))
        )
        alertmanager = [
            alertmanager_bin,
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
        ]
        prometheus = [
            prometheus_bin,
            f"--config.file={rules_dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--rules.alert.resend-delay=1s",
        ]
        with (
            run_server(
                alertmanager, tmp_path / "alertmanager.log", f"http://127.0.0.1:{am_port}/-/ready"
            ),
            run_server(
                prometheus, tmp_path / "prometheus.log", f"http://127.0.0.1:{prom_port}/-/ready"
            ),
        ):
            prom = Prometheus(f"http://127.0.0.1:{prom_port}")
            started = time.time()
            assert prom.rule_groups() == {
                "retrieval-monitor-measures",
                "retrieval-monitor-judge",
                "retrieval-monitor-ingest",
                "retrieval-monitor-alerts",
            }
            # Healthy until the baseline window (30s back) holds enough healthy events.
            wait_until(
                lambda: (prom.value(baseline_events) or 0) >= 12,
                90,
                "the baseline window never filled",
            )
            # A healthy baseline: both means are there and equal, and nothing is pending.
            assert prom.value(mean_short) == pytest.approx(healthy, rel=1e-9)
            assert prom.value(baseline) == pytest.approx(healthy, rel=1e-9)
            assert prom.alerts(ALERT) == []

            collapse_at, collapse_wall = time.monotonic(), time.time()
            traffic.collapsed.set()
            seen: dict[str, float] = {}

            def progressed() -> bool:
                for alert in prom.alerts(ALERT):
                    seen.setdefault(alert["state"], time.monotonic())
                paged = [d for d in webhook.deliveries if _carries(d, ALERT)]
                if paged:
                    seen.setdefault("delivered", paged[0].at)
                return "delivered" in seen

            wait_until(
                progressed,
                29,
                "the collapse never reached the Alertmanager",
                tmp_path / "prometheus.log",
            )
            assert traffic.errors == []

            (firing,) = [a for a in prom.alerts(ALERT) if a["state"] == "firing"]
            pending_since = _epoch(firing["activeAt"]) - collapse_wall
            timings = {state: round(at - collapse_at, 2) for state, at in seen.items()}
            print(
                f"\nfrom the first collapsed event: pending at {pending_since:.2f}s (activeAt), "
                f"first seen {timings} s; {traffic.sent} events sent"
            )
            assert "pending" in seen
            assert 0 < pending_since < seen["delivered"] - collapse_at
            # Delivered before the collapse reaches the baseline window (it would resolve).
            assert seen["delivered"] - collapse_at < 30

            assert firing["labels"] == {
                "alertname": ALERT,
                "severity": "critical",
                "job": "retrieval-monitor",
                "tenant": "default",  # keys off: every event is the default tenant's
                "app": APP,
                "retriever": RETRIEVER,
                "environment": ENVIRONMENT,
                "judge": JUDGE,
                "prompt_version": prompt_version,
            }
            assert float(firing["value"]) < 0.7 * healthy
            page = next(d for d in webhook.deliveries if _carries(d, ALERT))
            assert page.path == "/pager"  # the critical route of the shipped config
            (alert,) = [a for a in page.body["alerts"] if a["labels"]["alertname"] == ALERT]
            assert alert["status"] == "firing"
            assert alert["annotations"]["runbook_url"].endswith("#retrievalmonitorqualitycollapse")
            assert f"for {APP} / {RETRIEVER}" in alert["annotations"]["description"]

            check_every_dashboard_query(prom, started)


def _epoch(timestamp: str) -> float:
    # Prometheus writes RFC 3339 with nanoseconds; Python reads at most microseconds.
    whole, _, fraction = timestamp.rstrip("Z").partition(".")
    moment = datetime.fromisoformat(whole).replace(tzinfo=UTC)
    return moment.timestamp() + float(f"0.{fraction or 0}")


def _carries(delivery: Delivery, alertname: str) -> bool:
    return any(a["labels"].get("alertname") == alertname for a in delivery.body.get("alerts", []))


def check_every_dashboard_query(prom: Prometheus, since: float) -> None:
    values = TEST_VALUES | {"$__rate_interval": RATE_INTERVAL}
    end = time.time()
    empty: dict[tuple[str, str, str], str] = {}
    for path in sorted(generate.DASHBOARD_DIR.glob("*.json")):
        board = json.loads(path.read_text())
        for query in boards.panel_queries(board):
            result = prom.query_range(substitute(query.expr, values), since, end)
            finite = [
                v for series in result for _, v in series["values"] if math.isfinite(float(v))
            ]
            if not finite:
                empty[(query.dashboard, query.panel, query.ref)] = query.expr
        for name, selector in boards.variable_selectors(board).items():
            assert prom.series(substitute(selector, values), since), f"{path.name}: ${name}"
    assert set(empty) == set(NO_DATA_YET), (
        "dashboard queries without data (or listed in NO_DATA_YET but now with data): "
        f"{json.dumps({' / '.join(k): v for k, v in empty.items()}, indent=2)}"
    )
    # Empty for the reason given: the metric they wait for is not exported yet.
    for metric in set(NO_DATA_YET.values()):
        assert prom.series(metric, since) == [], f"{metric} exists now: update NO_DATA_YET"
