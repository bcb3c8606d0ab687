"""Structured logging: one JSON object per line, so log pipelines can index fields.

The demo sends the logs to a file instead, and keeps the console for its progress, its summary
and whatever is at WARNING or above (its own and the worker's: ``LogTee``).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TextIO

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "INFO", as_json: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(as_json))
    _install([handler], level)


def configure_file_and_console(path: Path, level: str = "INFO", as_json: bool = True) -> None:
    """Everything at ``level`` and above to the file at ``path``; WARNING and above to stderr."""
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(_formatter(as_json))
    to_console = logging.StreamHandler(sys.stderr)
    to_console.setFormatter(_formatter(False))
    to_console.setLevel(logging.WARNING)
    _install([to_file, to_console], level)


def _formatter(as_json: bool) -> logging.Formatter:
    if as_json:
        return JsonFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def _install(handlers: list[logging.Handler], level: str) -> None:
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level.upper())
    # One line per HTTP request or migration plugin drowns what matters at INFO.
    for noisy in ("httpx", "httpcore", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


# Where a record starts, and its level: Celery's "[date: LEVEL/process]", this module's plain
# "date time LEVEL logger:" and JSON '"level": "info"', and Python's "file:line: XWarning:".
_RECORD_STARTS = (
    re.compile(r"^\[\d{4}-\d\d-\d\d [^\]]*?: (?P<level>[A-Z]+)/"),
    re.compile(r"^\d{4}-\d\d-\d\d \S+ (?P<level>[A-Z]+) "),
    re.compile(r'^\{.*?"level": "(?P<level>[a-z]+)"'),
    re.compile(r"^\S+:\d+: \w*(?P<level>Warning): "),
)


def record_level(line: str) -> int | None:
    """The level of the record ``line`` opens, or None for a continuation (a traceback)."""
    for pattern in _RECORD_STARTS:
        found = pattern.match(line)
        if found:
            level = logging.getLevelName(found.group("level").upper())
            return level if isinstance(level, int) else logging.WARNING
    return None


class LogTee:
    """Copies a child process's output to a log file, and the records at WARNING and above (with
    their tracebacks) to the console too. What comes before the first record is shown: a child
    that fails to start says why where the user is looking."""

    def __init__(self, source: IO[bytes], path: Path, console: TextIO) -> None:
        self._source = source
        self._path = path
        self._console = console
        self._thread = threading.Thread(target=self._copy, name="log-tee", daemon=True)

    def start(self) -> LogTee:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _copy(self) -> None:
        level = logging.WARNING
        with self._path.open("a", encoding="utf-8") as log:
            for raw in iter(self._source.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                log.flush()
                opened = record_level(line)
                level = level if opened is None else opened
                if level >= logging.WARNING:
                    self._console.write(line)
                    self._console.flush()
