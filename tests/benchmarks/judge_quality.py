"""How well the judge agrees with gold labels, and how batching and order change an LLM judge.

Run as ``python -m tests.benchmarks.judge_quality`` from the repository root. It prints Markdown
tables and then one JSON object on the last line; it checks nothing.

Local judge, on SciFact and Vaswani (BEIR layout under ``../shared/data`` or ``RM_SHARED_DATA``):
the project's own BM25 retrieves the top ``--depth`` (20) passages per query, the local judge grades
every one, and a passage counts gold-relevant when the qrels mark it. ``--backend`` picks the
encoder (numpy float32 by default, the one the thresholds were fitted with); ``--compare-backend``
also encodes with a second one and reports how often the two give the same grade, under the
service's default thresholds and under each one's own fitted thresholds. The queries are split
in two halves at random (``--seed``): the similarity thresholds are fitted on one half
(``service.analysis.threshold_fit``) and precision, recall, F1 and Cohen's kappa are reported on the
other, per grade threshold (relevant = grade >= g), with 95% intervals from resampling queries.
Vaswani is reported with SciFact's thresholds (does one calibration travel?) and with its own.

LLM judge, with ``--llm-base-url`` (any OpenAI-compatible server): on the first ``--llm-queries``
held-out SciFact queries, the top ``--llm-depth`` passages are judged batched in rank order, batched
in reverse order, batched shuffled, and one passage per call, all through ``LlmJudge``. It reports
agreement between batched and per-passage grades, the position effect (the same passage's grade
change per step down the list, from the forward and reversed calls), and how far each batched
order moves the top-half-minus-bottom-half grade away from the per-passage one.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.analysis.threshold_fit import (
    Agreement,
    Interval,
    agreement,
    fit_thresholds,
    split_queries,
)
from service.replay.beir import BeirDataset, load_beir
from service.replay.bm25 import Bm25Index
from workers.judge.encoders import BACKENDS, Backend, load_encoder
from workers.judge.local import grades_from_similarity, local_prompt_version

DATASETS = ("scifact", "vaswani_npl")
DEFAULT_THRESHOLDS = (0.25, 0.40, 0.55)


def shared_data_dir() -> Path:
    configured = os.environ.get("RM_SHARED_DATA")
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / "shared/data"


@dataclass
class Retrieved:
    """One dataset's runs: per passage its query number, similarity and gold label."""

    name: str
    query_ids: list[str]  # query number -> id
    queries: list[str]
    doc_ids: list[list[str]]  # per query, ranked
    texts: list[list[str]]
    query: npt.NDArray[np.int64]  # per passage
    similarity: npt.NDArray[np.float64]
    gold: npt.NDArray[np.bool_]
    gold_total: int  # gold-relevant documents of these queries, retrieved or not


def retrieve(dataset: BeirDataset, name: str, depth: int) -> Retrieved:
    index = Bm25Index.build({doc_id: doc.full_text for doc_id, doc in dataset.corpus.items()})
    query_ids, queries, doc_ids, texts = [], [], [], []
    for query_id, text in sorted(dataset.queries.items()):
        hits = index.search(text, depth)
        if not hits:
            continue
        query_ids.append(query_id)
        queries.append(text)
        doc_ids.append([doc_id for doc_id, _ in hits])
        texts.append([dataset.corpus[doc_id].full_text for doc_id, _ in hits])
    query = np.repeat(np.arange(len(queries)), [len(d) for d in doc_ids])
    gold = np.array(
        [
            dataset.qrels[qid].get(doc_id, 0) >= 1
            for qid, docs in zip(query_ids, doc_ids, strict=True)
            for doc_id in docs
        ],
        dtype=bool,
    )
    gold_total = sum(sum(1 for g in dataset.qrels[qid].values() if g >= 1) for qid in query_ids)
    return Retrieved(
        name,
        query_ids,
        queries,
        doc_ids,
        texts,
        query.astype(np.int64),
        np.zeros(len(query)),
        gold,
        gold_total,
    )


def embed(run: Retrieved, backend: Backend = "numpy") -> None:
    """Cosine similarity of every (query, passage) pair, each distinct text encoded once."""
    encoder = load_encoder(backend)
    passages = sorted({t for texts in run.texts for t in texts})
    position = {t: i for i, t in enumerate(passages)}
    passage_vectors = encoder.encode(passages)
    query_vectors = encoder.encode(run.queries)
    run.similarity = np.array(
        [
            float(passage_vectors[position[t]] @ query_vectors[q])
            for q, texts in enumerate(run.texts)
            for t in texts
        ]
    )


def subset(run: Retrieved, keep: set[str]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """A passage mask for the queries in ``keep`` and their passages' queries renumbered 0..n-1."""
    chosen = [q for q, qid in enumerate(run.query_ids) if qid in keep]
    renumber = np.full(len(run.query_ids), -1, dtype=np.int64)
    renumber[chosen] = np.arange(len(chosen))
    mask = renumber[run.query] >= 0
    return mask, renumber[run.query][mask]


@dataclass
class Row:
    dataset: str
    thresholds: str
    fitted_on: str
    version: str
    grade: int
    agreement: Agreement


def evaluate(
    run: Retrieved,
    keep: set[str],
    thresholds: Sequence[float],
    fitted_on: str,
    reps: int,
    backend: Backend = "numpy",
) -> list[Row]:
    mask, query = subset(run, keep)
    grades = grades_from_similarity(run.similarity[mask], thresholds)
    gold = run.gold[mask]
    return [
        Row(
            dataset=run.name,
            thresholds=",".join(f"{t:g}" for t in thresholds),
            fitted_on=fitted_on,
            version=local_prompt_version(thresholds, backend),
            grade=g,
            agreement=agreement(grades >= g, gold, query, reps=reps, seed=g),
        )
        for g in (1, 2, 3)
    ]


def markdown(rows: Sequence[Row]) -> str:
    lines = [
        "| data (held-out half) | thresholds (fitted on) | grade >= | judged relevant | "
        "precision | recall | F1 | kappa |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        a = row.agreement
        lines.append(
            f"| {row.dataset}: {a.queries} q, {a.passages} p, {a.gold_positive} gold "
            f"| {row.thresholds} ({row.fitted_on}) | {row.grade} | {a.judge_positive} "
            f"| {a.precision.format()} | {a.recall.format()} | {a.f1.format()} "
            f"| {a.kappa.format()} |"
        )
    return "\n".join(lines)


def local_judge_report(
    data_dir: Path,
    depth: int,
    seed: int,
    reps: int,
    backend: Backend = "numpy",
    compare: Backend | None = None,
) -> dict[str, Any]:
    runs: dict[str, Retrieved] = {}
    comparisons: dict[str, dict[str, Any]] = {}
    halves: dict[str, tuple[set[str], set[str]]] = {}
    fitted: dict[str, tuple[float, float, float]] = {}
    info: dict[str, Any] = {}
    for name in DATASETS:
        folder = data_dir / name
        if not folder.is_dir():
            print(f"skipping {name}: {folder} is absent", file=sys.stderr)
            continue
        started = time.perf_counter()
        run = retrieve(load_beir(folder), name, depth)
        embed(run, backend)
        runs[name] = run
        halves[name] = split_queries(run.query_ids, seed)
        calibration_mask, _ = subset(run, halves[name][0])
        fitted[name] = fit_thresholds(run.similarity[calibration_mask], run.gold[calibration_mask])
        if compare is not None:
            other = copy.copy(run)
            embed(other, compare)
            other_fitted = fit_thresholds(
                other.similarity[calibration_mask], other.gold[calibration_mask]
            )
            comparisons[name] = backend_agreement(run, other, fitted[name], other_fitted)
        info[name] = {
            "queries": len(run.query_ids),
            "passages": len(run.gold),
            "gold_relevant_retrieved": int(run.gold.sum()),
            "gold_relevant_total": run.gold_total,
            "bm25_recall_at_depth": round(int(run.gold.sum()) / max(run.gold_total, 1), 4),
            "fitted_thresholds": fitted[name],
            "seconds": round(time.perf_counter() - started, 1),
        }
    rows: list[Row] = []
    for name, run in runs.items():
        held_out = halves[name][1]
        rows += evaluate(run, held_out, DEFAULT_THRESHOLDS, "defaults", reps, backend)
        rows += evaluate(run, held_out, fitted[name], f"{name} half", reps, backend)
        if name != "scifact" and "scifact" in fitted:
            rows += evaluate(run, held_out, fitted["scifact"], "scifact half", reps, backend)
    print(f"## Local judge ({backend}) against gold labels (BM25 top {depth}, seed {seed})\n")
    print(markdown(rows))
    print()
    for name, details in info.items():
        print(f"- {name}: {json.dumps(details)}")
    if comparisons:
        print(f"\n## Grades of {backend} against {compare}, every retrieved passage\n")
        for name, details in comparisons.items():
            print(f"- {name}: {json.dumps(details)}")
    return {
        "backend": backend,
        "comparisons": comparisons,
        "datasets": info,
        "rows": [
            {**{k: v for k, v in asdict(r).items() if k != "agreement"}, **_flat(r.agreement)}
            for r in rows
        ],
    }


def backend_agreement(
    run: Retrieved,
    other: Retrieved,
    fitted: Sequence[float],
    other_fitted: Sequence[float],
) -> dict[str, Any]:
    """How far two encoders' similarities and grades differ on the same (query, passage) pairs."""
    from service.config.settings import Settings

    difference = other.similarity - run.similarity
    service_thresholds = Settings().local_judge_thresholds
    out: dict[str, Any] = {
        "pairs": len(run.similarity),
        "similarity_difference_mean": round(float(difference.mean()), 5),
        "similarity_difference_abs_p99": round(float(np.quantile(np.abs(difference), 0.99)), 5),
        "similarity_difference_abs_max": round(float(np.abs(difference).max()), 5),
        "other_fitted_thresholds": [round(t, 4) for t in other_fitted],
    }
    for label, first, second in (
        ("service_thresholds", service_thresholds, service_thresholds),
        ("own_fitted_thresholds", fitted, other_fitted),
    ):
        a = grades_from_similarity(run.similarity, first)
        b = grades_from_similarity(other.similarity, second)
        out[label] = {
            "exact_grade_agreement": round(float(np.mean(a == b)), 4),
            "within_one_grade": round(float(np.mean(np.abs(a - b) <= 1)), 4),
            "relevant_ge2_agreement": round(float(np.mean((a >= 2) == (b >= 2))), 4),
        }
    return out


def _flat(a: Agreement) -> dict[str, Any]:
    out: dict[str, Any] = {
        "queries": a.queries,
        "passages": a.passages,
        "gold_positive": a.gold_positive,
        "judge_positive": a.judge_positive,
    }
    for name in ("precision", "recall", "f1", "kappa"):
        value: Interval = getattr(a, name)
        out[name] = [_round(value.value), _round(value.low), _round(value.high)]
    return out


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 4)


# --------------------------------------------------------------------------------------------
# LLM judge: batched versus per-passage, and position


def llm_report(
    run: Retrieved, held_out: set[str], args: argparse.Namespace, reps: int
) -> dict[str, Any]:
    from service.config.settings import Settings
    from workers.judge.llm import LlmJudge
    from workers.judge.prompt import JudgeRequest

    chosen = [q for q, qid in enumerate(run.query_ids) if qid in held_out][: args.llm_queries]
    base: dict[str, Any] = {
        "judge_base_url": args.llm_base_url,
        "judge_model": args.llm_model,
        "judge_max_tokens": args.llm_max_tokens,
        "judge_timeout_seconds": 600,
        "judge_malformed_retries": 0,
        "redis_url": "",
    }
    judges = {
        "forward": LlmJudge(Settings.model_validate(base)),
        "shuffled": LlmJudge(Settings.model_validate({**base, "judge_shuffle": True})),
        "per_passage": LlmJudge(Settings.model_validate({**base, "judge_per_passage": True})),
    }
    grades: dict[str, list[list[int | None]]] = {k: [] for k in (*judges, "reversed")}
    cost: dict[str, dict[str, float]] = {
        k: {"calls": 0, "malformed": 0, "seconds": 0.0, "prompt_tokens": 0, "completion_tokens": 0}
        for k in grades
    }
    modes: dict[str, int] = {}
    gold_rows: list[list[bool]] = []
    for q in chosen:
        texts = tuple(run.texts[q][: args.llm_depth])
        gold_rows.append(
            [run.gold[(run.query == q)][i] for i in range(len(texts))]  # rank order
        )
        request = JudgeRequest(run.queries[q], texts, rate_context=False, top_k_count=0)
        backwards = JudgeRequest(run.queries[q], texts[::-1], rate_context=False, top_k_count=0)
        for name, judge, asked in (
            ("forward", judges["forward"], request),
            ("reversed", judges["forward"], backwards),
            ("shuffled", judges["shuffled"], request),
            ("per_passage", judges["per_passage"], request),
        ):
            reply = judge.judge(asked)
            got = list(reply.grades)
            grades[name].append(got[::-1] if name == "reversed" else got)
            tally = cost[name]
            tally["calls"] += reply.calls
            tally["malformed"] += reply.malformed_replies
            tally["seconds"] += reply.latency_seconds
            tally["prompt_tokens"] += reply.prompt_tokens
            tally["completion_tokens"] += reply.completion_tokens
            for mode, count in reply.output_modes.items():
                modes[mode] = modes.get(mode, 0) + count
    result = llm_figures(grades, gold_rows, reps)
    result.update(cost=cost, output_modes=modes, queries=len(chosen), depth=args.llm_depth)
    print(f"\n## LLM judge {args.llm_model} at {args.llm_base_url}\n")
    print(json.dumps(result, indent=1))
    return result


def llm_figures(
    grades: dict[str, list[list[int | None]]], gold: list[list[bool]], reps: int
) -> dict[str, Any]:
    """Agreement, position effect and top-half bias from grades per variant, query and rank."""
    rng = np.random.default_rng(0)
    n_queries = len(gold)

    def pairs(a: str, b: str, queries: Sequence[int]) -> tuple[list[int], list[int]]:
        xs, ys = [], []
        for q in queries:
            for x, y in zip(grades[a][q], grades[b][q], strict=True):
                if x is not None and y is not None:
                    xs.append(x)
                    ys.append(y)
        return xs, ys

    def with_interval(statistic: Any) -> list[float | None]:
        point = statistic(range(n_queries))
        boots = [statistic(rng.integers(0, n_queries, n_queries)) for _ in range(reps)]
        finite = [b for b in boots if b is not None and math.isfinite(b)]
        if point is None or not finite:
            return [None, None, None]
        low, high = np.quantile(finite, [0.025, 0.975])
        return [_round(point), _round(float(low)), _round(float(high))]

    def exact(a: str, b: str) -> Any:
        return lambda qs: (lambda p: float(np.mean(np.equal(*p))) if p[0] else None)(
            pairs(a, b, qs)
        )

    def kappa(a: str, b: str) -> Any:
        def stat(qs: Sequence[int]) -> float | None:
            xs, ys = pairs(a, b, qs)
            if not xs:
                return None
            x, y = np.array(xs) >= 2, np.array(ys) >= 2
            observed = float(np.mean(x == y))
            chance = float(x.mean() * y.mean() + (1 - x.mean()) * (1 - y.mean()))
            return None if chance >= 1 else (observed - chance) / (1 - chance)

        return stat

    def position_slope(qs: Sequence[int]) -> float | None:
        # Within-passage change of grade per position step, from forward vs reversed order.
        num = den = 0.0
        for q in qs:
            n = len(grades["forward"][q])
            for rank, (f, r) in enumerate(
                zip(grades["forward"][q], grades["reversed"][q], strict=True)
            ):
                if f is None or r is None:
                    continue
                step = rank - (n - 1 - rank)  # forward position minus reversed position
                num += (f - r) * step
                den += step * step
        return num / den if den else None

    def top_minus_bottom(variant: str) -> Any:
        def stat(qs: Sequence[int]) -> float | None:
            diffs = []
            for q in qs:
                row = grades[variant][q]
                half = len(row) // 2
                top = [g for g in row[:half] if g is not None]
                bottom = [g for g in row[half:] if g is not None]
                if top and bottom:
                    diffs.append(float(np.mean(top) - np.mean(bottom)))
            return float(np.mean(diffs)) if diffs else None

        return stat

    def gold_kappa(variant: str) -> Any:
        def stat(qs: Sequence[int]) -> float | None:
            xs, ys = [], []
            for q in qs:
                for g, label in zip(grades[variant][q], gold[q], strict=True):
                    if g is not None:
                        xs.append(g >= 2)
                        ys.append(label)
            if not xs:
                return None
            x, y = np.array(xs), np.array(ys)
            observed = float(np.mean(x == y))
            chance = float(x.mean() * y.mean() + (1 - x.mean()) * (1 - y.mean()))
            return None if chance >= 1 else (observed - chance) / (1 - chance)

        return stat

    missing = {k: sum(g is None for row in rows for g in row) for k, rows in grades.items()}
    return {
        "labels_per_variant": sum(len(r) for r in grades["forward"]),
        "missing_labels": missing,
        "grade_histogram": {
            k: {str(v): sum(g == v for row in rows for g in row) for v in (0, 1, 2, 3)}
            for k, rows in grades.items()
        },
        "batched_vs_per_passage_exact": with_interval(exact("forward", "per_passage")),
        "batched_vs_per_passage_kappa_ge2": with_interval(kappa("forward", "per_passage")),
        "forward_vs_reversed_exact": with_interval(exact("forward", "reversed")),
        "position_slope_grade_per_step": with_interval(position_slope),
        "top_minus_bottom_half_grade": {
            k: with_interval(top_minus_bottom(k)) for k in ("forward", "shuffled", "per_passage")
        },
        "kappa_vs_gold_ge2": {k: with_interval(gold_kappa(k)) for k in grades},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=None, help="default: ../shared/data")
    parser.add_argument("--depth", type=int, default=20, help="passages retrieved per query")
    parser.add_argument("--seed", type=int, default=0, help="seed of the query split")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--backend", choices=BACKENDS, default="numpy", help="local judge encoder")
    parser.add_argument(
        "--compare-backend", choices=BACKENDS, default=None, help="grade agreement with this one"
    )
    parser.add_argument("--llm-base-url", default="", help="also judge with this LLM endpoint")
    parser.add_argument("--llm-model", default="judge")
    parser.add_argument("--llm-queries", type=int, default=20)
    parser.add_argument("--llm-depth", type=int, default=6)
    parser.add_argument("--llm-max-tokens", type=int, default=64)
    parser.add_argument(
        "--llm-only", action="store_true", help="skip the local judge (with --llm-base-url)"
    )
    args = parser.parse_args(argv)
    data_dir = args.data or shared_data_dir()
    if not data_dir.is_dir():
        raise SystemExit(f"no data folder at {data_dir} (set RM_SHARED_DATA or --data)")
    summary: dict[str, Any] = {}
    if not args.llm_only:
        local = local_judge_report(
            data_dir, args.depth, args.seed, args.reps, args.backend, args.compare_backend
        )
        summary["local"] = {k: local[k] for k in ("backend", "comparisons", "datasets", "rows")}
    if args.llm_base_url:
        if not (data_dir / "scifact").is_dir():
            raise SystemExit("the LLM comparison runs on SciFact, which is absent")
        run = retrieve(load_beir(data_dir / "scifact"), "scifact", args.depth)
        held_out = split_queries(run.query_ids, args.seed)[1]
        summary["llm"] = llm_report(run, held_out, args, min(args.reps, 1000))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
