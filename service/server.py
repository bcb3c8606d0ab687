"""The HTTP server of ``serve``."""

from __future__ import annotations

from types import FrameType
from typing import Any

import uvicorn

from service.settings import Settings

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
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_config": None,
        "access_log": False,
        "timeout_keep_alive": settings.http_keepalive_seconds,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_SECONDS,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


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
