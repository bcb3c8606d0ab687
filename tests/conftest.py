"""Shared fixtures: the real Redis, PostgreSQL, RabbitMQ, an API app, a Celery worker process.

Redis, PostgreSQL and RabbitMQ are the servers on this machine (127.0.0.1:6379, :5432 and :5672);
override them with RM_TEST_REDIS_URL, RM_TEST_POSTGRES_URL and RM_TEST_RABBITMQ_URL. Tests use
Redis database 15, a database of their own in PostgreSQL and a virtual host of their own in
RabbitMQ, so nothing else on those servers is touched.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.api.app import create_app
from service.config.settings import Settings
from service.store.migrate import upgrade
from service.store.partitions import schema_tables
from tests.support.brokers import RABBITMQ_URL, answers, session_vhost
from tests.support.environment import POSTGRES_ADMIN_URL, REDIS_URL, in_ci, make_settings
from tests.support.live import (
    FakeJudged,
    WorkerFactory,
)

# The OpenAI-compatible test server's fixtures: fake_llm_server (per session), fake_llm.
pytest_plugins = ["tests.support.fake_llm.fixture"]

if TYPE_CHECKING:
    from tests.support.fake_llm.fixture import FakeLLM


# Skips that stay skips in CI: opt-in outputs and checks of a platform detail, which no missing
# install can explain. Every other skip there means a prerequisite the test command should have
# provided (a tool, a data set, a server, root namespaces) and fails the run instead.
SKIPS_ALLOWED_IN_CI = (
    "set RM_UI_SCREENSHOTS_DIR",  # writes the docs' screenshots when asked to
    "numpy's BLAS is not an OpenBLAS",  # the thread-count check needs OpenBLAS's own API
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With RM_TEST_SHUFFLE_SEED set, the tests run in an order drawn from that seed: a test
    that passes only after (or before) another shows up in a run with another order."""
    seed = os.environ.get("RM_TEST_SHUFFLE_SEED")
    if seed:
        random.Random(int(seed)).shuffle(items)
        print(f"tests shuffled with RM_TEST_SHUFFLE_SEED={seed}")


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


@pytest.fixture(scope="session")
def rabbitmq_server_url() -> Iterator[str]:
    """RabbitMQ, on a virtual host of this test session's own."""
    if not answers(RABBITMQ_URL):  # a skip, which fails in CI (pytest_runtest_makereport)
        pytest.skip(f"no RabbitMQ at {RABBITMQ_URL}; .ci/run starts one")
    with session_vhost(RABBITMQ_URL) as url:
        yield url


@pytest.fixture(params=["redis", "rabbitmq"])
def broker_url(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    """The judge queue's broker (RM_BROKER_URL): the test's Redis itself, then RabbitMQ; a test
    may also ask (indirectly) for "redis-apart", another database of the test's Redis server,
    which the service treats as another Redis."""
    if request.param == "rabbitmq":
        yield request.getfixturevalue("rabbitmq_server_url")
        return
    if request.param == "redis":
        yield redis_url
        return
    index = int(redis_url.rsplit("/", 1)[1])
    apart = f"{redis_url.rsplit('/', 1)[0]}/{index - 1 if index else 1}"
    client = redis.Redis.from_url(apart)
    client.flushdb()
    yield apart
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
    """The session's PostgreSQL database, migrated and emptied for each test: every table of
    the schema (read from the models, so a table added later is emptied too), whatever an
    earlier test left in it, in whatever order the tests run."""
    upgrade(postgres_server_url)
    tables = ", ".join(f'"{table.name}"' for table in schema_tables("postgresql"))
    engine = create_engine(postgres_server_url)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
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


@pytest.fixture
def settings(tmp_path: Path, sqlite_url: str, redis_url: str) -> Settings:
    upgrade(sqlite_url)
    return make_settings(tmp_path, sqlite_url, redis_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def worker_factory(tmp_path: Path) -> Iterator[WorkerFactory]:
    factory = WorkerFactory(tmp_path)
    yield factory
    factory.stop_all()


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
