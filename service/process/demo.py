"""``serve --demo``: replay a generated workload against the running API and show the result."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from service.config.settings import Settings

log = logging.getLogger(__name__)


def wait_ready(client: httpx.Client, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.get("/readyz").status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    return False


def run_demo(settings: Settings, queries: int, log_file: Path | None = None) -> bool:
    from service.replay.replay import ReplayConfig, run_replay
    from service.replay.workload import generate_workload

    base = f"http://{settings.host}:{settings.port}"
    with httpx.Client(base_url=base, timeout=30) as client:
        if not wait_ready(client):
            print("the API did not become ready", flush=True)
            return False
        dataset = generate_workload(Path(settings.data_dir) / "workload")
        report = run_replay(
            ReplayConfig(
                base_url=base,
                dataset=dataset,
                k=5,
                rate=0,
                limit=queries,
                gold=True,
                app="demo",
                retriever="bm25",
            )
        )
        print(report.summary(), flush=True)
        judged = _wait_judged(client, report.event_ids, timeout=600)
        print(_summary(client, base, report.event_ids, judged, log_file), flush=True)
        return judged == len(report.event_ids)


def _wait_judged(client: httpx.Client, event_ids: list[str], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    with tqdm(total=len(event_ids), desc="judged", unit="event") as bar:
        while True:
            done = _judged_count(client)
            bar.update(done - bar.n)
            if done >= len(event_ids) or time.monotonic() > deadline:
                return done
            time.sleep(0.5)


def _judged_count(client: httpx.Client) -> int:
    total = 0.0
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name == "retrieval_monitor_events_judged":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return int(total)


def _summary(
    client: httpx.Client, base: str, event_ids: list[str], judged: int, log_file: Path | None
) -> str:
    means: dict[str, float] = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name.startswith("retrieval_monitor_measure_"):
            sums = sum(s.value for s in family.samples if s.name.endswith("_sum"))
            counts = sum(s.value for s in family.samples if s.name.endswith("_count"))
            if counts:
                means[family.name.removeprefix("retrieval_monitor_measure_")] = sums / counts
    example = client.get(f"/v1/events/{event_ids[0]}").json() if event_ids else {}
    lines = [
        "",
        f"Judged {judged} of {len(event_ids)} replayed events.",
        "Mean of each measure over them:",
        *(f"  {name:<18} {value:.3f}" for name, value in sorted(means.items())),
        "",
        f"Metrics:        {base}/metrics",
        f"API docs:       {base}/docs",
        f"Misses page:    {base}/ui/misses",
        f"A judged event: {base}/v1/events/{event_ids[0] if event_ids else ''}",
        json.dumps(
            {k: example.get(k) for k in ("event_id", "status", "judge", "measures")}, indent=2
        ),
    ]
    if log_file is not None:
        lines += ["", f"Logs of the API and the worker: {log_file}"]
    return "\n".join(lines)
