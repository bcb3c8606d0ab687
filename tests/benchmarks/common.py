"""Shared pieces of the benchmark suite: processes, environment, figures and the table.

A figure is the median of several runs, printed next to a baseline measured in the same run and
their ratio. Nothing here asserts a timing: on a shared 2-core machine timings are noise-prone,
so they are reported (with the load average) rather than checked.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from service.config.settings import Settings

REPO = Path(__file__).resolve().parents[2]
# Database 10 keeps the suite away from the tests (15) and from a demo (0).
REDIS_URL = os.environ.get("RM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")
POSTGRES_ADMIN_URL = os.environ.get(
    "RM_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
RESULTS_DIR = REPO / "bench-results"


@dataclass
class Figure:
    """One line of the table: a median over ``runs`` with its same-run baseline."""

    number: int
    name: str
    value: float | None
    unit: str
    baseline_name: str = ""
    baseline: float | None = None
    runs: int = 1
    target: str = ""
    note: str = ""
    samples: list[float] = field(default_factory=list)
    load_average: float = field(default_factory=lambda: round(os.getloadavg()[0], 2))

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline:
            return None
        return self.value / self.baseline


def median_figure(
    number: int,
    name: str,
    values: Sequence[float],
    unit: str,
    baseline_name: str = "",
    baselines: Sequence[float] = (),
    target: str = "",
    note: str = "",
) -> Figure:
    # A run that observed nothing (None or NaN) is left out rather than poisoning the median.
    values = [v for v in values if v == v]
    baselines = [v for v in baselines if v == v]
    return Figure(
        number=number,
        name=name,
        value=statistics.median(values) if values else None,
        unit=unit,
        baseline_name=baseline_name,
        baseline=statistics.median(baselines) if baselines else None,
        runs=len(values),
        target=target,
        note=note,
        samples=[round(v, 4) for v in values],
    )


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def table(figures: Sequence[Figure]) -> str:
    """The figures as a Markdown table (it reads in a terminal and pastes into the docs)."""
    lines = [
        "| # | figure | value | baseline | ratio | runs | target | load 1m |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        baseline = f"{_number(f.baseline)} ({f.baseline_name})" if f.baseline_name else "-"
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "-"
        name = f"{f.name}{' - ' + f.note if f.note else ''}"
        lines.append(
            f"| {f.number} | {name} | {_number(f.value)} {f.unit} | {baseline} | {ratio} "
            f"| {f.runs} | {f.target} | {f.load_average:.2f} |"
        )
    return "\n".join(lines)


def write_json(figures: Sequence[Figure], path: Path, extra: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{**asdict(f), "ratio": f.ratio} for f in figures]
    path.write_text(json.dumps({**extra, "figures": rows}, indent=2) + "\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def service_env(
    database_url: str, queue: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of an API or worker process, free of the caller's own RM_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
    env.update(
        {
            "RM_DATABASE_URL": database_url,
            "RM_REDIS_URL": REDIS_URL,
            "RM_QUEUE_NAME": queue,
            "RM_LOG_LEVEL": "WARNING",
            # Backlog refusals would measure the limit, not the service.
            "RM_MAX_PENDING_EVENTS": "100000000",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(extra or {})
    return env


def wait_ready(url: str, process: subprocess.Popen[bytes], path: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}{path} did not answer within {seconds:.0f} s")


@contextmanager
def running(command: list[str], env: dict[str, str], url: str, path: str) -> Iterator[int]:
    """Run a server process until the block ends; yields its pid."""
    process = subprocess.Popen(
        command, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_ready(url, process, path)
        yield process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def api_command(port: int) -> list[str]:
    return [sys.executable, "-m", "service.cli", "serve", "--no-worker", "--port", str(port)]


def rss_mib(pid: int, children: bool = True) -> float:
    """Resident memory of a process and, by default, its descendants (a Celery worker is a
    process tree), read from /proc (Linux)."""
    pids = [pid]
    if children:
        index = 0
        while index < len(pids):
            for task in Path(f"/proc/{pids[index]}/task").glob("*/children"):
                pids.extend(int(child) for child in task.read_text().split())
            index += 1
    total_kib = 0
    for each in pids:
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except FileNotFoundError:  # it ended between the listing and the read
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process under it, from /proc (Linux)."""
    pids = [pid]
    index = 0
    while index < len(pids):
        for task in Path(f"/proc/{pids[index]}/task").glob("*/children"):
            pids.extend(int(child) for child in task.read_text().split())
        index += 1
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process and its descendants have used so far, from /proc.

    Unlike events/s, CPU per event barely moves with the machine's load, so it compares two
    servers measured minutes apart on a shared machine.
    """
    total = 0
    for each in _descendants(pid):
        try:
            stat = Path(f"/proc/{each}/stat").read_text()
        except FileNotFoundError:  # it ended between the listing and the read
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime and stime, fields 14 and 15 of stat(5)
    return total / os.sysconf("SC_CLK_TCK")


@contextmanager
def postgres_database(name: str) -> Iterator[str]:
    """A database of our own on the test server, dropped afterwards. Its name carries this
    process's id: two runs on one server (two checkouts' test commands) never drop each other's."""
    from sqlalchemy import create_engine, text

    name = f"{name}_{os.getpid()}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def count_events(database_url: str) -> int:
    """Events really stored (not just answered)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
    finally:
        engine.dispose()


def shared_data_dir() -> Path:
    """The public datasets next to the repository (RM_SHARED_DATA overrides)."""
    configured = os.environ.get("RM_SHARED_DATA")
    return Path(configured) if configured else REPO.parent / "shared" / "data"


BENCH_VENV = Path(os.environ.get("RM_BENCH_VENV", "/tmp/rm-bench-venv"))


def in_process_settings(database_url: str, tmp: Path, **extra: object) -> Settings:
    """Settings for a benchmark that runs the service's functions in its own process: the
    benchmark Redis, a queue of its own and no backlog bound."""
    from service.config.settings import Settings

    settings: Settings = Settings.model_validate(
        {
            "database_url": database_url,
            "redis_url": REDIS_URL,
            "data_dir": str(tmp / "var"),
            "queue_name": f"profile-{uuid.uuid4().hex[:6]}",
            "max_pending_events": 100_000_000,
            **extra,
        }
    )
    return settings


def run_benchmark(
    doc: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    measure: Callable[[argparse.Namespace], Sequence[Figure]],
    argv: list[str] | None,
) -> int:
    """A benchmark's command line: its knobs (``--help`` gives its docstring's first line), then
    its figures printed as one table."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    add_arguments(parser)
    print(table(measure(parser.parse_args(argv))))
    return 0
