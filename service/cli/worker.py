"""``retrieval-monitor worker`` and ``scheduler``: this process becomes a Celery worker or the
Celery beat that runs the periodic jobs."""

from __future__ import annotations

import argparse
import os
import sys

from service.config.settings import Settings
from service.process.worker import scheduler_command, worker_command


def add_worker_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    worker = sub.add_parser(
        "worker",
        help="run a judge worker (needs RM_REDIS_URL)",
        description="Run a Celery worker that judges events. Needs RM_REDIS_URL.",
    )
    worker.add_argument("--concurrency", type=int, help="worker processes (RM_WORKER_CONCURRENCY)")
    worker.add_argument(
        "--with-scheduler", action="store_true", help="also run the periodic sweeper in-process"
    )
    worker.set_defaults(handler=cmd_worker)

    scheduler = sub.add_parser(
        "scheduler",
        help="run the periodic jobs (the pending-event sweeper); exactly one per deployment",
    )
    scheduler.set_defaults(handler=cmd_scheduler)


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.redis_url:
        print(
            "retrieval-monitor worker: set RM_REDIS_URL to the Redis of the aggregates "
            "(and RM_BROKER_URL if the judge queue runs elsewhere)",
            file=sys.stderr,
        )
        return 2
    concurrency = args.concurrency or settings.worker_concurrency
    command = worker_command(concurrency, args.with_scheduler, settings)
    os.execvp(command[0], command)
    return 0  # pragma: no cover - execvp does not return


def cmd_scheduler(_args: argparse.Namespace, settings: Settings) -> int:
    if not settings.redis_url:
        print("retrieval-monitor scheduler: set RM_REDIS_URL", file=sys.stderr)
        return 2
    command = scheduler_command(settings)
    os.execvp(command[0], command)
    return 0  # pragma: no cover
