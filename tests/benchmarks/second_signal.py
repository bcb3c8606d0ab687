"""Does a second signal beside the cosine raise the local judge's held-out kappa?

Run as ``python -m tests.benchmarks.second_signal`` from the repository root. It prints a
Markdown table and then one JSON object on the last line; it checks nothing.

On SciFact and Vaswani (BEIR layout, see ``judge_quality``), the project's BM25 retrieves the top
``--depth`` passages per query and the local judge's encoder gives each its cosine with the query.
Each candidate score is the cosine plus ``w`` times a second signal:
- ``overlap``: the share of the query's distinct terms (BM25's tokenizer: stopwords out, light
  stemming) that the passage contains;
- ``rank``: the retriever's own rank, as 1 - (rank - 1) / depth;
- ``both``: the two, each with its own weight.
On one half of the queries (``judge_quality``'s split), the weights (a grid) and the grade-2
threshold are fitted for kappa; the other half gives kappa with a 95% interval from resampling
queries, and the difference from the cosine alone on the same resamples, with its interval. A
signal is worth making the default only if that difference is above 0 on both data sets.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.analysis.threshold_fit import (
    fit_threshold,
    per_query_counts,
    scores_from_counts,
    split_queries,
)
from service.replay.beir import load_beir
from service.replay.bm25 import tokenize
from tests.benchmarks.judge_quality import DATASETS, Retrieved, embed, retrieve, shared_data_dir

FloatArray = npt.NDArray[np.float64]
WEIGHTS = tuple(round(0.05 * i, 2) for i in range(11))  # 0 .. 0.5


def term_overlap(run: Retrieved) -> FloatArray:
    values = []
    for query, texts in zip(run.queries, run.texts, strict=True):
        terms = set(tokenize(query))
        for text in texts:
            found = terms & set(tokenize(text))
            values.append(len(found) / len(terms) if terms else 0.0)
    return np.array(values)


def rank_signal(run: Retrieved, depth: int) -> FloatArray:
    return np.concatenate([1.0 - np.arange(len(d)) / depth for d in run.doc_ids])


@dataclass(frozen=True)
class Candidate:
    name: str
    signals: tuple[FloatArray, ...]


def _kappa(judge: npt.NDArray[np.bool_], gold: npt.NDArray[np.bool_]) -> float:
    counts = per_query_counts(judge, gold, np.zeros(judge.size, dtype=np.int64)).sum(axis=0)
    return float(scores_from_counts(counts)[3])


def fit(
    cosine: FloatArray, signals: tuple[FloatArray, ...], gold: npt.NDArray[np.bool_]
) -> tuple[tuple[float, ...], float]:
    """The weights and the grade-2 cut with the best kappa on the fitting passages."""
    best: tuple[float, tuple[float, ...], float] = (-2.0, (), 0.0)
    for weights in itertools.product(WEIGHTS, repeat=len(signals)):
        score = cosine + sum((w * s for w, s in zip(weights, signals, strict=True)), 0.0)
        cut = fit_threshold(score, gold, "kappa")
        kappa = _kappa(score >= cut, gold)
        if kappa > best[0] + 1e-12:
            best = (kappa, tuple(weights), cut)
    return best[1], best[2]


def held_out_kappas(
    judged: dict[str, npt.NDArray[np.bool_]],
    gold: npt.NDArray[np.bool_],
    query: npt.NDArray[np.int64],
    reps: int,
    seed: int,
) -> dict[str, dict[str, Any]]:
    """Kappa per candidate with a query-bootstrap interval, and its difference from ``cosine``
    on the same resamples."""
    counts = {
        name: per_query_counts(j, gold, query).astype(np.float64) for name, j in judged.items()
    }
    groups = int(query.max()) + 1
    rng = np.random.default_rng(seed)
    weights = np.zeros((reps, groups))
    draws = rng.integers(0, groups, size=(reps, groups))
    np.add.at(weights, (np.repeat(np.arange(reps), groups), draws.reshape(-1)), 1.0)
    replicates = {name: scores_from_counts(weights @ c)[:, 3] for name, c in counts.items()}
    out: dict[str, dict[str, Any]] = {}
    for name, c in counts.items():
        kappa = float(scores_from_counts(c.sum(axis=0))[3])
        difference = replicates[name] - replicates["cosine"]
        out[name] = {
            "kappa": kappa,
            "kappa_interval": [float(v) for v in np.nanquantile(replicates[name], [0.025, 0.975])],
            "difference": kappa - float(scores_from_counts(counts["cosine"].sum(axis=0))[3]),
            "difference_interval": [float(v) for v in np.nanquantile(difference, [0.025, 0.975])],
        }
    return out


def sample_queries(run: Retrieved, limit: int | None, seed: int) -> Retrieved:
    """At most ``limit`` of the run's queries, drawn at random (reproducibly): encoding every
    passage of every query costs more CPU than a shared machine should give a benchmark."""
    if limit is None or limit >= len(run.query_ids):
        return run
    chosen = sorted(np.random.default_rng(seed).permutation(len(run.query_ids))[:limit].tolist())
    keep = np.isin(run.query, chosen)
    renumber = np.full(len(run.query_ids), -1, dtype=np.int64)
    renumber[chosen] = np.arange(len(chosen))
    return Retrieved(
        run.name,
        [run.query_ids[q] for q in chosen],
        [run.queries[q] for q in chosen],
        [run.doc_ids[q] for q in chosen],
        [run.texts[q] for q in chosen],
        renumber[run.query[keep]],
        run.similarity[keep],
        run.gold[keep],
        run.gold_total,
    )


def run_dataset(
    name: str, data_dir: Path, depth: int, seed: int, reps: int, limit: int | None
) -> dict[str, Any]:
    started = time.perf_counter()
    run = sample_queries(retrieve(load_beir(data_dir / name), name, depth), limit, seed)
    embed(run)
    encoded = time.perf_counter() - started
    candidates = [
        Candidate("cosine", ()),
        Candidate("overlap", (term_overlap(run),)),
        Candidate("rank", (rank_signal(run, depth),)),
    ]
    candidates.append(Candidate("both", candidates[1].signals + candidates[2].signals))
    fit_half, held_half = split_queries(run.query_ids, seed)
    in_fit = np.array([run.query_ids[q] in fit_half for q in run.query])
    held = ~in_fit
    renumber = {q: i for i, q in enumerate(sorted({int(q) for q in run.query[held]}))}
    held_query = np.array([renumber[int(q)] for q in run.query[held]], dtype=np.int64)
    judged: dict[str, npt.NDArray[np.bool_]] = {}
    fitted: dict[str, Any] = {}
    for candidate in candidates:
        weights, cut = fit(
            run.similarity[in_fit], tuple(s[in_fit] for s in candidate.signals), run.gold[in_fit]
        )
        score = run.similarity + sum(
            (w * s for w, s in zip(weights, candidate.signals, strict=True)), np.zeros(1)
        )
        judged[candidate.name] = score[held] >= cut
        fitted[candidate.name] = {"weights": list(weights), "cut": round(cut, 4)}
    figures = held_out_kappas(judged, run.gold[held], held_query, reps, seed)
    return {
        "dataset": name,
        "queries": len(run.query_ids),
        "held_out_queries": len(held_half),
        "passages": int(run.gold.size),
        "gold_retrieved": int(run.gold.sum()),
        "encode_seconds": round(encoded, 1),
        "candidates": {n: {**fitted[n], **figures[n]} for n in fitted},
    }


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| data (held-out half) | score | weights | kappa [95%] | minus cosine alone [95%] |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        for name, c in result["candidates"].items():
            low, high = c["kappa_interval"]
            d_low, d_high = c["difference_interval"]
            lines.append(
                f"| {result['dataset']}: {result['held_out_queries']} q | {name} "
                f"| {c['weights']} | {c['kappa']:.3f} [{low:.3f}, {high:.3f}] "
                f"| {c['difference']:+.3f} [{d_low:+.3f}, {d_high:+.3f}] |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument(
        "--max-queries", type=int, default=None, help="encode at most this many queries a set"
    )
    args = parser.parse_args(argv)
    data_dir = shared_data_dir()
    results = [
        run_dataset(name, data_dir, args.depth, args.seed, args.reps, args.max_queries)
        for name in DATASETS
        if (data_dir / name).is_dir()
    ]
    print(
        f"## Second signals beside the cosine (BM25 top {args.depth}, seed {args.seed}, "
        f"at most {args.max_queries or 'all'} queries a set)\n"
    )
    print(markdown(results))
    print()
    print(json.dumps({"depth": args.depth, "seed": args.seed, "results": results}))


if __name__ == "__main__":
    main()
