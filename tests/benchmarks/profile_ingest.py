"""Ingest, stage by stage: microseconds of one process's time per event in each stage of the
request path, for single events and for batches of 100, on SQLite and PostgreSQL.

The real functions run in this process on a real database and Redis: the body is parsed as the
route does (a single event with ``json.loads`` then the pydantic models; a batch by the compiled
decoder, which builds every event from the bytes), then ``Ingestor.ingest`` stores it. Each
stage is timed by wrapping the function that does it, with ``time.thread_time_ns`` (CPU) and
``time.perf_counter_ns`` (wall); a stage's time excludes the stages nested in it (the passage
write inside the insert, for example), so a column adds up to its total. What the wrappers do
not cover is "other" (the loops of ``ingest`` itself). The near-duplicate ratio, counted after
the answer on a thread of its own, is timed there and included. Each timed call adds a few
microseconds of its own. HTTP (the server, Starlette, the answer's serialization) is not in it:
the bare endpoint's figures measure that. Objects alive after the warm-up are frozen out of the
garbage collector's walks, as the API freezes what its start-up built. A single event is stored
alone (a group of one, as on a quiet service; under load concurrent requests share a
transaction). Run:
``python -m tests.benchmarks.profile_ingest [--events N] [--no-postgres] [--unique-passages]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import redis
from sqlalchemy.orm import Session

from service.api.heap import freeze_startup_objects
from service.contract import validate
from service.contract.event_decoder import decode_valid_batch
from service.contract.schemas import BatchIn, EventIn
from service.ingest import counts, triage
from service.ingest.ingestor import Ingestor
from service.ingest.judge_queue import JudgeQueue
from service.ingest.signals import NearDuplicateCount
from service.primitives.background import BackgroundWorker
from service.store import event_rows
from service.store import events as event_store
from service.store.migrate import upgrade
from service.wiring.runtime import Runtime
from tests.benchmarks.bench_ingest import event, store
from tests.benchmarks.common import REDIS_URL, in_process_settings

# Stages in the order of the request path, as the table prints them.
STAGES = (
    "parse (json.loads)",
    "storable check",
    "validate (pydantic, rest)",
    "decode + build (msgspec, batch)",
    "limits + redaction",
    "signals + urgent decision",
    "sampling",
    "identity hash",
    "known-id lookup",
    "event insert",
    "passage insert",
    "commit",
    "counters (fold)",
    "counters + enqueue (Redis)",
    "duplicate ratio (after the answer)",
    "other",
)


class StageClock:
    """Exclusive nanoseconds per stage: time spent in a nested timed call goes to its stage."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.cpu_ns: dict[str, int] = defaultdict(int)
        # Per thread: the deferred duplicate ratios are counted on a thread of their own.
        self._local = threading.local()
        self._undo: list[Callable[[], None]] = []

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        children: list[tuple[int, int]] = self._local.__dict__.setdefault("children", [])
        children.append((0, 0))
        started, cpu_started = time.perf_counter_ns(), time.thread_time_ns()
        try:
            yield
        finally:
            elapsed = time.perf_counter_ns() - started
            cpu = time.thread_time_ns() - cpu_started
            nested, nested_cpu = children.pop()
            self.ns[name] += elapsed - nested
            self.cpu_ns[name] += cpu - nested_cpu
            if children:
                outer, outer_cpu = children[-1]
                children[-1] = (outer + elapsed, outer_cpu + cpu)

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        """Time every call of ``owner.attribute`` as stage ``name`` until ``restore``."""
        original = (
            owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
        )
        function = (
            original.__func__ if isinstance(original, classmethod | staticmethod) else original
        )

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return function(*args, **kwargs)

        replacement: Any = timed
        if isinstance(original, classmethod):
            replacement = classmethod(timed)
        elif isinstance(original, staticmethod):
            replacement = staticmethod(timed)
        setattr(owner, attribute, replacement)
        self._undo.append(lambda: setattr(owner, attribute, original))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def instrument(clock: StageClock) -> None:
    """Wrap the functions each stage runs; names as the modules of the request path call them."""
    import service.contract.schemas as schemas

    clock.wrap(schemas, "check_body", "storable check")
    clock.wrap(validate, "check_limits", "limits + redaction")
    clock.wrap(validate, "redact_event", "limits + redaction")
    clock.wrap(triage, "compute_signals", "signals + urgent decision")
    # The urgent check, read only as far as it needs.
    clock.wrap(NearDuplicateCount, "reaches", "signals + urgent decision")
    clock.wrap(triage, "decide", "sampling")
    clock.wrap(event_store, "payload_hash", "identity hash")
    clock.wrap(event_store, "known_payload_hashes", "known-id lookup")
    clock.wrap(event_store, "insert_events", "event insert")
    clock.wrap(event_store, "store_passages", "passage insert")
    # PostgreSQL writes the passages in the events' statement: their arrays are built here, and
    # the database's share of the statement counts as the event insert.
    if hasattr(event_rows, "postgres_passage_parameters"):
        clock.wrap(event_rows, "postgres_passage_parameters", "passage insert")
    clock.wrap(Session, "commit", "commit")
    clock.wrap(counts.IngestCounts, "accepted", "counters (fold)")
    clock.wrap(counts.IngestCounts, "add_to", "counters (fold)")
    # The only background worker here: the duplicate ratios' (no gathering, no HTTP counter).
    clock.wrap(BackgroundWorker, "flush", "duplicate ratio (after the answer)")
    # The counters and the judge messages leave in one Redis round trip.
    clock.wrap(JudgeQueue, "push", "counters + enqueue (Redis)")


def single(runtime: Runtime, ingestor: Ingestor, clock: StageClock, bodies: list[bytes]) -> None:
    """One event per call, as the route hands it over (a group of one)."""
    for body in bodies:
        with clock.stage("other"):
            with clock.stage("parse (json.loads)"):
                raw = json.loads(body)
            with clock.stage("validate (pydantic, rest)"):
                parsed = EventIn.model_validate(raw)
            checked = validate.validate(parsed, runtime.settings, runtime.redactor)
            assert isinstance(checked, EventIn)
            ingestor.ingest("default", [checked])


def batched(runtime: Runtime, ingestor: Ingestor, clock: StageClock, bodies: list[bytes]) -> None:
    """One batch per call, as ``POST /v1/events/batch`` runs it: read from its bytes by the
    compiled decoder (``service/http/decoded_batch.py``), by the models when it declines."""
    for body in bodies:
        with clock.stage("other"):
            with clock.stage("decode + build (msgspec, batch)"):
                decoded = decode_valid_batch(body, runtime.settings)
            if decoded is None:
                with clock.stage("parse (json.loads)"):
                    raw = json.loads(body)
                with clock.stage("validate (pydantic, rest)"):
                    batch = BatchIn.model_validate(raw)
            valid = []
            for item in batch.events if decoded is None else decoded:
                checked = validate.validate(item, runtime.settings, runtime.redactor)
                assert isinstance(checked, EventIn)
                valid.append(checked)
            ingestor.ingest("default", valid)


def profile(kind: str, events: int, tmp: Path, unique: bool = False) -> dict[str, dict[str, float]]:
    """Microseconds per event in each stage, for the single and the batch path, on ``kind``:
    CPU time of this thread (what limits throughput) and wall time (what the client waits)."""
    out: dict[str, dict[str, float]] = {}
    redis.Redis.from_url(REDIS_URL).flushdb()
    with store(kind, tmp) as database_url:
        upgrade(database_url)
        settings = in_process_settings(database_url, tmp)
        runtime = Runtime(settings)
        sender = JudgeQueue(settings.redis_url, settings.queue_name, settings.judge_slice_events)
        ingestor = Ingestor(runtime, sender)
        run = uuid.uuid4().hex[:6]
        # Warm up: connections, prepared statements, caches of label sets and passage prefixes.
        warm = [orjson.dumps(event(i, f"{run}w")) for i in range(200)]
        single(runtime, ingestor, StageClock(), warm)
        # As the API does once started (service/api/heap.py): what start-up built is left out of
        # the collector's walks, which otherwise land in whichever stage allocates past its
        # threshold.
        freeze_startup_objects()
        for path, bodies, runner in (
            (
                "single",
                [orjson.dumps(event(i, f"{run}s", unique=unique)) for i in range(events)],
                single,
            ),
            (
                "batch x100",
                [
                    orjson.dumps(
                        {
                            "events": [
                                event(b * 100 + i, f"{run}b", unique=unique) for i in range(100)
                            ]
                        }
                    )
                    for b in range(max(1, events // 100))
                ],
                batched,
            ),
        ):
            clock = StageClock()
            instrument(clock)
            try:
                runner(runtime, ingestor, clock, bodies)
                ingestor.before_scrape()  # what is still to count, counted
            finally:
                clock.restore()
            stored = len(bodies) * (1 if path == "single" else 100)
            name = f"{kind}, {path}"
            out[f"{name}, cpu"] = {s: clock.cpu_ns[s] / 1000 / stored for s in STAGES}
            out[f"{name}, wall"] = {s: clock.ns[s] / 1000 / stored for s in STAGES}
        runtime.engine.dispose()
    return out


def table(columns: dict[str, dict[str, float]], measure: str) -> str:
    names = [name for name in columns if name.endswith(measure)]
    lines = [
        f"| stage (us {measure} per event) | "
        + " | ".join(name.removesuffix(f", {measure}") for name in names)
        + " |",
        "|---|" + "---:|" * len(names),
    ]
    for stage in STAGES:
        lines.append(f"| {stage} | " + " | ".join(f"{columns[n][stage]:.0f}" for n in names) + " |")
    lines.append(
        "| **total** | " + " | ".join(f"**{sum(columns[n].values()):.0f}**" for n in names) + " |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=1000, help="events per path and store")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument(
        "--unique-passages",
        action="store_true",
        help="every passage text new (default: drawn from 200 texts, as bench_ingest)",
    )
    args = parser.parse_args(argv)
    columns: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ["sqlite"] + ([] if args.no_postgres else ["postgres"]):
            columns.update(profile(kind, args.events, Path(tmp), args.unique_passages))
    print(table(columns, "cpu"))
    print()
    print(table(columns, "wall"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
