"""`serve` killed with SIGKILL leaves no embedded redis-server behind.

Tests ``service.process.orphan_guard``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from service.process.embedded import free_port
from service.process.orphan_guard import alive
from tests.support.paths import REPO_ROOT


def embedded_redis_pid(log: Path) -> int | None:
    for line in log.read_text(errors="replace").splitlines():
        if "embedded Redis started" in line:
            return int(json.loads(line)["pid"])
    return None


def test_the_embedded_redis_does_not_outlive_a_killed_serve(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
    env.update(
        {
            "RM_DATA_DIR": str(tmp_path / "var"),
            "RM_DATABASE_URL": f"sqlite:///{tmp_path / 'rm.db'}",
            "RM_LOG_JSON": "true",
            "PYTHONPATH": str(REPO_ROOT),
        }
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--no-worker", "--port", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    redis_pid: int | None = None
    try:
        deadline = time.monotonic() + 90
        while True:
            assert serve.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            redis_pid = redis_pid or embedded_redis_pid(log)
            try:
                up = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                up = False
            if up and redis_pid:
                break
            time.sleep(0.2)
        assert alive(redis_pid)

        serve.send_signal(signal.SIGKILL)
        serve.wait(timeout=10)
        deadline = time.monotonic() + 30
        while alive(redis_pid):
            assert time.monotonic() < deadline, "the embedded redis-server outlived serve"
            time.sleep(0.1)
    finally:
        if serve.poll() is None:
            serve.kill()
        if redis_pid and alive(redis_pid):
            os.kill(redis_pid, signal.SIGKILL)
