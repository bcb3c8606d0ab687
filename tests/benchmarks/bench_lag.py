"""Lag from ingest to /metrics at a steady rate: how soon a scrape shows an accepted event.

The real API (``serve --no-worker``, one process and ``--workers 2``) on SQLite and on a fresh
PostgreSQL database, with a real Celery worker of 2 processes judging against the test's
OpenAI-compatible server, receives single events (``POST /v1/events``, the bodies of
``bench_ingest.event``) at a steady rate (default 100/s) from 16 client threads, each event sent
at its own moment (a late thread catches up rather than drifting; 16, not bench_judging's 4, so
that answers of ~100 ms on a loaded machine still leave room for 100 events/s). Figures, p50 and
p95 over every accepted event of a run:

(a) counter lag: from an event's send to the first scrape whose
    ``retrieval_monitor_events_accepted_total`` (summed over its series) shows it;
(b) near-duplicate ratio lag: the same with the ``_count`` of
    ``retrieval_monitor_signal_duplicate_ratio``, which a thread of the API process exports after
    the answer (``service.ingest.deferred``: every 0.25 s, and before each scrape of that process);
(c) ``retrieval_monitor_pipeline_lag_seconds`` (receipt to the export of the judged measures),
    interpolated within its buckets over the run, as ``bench_judging`` reads it.

Method for (a) and (b). One scraper thread polls /metrics every ~25 ms (start to start) over a
keep-alive connection pinned to the first API process (which process took a connection is read
from /proc), recording each scrape's start time and the two counts, less their values before the
run. Counts only grow, so the first scrape showing a count of at least i is exactly when the i-th
event (in the order they were counted) became visible: the set of visibility times is exact, and
with it the mean lag. Which event was counted i-th is not observable with concurrent senders, so
events are paired with counts by the order of their answers: event i is the i-th 202 to come back
(in time). Each event is counted before its 202 is sent, so the 202 order follows the count order
closely, not exactly: an answer held up (its process busy rendering a scrape, say) is overtaken
by the 202s of events counted after it, and an event can then be paired with a count reached
before it was even sent, a negative lag. Those are kept (dropping or clamping them would change
the mean, which the pairing cannot change) and counted in the note. An event's lag is its scrape's
start time (the time Prometheus gives the sample) minus the event's send time (what a user of the
API sees; the note gives the 202's own p50). With 2 API processes the senders are spread evenly
over both (their connections pinned the same way) and the scraper watches one: the metrics live
in Redis, so a scrape on any process must show every event, which is checked on every process
once the run is counted. One scraper, not one per process, because a scrape exports its own
process's pending ratios first: scraping every process 40 times a second would flush them all that
often and hide the other process's export thread (every 0.25 s), which is what a Prometheus
scrape landing on one process of several really waits for. A 25 ms poll is far more often than
Prometheus scrapes: each scrape's cost (in the note) is load on the API that a real one would not
add this often.

Baseline of (a) and (b): the median scrape interval, start to start (~25 ms, longer when a scrape
takes longer): a lag of about one interval is what scraping this often can resolve. Baseline of
(c): the judge call p95 of the same run (``retrieval_monitor_judge_latency_seconds``).

Run: ``python -m tests.benchmarks.bench_lag`` (``--help`` for the knobs). Redis database:
``RM_BENCH_REDIS_URL`` (``common.REDIS_URL``), flushed before each configuration. Nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import itertools
import math
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import redis
from celery import Celery

from service.queue.tasks import JUDGE_SLICE_TASK
from tests.benchmarks import earlier_events
from tests.benchmarks.bench_ingest import event
from tests.benchmarks.bench_ingest import store as database
from tests.benchmarks.bench_judging import JUDGED, start_worker, stop, wait_judged
from tests.benchmarks.common import (
    REDIS_URL,
    Figure,
    api_command,
    free_port,
    median_figure,
    running,
    service_env,
    table,
)
from tests.benchmarks.metrics_reader import counter_total, histogram_buckets, quantile
from tests.support.procfs import descendants, holds_connection_on

NUMBER = 11
SENDERS = 16
SCRAPE_MS = 25.0
WORKER_PROCESSES = 2
# Each sender connection posts this many events before the run: every API process has imported
# and connected what a first request needs, and the worker is judging, before anything is timed.
WARM_EVENTS_PER_CONNECTION = 2
ACCEPTED = b"retrieval_monitor_events_accepted_total"
RATIOS = b"retrieval_monitor_signal_duplicate_ratio_count"
JSON = {"content-type": "application/json"}


@dataclass(frozen=True)
class Answer:
    sent: float  # time.monotonic() before the request
    answered: float  # after its answer was read
    status: int  # 0: no answer (the connection failed)


@dataclass(frozen=True)
class Scrape:
    start: float
    end: float
    accepted: float
    ratios: float
    size: int  # bytes of the exposition text


def scrape_counts(body: bytes) -> tuple[float, float]:
    """Accepted events and counted duplicate ratios in an exposition text, over every series.

    A line scan rather than prometheus_client's parser: the scraper runs 40 times a second on the
    same 2 cores as the service, and only two families matter.
    """
    accepted = ratios = 0.0
    for line in body.splitlines():
        for prefix, is_accepted in ((ACCEPTED, True), (RATIOS, False)):
            if line.startswith(prefix) and line[len(prefix) : len(prefix) + 1] in (b"{", b" "):
                value = float(line.rsplit(b" ", 1)[1])
                if is_accepted:
                    accepted += value
                else:
                    ratios += value
    return accepted, ratios


def fetch(conn: http.client.HTTPConnection, method: str, path: str, body: bytes = b"") -> bytes:
    conn.request(method, path, body or None, JSON if body else {})
    answer = conn.getresponse()
    data = answer.read()
    if answer.status >= 300:
        raise RuntimeError(f"{method} {path} answered {answer.status}: {data[:200]!r}")
    return data


def pinned_connections(
    port: int, serve_pid: int, processes: int, per_process: int, timeout: float = 180
) -> list[list[http.client.HTTPConnection]]:
    """``per_process`` keep-alive connections to each of the API's ``processes`` processes.

    The processes accept on one shared socket, so which one takes a connection is up to them:
    connect, find the taker in /proc, keep the connection if that process needs more. This also
    waits for every process to be serving.
    """
    by_pid: dict[int, list[http.client.HTTPConnection]] = {}
    deadline = time.monotonic() + timeout
    while len(by_pid) < processes or any(len(c) < per_process for c in by_pid.values()):
        if time.monotonic() > deadline:
            for conns in by_pid.values():
                for conn in conns:
                    conn.close()
            raise RuntimeError(
                f"connections reached {len(by_pid)} of {processes} API processes in {timeout} s"
            )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        fetch(conn, "GET", "/readyz")  # answered, so a process has accepted it
        assert conn.sock is not None
        client_port = conn.sock.getsockname()[1]
        owner = next(
            (
                pid
                for pid in (serve_pid, *descendants(serve_pid))
                if holds_connection_on(pid, port, peer_port=client_port)
            ),
            None,
        )
        taken = by_pid.setdefault(owner, []) if owner is not None else None
        if taken is not None and len(taken) < per_process:
            taken.append(conn)
        else:
            conn.close()
            time.sleep(0.05)
    return list(by_pid.values())


class Scraper(threading.Thread):
    """Polls /metrics over one connection every ``period`` seconds, start to start."""

    def __init__(self, conn: http.client.HTTPConnection, period: float) -> None:
        super().__init__(name="scraper", daemon=True)
        self.conn = conn
        self.period = period
        self.scrapes: list[Scrape] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        due = time.monotonic()
        try:
            while not self.stopping.is_set():
                start = time.monotonic()
                body = fetch(self.conn, "GET", "/metrics")
                end = time.monotonic()
                self.scrapes.append(Scrape(start, end, *scrape_counts(body), len(body)))
                due += self.period
                pause = due - time.monotonic()
                if pause > 0:
                    self.stopping.wait(pause)
                else:  # a slow scrape: the next one starts now, without a burst to catch up
                    due = time.monotonic()
        except BaseException as exc:  # reported by the main thread, which would wait forever
            self.error = exc

    def latest(self) -> Scrape:
        if self.error is not None:
            raise RuntimeError("the scraper failed") from self.error
        while not self.scrapes:
            time.sleep(0.01)
        return self.scrapes[-1]


def send_steady(
    conns: Sequence[http.client.HTTPConnection], bodies: Sequence[bytes], rate: float
) -> tuple[list[Answer], float]:
    """POST each body at its moment (``i / rate`` s from the start), one thread per connection;
    the answers, by body, and the seconds the sending took."""
    answers: list[Answer | None] = [None] * len(bodies)
    started = time.monotonic()

    def client(t: int) -> None:
        conn = conns[t]
        for i in range(t, len(bodies), len(conns)):
            pause = started + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            sent = time.monotonic()
            try:
                conn.request("POST", "/v1/events", bodies[i], JSON)
                answer = conn.getresponse()
                answer.read()
                status = answer.status
            except (OSError, http.client.HTTPException):
                conn.close()  # the next request opens a new connection
                status = 0
            answers[i] = Answer(sent, time.monotonic(), status)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(len(conns))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    return [a for a in answers if a is not None], elapsed


def visible_lags(
    answers: Sequence[Answer], scrapes: Sequence[Scrape], base: float, ratios: bool
) -> list[float]:
    """Each accepted event's lag to the first scrape that shows it (see the module's method)."""
    accepted = sorted((a for a in answers if a.status == 202), key=lambda a: a.answered)
    shown: list[float] = []
    for scrape in scrapes:
        count = (scrape.ratios if ratios else scrape.accepted) - base
        shown.append(max(count, shown[-1]) if shown else count)  # non-decreasing, for bisect
    lags = []
    for i, answer in enumerate(accepted, start=1):
        first = bisect.bisect_left(shown, i)
        if first == len(shown):
            raise RuntimeError(f"no scrape showed {i} of {len(accepted)} events")
        lags.append(scrapes[first].start - answer.sent)
    return lags


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 < q < 1), interpolated between the sorted values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[round(q * 100) - 1]


@dataclass
class Run:
    """What one configuration (store, API processes) measured."""

    store: str
    processes: int
    earlier: int = 0  # judged events in the tables before the run
    counter_lags: list[float] = field(default_factory=list)
    ratio_lags: list[float] = field(default_factory=list)
    judged_p50: float = math.nan
    judged_p95: float = math.nan
    judge_call_p95: float = math.nan
    scrape_interval: float = math.nan
    scrape_duration: float = math.nan
    scrape_kib: float = math.nan
    negative: tuple[int, int] = (0, 0)  # lags below 0: counter, ratios (see the pairing above)
    sent: int = 0
    accepted: int = 0
    rate: float = 0.0
    answer_p50: float = math.nan
    slice_events: float = math.nan  # events judged per judge message, over the steady run


def wait_counted(url: str, accepted: float, ratios: float, timeout: float = 60) -> None:
    """Until /metrics shows ``accepted`` events and ``ratios`` duplicate ratios (every process's
    thread has flushed: a scrape flushes only its own process's)."""
    deadline = time.monotonic() + timeout
    while True:
        counted = counter_total(url, "retrieval_monitor_events_accepted")
        shown = histogram_buckets(url, "retrieval_monitor_signal_duplicate_ratio").get(math.inf, 0)
        if counted >= accepted and shown >= ratios:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"/metrics showed {counted:.0f} events, {shown:.0f} ratios")
        time.sleep(0.1)


def scrape_until(scraper: Scraper, base: Scrape, total: float, timeout: float = 60) -> None:
    """Until the scraper has seen ``total`` accepted events and as many ratios since ``base``."""
    deadline = time.monotonic() + timeout
    while (last := scraper.latest()).accepted - base.accepted < total or (
        last.ratios - base.ratios < total
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"/metrics showed {last.accepted - base.accepted:.0f} events and "
                f"{last.ratios - base.ratios:.0f} ratios of {total:.0f} within {timeout} s"
            )
        time.sleep(0.05)


def every_process_shows(
    groups: Sequence[Sequence[http.client.HTTPConnection]], base: Scrape, total: float
) -> None:
    """Each API process's own /metrics shows every event of the run, whichever took it."""
    for index, conns in enumerate(groups):
        accepted, ratios = scrape_counts(fetch(conns[0], "GET", "/metrics"))
        if accepted - base.accepted < total or ratios - base.ratios < total:
            raise RuntimeError(
                f"API process {index} shows {accepted - base.accepted:.0f} events and "
                f"{ratios - base.ratios:.0f} ratios of {total:.0f}"
            )


def steady_run(
    url: str, groups: list[list[http.client.HTTPConnection]], run: Run, args: argparse.Namespace
) -> None:
    """The measured run on a warm API and worker: send, scrape, wait for the judging."""
    slices_before = judge_slices_run()
    # The senders, taken in turn from each process's connections, so the load is shared evenly.
    senders = [groups[t % len(groups)][1 + t // len(groups)] for t in range(SENDERS)]
    count = int(args.rate * args.seconds)
    tag = f"lag-{uuid.uuid4().hex[:6]}"
    bodies = [orjson.dumps(event(i, tag)) for i in range(count)]
    lag_before = histogram_buckets(url, "retrieval_monitor_pipeline_lag_seconds")
    judge_before = histogram_buckets(url, "retrieval_monitor_judge_latency_seconds")
    judged_before = counter_total(url, JUDGED)
    scraper = Scraper(groups[0][0], args.scrape_ms / 1000)
    scraper.start()
    try:
        base = scraper.latest()  # a scrape before the first send
        answers, elapsed = send_steady(senders, bodies, args.rate)
        accepted = sum(a.status == 202 for a in answers)
        scrape_until(scraper, base, accepted)
    finally:
        scraper.stopping.set()
        scraper.join()
    every_process_shows(groups, base, accepted)
    scrapes = scraper.scrapes
    run.counter_lags = visible_lags(answers, scrapes, base.accepted, ratios=False)
    run.ratio_lags = visible_lags(answers, scrapes, base.ratios, ratios=True)
    run.negative = (sum(x < 0 for x in run.counter_lags), sum(x < 0 for x in run.ratio_lags))
    run.scrape_interval = statistics.median(
        b.start - a.start for a, b in itertools.pairwise(scrapes)
    )
    run.scrape_duration = statistics.median(s.end - s.start for s in scrapes)
    run.scrape_kib = statistics.median(s.size for s in scrapes) / 1024
    run.sent, run.accepted, run.rate = len(answers), accepted, accepted / elapsed
    run.answer_p50 = statistics.median(a.answered - a.sent for a in answers if a.status == 202)

    wait_judged(url, judged_before + accepted, 300)
    lag_after = histogram_buckets(url, "retrieval_monitor_pipeline_lag_seconds")
    judge_after = histogram_buckets(url, "retrieval_monitor_judge_latency_seconds")
    run.judged_p50 = quantile(0.5, lag_before, lag_after) or math.nan
    run.judged_p95 = quantile(0.95, lag_before, lag_after) or math.nan
    run.judge_call_p95 = quantile(0.95, judge_before, judge_after) or math.nan
    run.slice_events = accepted / max(1, judge_slices_run() - slices_before)


def judge_slices_run() -> int:
    """Judge messages (slice tasks) the worker has run so far, as its remote control reports
    them (the broker is the benchmark's Redis)."""
    inspector = Celery(broker=REDIS_URL, set_as_current=False).control.inspect(timeout=5)
    stats = inspector.stats() or {}
    return sum(int(node.get("total", {}).get(JUDGE_SLICE_TASK, 0)) for node in stats.values())


def measure_one(store: str, processes: int, args: argparse.Namespace, judge_url: str) -> Run:
    run = Run(store, processes, args.earlier)
    redis.Redis.from_url(REDIS_URL).flushdb()
    with tempfile.TemporaryDirectory() as tmp, database(store, Path(tmp)) as database_url:
        if args.earlier:
            seconds = earlier_events.fill(database_url, args.earlier)
            print(
                f"[lag] {args.earlier:,} earlier events stored in {seconds:.0f} s", file=sys.stderr
            )
            seconds = earlier_events.export(database_url, Path(tmp))
            print(f"[lag] aggregates rebuilt from them in {seconds:.0f} s", file=sys.stderr)
        env = service_env(
            database_url,
            f"bench-lag-{uuid.uuid4().hex[:6]}",
            {"RM_JUDGE_BASE_URL": judge_url, "RM_JUDGE_MODEL": "bench"},
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [*api_command(port), "--workers", str(processes)]
        with running(command, env, url, "/readyz") as pid:
            # Per process: one connection to scrape or check it, then its share of the senders.
            groups = pinned_connections(port, pid, processes, 1 + -(-SENDERS // processes))
            worker = start_worker(env, WORKER_PROCESSES)
            try:
                # The aggregates rebuilt from earlier events already count them: the warm-up
                # waits for its own events on top of those, or the steady run would start while
                # the worker is still starting and measure its start-up as lag.
                judged_before = counter_total(url, JUDGED)
                accepted_before = counter_total(url, "retrieval_monitor_events_accepted")
                ratios_before = histogram_buckets(
                    url, "retrieval_monitor_signal_duplicate_ratio"
                ).get(math.inf, 0)
                warm = 0
                for conns in groups:
                    for conn in conns[1:]:
                        for _ in range(WARM_EVENTS_PER_CONNECTION):
                            fetch(conn, "POST", "/v1/events", orjson.dumps(event(warm, "warm")))
                            warm += 1
                wait_judged(url, judged_before + warm, 180)
                wait_counted(url, accepted_before + warm, ratios_before + warm)
                steady_run(url, groups, run, args)
            finally:
                stop(worker)
                for conns in groups:
                    for conn in conns:
                        conn.close()
    return run


def figures_of(run: Run) -> list[Figure]:
    where = f"{run.store}, {run.processes} API process{'es' if run.processes > 1 else ''}"
    if run.earlier:
        where += f", {run.earlier:,} earlier events"
    note = (
        f"{run.accepted} of {run.sent} events accepted at {run.rate:.0f} ev/s, 202 p50 "
        f"{run.answer_p50 * 1000:.0f} ms, scrape {run.scrape_duration * 1000:.1f} ms "
        f"({run.scrape_kib:.0f} KiB), lags < 0: {run.negative[0]} counter, "
        f"{run.negative[1]} ratios"
    )
    interval = "scrape interval, start to start"
    rows: list[Figure] = []
    for label, lags in (
        ("events_accepted counter", run.counter_lags),
        ("duplicate-ratio histogram count", run.ratio_lags),
    ):
        for q, target in ((0.5, ""), (0.95, "< 1 s")):
            rows.append(
                median_figure(
                    NUMBER,
                    f"send to first /metrics showing it, {label}, p{q * 100:.0f} ({where})",
                    [percentile(lags, q)],
                    "s",
                    interval,
                    [run.scrape_interval],
                    target,
                    note if q == 0.5 and label.startswith("events") else "",
                )
            )
    for q, value, target in ((50, run.judged_p50, ""), (95, run.judged_p95, "< 1 s")):
        rows.append(
            median_figure(
                NUMBER,
                f"pipeline_lag_seconds (receipt to judged export), p{q} ({where})",
                [value],
                "s",
                "judge call p95",
                [run.judge_call_p95],
                target,
                f"worker x{WORKER_PROCESSES} processes, {run.slice_events:.1f} events per judge "
                "message"
                if q == 50
                else "",
            )
        )
    return rows


def measure(args: argparse.Namespace) -> list[Figure]:
    from tests.support.fake_llm.fixture import running_fake_llm

    stores = [
        store
        for store, off in (("sqlite", args.no_sqlite), ("postgres", args.no_postgres))
        if not off
    ]
    figures: list[Figure] = []
    with running_fake_llm() as llm:
        for store in stores:
            for processes in args.workers:
                print(f"[lag] {store}, {processes} API processes ...", file=sys.stderr, flush=True)
                # Each configuration's figures now, so their load average is that of its run.
                figures += figures_of(measure_one(store, processes, args, llm.base_url))
    return figures


def worker_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"a comma-separated list of counts >= 1, not {text!r}")
    return counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds",
        type=float,
        default=20.0,
        help="seconds of steady sending per configuration (default 20)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=100.0,
        help=f"events/s sent (single-event POSTs, {SENDERS} threads; default 100)",
    )
    parser.add_argument(
        "--scrape-ms",
        type=float,
        default=SCRAPE_MS,
        help="milliseconds between the scraper's /metrics polls, start to start (default 25)",
    )
    parser.add_argument(
        "--no-postgres", action="store_true", help="SQLite only (default: SQLite and PostgreSQL)"
    )
    parser.add_argument(
        "--earlier",
        type=int,
        default=0,
        help="judged events stored before the service starts, statistics left as a bulk load "
        "leaves them (default 0)",
    )
    parser.add_argument(
        "--no-sqlite", action="store_true", help="PostgreSQL only (default: SQLite and PostgreSQL)"
    )
    parser.add_argument(
        "--workers",
        type=worker_counts,
        default=[1, 2],
        help="API process counts to run, comma-separated (serve --workers N; default 1,2)",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    print(table(measure(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
