"""The Celery processes' command lines (a judge worker, the periodic scheduler) and the worker
that ``serve`` starts beside the API and stops with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from service.config.settings import Settings
from service.process import logs
from service.queue.names import urgent_queue

# SIGTERM lets Celery finish (or, with acks_late, requeue) the task in hand; then it is killed.
STOP_TIMEOUT_SECONDS = 30


def worker_command(concurrency: int, with_scheduler: bool, settings: Settings) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app",
        "worker",
        "--concurrency",
        str(concurrency),
        "--queues",
        # The urgent queue first: gold events and events whose signals look bad.
        f"{urgent_queue(settings.queue_name)},{settings.queue_name}",
        "--loglevel",
        settings.log_level,
        "--without-gossip",
        "--without-mingle",
    ]
    if with_scheduler:
        command += ["--beat", "--schedule", str(beat_schedule(settings))]
    return command


def scheduler_command(settings: Settings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app",
        "beat",
        "--schedule",
        str(beat_schedule(settings)),
        "--loglevel",
        settings.log_level,
    ]


def beat_schedule(settings: Settings) -> Path:
    """Celery beat's schedule file, in the data folder (created): the one place beat writes."""
    schedule = Path(settings.data_dir) / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    return schedule


def quiet(command: list[str]) -> list[str]:
    """The Celery command without its start-up banner (``-q`` goes before the subcommand)."""
    at = command.index("worker")
    return [*command[:at], "--quiet", *command[at:]]


@dataclass
class WorkerProcess:
    """A worker with the periodic sweeper, as a child of ``serve``; with a log file, its output
    goes there and only its warnings reach the console."""

    process: subprocess.Popen[bytes]
    tee: logs.LogTee | None = None

    @classmethod
    def start(cls, settings: Settings, log_file: Path | None) -> WorkerProcess:
        env = {**os.environ, "RM_REDIS_URL": settings.redis_url}
        env["RM_DATABASE_URL"] = settings.database_url
        command = worker_command(settings.worker_concurrency, True, settings)
        if log_file is None:
            return cls(subprocess.Popen(command, env=env))
        process = subprocess.Popen(
            quiet(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert process.stdout is not None
        return cls(process, logs.LogTee(process.stdout, log_file, sys.stderr).start())

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
        if self.tee is not None:
            self.tee.join(timeout=5)
