"""The local judge following the calibration applied last (``retrieval-monitor calibrate
--apply``): its thresholds, and so its prompt version, change when a new one is stored.

The database is read at most once per ``local_judge_calibration_check_seconds``, so a worker
switches within that time; every event is judged wholly under one prompt version.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine

from service.store.calibration import applied_calibration
from service.store.engine import session_scope
from workers.judge.local import LocalJudge


class CalibratedLocalJudge:
    def __init__(
        self,
        configured: LocalJudge,
        engine: Engine,
        check_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._configured = configured
        self._engine = engine
        self._check_seconds = check_seconds
        self._clock = clock
        self._current = configured
        self._checked_at: float | None = None

    def current(self) -> LocalJudge:
        now = self._clock()
        if self._checked_at is not None and now - self._checked_at < self._check_seconds:
            return self._current
        with session_scope(self._engine) as session:
            applied = applied_calibration(session, self._configured.encoder_version)
            thresholds = (
                tuple(float(t) for t in applied.thresholds)
                if applied is not None
                else self._configured.thresholds
            )
        if thresholds != self._current.thresholds:
            self._current = (
                self._configured
                if thresholds == self._configured.thresholds
                else self._current.with_thresholds(thresholds)
            )
        self._checked_at = now
        return self._current
