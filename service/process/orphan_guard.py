"""Stops the processes ``serve`` started when ``serve`` itself dies without cleaning up.

``serve`` stops its worker and the embedded redis-server on a normal exit or SIGTERM, but a
SIGKILL (or an OOM kill) gives it no chance, and the redis-server daemonizes, so nothing would
stop it. This small process watches its parent: once the parent is gone (it is re-parented), it
sends SIGTERM to every process it was given, then SIGKILL to those still running.

Run as ``python -m service.process.orphan_guard <parent pid> <pid>...``.

The API processes of ``serve --workers N`` are started and restarted by uvicorn's supervisor, so
their ids are not known up front: each watches its own parent instead (``exit_with_parent``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

POLL_SECONDS = 0.5
GRACE_SECONDS = 10.0


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(pids: Sequence[int], grace_seconds: float = GRACE_SECONDS) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def watch(parent: int, pids: Sequence[int]) -> None:
    # A SIGTERM sent to serve's process group reaches this process too: serve then stops the
    # processes itself, and this one must not race it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while os.getppid() == parent:
        time.sleep(POLL_SECONDS)
    stop([pid for pid in pids if alive(pid)])


def exit_with_parent(parent: int, grace_seconds: float = GRACE_SECONDS * 3) -> threading.Thread:
    """In a child: SIGTERM this process once ``parent`` is gone (a graceful stop: requests in
    flight finish and what is queued is committed), then exit for good after ``grace_seconds``."""

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_seconds)
        os._exit(1)

    thread = threading.Thread(target=watch_parent, name="exit-with-parent", daemon=True)
    thread.start()
    return thread


def start_guard(children: Sequence[int]) -> subprocess.Popen[bytes] | None:
    """Start the guard over ``children`` of this process (None when there are none): it outlives
    this process only to stop them."""
    if not children:
        return None
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service.process.orphan_guard",
            str(os.getpid()),
            *map(str, children),
        ]
    )


def main(argv: Sequence[str]) -> int:
    parent, *pids = (int(value) for value in argv)
    watch(parent, pids)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
