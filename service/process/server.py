"""The HTTP server of ``serve``: one process, or several API processes on one socket.

With ``--workers N`` (``RM_API_WORKERS``) the ``serve`` process binds the port once and uvicorn's
supervisor runs N processes that accept on it, restarting any that dies. Each builds its own
application from the environment (``worker_app``). Everything a count or a limit depends on is
shared through the database and Redis; what stays per process is listed in docs/scaling.md.
"""

from __future__ import annotations

import os
from types import FrameType
from typing import Any

import uvicorn

from service.config.settings import Settings, get_settings

# uvicorn imports the application of each API process by this name.
WORKER_APP = "service.process.server:worker_app"
WORKER_HEALTHCHECK_SECONDS = 60

# uvicorn drains open requests this long after SIGTERM (the compose file and the chart's grace
# period are sized for it).
GRACEFUL_SHUTDOWN_SECONDS = 10


def server_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration for the API, shared by ``serve`` and the tests' live server.

    uvicorn closes an idle keep-alive connection after 5 s by default. A client that sends its
    next request as the timer fires, or whose request arrives while the event loop is busy
    (uvloop runs due timers before reading sockets), gets a connection reset for a POST it
    cannot safely know the fate of; ``http_keepalive_seconds`` makes that window rare.
    """
    return uvicorn.Config(app, **server_options(settings, **overrides))


def server_options(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """uvicorn's options for the API (see ``server_config``)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_config": None,
        "access_log": False,
        "timeout_keep_alive": settings.http_keepalive_seconds,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_SECONDS,
    }
    options.update(overrides)
    return options


def run_workers(settings: Settings, workers: int) -> None:
    """Serve with ``workers`` API processes until SIGTERM/SIGINT, then return.

    The processes read their settings from the environment, so ``serve`` puts what it decided
    there (the embedded Redis's URL) before calling this. uvicorn's supervisor stops them with
    SIGTERM, each draining its requests and committing what its group commit holds.
    """
    uvicorn.run(
        WORKER_APP,
        factory=True,
        workers=workers,
        # uvicorn replaces a process that does not answer its ping within this time. A new
        # process imports the whole service before it can answer, several seconds on a busy
        # machine: uvicorn's 5 s default kept killing processes that were still starting.
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
        **server_options(settings),
    )


def worker_app() -> Any:
    """The application of one API process started by ``run_workers``."""
    from service.api.app import create_app
    from service.process import logs
    from service.process.orphan_guard import exit_with_parent

    settings = get_settings()
    logs.configure(settings.log_level, settings.log_json)
    # A SIGKILL of serve reaches neither uvicorn's supervisor nor these processes: each stops
    # itself once its parent is gone, rather than keep serving on the inherited socket.
    exit_with_parent(os.getppid())
    return create_app(settings)


class Server(uvicorn.Server):
    """uvicorn's server, stopping gracefully on SIGTERM/SIGINT but then returning.

    uvicorn re-raises the signal after its shutdown; when the API is not PID 1 that kills the
    process before ``serve`` can stop the worker and the embedded Redis it started.
    """

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()
