"""The local judge: an embedding-similarity proxy for when no LLM endpoint is configured.

It is not an LLM and does not read the passages the way one does: it maps the cosine similarity of
query and passage (all-MiniLM-L6-v2) to a grade through three thresholds. Its labels carry their
own judge name, and a prompt version that names the thresholds, so they are never mixed with an
LLM judge's nor with its own labels under another calibration. It grades each passage on its
own, so batching, order and position cannot change a grade.

The encoder is numpy float32 or onnxruntime (``workers.judge.encoders``). Float32 on either gives
the same similarities to rounding and shares labels; the int8 encoder's similarities differ a
little, so its labels carry a prompt version of their own and never share a cache entry or series.

A slice is encoded at once (``prepare``): its queries, and the passages whose vectors no worker
kept (``workers.judge.vectors``), in one encoder call; then each event's similarities are products
of those vectors. A passage's vector is the encoder's output for its text, whichever slice made
it, so a vector read back gives the grade encoding it again would, to the last bits the encoder
itself varies by with the batch a text falls in (about 1e-7 of a similarity).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from redis import Redis

from service.config.settings import Settings
from service.primitives.hashing import text_hash
from service.store.calibration import local_prompt_version as prompt_version_of
from service.store.judging import JudgeIdentity
from workers.judge.base import JudgeReply, PreparedSlice, VectorUse
from workers.judge.encoders import Backend, load_encoder, resolve_backend
from workers.judge.prompt import JudgeRequest
from workers.judge.vectors import F32, RedisVectors, vector_field, vector_version

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

    def __init__(self, settings: Settings, redis: Redis | None = None) -> None:
        """``redis`` keeps passage vectors for every worker (none kept without it, or with
        ``local_judge_vector_cache_entries`` at 0)."""
        self._redis = redis if settings.local_judge_vector_cache_entries > 0 else None
        self._vector_entries = settings.local_judge_vector_cache_entries
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

    @property
    def vector_version(self) -> str:
        return vector_version(
            LOCAL_JUDGE_NAME, self.encoder_version, self.backend, self.encoder.dim
        )

    @cached_property
    def vectors(self) -> RedisVectors | None:
        """The passage vectors every worker shares, or None when none are kept."""
        if self._redis is None:
            return None
        return RedisVectors(
            self._redis, self.vector_version, self.encoder.dim, self._vector_entries
        )

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

    def prepare(self, requests: Sequence[JudgeRequest]) -> PreparedSlice:
        """Vectors for every query and passage of ``requests``: the passages' from the shared
        vectors where kept, the rest (each distinct text once) in one encoder call."""
        started = time.perf_counter()
        queries = list(dict.fromkeys(request.query for request in requests))
        # Keyed by the content hash the store gives the same text; kept in Redis under each
        # requesting scope, and read only under the scope of a request that has the text.
        passages: dict[str, str] = {}
        fields: dict[str, str] = {}  # shared field -> content hash
        for request in requests:
            for text in request.passages:
                content_hash = text_hash(text)
                passages[content_hash] = text
                fields[vector_field(request.scope, content_hash)] = content_hash
        vectors = self.vectors
        kept = vectors.get_many(list(fields)) if vectors is not None and fields else {}
        cached = {fields[field]: vector for field, vector in kept.items()}
        missing = [content_hash for content_hash in passages if content_hash not in cached]
        texts = queries + [passages[content_hash] for content_hash in missing]
        encoded = self.encoder.encode(texts) if texts else np.zeros((0, 0), dtype=np.float32)
        new = {content_hash: encoded[len(queries) + i] for i, content_hash in enumerate(missing)}
        if vectors is not None and len(kept) < len(fields):
            made = {**cached, **new}
            vectors.put_many({f: made[h] for f, h in fields.items() if f not in kept})
        ready = _SliceJudge(
            self,
            dict(zip(queries, encoded, strict=False)),
            {**cached, **new},
            # The slice's encoding is shared by its calls: each carries an even part of it.
            setup_seconds=(time.perf_counter() - started) / max(1, len(requests)),
        )
        return PreparedSlice(ready, VectorUse(frozenset(cached), frozenset(new)))

    def judge(self, request: JudgeRequest) -> JudgeReply:
        return self.prepare([request]).judge.judge(request)

    def reply(
        self, request: JudgeRequest, similarities: npt.ArrayLike, latency_seconds: float
    ) -> JudgeReply:
        """The reply of one request from its passages' similarities to the query."""
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
            latency_seconds=latency_seconds,
            similarities=tuple(float(s) for s in np.asarray(similarities)),
        )


class _SliceJudge:
    """The local judge with a slice's vectors in hand: each request is a matrix-vector product."""

    max_concurrency = 1

    def __init__(
        self,
        local: LocalJudge,
        queries: Mapping[str, F32],
        passages: Mapping[str, F32],
        setup_seconds: float,
    ) -> None:
        self.identity = local.identity
        self._local = local
        self._queries = queries
        self._passages = passages
        self._setup_seconds = setup_seconds

    def prepare(self, requests: Sequence[JudgeRequest]) -> PreparedSlice:
        return self._local.prepare(requests)

    def judge(self, request: JudgeRequest) -> JudgeReply:
        started = time.perf_counter()
        hashes = [text_hash(text) for text in request.passages]
        if request.query not in self._queries or any(h not in self._passages for h in hashes):
            # A request the slice did not announce: it is encoded on its own.
            return self._local.prepare([request]).judge.judge(request)
        query = self._queries[request.query]
        if hashes:
            similarities: F32 = np.stack([self._passages[h] for h in hashes]) @ query
        else:
            similarities = np.zeros(0, dtype=np.float32)
        latency = time.perf_counter() - started + self._setup_seconds
        return self._local.reply(request, similarities, latency)
