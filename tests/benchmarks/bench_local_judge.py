"""Speed of the local judge's encoder: start-up time and passages per second.

Run as ``python -m tests.benchmarks.bench_local_judge`` or as a file. It prints a table (one
column per ``--backends`` entry, and the float32 ceiling: what this machine's sgemm speed, measured
in the same run, allows a float32 encoder) and then one JSON object on the last line; it checks
nothing. ONNX backends report their first start (graph built and quantised into an empty cache
folder) apart from the cached load. The passages are synthetic (~150 words of
plain English drawn from a fixed vocabulary with a fixed seed), so runs compare like with like.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
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


def flops_per_passage(tokens: float, layers: int = 6, width: int = 384, ff: int = 1536) -> float:
    """Multiply-adds x 2 of MiniLM-L6's encoder for one passage: projections, feed-forward and
    the attention products (the matrix products are nearly all of the work)."""
    per_token = 2 * (4 * width * width + 2 * width * ff) + 4 * tokens * width
    return layers * per_token * tokens


def blas_gflops(runs: int) -> float:
    """Wall-clock sgemm speed of this machine now, on the encoder's feed-forward shape."""
    import numpy as np

    a = np.ones((32 * 164, 384), dtype=np.float32)
    b = np.ones((384, 1536), dtype=np.float32)
    np.matmul(a, b)
    speeds = []
    for _ in range(max(3, runs)):
        started = time.perf_counter()
        for _ in range(5):
            np.matmul(a, b)
        speeds.append(5 * 2 * a.shape[0] * 384 * 1536 / (time.perf_counter() - started) / 1e9)
    return sorted(speeds)[len(speeds) // 2]


def measure(
    passages: int,
    words: int,
    runs: int,
    batch_size: int,
    backends: Sequence[str] = ("numpy",),
) -> dict[str, dict[str, Any]]:
    """Figures per backend; the backends take turns within each run so they share its load."""
    if __package__ in (None, ""):
        # Run as a file: make the repository importable.
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from workers.judge.encoders import Backend, load_encoder, resolve_backend
    from workers.judge.text_encoder import TextEncoder

    chosen: list[Backend] = [resolve_backend(b) for b in backends]
    texts = synthetic_passages(passages, words)
    query = "how does the retrieval system measure the quality of an answer"
    figures: dict[str, dict[str, Any]] = {}
    encoders: dict[str, TextEncoder] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for backend in chosen:
            found: dict[str, Any] = {}
            if backend != "numpy":
                # First use: build (and quantise) the graph into an empty cache folder.
                started = time.perf_counter()
                load_encoder(backend, cache_dir=Path(scratch))
                found["build_seconds"] = round(time.perf_counter() - started, 3)
            load_times = []
            for _ in range(runs):
                started = time.perf_counter()
                encoders[backend] = load_encoder(backend, cache_dir=Path(scratch))
                load_times.append(time.perf_counter() - started)
            found["load_seconds"] = round(statistics.median(load_times), 3)
            encoders[backend].encode(texts[:batch_size], batch_size=batch_size)  # first-call set-up
            figures[backend] = found

    tokens = next(iter(encoders.values())).token_counts(texts)
    samples: dict[str, dict[str, list[float]]] = {
        b: {"wall": [], "cpu": [], "small": []} for b in encoders
    }
    for run in range(runs):
        for name, encoder in encoders.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            encoder.encode(texts, batch_size=batch_size)
            samples[name]["wall"].append(time.perf_counter() - started)
            samples[name]["cpu"].append(time.process_time() - cpu_started)
            # The judge's real call: one query against the ten passages of an event.
            started = time.perf_counter()
            encoder.similarity(query, texts[run * 10 : run * 10 + 10])
            samples[name]["small"].append(time.perf_counter() - started)

    for name, encoder in encoders.items():
        wall = statistics.median(samples[name]["wall"])
        figures[name].update(
            {
                "passages": passages,
                "words_per_passage": words,
                "mean_tokens_per_passage": round(statistics.fmean(tokens), 1),
                "batch_size": batch_size,
                "threads": encoder.threads,
                "runs": runs,
                "encode_seconds": round(wall, 3),
                "passages_per_second": round(passages / wall, 1),
                # CPU time shows the cost when other processes share the cores and wall time
                # suffers: passages per CPU-second times the cores is the idle machine's speed.
                "encode_cpu_seconds": round(statistics.median(samples[name]["cpu"]), 3),
                "passages_per_cpu_second": round(
                    passages / statistics.median(samples[name]["cpu"]), 1
                ),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "query_plus_10_passages_ms": round(
                    1000 * statistics.median(samples[name]["small"]), 1
                ),
            }
        )
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--passages", type=int, default=200)
    parser.add_argument("--words", type=int, default=150)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--backends",
        default="numpy,onnx-int8",
        help="comma-separated: numpy, onnx-fp32, onnx-int8, auto (default: numpy,onnx-int8)",
    )
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    figures = measure(args.passages, args.words, args.runs, args.batch_size, backends)
    tokens = next(iter(figures.values()))["mean_tokens_per_passage"]
    ceiling = blas_gflops(args.runs) * 1e9 / flops_per_passage(tokens)
    names = sorted({name for found in figures.values() for name in found})
    width = max(len(name) for name in names)
    print(f"local judge encoder (median of {args.runs} runs; backends alternate within a run)")
    print(f"  {'':<{width}}  " + "  ".join(f"{b:>12}" for b in figures))
    for name in names:
        cells = "  ".join(f"{found.get(name, '-')!s:>12}" for found in figures.values())
        print(f"  {name:<{width}}  {cells}")
    print(f"  {'float32 BLAS ceiling, passages/s':<{width}}  {ceiling:>12.1f}")
    print(json.dumps({"backends": figures, "blas_ceiling_passages_per_second": round(ceiling, 1)}))


if __name__ == "__main__":
    main()
