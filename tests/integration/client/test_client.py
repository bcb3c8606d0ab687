"""The client library against the real service over HTTP: an outage and a restart, a service
that stalls, a full queue, rate limiting, per-event refusals, feedback, asyncio, and the process
edges (exit without close, fork, an application without the server's packages installed).

No test waits on a clock to prove that ``record()`` does not block: the calls are made while the
service cannot answer, and the service is only brought back after they returned, so a call that
waited for it would hang the test instead."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from retrieval_monitor_client import AsyncMonitorClient, MonitorClient, Passage, Stats
from sqlalchemy import create_engine, text

from service.config.settings import Settings
from tests.support.environment import make_settings
from tests.support.live import LiveServer, wait_for
from tests.support.paths import REPO_ROOT
from tests.support.stalling_proxy import StallingProxy

PASSAGES: list[Passage] = [
    {"id": "d1", "text": "Returns are accepted within 30 days of delivery."},
    {"id": "d2", "text": "Shipping takes three to five working days."},
    "Gift cards cannot be exchanged for cash.",
]
# Quick to notice a restart; the defaults suit production, not a test's patience.
FAST: dict[str, Any] = {"flush_interval": 0.05, "max_backoff": 0.2}


@pytest.fixture
def settings(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, store_url, redis_url)


@pytest.fixture
def server(settings: Settings) -> Iterator[LiveServer]:
    with LiveServer(settings) as live:
        yield live


def stored_ids(settings: Settings, app: str) -> list[str]:
    engine = create_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT event_id FROM events WHERE app = :app"), {"app": app})
            return [str(row[0]) for row in rows]
    finally:
        engine.dispose()


def record_in_threads(monitor: MonitorClient, prefix: str, threads: int, each: int) -> list[str]:
    ids: list[str] = []
    lock = threading.Lock()

    def work(thread: int) -> None:
        for n in range(each):
            event_id = monitor.record(f"{prefix} question {thread}-{n}", PASSAGES, k=2)
            with lock:
                ids.append(event_id)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return ids


def settled(stats: Stats) -> int:
    return stats.accepted + stats.duplicate + stats.feedback_sent + stats.rejected + stats.failed


def test_service_stopped_and_restarted_while_the_app_records(
    settings: Settings, server: LiveServer
) -> None:
    monitor = MonitorClient(
        server.url, app="outage", retriever="bm25", max_pending=500, batch_size=20, **FAST
    )
    sent = record_in_threads(monitor, "before", threads=4, each=10)
    assert monitor.flush(60)
    assert monitor.stats().accepted == 40

    server.__exit__(None, None, None)
    during = record_in_threads(monitor, "during", threads=4, each=25)
    # Every call returned with the service down; nothing was lost, everything waits.
    down = monitor.stats()
    assert (down.pending, down.dropped, down.failed) == (100, 0, 0)

    with LiveServer(settings, port=server.port):
        assert monitor.flush(60)
        stats = monitor.close()
    assert stats.retries > 0
    assert (stats.recorded, stats.accepted + stats.duplicate) == (140, 140)
    assert (stats.rejected, stats.failed, stats.dropped, stats.pending) == (0, 0, 0, 0)
    stored = stored_ids(settings, "outage")
    assert len(stored) == 140
    assert sorted(stored) == sorted(sent + during)


def test_a_stalled_service_fills_the_queue_and_a_resent_batch_counts_once(
    settings: Settings, server: LiveServer
) -> None:
    with StallingProxy(server.port) as proxy:
        monitor = MonitorClient(
            proxy.url,
            app="stalled",
            retriever="bm25",
            max_pending=30,
            batch_size=10,
            timeout=1.0,
            **FAST,
        )
        proxy.hold_answers()
        ids = [monitor.record(f"question {n}", PASSAGES) for n in range(100)]
        full = monitor.stats()
        assert (full.recorded, full.pending, full.dropped) == (100, 30, 70)
        # The first batch reached the service and was stored; its answer never came back, so the
        # client times out and sends the same events again.
        wait_for(lambda: stored_ids(settings, "stalled") != [], timeout=30)
        wait_for(lambda: monitor.stats().retries >= 2, timeout=30)
        proxy.release_answers()
        assert monitor.flush(60)
        stats = monitor.close()
    assert stats.duplicate > 0
    assert (stats.accepted + stats.duplicate, stats.dropped, stats.failed) == (30, 70, 0)
    # The 30 the queue kept are the first 30 recorded, each stored once.
    assert sorted(stored_ids(settings, "stalled")) == sorted(ids[:30])


def test_a_rate_limited_tenant_is_retried_after_retry_after(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    from service.store.migrate import upgrade

    upgrade(sqlite_url)
    limited = make_settings(
        tmp_path, sqlite_url, redis_url, tenant_events_per_second=20, tenant_burst_events=10
    )
    with LiveServer(limited) as live:
        monitor = MonitorClient(live.url, app="limited", retriever="bm25", batch_size=10, **FAST)
        ids = [monitor.record(f"question {n}", PASSAGES) for n in range(40)]
        assert monitor.flush(60)
        stats = monitor.close()
    assert stats.retries > 0
    assert (stats.accepted, stats.rejected, stats.failed) == (40, 0, 0)
    assert sorted(stored_ids(limited, "limited")) == sorted(ids)


def test_refused_events_and_feedback_are_reported_and_not_retried(
    settings: Settings, server: LiveServer
) -> None:
    refused: dict[str, str] = {}
    monitor = MonitorClient(
        server.url,
        app="refusals",
        retriever="bm25",
        on_rejected=lambda event_id, reason: refused.__setitem__(event_id, reason),
        **FAST,
    )
    good = monitor.record("what is the return window?", PASSAGES, k=2, gold_passage_ids=["d1"])
    too_deep = monitor.record("k past the passages", PASSAGES, k=9)
    not_json = monitor.record("a NaN score", [{"text": "x", "score": float("nan")}])
    monitor.feedback(good, response_grade=4, answer_correct=True)
    monitor.feedback("never-recorded", answer_correct=False)
    assert monitor.flush(30)
    stats = monitor.close()

    assert set(refused) == {too_deep, not_json, "never-recorded"}
    assert "k must be between 1 and the number of passages" in refused[too_deep]
    assert "not JSON" in refused[not_json]
    assert refused["never-recorded"].startswith("HTTP 404")
    assert (stats.accepted, stats.rejected, stats.feedback_sent, stats.retries) == (1, 3, 1, 0)
    assert stored_ids(settings, "refusals") == [good]
    stored = httpx.get(f"{server.url}/v1/events/{good}").json()
    assert (stored["response_grade"], stored["answer_correct"]) == (4, True)
    assert stored["gold_passage_ids"] == ["d1"]
    # The bare string became a passage of its own, given an id by the service.
    assert [p["id"] for p in stored["passages"]][:2] == ["d1", "d2"]
    assert len(stored["passages"]) == 3


def test_the_asyncio_client_records_on_the_loop_and_awaits_the_flush(
    settings: Settings, server: LiveServer
) -> None:
    async def app() -> tuple[list[str], Stats]:
        async with AsyncMonitorClient(server.url, app="async", retriever="dense", **FAST) as mon:
            ids = [mon.record(f"question {n}", PASSAGES) for n in range(25)]
            assert await mon.flush(30)
            return ids, mon.stats()

    ids, stats = asyncio.run(app())
    assert (stats.accepted, stats.pending) == (25, 0)
    assert sorted(stored_ids(settings, "async")) == sorted(ids)


# --- process edges: each runs an application of its own in a subprocess -------------------------

# An application's view: none of the server's packages or heavy dependencies can be imported.
BLOCKED = ("fastapi", "celery", "sqlmodel", "sqlalchemy", "service", "workers", "redis")
BLOCKER = f"""
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is not installed in this application")
        return None
sys.meta_path.insert(0, Blocked())
"""


def run_app(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as an application outside the repository, with the client installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_client_imports_and_runs_without_the_server_packages(
    settings: Settings, server: LiveServer, tmp_path: Path
) -> None:
    result = run_app(
        f"""
        import json, sys
        from retrieval_monitor_client import MonitorClient
        monitor = MonitorClient({server.url!r}, app="isolated", retriever="bm25")
        monitor.record("a question", ["a passage"])
        assert monitor.flush(30)
        blocked = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
        print(json.dumps({{"accepted": monitor.close().accepted, "loaded": blocked}}))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"accepted": 1, "loaded": []}
    project = tomllib.loads((REPO_ROOT / "client" / "pyproject.toml").read_text())["project"]
    assert [d.split(">")[0] for d in project["dependencies"]] == ["httpx"]


def test_events_recorded_before_exit_are_sent_without_a_close(
    settings: Settings, server: LiveServer, tmp_path: Path
) -> None:
    result = run_app(
        f"""
        from retrieval_monitor_client import MonitorClient
        monitor = MonitorClient({server.url!r}, app="exiting", retriever="bm25", flush_interval=60)
        for n in range(20):
            monitor.record(f"question {{n}}", ["a passage"])
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert len(stored_ids(settings, "exiting")) == 20


def test_a_forked_worker_sends_its_own_events_with_ids_of_its_own(
    settings: Settings, server: LiveServer, tmp_path: Path
) -> None:
    result = run_app(
        f"""
        import json, os, warnings
        from retrieval_monitor_client import MonitorClient
        monitor = MonitorClient({server.url!r}, app="forked", retriever="bm25", flush_interval=0.05)
        parent = [monitor.record(f"parent {{n}}", ["a passage"]) for n in range(5)]
        # Queued but not yet sent at the fork: the parent's to send, not the child's.
        parent += [monitor.record(f"parent late {{n}}", ["a passage"]) for n in range(5)]
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            child = [monitor.record(f"child {{n}}", ["a passage"]) for n in range(7)]
            ok = monitor.flush(30)
            stats = monitor.stats()
            os.write(write, json.dumps({{"ids": child, "ok": ok, "accepted": stats.accepted,
                                         "recorded": stats.recorded}}).encode())
            os._exit(0)
        os.close(write)
        parent += [monitor.record(f"parent after {{n}}", ["a passage"]) for n in range(3)]
        assert monitor.flush(30)
        child = json.loads(os.read(read, 1 << 20))
        assert os.waitpid(pid, 0)[1] == 0
        print(json.dumps({{"parent": parent, "child": child,
                           "accepted": monitor.close().accepted}}))
        """,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    parent, child = found["parent"], found["child"]
    assert found["accepted"] == 13
    assert (child["ok"], child["recorded"], child["accepted"]) == (True, 7, 7)
    prefix = {event_id.rsplit("-", 1)[0] for event_id in parent}
    assert len(prefix) == 1
    assert not {event_id.rsplit("-", 1)[0] for event_id in child["ids"]} & prefix
    assert sorted(stored_ids(settings, "forked")) == sorted(parent + child["ids"])
