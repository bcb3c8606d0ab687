"""The HTTP server of ``serve``."""

from __future__ import annotations

from types import FrameType

import uvicorn


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
