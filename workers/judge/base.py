"""What every judge does: grade the passages of one request, and say what that cost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from service.store.judging import JudgeIdentity
from workers.judge.prompt import JudgeRequest


@dataclass(frozen=True)
class JudgeReply:
    grades: tuple[int | None, ...]  # one per request passage; None = missing after retries
    context_rating: int | None
    calls: int
    prompt_tokens: int
    completion_tokens: int
    malformed_replies: int
    latency_seconds: float
    # Answered calls by output mode (see prompt.OUTPUT_MODES); empty for the local judge.
    output_modes: dict[str, int] = field(default_factory=dict)
    # The local judge's cosine per request passage, kept for calibration; None for an LLM.
    similarities: tuple[float, ...] | None = None


class TransientJudgeError(RuntimeError):
    """The judge could not be reached or kept failing (429, 5xx, timeouts after retries).

    The task is retried later; the event stays pending meanwhile.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # a bounded metric label


@dataclass(frozen=True)
class VectorUse:
    """Where a slice's passage vectors came from, by content hash (the local judge only)."""

    cached: frozenset[str] = frozenset()  # read from the vectors every worker shares
    encoded: frozenset[str] = frozenset()  # encoded for this slice, in one encoder call


class Judge(Protocol):
    identity: JudgeIdentity
    # How many ``judge`` calls one worker process may have in flight at once.
    max_concurrency: int

    def judge(self, request: JudgeRequest) -> JudgeReply: ...

    def prepare(self, requests: Sequence[JudgeRequest]) -> PreparedSlice:
        """Get ready for a slice's requests at once; the answer's judge takes them."""
        ...


@dataclass(frozen=True)
class PreparedSlice:
    judge: Judge  # the same identity, ready for the slice's requests
    vectors: VectorUse | None = None  # None: a judge without vectors (an LLM)
