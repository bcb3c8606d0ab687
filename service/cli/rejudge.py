"""``retrieval-monitor rejudge``: send a window's stored events to the workers again with judge
overrides; the same command resumes where it stopped (``service.replay.rejudge``)."""

from __future__ import annotations

import argparse
import sys

from celery import Celery

from service.analysis.window import TIME_HELP, resolve_window
from service.config.settings import Settings
from service.primitives.clock import utcnow
from service.replay.rejudge import Rejudge, RejudgePlan
from service.wiring.runtime import Runtime


def add_rejudge_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    rejudge = sub.add_parser(
        "rejudge",
        help="judge stored events again with another judge or prompt version",
        description="Send the events of a window (optionally one app or retriever) to the "
        "workers again with judge overrides. Resumable: the same command continues where it "
        "stopped. New scores carry their own judge and prompt version.",
    )
    rejudge.add_argument("--since", default="1d", help=f"window start (default 1d). {TIME_HELP}")
    rejudge.add_argument("--until", default=None, help=f"window end (default now). {TIME_HELP}")
    rejudge.add_argument("--tenant", default="default", help="whose events (default: default)")
    rejudge.add_argument("--app", help="only events of this app")
    rejudge.add_argument("--retriever", help="only events of this retriever")
    rejudge.add_argument("--judge-model", help="the judge model to use instead of RM_JUDGE_MODEL")
    rejudge.add_argument("--judge-base-url", help="the judge endpoint instead of the worker's")
    rejudge.add_argument(
        "--per-passage", action="store_true", help="one call per passage (own prompt version)"
    )
    rejudge.add_argument(
        "--shuffle", action="store_true", help="shuffled passage order (own prompt version)"
    )
    rejudge.add_argument(
        "--include-skipped",
        action="store_true",
        help="also judge events that sampling, a budget or shedding skipped (backfill); events "
        "stored narrow (RM_KEEP_TEXTS=needed) keep no texts and are left out",
    )
    rejudge.add_argument("--batch-size", type=int, default=200, help="events per batch")
    rejudge.add_argument(
        "--max-queued", type=int, default=1_000, help="pause while the queue holds more tasks"
    )
    rejudge.add_argument(
        "--no-wait",
        action="store_true",
        help="stop when a budget is spent instead of waiting for it to reset",
    )
    rejudge.set_defaults(handler=cmd_rejudge)


def overrides_from(args: argparse.Namespace) -> dict[str, str]:
    overrides: dict[str, str] = {}
    if args.judge_model:
        overrides["judge_model"] = args.judge_model
    if args.judge_base_url:
        overrides["judge_base_url"] = args.judge_base_url
    if args.per_passage:
        overrides["judge_per_passage"] = "true"
    if args.shuffle:
        overrides["judge_shuffle"] = "true"
    return overrides


def cmd_rejudge(args: argparse.Namespace, settings: Settings) -> int:
    overrides = overrides_from(args)
    if not overrides:
        print("retrieval-monitor rejudge: name what changes (--judge-model, ...)", file=sys.stderr)
        return 2
    if not settings.redis_url:
        print("retrieval-monitor rejudge: set RM_REDIS_URL", file=sys.stderr)
        return 2
    since, until = resolve_window(args.since, args.until, utcnow())
    plan = RejudgePlan(
        since,
        until,
        args.tenant,
        args.app,
        args.retriever,
        overrides,
        args.include_skipped,
        window_text=f"{args.since}..{args.until or 'now'}",
    )
    sender = Celery(
        "retrieval-monitor-rejudge", broker=settings.judge_broker_url, set_as_current=False
    )
    result = Rejudge(Runtime(settings), sender).run(
        plan, args.batch_size, args.max_queued, wait_for_budget=not args.no_wait
    )
    print(f"sent {result.sent} of {result.total} events (run {plan.run_id})")
    if result.narrow:
        print(
            f"left out {result.narrow} events of the window stored without their texts "
            "(RM_KEEP_TEXTS=needed): there is nothing to judge them on"
        )
    if result.stopped_for_budget is not None:
        print(
            f"stopped: the judge budget of {result.stopped_for_budget!r} is spent; "
            "run the same command again to resume",
            file=sys.stderr,
        )
        return 3
    return 0
