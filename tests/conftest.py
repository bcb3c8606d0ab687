"""Shared fixtures: the real Redis, PostgreSQL, an API app, a Celery worker process.

Redis and PostgreSQL are the servers on this machine (127.0.0.1:6379 and :5432); override them with
RM_TEST_REDIS_URL and RM_TEST_POSTGRES_URL. Tests use Redis database 15 and a database of their
own in PostgreSQL, so nothing else on those servers is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.api.app import create_app
from service.kernel.settings import Settings
from service.store.migrate import upgrade
from tests.paths import REPO_ROOT

# The OpenAI-compatible test server's fixtures: fake_llm_server (per session), fake_llm.
pytest_plugins = ["tests.fake_llm.fixture"]

if TYPE_CHECKING:
    from tests.fake_llm.fixture import FakeLLM

REDIS_URL = os.environ.get("RM_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
POSTGRES_ADMIN_URL = os.environ.get(
    "RM_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


# Skips that stay skips in CI: opt-in outputs and checks of a platform detail, which no missing
# install can explain. Every other skip there means a prerequisite the test command should have
# provided (a tool, a data set, a server, root namespaces) and fails the run instead.
SKIPS_ALLOWED_IN_CI = (
    "set RM_UI_SCREENSHOTS_DIR",  # writes the docs' screenshots when asked to
    "numpy's BLAS is not an OpenBLAS",  # the thread-count check needs OpenBLAS's own API
)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """In CI, a skip outside ``SKIPS_ALLOWED_IN_CI`` is a failure: it hides a missing part."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(allowed in reason for allowed in SKIPS_ALLOWED_IN_CI):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI (CI={os.environ.get('CI')}), which needs it to run: {reason}"


@pytest.fixture
def redis_url() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"no Redis at {REDIS_URL} ({exc}); .ci/run starts one")
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'rm.db'}"


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped afterwards."""
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"rm_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # no server: a skip, which fails in CI (pytest_runtest_makereport)
        pytest.skip(f"no PostgreSQL at {POSTGRES_ADMIN_URL}: {exc}")
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with admin.connect() as conn:
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :name AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        )
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


@pytest.fixture
def postgres_url(postgres_server_url: str) -> str:
    """The session's PostgreSQL database, migrated and emptied for each test."""
    upgrade(postgres_server_url)
    engine = create_engine(postgres_server_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE events, passages, passage_texts, judgments, judge_runs, label_cache, "
                "scores, local_judge_calibrations CASCADE"
            )
        )
    engine.dispose()
    return postgres_server_url


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The test runs on both stores: a migrated SQLite file, then the PostgreSQL database."""
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    url = f"sqlite:///{tmp_path / 'rm.db'}"
    upgrade(url)
    return url


def make_settings(tmp_path: Path, database_url: str, redis_url: str, **extra: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "redis_url": redis_url,
        "data_dir": str(tmp_path / "var"),
        "queue_name": f"judge-test-{uuid.uuid4().hex[:8]}",
        "log_json": False,
    }
    values.update(extra)
    return Settings.model_validate(values)


@pytest.fixture
def settings(tmp_path: Path, sqlite_url: str, redis_url: str) -> Settings:
    upgrade(sqlite_url)
    return make_settings(tmp_path, sqlite_url, redis_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes another process see these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
    for name, value in settings.model_dump(mode="json").items():
        if isinstance(value, list | tuple | dict):
            import json

            env[f"RM_{name.upper()}"] = json.dumps(value)
        elif value is not None:
            env[f"RM_{name.upper()}"] = str(value)
    env["RM_JUDGE_API_KEY"] = settings.judge_api_key.get_secret_value()
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


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


@pytest.fixture
def worker_factory(tmp_path: Path) -> Iterator[WorkerFactory]:
    factory = WorkerFactory(tmp_path)
    yield factory
    factory.stop_all()


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
        import threading

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


@pytest.fixture
def fake_judged(tmp_path: Path, sqlite_url: str, redis_url: str, fake_llm: FakeLLM) -> FakeJudged:
    """Settings for a migrated SQLite store judged by the fake LLM, on the test Redis or on
    ``redis``; keyword arguments set any other setting."""
    upgrade(sqlite_url)

    def make(*, redis: str | None = None, **extra: object) -> Settings:
        return make_settings(
            tmp_path, sqlite_url, redis or redis_url, judge_base_url=fake_llm.base_url, **extra
        )

    return make


@pytest.fixture
def llm_settings(tmp_path: Path, sqlite_url: str, redis_url: str, fake_llm: FakeLLM) -> Settings:
    upgrade(sqlite_url)
    return make_settings(
        tmp_path,
        sqlite_url,
        redis_url,
        judge_base_url=fake_llm.base_url,
        judge_model="fake-judge",
        judge_max_retries=3,
        judge_timeout_seconds=5,
    )


@pytest.fixture
def running(llm_settings: Settings, worker_factory: WorkerFactory) -> Iterator[TestClient]:
    worker_factory(llm_settings).start()
    with TestClient(create_app(llm_settings)) as client:
        yield client


@contextmanager
def private_redis(tmp_path: Path, *config: str) -> Iterator[str]:
    """A redis-server of the test's own (extra ``config`` flags), for faults that must not touch
    the shared one: restarts, flushes, eviction policies. Yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    from service.process.embedded import free_port

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
