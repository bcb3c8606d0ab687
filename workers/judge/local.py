"""The local judge: an embedding-similarity proxy for when no LLM endpoint is configured.

It is not an LLM and does not read the passages the way one does: it maps the cosine similarity of
query and passage (all-MiniLM-L6-v2) to a grade through three thresholds. Its labels carry their
own judge name, and a prompt version that names the thresholds, so they are never mixed with an
LLM judge's nor with its own labels under another calibration. It grades each passage on its
own, so batching, order and position cannot change a grade.

The encoder is numpy float32 or onnxruntime (``workers.judge.encoders``). Float32 on either gives
the same similarities to rounding and shares labels; the int8 encoder's similarities differ a
little, so its labels carry a prompt version of their own and never share a cache entry or series.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from service.analysis.local_calibration import local_prompt_version as prompt_version_of
from service.settings import Settings
from service.store.judging import JudgeIdentity
from workers.judge.base import JudgeReply
from workers.judge.encoders import Backend, load_encoder, resolve_backend
from workers.judge.prompt import JudgeRequest

if TYPE_CHECKING:
    from workers.judge.text_encoder import TextEncoder

LOCAL_JUDGE_NAME = "local-minilm-l6-v2"
LOCAL_PROMPT_VERSION = "sim-v1"


def encoder_version(backend: Backend = "numpy") -> str:
    """The prompt version's stem: the int8 encoder's similarities differ a little, so its labels
    are ``sim-v1-int8``; both float32 encoders share ``sim-v1``, being equal to float32 rounding.
    """
    return f"{LOCAL_PROMPT_VERSION}-int8" if backend == "onnx-int8" else LOCAL_PROMPT_VERSION


def local_prompt_version(thresholds: Sequence[float], backend: Backend = "numpy") -> str:
    """``sim-v1@t1,t2,t3``: the mapping from similarity to grade is this judge's prompt."""
    return prompt_version_of(encoder_version(backend), thresholds)


def grades_from_similarity(
    similarities: npt.ArrayLike, thresholds: Sequence[float]
) -> npt.NDArray[np.intp]:
    """Grade 0-3 per similarity: how many of the (ascending) thresholds it reaches."""
    bounds = np.asarray(thresholds, dtype=np.float64)
    if bounds.shape != (3,) or np.any(np.diff(bounds) < 0):
        raise ValueError(f"need three ascending thresholds, got {list(thresholds)}")
    values = np.asarray(similarities, dtype=np.float64)
    grades: npt.NDArray[np.intp] = np.searchsorted(bounds, values, side="right")
    return grades


def context_from_grades(top_k_grades: Sequence[int]) -> int:
    """The 0-2 context rating the proxy gives: from the best grade in the top k."""
    best = max(top_k_grades, default=0)
    return 2 if best >= 3 else 1 if best >= 2 else 0


class LocalJudge:
    # The encoder already uses every core for one call; a second call in flight only competes.
    max_concurrency = 1

    def __init__(self, settings: Settings) -> None:
        self.thresholds = tuple(float(t) for t in settings.local_judge_thresholds)
        grades_from_similarity([], self.thresholds)  # fail at start on a bad setting
        self.backend = resolve_backend(settings.local_judge_backend)
        self._cache_dir = (
            Path(settings.local_judge_cache_dir) if settings.local_judge_cache_dir else None
        )
        self.identity = JudgeIdentity(
            judge=LOCAL_JUDGE_NAME,
            model=LOCAL_JUDGE_NAME,
            prompt_version=local_prompt_version(self.thresholds, self.backend),
        )

    @cached_property
    def encoder(self) -> TextEncoder:
        return load_encoder(self.backend, cache_dir=self._cache_dir)

    @property
    def encoder_version(self) -> str:
        return encoder_version(self.backend)

    def with_thresholds(self, thresholds: Sequence[float]) -> LocalJudge:
        """The same judge (and encoder, once loaded) grading with other thresholds, under the
        prompt version those thresholds name."""
        grades_from_similarity([], thresholds)
        other = copy.copy(self)
        other.thresholds = tuple(float(t) for t in thresholds)
        other.identity = JudgeIdentity(
            judge=LOCAL_JUDGE_NAME,
            model=LOCAL_JUDGE_NAME,
            prompt_version=local_prompt_version(other.thresholds, self.backend),
        )
        return other

    def grades_for(self, similarities: npt.ArrayLike) -> npt.NDArray[np.intp]:
        return grades_from_similarity(similarities, self.thresholds)

    def judge(self, request: JudgeRequest) -> JudgeReply:
        started = time.perf_counter()
        similarities = self.encoder.similarity(request.query, list(request.passages))
        grades = [int(g) for g in self.grades_for(similarities)]
        context: int | None = None
        if request.rate_context and request.top_k_count:
            context = context_from_grades(grades[: request.top_k_count])
        return JudgeReply(
            grades=tuple(grades),
            context_rating=context,
            calls=1,
            prompt_tokens=0,
            completion_tokens=0,
            malformed_replies=0,
            latency_seconds=time.perf_counter() - started,
            similarities=tuple(float(s) for s in similarities),
        )
