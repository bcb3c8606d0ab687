"""Memory before identity: slow, inflating, unauthenticated bodies against a real `serve` process.

Dozens of connections send a gzip-encoded, chunked body that inflates to megabytes and never
finish it. The API process's resident memory (from /proc) must stay within the in-flight body
budget plus a margin, requests without a key must be answered 401 before their body is read and
move no metric, and a body that never completes must be answered 408 and closed.

Tests ``service.api.body_limit`` and ``service.auth.gate``.
"""

from __future__ import annotations

import gzip
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.served import Served, serve_with_key

MIB = 1024 * 1024
CONNECTIONS = 40
INFLATED_BYTES = 8 * MIB  # under the body limit: only the budget and the timeout stop it
INFLIGHT_BUDGET = 32 * MIB
BODY_TIMEOUT_SECONDS = 4
# The interpreter's allocator, the parsed event's objects and socket buffers: what the process
# may add beyond the bodies the budget admits.
MARGIN = 48 * MIB

INFLATING_BODY = gzip.compress(b'{"app": "' + b"a" * INFLATED_BYTES)

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")


@pytest.fixture
def served(tmp_path: Path, redis_url: str) -> Iterator[Served]:
    with serve_with_key(
        tmp_path,
        redis_url,
        RM_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT_SECONDS),
        RM_MAX_INFLIGHT_BODY_BYTES=str(INFLIGHT_BUDGET),
    ) as server:
        yield server


def endless_gzip_request(port: int, key: str | None) -> socket.socket:
    """Opens a POST whose chunked gzip body inflates to ``INFLATED_BYTES`` and never ends."""
    inflating = INFLATING_BODY
    sock = socket.create_connection(("127.0.0.1", port))
    head = [
        "POST /v1/events HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Content-Type: application/json",
        "Content-Encoding: gzip",
        "Transfer-Encoding: chunked",
    ]
    if key is not None:
        head.append(f"Authorization: Bearer {key}")
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    # Every compressed byte but no terminating chunk: the server waits for the rest.
    sock.sendall(f"{len(inflating):x}\r\n".encode() + inflating + b"\r\n")
    return sock


def answers(served: Served, sockets: list[socket.socket], timeout: float) -> tuple[list[int], int]:
    """Each connection's answered status (-1: closed without one) and the API's peak RSS seen
    while waiting for them all, sampled as they come in."""
    statuses: dict[socket.socket, int] = {}
    peak = served.rss()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for sock in sockets:
            selector.register(sock, selectors.EVENT_READ)
        while len(statuses) < len(sockets) and time.monotonic() < deadline:
            for ready, _ in selector.select(timeout=0.05):
                answered = ready.fileobj
                assert isinstance(answered, socket.socket)
                try:
                    head = answered.recv(4096)
                except ConnectionResetError:
                    head = b""
                statuses[answered] = (
                    int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else -1
                )
                selector.unregister(answered)
            peak = max(peak, served.rss())
    return [statuses.get(sock, 0) for sock in sockets], peak


def closed(sock: socket.socket, timeout: float) -> bool:
    """True once the server has closed the connection: reads reach end of stream, or the
    connection is reset (a server closing a socket whose received bytes it never read makes the
    kernel send a reset instead of an end of stream, whichever bytes happened to arrive first)."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if sock.recv(65536) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def metrics_text(served: Served) -> str:
    response = httpx.get(
        f"{served.url}/metrics", headers={"Authorization": f"Bearer {served.key}"}, timeout=30
    )
    assert response.status_code == 200
    return response.text


def rejected_and_accepted(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if line.startswith(
            ("retrieval_monitor_events_rejected_total", "retrieval_monitor_events_accepted_total")
        )
    ]


def test_unauthenticated_slow_bodies_are_refused_before_they_are_read(served: Served) -> None:
    metrics_text(served)  # warm: the page's first render builds its caches
    before = served.rss()
    counted_before = rejected_and_accepted(metrics_text(served))
    sockets = [endless_gzip_request(served.port, key=None) for _ in range(CONNECTIONS)]
    try:
        statuses, peak = answers(served, sockets, timeout=60)
        assert statuses == [401] * CONNECTIONS
        # Refused from the headers, and the connection closed rather than left trickling.
        assert all(closed(sock, timeout=30) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()
    print(f"RSS without a key: {before / MIB:.1f} MiB before, peak {peak / MIB:.1f} MiB")
    assert peak - before < MARGIN
    # No identity, so no tenant's counters moved (rejections are counted only after identity).
    assert rejected_and_accepted(metrics_text(served)) == counted_before


def test_slow_bodies_with_a_key_hold_at_most_the_inflight_budget(served: Served) -> None:
    metrics_text(served)
    before = served.rss()
    sockets = [endless_gzip_request(served.port, key=served.key) for _ in range(CONNECTIONS)]
    try:
        # The budget admits a few bodies and answers every other request 503 at once; the
        # admitted ones never finish their body and are answered 408 after the timeout.
        statuses, peak = answers(served, sockets, timeout=60 + 6 * BODY_TIMEOUT_SECONDS)
        assert set(statuses) == {503, 408}, statuses
        assert all(closed(sock, timeout=30) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()
    print(
        f"RSS with a key: {before / MIB:.1f} MiB before, peak {peak / MIB:.1f} MiB; "
        f"{statuses.count(503)} answered 503, {statuses.count(408)} answered 408"
    )
    assert peak - before < INFLIGHT_BUDGET + MARGIN
    # Without the budget, the inflated bodies alone would be far above that bound.
    assert CONNECTIONS * INFLATED_BYTES > 3 * (INFLIGHT_BUDGET + MARGIN)
