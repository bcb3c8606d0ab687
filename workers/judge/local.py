"""The local judge: an embedding-similarity proxy for when no LLM endpoint is configured.

It is not an LLM and does not read the passages the way one does: it maps the cosine similarity of
query and passage (all-MiniLM-L6-v2) to a grade through fixed thresholds. Its labels carry their own
judge name and prompt version so they are never mixed with an LLM judge's.
"""

from __future__ import annotations

import time
from functools import cached_property

import numpy as np

from service.repository import JudgeIdentity
from service.settings import Settings
from workers.judge.base import JudgeReply
from workers.judge.prompt import JudgeRequest

LOCAL_JUDGE_NAME = "local-minilm-l6-v2"
LOCAL_PROMPT_VERSION = "sim-v1"


class LocalJudge:
    def __init__(self, settings: Settings) -> None:
        self.thresholds = np.asarray(settings.local_judge_thresholds, dtype=np.float32)
        self.identity = JudgeIdentity(
            judge=LOCAL_JUDGE_NAME, model=LOCAL_JUDGE_NAME, prompt_version=LOCAL_PROMPT_VERSION
        )

    @cached_property
    def encoder(self):  # type: ignore[no-untyped-def]
        from workers.judge.embedding import MiniLMEncoder

        return MiniLMEncoder.load()

    def grades_for(self, similarities: np.ndarray) -> np.ndarray:
        # grade = how many thresholds the similarity reaches: 0..3
        return np.searchsorted(self.thresholds, similarities, side="right")

    def judge(self, request: JudgeRequest) -> JudgeReply:
        started = time.perf_counter()
        similarities = self.encoder.similarity(request.query, list(request.passages))
        grades = self.grades_for(similarities)
        context: int | None = None
        if request.rate_context and request.top_k_count:
            best = int(grades[: request.top_k_count].max())
            context = 2 if best >= 3 else 1 if best >= 2 else 0
        return JudgeReply(
            grades=tuple(int(g) for g in grades),
            context_rating=context,
            calls=1,
            prompt_tokens=0,
            completion_tokens=0,
            malformed_replies=0,
            latency_seconds=time.perf_counter() - started,
        )
