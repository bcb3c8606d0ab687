"""Every read of what was accepted answers 200, before and after judging."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.support.helpers import judge


def judge_all(client: TestClient, accepted: set[str]) -> None:
    """Store a judging of each accepted event, as a worker would, so the pages that show only
    judged events (misses, gold recall, the overview's measures) read them too."""
    engine = client.app.state.rm.runtime.engine  # type: ignore[attr-defined]
    for event_id in sorted(accepted):
        view = client.get(f"/v1/events/{event_id}").json()
        if view["status"] == "pending":
            grades = [rank % 4 for rank in range(len(view["passages"]))]
            judge(engine, event_id, grades)


def assert_everything_reads(client: TestClient, accepted: set[str]) -> None:
    """Every read of what was accepted answers 200, before and after it is judged."""
    check_reads(client, accepted)
    judge_all(client, accepted)
    check_reads(client, accepted)


def check_reads(client: TestClient, accepted: set[str]) -> None:
    for event_id in sorted(accepted):
        for path in (f"/v1/events/{event_id}", f"/ui/events/{event_id}"):
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code, response.text[:300])
    for path in ("/ui", "/ui/events", "/ui/misses", "/v1/analysis", "/metrics"):
        response = client.get(path)
        assert response.status_code == 200, (path, response.status_code, response.text[:300])
