"""The demo's log split: which lines open a record at which level, and what the tee shows."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from service.process.logs import LogTee, record_level

WORKER_OUTPUT = """\
[2026-12-01 11:04:41,781: INFO/Beat] beat: Starting...
[2026-12-01 11:04:42,071: INFO/MainProcess] Task judge.events[d764fce9] received
[2026-12-01 11:04:43,001: ERROR/ForkPoolWorker-2] Task judge.events[d764fce9] raised
Traceback (most recent call last):
  File "workers/tasks.py", line 1, in judge
ValueError: boom
[2026-12-01 11:04:44,459: INFO/ForkPoolWorker-2] Task judge.events[e1] succeeded in 8.3s
"""


@pytest.mark.parametrize(
    ("line", "level"),
    [
        ("[2026-12-01 11:04:41,781: INFO/Beat] beat: Starting...", logging.INFO),
        ("[2026-12-01 11:04:41,781: WARNING/MainProcess] slow", logging.WARNING),
        ("2026-12-01 11:04:28,055 INFO retrieval_monitor: worker started", logging.INFO),
        ('{"ts": "2026-12-01T11:04:28", "level": "error", "logger": "x"}', logging.ERROR),
        ("/venv/celery/platforms.py:893: SecurityWarning: You're running as root", logging.WARNING),
        ('  File "workers/tasks.py", line 1, in judge', None),
        (" -------------- celery@host v5.7.0 (collider)", None),
    ],
)
def test_record_level(line: str, level: int | None) -> None:
    assert record_level(line) == level


def test_the_tee_keeps_everything_in_the_file_and_shows_errors_with_their_traceback(
    tmp_path: Path,
) -> None:
    log_file = tmp_path / "serve.log"
    log_file.write_text("already there\n")
    console = io.StringIO()
    tee = LogTee(io.BytesIO(WORKER_OUTPUT.encode()), log_file, console).start()
    tee.join(timeout=10)
    assert log_file.read_text() == "already there\n" + WORKER_OUTPUT
    assert console.getvalue().splitlines() == WORKER_OUTPUT.splitlines()[2:6]
