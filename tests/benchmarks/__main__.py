"""The benchmark suite: every figure of the performance section, in one command.

``python -m tests.benchmarks`` (``make bench``) runs ingest, judge tokens, judging, the local
judge, the scrape, the judge queue's brokers, the client library's, the shared vectors', the
storage, the storage policy's and the ingest-to-/metrics lag benchmarks in turn, prints one
table (each figure, the median of its runs, next to its same-run baseline and their ratio) and
writes it to ``bench-results/bench.json`` and ``bench-results/bench.md``. ``--quick`` runs each
once on tiny inputs (the smoke test uses it). Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

from tests.benchmarks import (
    bench_broker,
    bench_client,
    bench_ingest,
    bench_judging,
    bench_lag,
    bench_policy,
    bench_retention,
    bench_scrape,
    bench_storage,
    bench_tokens,
    bench_vectors,
)
from tests.benchmarks.common import RESULTS_DIR, Figure, table, write_json

QUICK = {
    "ingest": [
        "--seconds",
        "1",
        "--repeat",
        "1",
        "--batches",
        "1",
        "--connections",
        "4",
        "--memory-events",
        "300",
        "--process-batches",
        "2",
    ],
    "tokens": ["--queries", "5"],
    "retention": ["--events", "300", "1000"],
    "judging": [
        "--backlog",
        "20",
        "--repeat",
        "1",
        "--rate",
        "20",
        "--lag-seconds",
        "1",
        "--raw-seconds",
        "0.5",
    ],
    "scrape": [
        *("--apps", "2", "--retrievers", "2", "--scrapes", "2", "--repeat", "1"),
        *("--earlier", "20"),
    ],
    "local_judge": ["--passages", "8", "--runs", "1", "--batch-size", "8"],
    "client": ["--events", "2000", "--posts", "20", "--repeat", "1"],
    "vectors": ["--events", "3", "--k", "2", "--repeat", "1"],
    "storage": ["--claims", "20", "--rounds", "2"],
    "lag": ["--seconds", "2", "--rate", "20", "--no-postgres", "--workers", "1"],
    "broker": ["--sends", "20", "--batches", "2", "--singles", "20", "--repeat", "1"],
    "policy": [
        *("--claims", "20", "--rounds", "2", "--narrow-events", "200"),
        *("--batches", "2", "--repeat", "1"),
    ],
}


def local_judge(argv: list[str]) -> list[Figure]:
    from tests.benchmarks import bench_local_judge

    parser = argparse.ArgumentParser()
    parser.add_argument("--passages", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    by_backend = bench_local_judge.measure(
        args.passages, 150, args.runs, args.batch_size, ("auto", "numpy")
    )
    tokens = next(iter(by_backend.values()))["mean_tokens_per_passage"]
    gflops = bench_local_judge.blas_gflops(args.runs)
    ceiling = gflops * 1e9 / bench_local_judge.flops_per_passage(tokens)
    figures = []
    for backend, found in by_backend.items():
        figures += [
            Figure(
                5,
                f"local judge (MiniLM proxy, {backend}), passages/s, ~150 words",
                found["passages_per_second"],
                "passages/s",
                "float32 BLAS ceiling: sgemm FLOP/s / FLOPs per passage",
                ceiling,
                runs=args.runs,
                target=">= 100 passages/s",
                note=f"{found['threads']} threads, {found['mean_tokens_per_passage']:.0f} tokens "
                f"per passage, {found['encode_cpu_seconds']:.1f} CPU-s per {found['passages']}",
            ),
            Figure(
                5,
                f"local judge start-up ({backend}: cached graph, or weights and tokenizer)",
                found["load_seconds"],
                "s",
                runs=args.runs,
                target="reported",
            ),
            Figure(
                5,
                f"local judge, one query + 10 passages ({backend})",
                found["query_plus_10_passages_ms"],
                "ms",
                runs=args.runs,
                target="reported",
            ),
        ]
        if "build_seconds" in found:
            figures.append(
                Figure(
                    5,
                    f"local judge first start ({backend}: build and cache the graph)",
                    found["build_seconds"],
                    "s",
                    target="reported",
                )
            )
    return figures


def _module(
    module: object,
) -> Callable[[list[str]], list[Figure]]:
    def run(argv: list[str]) -> list[Figure]:
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)  # type: ignore[attr-defined]
        figures: list[Figure] = module.measure(parser.parse_args(argv))  # type: ignore[attr-defined]
        return figures

    return run


BENCHMARKS: dict[str, Callable[[list[str]], list[Figure]]] = {
    "ingest": _module(bench_ingest),
    "tokens": _module(bench_tokens),
    "judging": _module(bench_judging),
    "local_judge": local_judge,
    "scrape": _module(bench_scrape),
    "broker": _module(bench_broker),
    "client": _module(bench_client),
    "vectors": _module(bench_vectors),
    "storage": _module(bench_storage),
    "policy": _module(bench_policy),
    "retention": _module(bench_retention),
    "lag": _module(bench_lag),
}


def run_suite(only: list[str], quick: bool, out: Path) -> list[Figure]:
    figures: list[Figure] = []
    for name in only:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        figures.extend(BENCHMARKS[name](QUICK[name] if quick else []))
    figures.sort(key=lambda f: f.number)
    load = [round(x, 2) for x in os.getloadavg()]
    extra: dict[str, object] = {
        "command": "make bench" if not quick else "python -m tests.benchmarks --quick",
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average": load,
        "python": platform.python_version(),
        "quick": quick,
    }
    write_json(figures, out / "bench.json", extra)
    text = table(figures)
    header = (
        f"{extra['finished_at']}, {extra['cpus']} CPUs, load average at the end "
        f"{' '.join(str(x) for x in load)}; value and baseline are medians of "
        "the runs counted; ratio = value / baseline"
    )
    (out / "bench.md").write_text(f"{header}\n\n{text}\n")
    print(header)
    print(text)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="each benchmark once, tiny")
    parser.add_argument("--only", nargs="*", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    run_suite(args.only, args.quick, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
