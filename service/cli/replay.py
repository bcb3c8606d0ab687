"""``retrieval-monitor replay``: a BEIR-format dataset (or a generated workload) retrieved with
the built-in BM25 and sent as live events."""

from __future__ import annotations

import argparse
from pathlib import Path

from service.config.settings import Settings


def add_replay_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    replay = sub.add_parser(
        "replay",
        help="replay a BEIR-format dataset (or a generated workload) as live events",
        description="Retrieve with a built-in BM25 for each query of a BEIR-format dataset "
        "(corpus.jsonl, queries.jsonl, qrels/<split>.tsv) and send each retrieval as an event.",
    )
    source = replay.add_mutually_exclusive_group(required=True)
    source.add_argument("--dataset", type=Path, help="folder of a BEIR-format dataset")
    source.add_argument(
        "--workload", action="store_true", help="generate a synthetic workload and replay it"
    )
    replay.add_argument("--url", default=None, help="base URL of the API (default: from settings)")
    replay.add_argument("--k", type=int, default=10, help="passages the prompt carries")
    replay.add_argument("--rate", type=float, default=20.0, help="events per second (0: max)")
    replay.add_argument("--limit", type=int, help="replay at most this many queries")
    replay.add_argument("--gold", action="store_true", help="send qrels as gold_passage_ids")
    replay.add_argument(
        "--batch-size", type=int, default=0, help="most events per request (0: the client's 100)"
    )
    replay.add_argument("--app", default="replay", help="the app label of the events")
    replay.add_argument("--retriever", default="bm25", help="the retriever label of the events")
    replay.add_argument("--environment", default=None, help="the environment label")
    replay.add_argument("--split", default="test", help="qrels split to read")
    replay.set_defaults(handler=cmd_replay)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from service.replay.replay import ReplayConfig, run_replay
    from service.replay.workload import generate_workload

    dataset = args.dataset
    if args.workload:
        dataset = generate_workload(Path(settings.data_dir) / "workload")
    url = args.url or f"http://{settings.host}:{settings.port}"
    report = run_replay(
        ReplayConfig(
            base_url=url,
            dataset=dataset,
            k=args.k,
            rate=args.rate,
            limit=args.limit,
            gold=args.gold,
            app=args.app,
            retriever=args.retriever,
            environment=args.environment,
            batch_size=args.batch_size,
            split=args.split,
        )
    )
    print(report.summary())
    return 0 if report.rejected == 0 else 1
