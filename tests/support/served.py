"""A real `serve` process (SQLite, the test Redis, API keys required) with one key, and its
memory read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from service.auth.keys import key_hash, new_key
from service.primitives.clock import utcnow
from service.process.embedded import free_port
from service.store import keys as keys_repository
from service.store.engine import make_engine, session_scope
from service.store.migrate import upgrade
from tests.support.paths import REPO_ROOT


@dataclass
class Served:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    key: str
    log: Path

    def rss(self) -> int:
        """Resident bytes now."""
        return self._status_bytes("VmRSS:")

    def peak_rss(self) -> int:
        """The most resident bytes since start or since the last ``reset_peak``."""
        return self._status_bytes("VmHWM:")

    def reset_peak(self) -> None:
        # Writing 5 to clear_refs resets the peak resident set to the current one (Linux 4.0+).
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def _status_bytes(self, field: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field}")


@contextmanager
def serve_with_key(
    tmp_path: Path, redis_url: str, database_url: str | None = None, **environment: str
) -> Iterator[Served]:
    """`serve --no-worker` with keys required and one key for tenant acme, on ``database_url``
    (a fresh SQLite database when None); ``environment`` adds RM_ settings."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    database_url = database_url or f"sqlite:///{tmp_path / 'rm.db'}"
    upgrade(database_url)
    key = new_key()
    engine = make_engine(database_url)
    with session_scope(engine) as session:
        keys_repository.add_key(session, "acme", key_hash(key), "", True, utcnow())
        session.commit()
    engine.dispose()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
    env.update(
        {
            "RM_DATABASE_URL": database_url,
            "RM_REDIS_URL": redis_url,
            "RM_DATA_DIR": str(tmp_path / "var"),
            "RM_AUTH_REQUIRED": "true",
            "RM_LOG_JSON": "false",
            "PYTHONPATH": str(REPO_ROOT),
            **environment,
        }
    )
    log_path = tmp_path / "serve.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--no-worker", "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "serve did not come up"
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    try:
        yield Served(url, port, process, key, log_path)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
