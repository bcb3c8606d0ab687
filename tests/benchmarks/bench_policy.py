"""Keeping in full only what is read (``RM_KEEP_TEXTS=needed``): database bytes and ingest cost.

Two parts, each side by side in one run:

- bytes: bench_storage's workload (SciFact's 300 test claims with their BM25 top 20, k=10,
  replayed three times with reworded queries) written through the store's ingest write in
  commit groups of 50, each event triaged as ingest triages it (``Triage.of`` with the run's
  settings: a 10 % judge sample, the default 1 % kept share), once with ``needed`` and once with
  ``all`` (the baseline); bytes as bench_storage counts them (PostgreSQL: events, passages and
  passage_texts with their indexes and TOAST; SQLite: the file). Then a narrow row alone: the
  same events' labels and ids stored narrow, ``--narrow-events`` of them (enough rows that the
  fixed pages of a table and its indexes weigh little), bytes per row against a full event's;
- ingest: the API (``serve``'s app, on SQLite and on PostgreSQL) taking batches of 100 at the
  same 10 % sample with ``needed`` against ``all``, in alternating runs: events stored/s and API
  CPU per stored event from /proc.

Run: ``python -m tests.benchmarks.bench_policy`` (``--help`` for the knobs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path

import redis

from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.ingest.triage import Triage, initial_states
from service.primitives.clock import utcnow
from service.store.engine import make_engine, session_scope
from service.store.events import InitialState, insert_events
from service.store.migrate import upgrade
from tests.benchmarks.bench_ingest import batch_bodies, post_batches
from tests.benchmarks.bench_ingest import store as api_store
from tests.benchmarks.bench_storage import GROUP, build_workload, database_bytes, store
from tests.benchmarks.common import (
    REDIS_URL,
    Figure,
    api_command,
    count_events,
    cpu_seconds,
    free_port,
    median_figure,
    run_benchmark,
    running,
    service_env,
)

SAMPLE_RATE = 0.1


def fill(url: str, events: list[EventIn], settings: Settings) -> tuple[int, int]:
    """The events through the ingest write, triaged with ``settings``; (narrow, kept) counts."""
    upgrade(url)
    engine = make_engine(url)
    narrow = 0
    for start in range(0, len(events), GROUP):
        named = [(e.event_id or "", e) for e in events[start : start + GROUP]]
        triage = {event_id: Triage.of(event_id, event, settings) for event_id, event in named}
        narrow += sum(not chosen.keep_texts for chosen in triage.values())
        with session_scope(engine) as session:
            insert_events(session, "default", named, utcnow(), initial_states(triage))
            session.commit()
    engine.dispose()
    return narrow, len(events) - narrow


def fill_narrow(url: str, events: list[EventIn], count: int) -> None:
    """``count`` narrow rows made from ``events`` under new ids."""
    upgrade(url)
    engine = make_engine(url)
    narrow = InitialState(skip_reason="unsampled", keep_texts=False)
    named = [(f"n{i}-{uuid.uuid4().hex[:8]}", events[i % len(events)]) for i in range(count)]
    for start in range(0, len(named), 500):
        group = named[start : start + 500]
        with session_scope(engine) as session:
            insert_events(
                session,
                "default",
                group,
                utcnow(),
                dict.fromkeys((event_id for event_id, _ in group), narrow),
            )
            session.commit()
    engine.dispose()


def measure_bytes(args: argparse.Namespace) -> list[Figure]:
    workload = build_workload(args.claims, args.rounds, args.window)
    events = workload.events
    needed = Settings(sample_rate=SAMPLE_RATE, keep_texts="needed")
    everything = Settings(sample_rate=SAMPLE_RATE, keep_texts="all")
    figures: list[Figure] = []
    for kind in ("sqlite", *(() if args.no_postgres else ("postgres",))):
        with store(kind, "policy") as url:
            narrow, kept = fill(url, events, needed)
            policy_bytes = database_bytes(url)
        with store(kind, "all") as url:
            fill(url, events, everything)
            all_bytes = database_bytes(url)
        with store(kind, "narrow") as url:
            fill_narrow(url, events, args.narrow_events)
            narrow_row = database_bytes(url) / args.narrow_events
        note = (
            f"{workload.name}: {len(events)} events at a {SAMPLE_RATE:.0%} sample, "
            f"{kept} kept in full, {narrow} narrow"
        )
        figures += [
            Figure(
                13,
                f"database bytes per event ({kind}), RM_KEEP_TEXTS=needed",
                policy_bytes / len(events),
                "B",
                "RM_KEEP_TEXTS=all, the same events",
                all_bytes / len(events),
                target="<= 0.20x baseline",
                note=note,
            ),
            Figure(
                13,
                f"database bytes per narrow event ({kind})",
                narrow_row,
                "B",
                "every event in full (RM_KEEP_TEXTS=all)",
                all_bytes / len(events),
                target="<= 600 B" if kind == "postgres" else "reported",
                note=f"{args.narrow_events:,} narrow rows",
            ),
        ]
    return figures


def measure_api(stores: list[str], batches: int, repeat: int) -> list[Figure]:
    rate: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(repeat):
            for kind in stores:
                for policy in ("needed", "all"):
                    redis.Redis.from_url(REDIS_URL).flushdb()
                    queue = f"bench-{uuid.uuid4().hex[:6]}"
                    with api_store(kind, Path(folder)) as database_url:
                        port = free_port()
                        url = f"http://127.0.0.1:{port}"
                        env = service_env(
                            database_url,
                            queue,
                            {"RM_KEEP_TEXTS": policy, "RM_SAMPLE_RATE": str(SAMPLE_RATE)},
                        )
                        with running(api_command(port), env, url, "/readyz") as pid:
                            post_batches(url, batch_bodies(2, f"{policy}{r}-warm"))
                            before, spent = count_events(database_url), cpu_seconds(pid)
                            seconds = post_batches(url, batch_bodies(batches, f"{policy}{r}"))
                            stored = max(1, count_events(database_url) - before)
                            rate.setdefault((kind, policy), []).append(stored / seconds)
                            cpu.setdefault((kind, policy), []).append(
                                1000 * (cpu_seconds(pid) - spent) / stored
                            )
                    redis.Redis.from_url(REDIS_URL).delete(queue, f"{queue}.urgent")
    figures: list[Figure] = []
    for kind in stores:
        route = (
            f"POST /v1/events/batch x100 ({kind}), {SAMPLE_RATE:.0%} sample, RM_KEEP_TEXTS=needed"
        )
        figures += [
            median_figure(
                13,
                f"{route}, events stored/s",
                rate[(kind, "needed")],
                "ev/s",
                "RM_KEEP_TEXTS=all",
                rate[(kind, "all")],
                target="no slower (ratio >= ~1)",
            ),
            median_figure(
                13,
                f"{route}, API CPU per stored event",
                cpu[(kind, "needed")],
                "ms",
                "RM_KEEP_TEXTS=all",
                cpu[(kind, "all")],
                target="no more (ratio <= ~1)",
            ),
        ]
    return figures


def measure(args: argparse.Namespace) -> list[Figure]:
    stores = ["sqlite", *(() if args.no_postgres else ("postgres",))]
    return measure_bytes(args) + measure_api(stores, args.batches, args.repeat)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claims", type=int, default=300, help="queries per round")
    parser.add_argument("--rounds", type=int, default=3, help="replays, each reworded")
    parser.add_argument("--window", type=int, default=20, help="passages per event (2k)")
    parser.add_argument(
        "--narrow-events", type=int, default=20_000, help="narrow rows for the per-row figure"
    )
    parser.add_argument("--batches", type=int, default=50, help="batches of 100 per API run")
    parser.add_argument("--repeat", type=int, default=3, help="alternating API runs per policy")
    parser.add_argument("--no-postgres", action="store_true")


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
