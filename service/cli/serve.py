"""``retrieval-monitor serve``: the API, and by default the embedded Redis, a worker and the
sweeper, all stopped with it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from service.config.settings import Settings
from service.process import logs
from service.process.exposure import open_remote_refusal


def add_serve_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    serve = sub.add_parser(
        "serve",
        help="run the API (and, by default, a worker and the sweeper)",
        description="Run the HTTP API. With no RM_REDIS_URL it starts an embedded Redis; unless "
        "--no-worker it also starts a worker process with the periodic sweeper. With --workers N "
        "it runs N API processes on the one port; the embedded Redis and the worker are still "
        "started once, and every process stops when serve does.",
    )
    serve.add_argument("--host", help="address to listen on (default: RM_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default: RM_PORT or 8080)")
    serve.add_argument(
        "--workers",
        type=positive_int,
        help="API processes sharing the port, about one per core (default: RM_API_WORKERS or 1); "
        "counters, rate limits and metrics stay exact across them",
    )
    serve.add_argument("--no-worker", action="store_true", help="do not start a worker process")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="replay a generated workload once the API is up and print where to look",
    )
    serve.add_argument(
        "--demo-queries", type=int, default=150, help="queries the demo replays (default 150)"
    )
    serve.add_argument(
        "--exit-after-demo",
        action="store_true",
        help="stop once the demo's events are judged (for scripted checks)",
    )
    serve.set_defaults(handler=cmd_serve)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from service.process.supervisor import Demo, ServePlan, serve

    api_workers = args.workers or settings.api_workers
    if api_workers > 1 and args.demo:
        print(
            "retrieval-monitor serve: --demo runs one API process; leave out --workers",
            file=sys.stderr,
        )
        return 2
    log_file: Path | None = None
    if args.demo:
        # The console is the demo's: its progress and summary, and only warnings among the logs.
        log_file = Path(settings.data_dir) / "logs" / "serve.log"
        logs.configure_file_and_console(log_file, settings.log_level, settings.log_json)
        print(f"Logs go to {log_file} (warnings also here).", file=sys.stderr, flush=True)
    overrides: dict[str, object] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    settings = settings.model_copy(update=overrides)
    refusal = open_remote_refusal(settings)
    if refusal:
        print(f"retrieval-monitor serve: {refusal}", file=sys.stderr)
        return 2
    plan = ServePlan(
        api_workers=api_workers,
        with_worker=not args.no_worker,
        demo=Demo(args.demo_queries, args.exit_after_demo) if args.demo else None,
        log_file=log_file,
    )
    serve(settings, plan)
    return 0
