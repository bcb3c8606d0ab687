"""Tenants and /metrics: every series carries its tenant, no tenant moves another's series,
/metrics needs an admin key when keys are on, and distinct label sets are capped.

Tests ``service.auth.scrape_token``, ``service.telemetry.metrics`` and
``service.telemetry.pipeline``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.api.app import create_app
from service.auth.scrape_token import ScrapeTokenError
from service.config.settings import Settings
from service.telemetry.cardinality import OVERFLOW
from service.telemetry.metrics import SHARED_FAMILIES
from tests.support.environment import make_settings
from tests.support.helpers import bearer, make_event
from tests.support.live import WorkerFactory, wait_status
from tests.support.paths import REPO_ROOT
from tests.support.tenants import add_key

ACCEPTED = "retrieval_monitor_events_accepted_total"


def series(**labels: str) -> str:
    """A sample's label text as the page writes it (names in order)."""
    return ",".join(f'{name}="{value}"' for name, value in sorted(labels.items()))


def samples(page: str, family: str) -> dict[str, float]:
    """Label text -> value of every sample of ``family``."""
    found: dict[str, float] = {}
    for match in re.finditer(rf"^{family}\{{(.*)\}} (\S+)$", page, re.MULTILINE):
        found[match.group(1)] = float(match.group(2))
    return found


@pytest.fixture
def keyed(tmp_path: Path, store_url: str, redis_url: str) -> Iterator[tuple[TestClient, Settings]]:
    settings = make_settings(tmp_path, store_url, redis_url, auth_required=True)
    with TestClient(create_app(settings)) as client:
        yield client, settings


def test_a_tenant_cannot_move_another_tenants_series(
    keyed: tuple[TestClient, Settings],
) -> None:
    client, settings = keyed
    acme, globex = add_key(settings, "acme"), add_key(settings, "globex")
    admin = add_key(settings, "ops", admin=True)
    first = {"events": [make_event("a1")]}
    assert client.post("/v1/events/batch", json=first, headers=bearer(acme)).status_code == 200

    # /metrics is closed by default once keys are on: no key, and a tenant's key, are refused.
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer(acme)).status_code == 401
    before = samples(client.get("/metrics", headers=bearer(admin)).text, ACCEPTED)
    acme_shop = series(tenant="acme", app="shop", retriever="bm25-v1", environment="")
    assert before[acme_shop] == 1

    # globex sends under acme's app name, and sends garbage; nobody without a key gets counted.
    batch = {"events": [make_event(f"g{i}") for i in range(5)]}
    assert client.post("/v1/events/batch", json=batch, headers=bearer(globex)).status_code == 200
    for _ in range(3):
        assert client.post("/v1/events", json={"app": 1}, headers=bearer(globex)).status_code == 422
        assert client.post("/v1/events", json={"app": 1}).status_code == 401

    page = client.get("/metrics", headers=bearer(admin)).text
    after = samples(page, ACCEPTED)
    assert after[acme_shop] == 1
    assert after[series(tenant="globex", app="shop", retriever="bm25-v1", environment="")] == 5
    rejected = samples(page, "retrieval_monitor_events_rejected_total")
    assert rejected == {series(tenant="globex", reason="invalid"): 3}
    # Every event series names its tenant.
    for family in (ACCEPTED, "retrieval_monitor_signal_top_score_count"):
        assert all('tenant="' in labels for labels in samples(page, family))


def test_a_thousand_app_names_keep_metrics_small(
    keyed: tuple[TestClient, Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    client, settings = keyed
    acme, admin = add_key(settings, "acme"), add_key(settings, "ops", admin=True)
    client.post("/v1/events/batch", json={"events": [make_event("first")]}, headers=bearer(acme))
    before = client.get("/metrics", headers=bearer(admin)).content

    batch = {"events": [make_event(f"e{i}", app=f"app-{i}") for i in range(1000)]}
    answer = client.post("/v1/events/batch", json=batch, headers=bearer(acme))
    assert answer.status_code == 200
    assert {r["status"] for r in answer.json()["results"]} == {"accepted"}

    after = client.get("/metrics", headers=bearer(admin)).content
    with capsys.disabled():
        print(f"\n/metrics: {len(before)} bytes before, {len(after)} bytes after 1,000 apps")
    page = after.decode()
    accepted = samples(page, ACCEPTED)
    apps = {re.findall(r'app="([^"]*)"', labels)[0] for labels in accepted}
    cap = settings.max_label_sets_per_tenant
    # The first label set ("shop") and cap - 1 of the new apps keep their own series.
    assert len(apps - {OVERFLOW}) == cap
    overflowed = 1001 - cap
    overflow_set = series(tenant="acme", app=OVERFLOW, retriever=OVERFLOW, environment=OVERFLOW)
    assert accepted[overflow_set] == overflowed
    assert samples(page, "retrieval_monitor_label_sets_overflow_total") == {
        'tenant="acme"': overflowed
    }
    # Each label set costs a bounded number of bytes, whatever the number of app names sent.
    per_label_set = (len(after) - len(before)) / cap
    assert len(after) < len(before) + (cap + 1) * per_label_set * 1.01
    assert len(after) < 1000 * per_label_set / 5
    # The overflowed events are stored as sent.
    stored = client.get("/v1/events/e999", headers=bearer(acme))
    assert stored.status_code == 200
    assert stored.json()["app"] == "app-999"


def test_the_overall_cap_holds_across_tenants(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = make_settings(
        tmp_path,
        store_url,
        redis_url,
        auth_required=True,
        max_label_sets_per_tenant=8,
        max_label_sets=12,
    )
    with TestClient(create_app(settings)) as client:
        acme, globex = add_key(settings, "acme"), add_key(settings, "globex")
        admin = add_key(settings, "ops", admin=True)
        for tenant, key in (("acme", acme), ("globex", globex)):
            batch = {"events": [make_event(f"{tenant}-{i}", app=f"a{i}") for i in range(10)]}
            assert (
                client.post("/v1/events/batch", json=batch, headers=bearer(key)).status_code == 200
            )
        page = client.get("/metrics", headers=bearer(admin)).text
    accepted = samples(page, ACCEPTED)
    own = [labels for labels in accepted if OVERFLOW not in labels]
    assert len([labels for labels in own if 'tenant="acme"' in labels]) == 8
    assert len([labels for labels in own if 'tenant="globex"' in labels]) == 4
    assert samples(page, "retrieval_monitor_label_sets_overflow_total") == {
        'tenant="acme"': 2,
        'tenant="globex"': 6,
    }


def test_events_past_the_cap_are_judged_and_scored_under_the_overflow_set(
    llm_settings: Settings, worker_factory: WorkerFactory
) -> None:
    """The cap bounds the export, not the work: an overflowed event is judged like any other and
    its measures land in the ``__overflow__`` label set."""
    settings = llm_settings.model_copy(update={"max_label_sets_per_tenant": 1})
    worker_factory(settings).start()
    with TestClient(create_app(settings)) as client:
        batch = {"events": [make_event("kept", app="shop"), make_event("over", app="elsewhere")]}
        answer = client.post("/v1/events/batch", json=batch)
        assert [r["status"] for r in answer.json()["results"]] == ["accepted", "accepted"]
        for event_id in ("kept", "over"):
            assert wait_status(client, event_id)["measures"]["precision"] is not None
        page = client.get("/metrics").text
    judged = samples(page, "retrieval_monitor_events_judged_total")
    scored = samples(page, "retrieval_monitor_measure_precision_count")
    for found in (judged, scored):
        overflow = [labels for labels in found if f'app="{OVERFLOW}"' in labels]
        kept = [labels for labels in found if 'app="shop"' in labels]
        assert len(overflow) == 1, found
        assert len(kept) == 1, found
        assert found[overflow[0]] == 1
        assert found[kept[0]] == 1
    assert not any("elsewhere" in labels for labels in {**judged, **scored})


def test_the_scrape_token_reads_metrics_and_nothing_else(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    token_file = tmp_path / "metrics_token"
    token_file.write_text("s3cret-scrape-token-0123456789\n")
    settings = make_settings(
        tmp_path, store_url, redis_url, auth_required=True, metrics_token_file=str(token_file)
    )
    with TestClient(create_app(settings)) as client:
        token = bearer("s3cret-scrape-token-0123456789")
        # Without a credential, or with a wrong one, /metrics stays closed.
        assert client.get("/metrics").status_code == 401
        assert (
            client.get("/metrics", headers=bearer("s3cret-scrape-token-01234567")).status_code
            == 401
        )
        page = client.get("/metrics", headers=token)
        assert page.status_code == 200
        assert "retrieval_monitor_events_pending" in page.text
        # It is no tenant's key: ingest and reads refuse it.
        assert client.post("/v1/events", json=make_event("x"), headers=token).status_code == 401
        assert client.get("/v1/events/x", headers=token).status_code == 401


@pytest.mark.parametrize("content", ["", "short", None])
def test_an_unusable_scrape_token_file_stops_the_api(
    tmp_path: Path, settings: Settings, content: str | None
) -> None:
    token_file = tmp_path / "metrics_token"
    if content is not None:
        token_file.write_text(content)
    broken = settings.model_copy(
        update={"auth_required": True, "metrics_token_file": str(token_file)}
    )
    with pytest.raises(ScrapeTokenError, match="RM_METRICS_TOKEN_FILE"):
        create_app(broken)


def test_every_series_names_its_tenant_but_the_shared_machinery(
    llm_settings: Settings, worker_factory: WorkerFactory
) -> None:
    settings = llm_settings.model_copy(
        update={"auth_required": True, "budget_tokens_per_day": 1_000_000}
    )
    acme, admin = add_key(settings, "acme"), add_key(settings, "ops", admin=True)
    worker_factory(settings).start()
    with TestClient(create_app(settings)) as client:
        batch = {"events": [make_event("plain"), make_event("gold", gold_passage_ids=["d1"])]}
        assert client.post("/v1/events/batch", json=batch, headers=bearer(acme)).status_code == 200

        for event_id in ("plain", "gold"):
            wait_status(client, event_id, headers=bearer(acme))
        page = client.get("/metrics", headers=bearer(admin)).text
    families = {
        family.name.removeprefix("retrieval_monitor_"): family
        for family in text_string_to_metric_families(page)
    }
    untenanted = {
        name: sorted({tuple(sorted(s.labels)) for s in family.samples if "tenant" not in s.labels})
        for name, family in families.items()
        if name not in SHARED_FAMILIES
    }
    assert {name: labels for name, labels in untenanted.items() if labels} == {}
    # The families computed at scrape time, the spend and the measures all had samples to check.
    with_samples = {name for name, family in families.items() if family.samples}
    assert {
        "events_pending",
        "oldest_pending_event_age_seconds",
        "judge_budget_remaining",
        "judge_gold_kappa",
        "judge_gold_passages",
        "judge_app_calls",
        "measure_precision",
        "events_judged",
    } <= with_samples
    # The allow-list names real families, each documented with its reason.
    assert set(SHARED_FAMILIES) <= set(families)
    documented = (REPO_ROOT / "docs" / "metrics.md").read_text()
    assert all(f"retrieval_monitor_{name}" in documented for name in SHARED_FAMILIES)
