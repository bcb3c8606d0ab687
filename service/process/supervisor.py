"""``serve``'s processes: the embedded Redis when no Redis is configured, the schema brought up
to date, a worker with the sweeper, the guard that stops them if ``serve`` dies, and the API (in
this process, or several processes on one port); everything started here stops with it."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from service.config.settings import Settings
from service.process.embedded import EmbeddedRedis
from service.process.orphan_guard import start_guard
from service.process.worker import WorkerProcess

log = logging.getLogger("retrieval_monitor")


@dataclass(frozen=True)
class Demo:
    """A generated workload replayed once the API is up (one API process only)."""

    queries: int
    exit_after: bool  # stop serving once the demo's events are judged


@dataclass(frozen=True)
class ServePlan:
    api_workers: int
    with_worker: bool
    demo: Demo | None = None
    log_file: Path | None = None  # where the logs go instead of the console (the demo's)


def serve(settings: Settings, plan: ServePlan) -> None:
    """Run until the API stops, then stop every process started for it."""
    from service.store.migrate import upgrade

    embedded: EmbeddedRedis | None = None
    if not settings.redis_url:
        embedded = EmbeddedRedis.start(Path(settings.data_dir) / "redis")
        settings = settings.model_copy(update={"redis_url": embedded.url})
        log.info("embedded Redis started", extra={"url": embedded.url, "pid": embedded.pid})
    upgrade(settings.database_url)

    worker: WorkerProcess | None = None
    if plan.with_worker:
        worker = WorkerProcess.start(settings, plan.log_file)
        log.info("worker started", extra={"pid": worker.pid})
    guard = start_guard([p.pid for p in (worker, embedded) if p is not None and p.pid])

    try:
        if plan.api_workers > 1:
            _serve_processes(settings, plan.api_workers)
        else:
            _serve_in_process(settings, plan.demo, plan.log_file)
    finally:
        if worker is not None:
            worker.stop()
        if embedded is not None:
            embedded.stop()
        if guard is not None:
            guard.terminate()


def _serve_in_process(settings: Settings, demo: Demo | None, log_file: Path | None) -> None:
    from service.api.app import create_app
    from service.process.server import Server, server_config

    server = Server(server_config(create_app(settings), settings))
    if demo is not None:
        threading.Thread(
            target=_run_demo, args=(settings, server, demo, log_file), daemon=True
        ).start()
    server.run()


def _serve_processes(settings: Settings, workers: int) -> None:
    from service.process.server import run_workers
    from service.telemetry.rebuild import ensure_aggregates
    from service.wiring.runtime import Runtime

    # The API processes build their settings from the environment: what serve decided goes there.
    os.environ.update(
        {
            "RM_REDIS_URL": settings.redis_url,
            "RM_HOST": settings.host,
            "RM_PORT": str(settings.port),
        }
    )
    # Rebuilt once, before any process takes traffic: a process that is still rebuilding while
    # another one already counts would see those events in the database and count them again.
    runtime = Runtime(settings)
    try:
        ensure_aggregates(runtime)
    except Exception:  # Redis or the database down at start: /metrics retries on scrape
        log.warning("shared aggregates not checked at startup", exc_info=True)
    finally:
        runtime.engine.dispose()
    log.info("starting API processes", extra={"workers": workers, "port": settings.port})
    run_workers(settings, workers)


def _run_demo(settings: Settings, server: object, demo: Demo, log_file: Path | None) -> None:
    from service.process.demo import run_demo

    ok = run_demo(settings, demo.queries, log_file)
    if demo.exit_after:
        setattr(server, "should_exit", True)  # noqa: B010 - uvicorn's documented stop flag
        if not ok:
            os._exit(1)
