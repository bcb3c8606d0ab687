"""The served HTTP configuration: how long an idle keep-alive connection stays open.

A client's pooled connection that the server closes as the client reuses it turns a POST into a
connection reset; the server must keep idle connections longer than clients keep them pooled.

Tests ``service.process.server``.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from service.config.settings import Settings
from service.store.migrate import upgrade
from tests.support.environment import make_settings
from tests.support.live import LiveServer

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"


def closed_after_idle(port: int, idle_seconds: float) -> bool:
    """One request on a raw connection, then idle; whether the server closed it meanwhile."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(REQUEST)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
        time.sleep(idle_seconds)
        conn.setblocking(False)
        try:
            # Empty bytes: the server closed its side. No data yet: the connection is open.
            return conn.recv(4096, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False


@pytest.mark.parametrize(("keepalive", "closed"), [(0.5, True), (4.0, False)])
def test_idle_connections_stay_open_for_the_configured_keepalive(
    tmp_path: Path, sqlite_url: str, redis_url: str, keepalive: float, closed: bool
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, http_keepalive_seconds=keepalive)
    with LiveServer(settings) as server:
        assert closed_after_idle(server.port, idle_seconds=2.0) is closed


def test_default_keepalive_outlasts_common_client_pools() -> None:
    # httpx keeps idle pooled connections 5 s, urllib3 until the server closes them, and cloud
    # load balancers 60 s by default: the server's side must be the longer one.
    assert Settings().http_keepalive_seconds > 60
