"""Which output mode the LLM judge asks a server for, and how a server's refusal is recognised.

``json_schema`` is the strictest and what OpenAI, vLLM and llama.cpp's own server accept. Some
OpenAI-compatible servers only know JSON mode: llama-cpp-python answers a ``json_schema`` with a
500 carrying its validation error, but takes ``json_object`` with a ``schema`` beside it and
turns it into a grammar (``json_object_schema``); others refuse that extra key and want plain
``json_object``; some know neither (``text``). In ``auto`` the judge starts at ``json_schema``
and steps down one mode each time the server rejects the one asked for. The mode found is
remembered per endpoint and model in this process and in Redis, so the other worker processes and
replicas do not each pay a rejected call; it expires after a while, so a server upgrade is noticed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time

import openai
from redis import Redis
from redis.exceptions import RedisError

from service.primitives.keys import composite_key, redis_key
from workers.judge.prompt import OUTPUT_MODES, OutputMode

log = logging.getLogger(__name__)

NAMESPACE = "rm:judge:output_mode"
# How long a process trusts what it knows before reading the shared memory again.
LOCAL_REFRESH_SECONDS = 60.0
_REJECTION_WORDS = ("response_format", "json_schema", "json_object")
_VALIDATION_WORDS = ("validation error", "literal_error", "input should be")

# Per process: (mode, monotonic time it expires) by Redis key.
_known: dict[str, tuple[OutputMode, float]] = {}
_known_lock = threading.Lock()


def forget_known_modes() -> None:
    """Drop this process's memory of detected modes (Redis keeps its own)."""
    with _known_lock:
        _known.clear()


def is_format_rejection(exc: openai.APIStatusError) -> bool:
    """Whether an error says the server does not take the ``response_format`` that was sent.

    Servers word it differently: OpenAI answers 400 with ``param: response_format``, FastAPI-based
    servers 422 whose detail points at ``response_format``, and llama-cpp-python 500 with the
    request validation error as text. So the status and the error text decide together. Another
    400 (a prompt too long, a bad model name) or a 500 that is not a validation error of
    ``response_format`` is not a rejection of the mode and must not make the judge step down.
    """
    text = (exc.message + " " + json.dumps(exc.body, default=str)).lower()
    names_format = any(word in text for word in _REJECTION_WORDS)
    if exc.status_code in (400, 422):
        return names_format
    if exc.status_code == 500:
        return "response_format" in text and any(word in text for word in _VALIDATION_WORDS)
    return False


def mode_key(base_url: str, model: str) -> str:
    endpoint = composite_key(base_url.rstrip("/"), model)
    return redis_key(NAMESPACE, hashlib.sha256(endpoint.encode()).hexdigest()[:32])


class OutputModes:
    """The mode to ask one endpoint and model for: a fixed setting, or detected in ``auto``."""

    def __init__(
        self,
        setting: str,
        base_url: str,
        model: str,
        *,
        redis: Redis | None,
        memory_seconds: float,
    ) -> None:
        if setting != "auto" and setting not in OUTPUT_MODES:
            raise ValueError(f"unknown judge output mode {setting!r}")
        self.setting = setting
        self.key = mode_key(base_url, model)
        self.redis = redis
        self.memory_seconds = memory_seconds

    @property
    def auto(self) -> bool:
        return self.setting == "auto"

    def current(self) -> OutputMode:
        if not self.auto:
            return _as_mode(self.setting) or "json_schema"
        now = time.monotonic()
        with _known_lock:
            known = _known.get(self.key)
        if known is not None and known[1] > now:
            return known[0]
        mode = self._read_shared()
        self._know(mode)
        return mode

    def step_down(self, rejected: OutputMode) -> OutputMode | None:
        """The next mode after ``rejected``, remembered; None when none is left or not in auto."""
        if not self.auto:
            return None
        index = OUTPUT_MODES.index(rejected)
        if index + 1 >= len(OUTPUT_MODES):
            return None
        mode = OUTPUT_MODES[index + 1]
        log.warning(
            "judge server rejected an output mode, stepping down",
            extra={"rejected": rejected, "mode": mode},
        )
        self._know(mode)
        if self.redis is not None:
            try:
                # Never replace a lower mode another process found meanwhile by a higher one.
                stored = _as_mode(self.redis.get(self.key))
                if stored is None or OUTPUT_MODES.index(stored) < index + 1:
                    self.redis.set(self.key, mode, ex=max(1, round(self.memory_seconds)))
            except RedisError as exc:
                log.warning("could not remember the judge output mode: %s", exc)
        return mode

    def _know(self, mode: OutputMode) -> None:
        # With Redis as the shared memory, look again now and then to learn what other
        # processes found; without it, this process's memory is the only one.
        lifetime = LOCAL_REFRESH_SECONDS if self.redis is not None else self.memory_seconds
        with _known_lock:
            _known[self.key] = (mode, time.monotonic() + lifetime)

    def _read_shared(self) -> OutputMode:
        if self.redis is None:
            return "json_schema"
        try:
            raw = self.redis.get(self.key)
        except RedisError as exc:
            # The memory only saves a rejected call; judging goes on without it.
            log.warning("could not read the judge output mode: %s", exc)
            return "json_schema"
        return _as_mode(raw) or "json_schema"


def _as_mode(raw: object) -> OutputMode | None:
    value = raw.decode() if isinstance(raw, bytes) else raw
    for mode in OUTPUT_MODES:
        if value == mode:
            return mode
    return None
