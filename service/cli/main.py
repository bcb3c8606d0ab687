"""``retrieval-monitor``: run the API, a worker, the scheduler, migrations, or a replay.

Every setting also comes from the environment (``RM_*``; see ``retrieval-monitor settings``).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from service.cli.analyze import add_analyze_command
from service.cli.calibrate import add_calibrate_command
from service.kernel.settings import Settings, get_settings
from service.process import logs
from service.replay.gold_export import add_gold_command
from service.replay.rejudge import add_rejudge_command

log = logging.getLogger("retrieval_monitor")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = get_settings()
    logs.configure(settings.log_level, settings.log_json)
    handler = args.handler
    result: int = handler(args, settings)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retrieval-monitor",
        description="Judge live RAG retrievals and export their quality to Prometheus. "
        "Settings come from RM_* environment variables; empty connection settings mean the "
        "embedded defaults (SQLite file, embedded Redis, local embedding judge).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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

    worker = sub.add_parser(
        "worker",
        help="run a judge worker (needs RM_REDIS_URL)",
        description="Run a Celery worker that judges events. Needs RM_REDIS_URL.",
    )
    worker.add_argument("--concurrency", type=int, help="worker processes (RM_WORKER_CONCURRENCY)")
    worker.add_argument(
        "--with-scheduler", action="store_true", help="also run the periodic sweeper in-process"
    )
    worker.set_defaults(handler=cmd_worker)

    scheduler = sub.add_parser(
        "scheduler",
        help="run the periodic jobs (the pending-event sweeper); exactly one per deployment",
    )
    scheduler.set_defaults(handler=cmd_scheduler)

    migrate = sub.add_parser("migrate", help="bring the database schema up to date")
    migrate.set_defaults(handler=cmd_migrate)

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

    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it (shown only once)")
    create.add_argument("--tenant", required=True, help="the tenant the key acts for")
    create.add_argument("--name", default="", help="a note on who uses the key")
    create.add_argument("--admin", action="store_true", help="may read /metrics when protected")
    create.set_defaults(handler=cmd_keys_create)
    revoke = keys_sub.add_parser("revoke", help="revoke keys by the prefix of their hash")
    revoke.add_argument("hash_prefix", help="at least 8 characters of the key's hash (keys list)")
    revoke.set_defaults(handler=cmd_keys_revoke)
    listing = keys_sub.add_parser("list", help="list keys (hash prefix, tenant, state)")
    listing.set_defaults(handler=cmd_keys_list)

    add_analyze_command(sub)
    add_rejudge_command(sub)
    add_calibrate_command(sub)
    add_gold_command(sub)

    show = sub.add_parser("settings", help="print every setting with its value and description")
    show.set_defaults(handler=cmd_settings)
    return parser


# --- commands -----------------------------------------------------------------------------------


def cmd_migrate(_args: argparse.Namespace, settings: Settings) -> int:
    from service.store.migrate import upgrade

    upgrade(settings.database_url)
    log.info("database schema is up to date")
    return 0


def cmd_keys_create(args: argparse.Namespace, settings: Settings) -> int:
    from service.auth.keys import key_hash, new_key
    from service.kernel.clock import utcnow
    from service.store import keys as keys_repository
    from service.store.engine import get_engine, session_scope
    from service.store.migrate import upgrade

    upgrade(settings.database_url)
    key = new_key()
    with session_scope(get_engine(settings.database_url)) as session:
        keys_repository.add_key(
            session, args.tenant, key_hash(key), args.name, args.admin, utcnow()
        )
        session.commit()
    print(key)
    print(f"hash {key_hash(key)[:12]}  tenant {args.tenant}  (store the key now)", file=sys.stderr)
    return 0


def cmd_keys_revoke(args: argparse.Namespace, settings: Settings) -> int:
    from redis import Redis

    from service.auth.keys import announce_revocation
    from service.kernel.clock import utcnow
    from service.store import keys as keys_repository
    from service.store.engine import get_engine, session_scope

    if not re.fullmatch(r"[0-9a-f]{8,64}", args.hash_prefix):
        print("give at least 8 hex characters of the hash (keys list)", file=sys.stderr)
        return 2
    with session_scope(get_engine(settings.database_url)) as session:
        count = keys_repository.revoke_keys(session, args.hash_prefix, utcnow())
        session.commit()
    if count and settings.redis_url:
        # Every API process drops its cached lookups within a second.
        announce_revocation(Redis.from_url(settings.redis_url))
    print(f"revoked {count} key(s)")
    return 0 if count else 1


def cmd_keys_list(_args: argparse.Namespace, settings: Settings) -> int:
    from service.store import keys as keys_repository
    from service.store.engine import get_engine, session_scope

    with session_scope(get_engine(settings.database_url)) as session:
        for key in keys_repository.list_keys(session):
            state = "revoked" if key.revoked_at else "active"
            role = "admin" if key.is_admin else "tenant"
            print(f"{key.key_hash[:12]}  {key.tenant:<20} {role:<6} {state:<8} {key.name}")
    return 0


def cmd_settings(_args: argparse.Namespace, settings: Settings) -> int:
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        shown = "********" if "key" in name and str(value) else value
        print(f"RM_{name.upper()}={shown}\n    {field.description}")
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.redis_url:
        print("retrieval-monitor worker: set RM_REDIS_URL to the broker's URL", file=sys.stderr)
        return 2
    concurrency = args.concurrency or settings.worker_concurrency
    command = worker_command(concurrency, args.with_scheduler, settings)
    os.execvp(command[0], command)
    return 0  # pragma: no cover - execvp does not return


def worker_command(concurrency: int, with_scheduler: bool, settings: Settings) -> list[str]:
    from service.kernel.queue_names import urgent_queue

    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app",
        "worker",
        "--concurrency",
        str(concurrency),
        "--queues",
        # The urgent queue first: gold events and events whose signals look bad.
        f"{urgent_queue(settings.queue_name)},{settings.queue_name}",
        "--loglevel",
        settings.log_level,
        "--without-gossip",
        "--without-mingle",
    ]
    if with_scheduler:
        schedule = Path(settings.data_dir) / "celerybeat-schedule"
        schedule.parent.mkdir(parents=True, exist_ok=True)
        command += ["--beat", "--schedule", str(schedule)]
    return command


def quiet(command: list[str]) -> list[str]:
    """The Celery command without its start-up banner (``-q`` goes before the subcommand)."""
    at = command.index("worker")
    return [*command[:at], "--quiet", *command[at:]]


def cmd_scheduler(_args: argparse.Namespace, settings: Settings) -> int:
    if not settings.redis_url:
        print("retrieval-monitor scheduler: set RM_REDIS_URL", file=sys.stderr)
        return 2
    schedule = Path(settings.data_dir) / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.celery_app",
        "beat",
        "--schedule",
        str(schedule),
        "--loglevel",
        settings.log_level,
    ]
    os.execvp(command[0], command)
    return 0  # pragma: no cover


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


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from service.process.embedded import EmbeddedRedis
    from service.store.migrate import upgrade

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
    refusal = open_remote_refusal(settings.model_copy(update=overrides))
    if refusal:
        print(f"retrieval-monitor serve: {refusal}", file=sys.stderr)
        return 2
    embedded: EmbeddedRedis | None = None
    if not settings.redis_url:
        embedded = EmbeddedRedis.start(Path(settings.data_dir) / "redis")
        overrides["redis_url"] = embedded.url
        log.info("embedded Redis started", extra={"url": embedded.url, "pid": embedded.pid})
    settings = settings.model_copy(update=overrides)
    upgrade(settings.database_url)

    worker: subprocess.Popen[bytes] | None = None
    tee: logs.LogTee | None = None
    if not args.no_worker:
        env = {**os.environ, "RM_REDIS_URL": settings.redis_url}
        env["RM_DATABASE_URL"] = settings.database_url
        command = worker_command(settings.worker_concurrency, True, settings)
        if log_file is None:
            worker = subprocess.Popen(command, env=env)
        else:
            worker = subprocess.Popen(
                quiet(command), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            assert worker.stdout is not None
            tee = logs.LogTee(worker.stdout, log_file, sys.stderr).start()
        log.info("worker started", extra={"pid": worker.pid})
    children = [p.pid for p in (worker, embedded) if p is not None and p.pid]
    guard = (
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.process.orphan_guard",
                str(os.getpid()),
                *map(str, children),
            ]
        )
        if children
        else None
    )

    try:
        if api_workers > 1:
            _serve_processes(settings, api_workers)
        else:
            _serve_in_process(settings, args, log_file)
    finally:
        if worker is not None:
            # SIGTERM lets Celery finish (or, with acks_late, requeue) the task in hand.
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
        if tee is not None:
            tee.join(timeout=5)
        if embedded is not None:
            embedded.stop()
        if guard is not None:
            guard.terminate()
    return 0


def _serve_in_process(settings: Settings, args: argparse.Namespace, log_file: Path | None) -> None:
    from service.api.app import create_app
    from service.process.server import Server, server_config

    server = Server(server_config(create_app(settings), settings))
    if args.demo:
        threading.Thread(
            target=_run_demo,
            args=(settings, server, args.demo_queries, args.exit_after_demo, log_file),
            daemon=True,
        ).start()
    server.run()


def _serve_processes(settings: Settings, workers: int) -> None:
    from service.process.server import run_workers
    from service.telemetry.rebuild import ensure_aggregates
    from service.wiring.runtime import Runtime

    # The API processes build their settings from the environment: what serve decided goes there.
    os.environ.update(
        {
            "RM_REDIS_URL": settings.redis_url,
            "RM_HOST": settings.host,
            "RM_PORT": str(settings.port),
        }
    )
    # Rebuilt once, before any process takes traffic: a process that is still rebuilding while
    # another one already counts would see those events in the database and count them again.
    runtime = Runtime(settings)
    try:
        ensure_aggregates(runtime)
    except Exception:  # Redis or the database down at start: /metrics retries on scrape
        log.warning("shared aggregates not checked at startup", exc_info=True)
    finally:
        runtime.engine.dispose()
    log.info("starting API processes", extra={"workers": workers, "port": settings.port})
    run_workers(settings, workers)


def open_remote_refusal(settings: Settings) -> str | None:
    """Why ``serve`` must not start as configured, or None: listening beyond loopback with no
    API keys required opens ingest and every tenant's pages to whoever reaches the port."""
    if settings.auth_required or settings.allow_open_remote or is_loopback(settings.host):
        return None
    return (
        f"refusing to listen on {settings.host} with API keys off: anyone who reaches the port "
        "could send events and read every page. Set RM_AUTH_REQUIRED=true and create keys "
        "(retrieval-monitor keys create), or set RM_ALLOW_OPEN_REMOTE=true if the network in "
        "front already controls who gets in."
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to anything


def _run_demo(
    settings: Settings, server: object, queries: int, exit_after: bool, log_file: Path | None
) -> None:
    from service.process.demo import run_demo

    ok = run_demo(settings, queries, log_file)
    if exit_after:
        setattr(server, "should_exit", True)  # noqa: B010 - uvicorn's documented stop flag
        if not ok:
            os._exit(1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
