"""Reading one figure off /metrics, through a test client or over HTTP."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families


def sample(client: TestClient, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def metric_value(client: TestClient, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
        if sample.name == name
    )


def metric_total(url: str, name: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        total += sum(s.value for s in family.samples if s.name == name)
    return total
