"""Start the fake judge server as its own process and drive it from tests.

``running_fake_llm()`` is a context manager for any code; ``fake_llm_server`` (one process per test
session) and ``fake_llm`` (the same process, reset before each test) are pytest fixtures.
"""

from __future__ import annotations

import selectors
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.support.paths import REPO_ROOT

LabelMap = Mapping[tuple[str | None, str | None], int]


class FakeLLM:
    """A handle on a running fake judge server: where to point the client and how to steer it."""

    def __init__(self, url: str, process: subprocess.Popen[str] | None = None) -> None:
        self.url = url
        self.base_url = f"{url}/v1"
        self.process = process
        self._http = httpx.Client(base_url=url, timeout=10.0)

    def set_labels(
        self,
        labels: LabelMap | None = None,
        *,
        default_grade: int = 0,
        contexts: Mapping[str | None, int] | None = None,
    ) -> None:
        """Grades by ``(query, passage)``; ``None`` in either place matches any query / passage.

        The most specific label wins: (query, passage), then (any, passage), then (query, any),
        then ``default_grade``. ``contexts`` maps a query (or ``None`` for all) to its context
        rating; without one the rating follows the best top-k grade.
        """
        payload = {
            "labels": [
                {"query": q, "passage": p, "grade": g} for (q, p), g in (labels or {}).items()
            ],
            "default_grade": default_grade,
            "contexts": [{"query": q, "rating": r} for q, r in (contexts or {}).items()],
        }
        self._post("/_control/labels", payload)

    def set_fault(
        self,
        mode: str,
        *,
        count: int | None = None,
        retry_after: float = 1.0,
        delay: float = 1.0,
    ) -> None:
        """Spoil the next ``count`` calls (all of them when ``None``) in the given mode."""
        payload = {"mode": mode, "count": count, "retry_after": retry_after, "delay": delay}
        self._post("/_control/faults", payload)

    def hold(self, at_most: float = 300.0) -> None:
        """Every call from now on waits until ``release`` (or ``at_most`` seconds) to answer:
        a test holds the judge call to act while it is in flight."""
        self.set_fault("held", count=None, delay=at_most)

    def release(self) -> None:
        self._post("/_control/release", {})

    def reset(self) -> None:
        self._post("/_control/reset", {})

    def stats(self) -> dict[str, Any]:
        response = self._http.get("/_stats")
        response.raise_for_status()
        stats: dict[str, Any] = response.json()
        return stats

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, payload: dict[str, Any]) -> None:
        self._http.post(path, json=payload).raise_for_status()


def _read_announced_url(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise RuntimeError(f"fake LLM server did not start within {timeout} s")
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        raise RuntimeError(f"fake LLM server failed to start (exit {process.poll()}): {line!r}")
    return line.removeprefix("listening on ")


def _wait_until_answering(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(f"{url}/_stats", timeout=1.0).raise_for_status()
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def running_fake_llm(start_timeout: float = 15.0) -> Iterator[FakeLLM]:
    """Run the server on a free loopback port for the duration of the block."""
    # Port 0 and reading the port back avoids the race of picking a port and binding it later.
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fake_llm.server", "--port", "0"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    fake: FakeLLM | None = None
    try:
        url = _read_announced_url(process, start_timeout)
        _wait_until_answering(url, start_timeout)
        fake = FakeLLM(url, process)
        yield fake
    finally:
        if fake is not None:
            fake.close()
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="session")
def fake_llm_server() -> Iterator[FakeLLM]:
    """One fake judge process for the whole session (worker processes can keep its URL)."""
    with running_fake_llm() as fake:
        yield fake


@pytest.fixture
def fake_llm(fake_llm_server: FakeLLM) -> FakeLLM:
    """The session's fake judge with no labels, no fault and zeroed statistics."""
    fake_llm_server.reset()
    return fake_llm_server
