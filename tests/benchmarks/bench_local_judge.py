"""Speed of the local judge's encoder: start-up time and passages per second.

Run as ``python -m tests.benchmarks.bench_local_judge`` or as a file. It prints a table and then
one JSON object on the last line; it checks nothing. The passages are synthetic (~150 words of
plain English drawn from a fixed vocabulary with a fixed seed), so runs compare like with like.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

_VOCABULARY_TEXT = (
    "the a of and to in is was for on that with as by at from it this are be or an which have has "
    "not but were their they its one all also can more been other when there first new after "
    "time people year two these some would into most only over such many made may where between "
    "used system data model search query answer passage document result retrieval ranking score "
    "quality measure judge relevant evidence study patients treatment cells protein gene cancer "
    "risk effect increase reduced higher lower analysis trial clinical disease expression levels "
    "water energy light plants climate temperature river city history century war government "
    "market price company service network server request latency memory storage cluster traffic "
    "language words sentence meaning question context source library engine index vector"
)
VOCABULARY = _VOCABULARY_TEXT.split()


def synthetic_passages(count: int, words: int, seed: int = 7) -> list[str]:
    """Passages of ``words`` words cut into sentences of 8 to 20 words."""
    rng = random.Random(seed)
    passages = []
    for _ in range(count):
        sentences: list[str] = []
        remaining = words
        while remaining > 0:
            length = min(remaining, rng.randint(8, 20))
            chosen = [rng.choice(VOCABULARY) for _ in range(length)]
            sentences.append(" ".join(chosen).capitalize() + ".")
            remaining -= length
        passages.append(" ".join(sentences))
    return passages


def measure(passages: int, words: int, runs: int, batch_size: int) -> dict[str, Any]:
    if __package__ in (None, ""):
        # Run as a file: make the repository importable.
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from workers.judge.embedding import MiniLMEncoder

    load_times = []
    for _ in range(runs):
        started = time.perf_counter()
        encoder = MiniLMEncoder.load()
        load_times.append(time.perf_counter() - started)

    texts = synthetic_passages(passages, words)
    tokens = encoder.token_counts(texts)
    encoder.encode(texts[:batch_size], batch_size=batch_size)  # first-call allocations

    encode_times = []
    cpu_times = []
    for _ in range(runs):
        started, cpu_started = time.perf_counter(), time.process_time()
        encoder.encode(texts, batch_size=batch_size)
        encode_times.append(time.perf_counter() - started)
        cpu_times.append(time.process_time() - cpu_started)

    # The judge's real call: one query against the ten passages of an event.
    query = "how does the retrieval system measure the quality of an answer"
    small_times = []
    for run in range(runs):
        started = time.perf_counter()
        encoder.similarity(query, texts[run * 10 : run * 10 + 10])
        small_times.append(time.perf_counter() - started)

    encode_median = statistics.median(encode_times)
    return {
        "passages": passages,
        "words_per_passage": words,
        "mean_tokens_per_passage": round(statistics.fmean(tokens), 1),
        "batch_size": batch_size,
        "threads": encoder.threads,
        "runs": runs,
        "load_seconds": round(statistics.median(load_times), 3),
        "encode_seconds": round(encode_median, 3),
        "passages_per_second": round(passages / encode_median, 1),
        # CPU time shows the cost when other processes share the cores and wall time suffers.
        "encode_cpu_seconds": round(statistics.median(cpu_times), 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "query_plus_10_passages_ms": round(1000 * statistics.median(small_times), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--passages", type=int, default=200)
    parser.add_argument("--words", type=int, default=150)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    figures = measure(args.passages, args.words, args.runs, args.batch_size)
    width = max(len(name) for name in figures)
    print(f"local judge encoder (median of {args.runs} runs)")
    for name, value in figures.items():
        print(f"  {name:<{width}}  {value}")
    print(json.dumps(figures, sort_keys=True))


if __name__ == "__main__":
    main()
