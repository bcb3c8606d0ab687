"""The local judge on repeated content: with shared passage vectors, each distinct passage is
encoded once.

Three passes of N events each, judged in slices (``workers.judging.judge_events``, as a worker
does) by the local judge with the configured encoder, on a SQLite file and the bench's Redis:

- A: N SciFact claims with the BM25 top 2k of the replay's index, passages never seen;
- B: N new events, the claims reworded ("Is it true that ...?"), the passages exactly A's;
- C: the claims reworded another way ("Does the evidence show that ...?") with their own BM25
  top 2k: a replay of SciFact with reworded queries after the original ones, most passages seen
  in A, some new, and no label known for any (query, passage) pair.

Each run judges the three passes twice, with the shared vectors and without them (the baseline,
``local_judge_vector_cache_entries`` = 0), and pass A once more the way the judge worked before
slices were encoded at once (one encoder call per event, nothing kept), in alternating order.
Figures: the time to judge B over the time to judge A; passages encoded per judged event in C
(the vector misses of ``judge_cache_lookups``); judged events/s over A, where nothing repeats
(what keeping the vectors costs), beside the per-event judge. Without SciFact the passages are
synthetic and C is left out.

Run: ``python -m tests.benchmarks.bench_vectors`` (``--help`` for the knobs).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from service.config.settings import Settings
from service.wiring.runtime import Runtime
from tests.benchmarks.bench_local_judge import synthetic_passages
from tests.benchmarks.common import REDIS_URL, Figure, median_figure, table
from tests.support.retrievals import (
    Retrieval,
    bm25_retrievals,
    load_scifact,
    reword,
    store_retrievals,
    with_reworded_queries,
)
from workers import judging
from workers.judge.base import JudgeReply, PreparedSlice
from workers.judge.local import LocalJudge
from workers.judge.prompt import JudgeRequest
from workers.judge.text_encoder import TextEncoder

MODES = ("vectors", "no vectors", "per event")


class _PerEventJudge(LocalJudge):
    """The local judge as it was before a slice was encoded at once: one encoder call per event
    (its query and passages together), no vector kept."""

    def prepare(self, requests: Sequence[JudgeRequest]) -> PreparedSlice:
        return PreparedSlice(self)

    def judge(self, request: JudgeRequest) -> JudgeReply:
        started = time.perf_counter()
        similarities = self.encoder.similarity(request.query, list(request.passages))
        return self.reply(request, similarities, time.perf_counter() - started)


@dataclass(frozen=True)
class ModeRun:
    seconds_a: float
    seconds_b: float | None  # None: pass A only (the per-event judge)
    encoded_per_event_c: float | None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=12, help="events per pass")
    parser.add_argument("--k", type=int, default=3, help="top k (each event carries 2k)")
    parser.add_argument("--repeat", type=int, default=2, help="runs (each judges both modes)")
    parser.add_argument("--backend", default="auto", help="the local judge's encoder")
    parser.add_argument("--slice-events", type=int, default=16, help="events per judge task")


Passes = tuple[list[Retrieval], list[Retrieval], list[Retrieval] | None]


def _passes(events: int, k: int) -> tuple[Passes, str]:
    dataset = load_scifact()
    if dataset is not None:
        pass_a = bm25_retrievals(dataset, events, k)
        # Worded unlike B's queries, so no label of B answers for C.
        pass_c = bm25_retrievals(dataset, events, k, reworded=1)
        return (pass_a, with_reworded_queries(pass_a), pass_c), "SciFact"
    texts = synthetic_passages(events * 2 * k, 150)
    pass_a = [
        Retrieval(
            reword(f"Claim {i} about {texts[i].split('.')[0].lower()}."),
            tuple(texts[i * 2 * k : (i + 1) * 2 * k]),
            k,
        )
        for i in range(events)
    ]
    return (pass_a, with_reworded_queries(pass_a), None), "synthetic"


def _judge_pass(
    runtime: Runtime, judge: LocalJudge, pks: Sequence[int], slice_events: int
) -> float:
    started = time.perf_counter()
    for start in range(0, len(pks), slice_events):
        result = judging.judge_events(runtime, judge, pks[start : start + slice_events])
        if set(result.outcomes.values()) != {"judged"}:
            raise RuntimeError(f"not every event was judged: {result.outcomes}")
    return time.perf_counter() - started


def _vector_misses(runtime: Runtime) -> float:
    return sum(
        amount
        for (family, labels, _), amount in runtime.aggregates.read().items()
        if family == "judge_cache_lookups" and labels[2:] == ("vector", "miss")
    )


def _run_mode(
    mode: str, passes: Passes, encoder: TextEncoder, args: argparse.Namespace, folder: Path
) -> ModeRun:
    redis.Redis.from_url(REDIS_URL).flushdb()  # no vector, aggregate or marker of a past run
    pass_a, pass_b, pass_c = passes
    settings = Settings(
        database_url=f"sqlite:///{folder / uuid.uuid4().hex}.db",
        redis_url=REDIS_URL,
        data_dir=str(folder),
        queue_name=f"bench-vectors-{uuid.uuid4().hex[:8]}",
        local_judge_backend=args.backend,
        local_judge_vector_cache_entries=50_000 if mode == "vectors" else 0,
        log_json=False,
    )
    everything = [*pass_a, *pass_b, *(pass_c or [])]
    runtime, pks = store_retrievals(settings, everything, "bench")
    judge = (_PerEventJudge if mode == "per event" else LocalJudge)(settings, runtime.redis)
    judge.encoder = encoder  # loaded once, shared by every mode
    n = len(pass_a)
    seconds_a = _judge_pass(runtime, judge, pks[:n], args.slice_events)
    if mode == "per event":
        runtime.engine.dispose()
        return ModeRun(seconds_a, None, None)
    seconds_b = _judge_pass(runtime, judge, pks[n : 2 * n], args.slice_events)
    encoded_c: float | None = None
    if pass_c is not None:
        before = _vector_misses(runtime)
        _judge_pass(runtime, judge, pks[2 * n :], args.slice_events)
        encoded_c = (_vector_misses(runtime) - before) / len(pass_c)
    runtime.engine.dispose()
    return ModeRun(seconds_a, seconds_b, encoded_c)


def measure(args: argparse.Namespace) -> list[Figure]:
    (pass_a, pass_b, pass_c), source = _passes(args.events, args.k)
    encoder = LocalJudge(Settings(local_judge_backend=args.backend)).encoder
    backend = encoder.backend
    encoder.encode(["warm-up of the encoder's first call"] * 4)
    runs: dict[str, list[ModeRun]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.repeat):
            # Alternating order, so neither mode always runs on a warmer machine.
            for mode in MODES if run % 2 == 0 else tuple(reversed(MODES)):
                found = _run_mode(mode, (pass_a, pass_b, pass_c), encoder, args, Path(scratch))
                runs[mode].append(found)
                print(f"[vectors] run {run + 1} {mode}: {found}", file=sys.stderr, flush=True)
    on, off, per_event = runs["vectors"], runs["no vectors"], runs["per event"]
    events = len(pass_a)
    passages = 2 * args.k
    figures = [
        median_figure(
            9,
            f"local judge ({backend}), time to judge pass B / pass A, shared vectors - "
            f"{events} events x {passages} passages ({source}), B: reworded queries, A's passages",
            [r.seconds_b / r.seconds_a for r in on if r.seconds_b is not None],
            "x",
            "the same without shared vectors",
            [r.seconds_b / r.seconds_a for r in off if r.seconds_b is not None],
            target="<= 0.35",
        ),
        *(
            median_figure(
                9,
                f"local judge ({backend}), judged events/s over pass A (nothing repeats), {name}",
                [events / r.seconds_a for r in found],
                "ev/s",
                "one encoder call per event, nothing kept, as before",
                [events / r.seconds_a for r in per_event],
                target="no regression (ratio >= ~1)",
            )
            for name, found in (("shared vectors", on), ("without shared vectors", off))
        ),
    ]
    if pass_c is not None:
        figures.append(
            median_figure(
                9,
                f"local judge ({backend}), passages encoded per judged event, SciFact replayed "
                f"with reworded queries after the original ones ({events} events, top {passages})",
                [r.encoded_per_event_c for r in on if r.encoded_per_event_c is not None],
                "passages",
                "the same without shared vectors",
                [r.encoded_per_event_c for r in off if r.encoded_per_event_c is not None],
                target="reported",
            )
        )
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    figures = measure(parser.parse_args(argv))
    print(table(figures))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
