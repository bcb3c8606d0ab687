"""Live processes a test starts and waits on: Celery workers, a served API, a private
redis-server, and waiting for a condition or an event's status."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from service.api.app import create_app
from service.config.settings import Settings
from service.process.embedded import free_port
from service.store.models import Event
from service.telemetry.aggregates import DONE_PREFIX
from service.telemetry.judged_export import done_key
from service.wiring.runtime import Runtime
from tests.support.environment import settings_env
from tests.support.paths import REPO_ROOT


class WorkerProcess:
    """A real Celery worker process judging from the test's queue."""

    def __init__(
        self,
        settings: Settings,
        log_path: Path,
        concurrency: int = 1,
        with_scheduler: bool = False,
    ) -> None:
        self.settings = settings
        self.log_path = log_path
        self.concurrency = concurrency
        self.with_scheduler = with_scheduler
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        from service.process.worker import worker_command

        command = worker_command(self.concurrency, self.with_scheduler, self.settings)
        self.log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            command,
            env=settings_env(self.settings),
            cwd=REPO_ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a test can kill it whole
        )
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log_path.read_text()[-3000:]}")
            if "ready." in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"worker not ready: {self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes at once, as an OOM kill or a node loss."""
        import signal

        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.log.close()

    def stop(self, sig: int = 15) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def processes_that_judged(workers: list[WorkerProcess]) -> set[tuple[str, str]]:
    """(worker log, pool process) pairs whose judge tasks called the judge or met the budget:
    which processes really took part, read from the workers' own task logs."""
    found: set[tuple[str, str]] = set()
    for worker in workers:
        for line in worker.log_path.read_text(errors="replace").splitlines():
            if "Task judge.events[" not in line or "succeeded" not in line:
                continue
            if "'judged'" in line or "'over_budget'" in line:
                process = line.split("/", 1)[1].split("]", 1)[0]
                found.add((worker.log_path.name, process))
    return found


class WorkerFactory:
    """Starts worker processes for a test and stops them all when it ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[WorkerProcess] = []

    def __call__(
        self, settings: Settings, concurrency: int = 1, with_scheduler: bool = False
    ) -> WorkerProcess:
        worker = WorkerProcess(
            settings,
            self.log_dir / f"worker-{len(self.started)}.log",
            concurrency,
            with_scheduler,
        )
        self.started.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in self.started:
            worker.stop()


def wait_for(predicate: object, timeout: float = 60.0, interval: float = 0.2) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def wait_while_progressing(
    count: Callable[[], int],
    target: int,
    stall_seconds: float = 120.0,
    interval: float = 1.0,
    limit_seconds: float = 3600.0,
) -> None:
    """Wait until ``count()`` reaches ``target``, for as long as it keeps moving: the wait fails
    once the count has stood still for ``stall_seconds`` (work left behind, not a slow machine),
    or past ``limit_seconds`` in all."""
    started = last_move = time.monotonic()
    last = count()
    while last < target:
        time.sleep(interval)
        now, current = time.monotonic(), count()
        if current != last:
            last, last_move = current, now
        elif now - last_move >= stall_seconds:
            raise AssertionError(f"stuck at {current} of {target} for {stall_seconds:g}s")
        if now - started >= limit_seconds:
            raise AssertionError(f"{current} of {target} after {limit_seconds:g}s")


def http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


PYTHON = sys.executable


class LiveServer:
    """The real app served over HTTP by uvicorn in a background thread."""

    def __init__(self, settings: Settings, port: int | None = None) -> None:
        """On ``port`` when given: a server started again where its clients expect it."""

        import uvicorn

        from service.process.embedded import free_port
        from service.process.server import server_config

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # The served configuration (keep-alive and all), on a free loopback port.
        self.server = uvicorn.Server(
            server_config(
                create_app(settings),
                settings,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        wait_for(lambda: http_ok(f"{self.url}/healthz"), timeout=30)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class FakeJudged(Protocol):
    def __call__(self, *, redis: str | None = None, **extra: object) -> Settings: ...


@contextmanager
def private_redis(tmp_path: Path, *config: str) -> Iterator[str]:
    """A redis-server of the test's own (extra ``config`` flags), for faults that must not touch
    the shared one: restarts, flushes, eviction policies. Yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")

    port = free_port()
    command = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--dir",
        str(tmp_path),
        *config,
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"

    def pings() -> bool:
        try:
            return bool(redis.Redis.from_url(url).ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(pings, timeout=10)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def wait_status(
    client: TestClient,
    event_id: str,
    status: str = "judged",
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The event once it has ``status``; for "judged", also once its judging is exported.

    A worker commits the judged status before it adds the event to the shared aggregates, so a
    test that reads ``/metrics`` right after the status could see the export not yet made. The
    export sets a once-only marker in Redis in the same atomic step as its increments: waiting
    for the marker waits for the export itself, however slow the machine."""

    def done() -> bool:
        view = client.get(f"/v1/events/{event_id}", headers=headers).json()
        return bool(view["status"] == status)

    wait_for(done, timeout=120)
    body: dict[str, Any] = client.get(f"/v1/events/{event_id}", headers=headers).json()
    if status == "judged":
        runtime = _runtime(client)
        marker = _export_marker(runtime, event_id, body["judge"], body["prompt_version"])
        wait_for(lambda: bool(runtime.redis.exists(marker)), timeout=120)
    return body


def _runtime(client: TestClient) -> Runtime:
    runtime: Runtime = client.app.state.rm.runtime  # type: ignore[attr-defined]
    return runtime


def _export_marker(runtime: Runtime, event_id: str, judge: str, prompt_version: str) -> str:
    """The Redis key of the judged event's once-only export marker."""
    with Session(runtime.engine) as session:
        pks = session.exec(select(Event.id).where(Event.event_id == event_id)).all()
    # The event's view does not name its tenant, so the id must name one stored event: a test
    # that stores one id under several tenants fails here rather than wait on another's marker.
    assert len(pks) == 1, f"{len(pks)} stored events have the id {event_id!r}"
    pk = pks[0]
    assert pk is not None
    return DONE_PREFIX + done_key(pk, judge, prompt_version)


class ApiProcess:
    def __init__(self, settings: Settings, port: int, log: Path) -> None:
        self.settings, self.port, self.log_path = settings, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ApiProcess:
        self.log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--no-worker", "--port", str(self.port)],
            env=settings_env(self.settings),
            cwd=REPO_ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: http_ok(f"{self.url}/readyz"), timeout=60)
        return self

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.log.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.log.close()
