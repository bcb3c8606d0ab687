"""Label values holding any separator cannot pass the label-set cap: two different label sets
never share an identity, so each one the page shows was admitted on its own.

Tests ``service.telemetry.cardinality``.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from fastapi.testclient import TestClient

from service.api.app import create_app
from service.telemetry.cardinality import OVERFLOW
from tests.support.environment import make_settings
from tests.support.helpers import make_event

ACCEPTED = "retrieval_monitor_events_accepted_total"
CAP = 4
# Characters a key joined by a separator could be fooled by: the unit separator the cap once
# joined with, the usual ones, and the escape of the percent-encoding.
SEPARATORS = ("\x1f", ":", "|", "/", "%", "%3A")
PIECES = 6


def splits(pieces: list[str], separator: str) -> list[tuple[str, str, str]]:
    """Every (app, retriever, environment) that joins back to ``pieces`` with ``separator``."""
    found = []
    for first, second in itertools.combinations(range(1, len(pieces)), 2):
        found.append(
            (
                separator.join(pieces[:first]),
                separator.join(pieces[first:second]),
                separator.join(pieces[second:]),
            )
        )
    return found


def label_sets(page: str) -> set[tuple[str, str, str]]:
    """The (app, retriever, environment) of every accepted-events sample of the page."""
    found = set()
    pattern = rf'^{ACCEPTED}\{{app="(.*?)",environment="(.*?)",retriever="(.*?)",tenant=".*?"\}} '
    for match in re.finditer(pattern, page, re.MULTILINE):
        app, environment, retriever = match.groups()
        found.add((app, retriever, environment))
    return found


def test_label_values_with_separators_cannot_pass_the_cap(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = make_settings(
        tmp_path, store_url, redis_url, max_label_sets_per_tenant=CAP, max_label_sets=1000
    )
    sent: list[tuple[str, str, str]] = []
    for separator in SEPARATORS:
        for word in range(CAP):
            sent += splits([f"w{word}p{piece}" for piece in range(PIECES)], separator)
    assert len(sent) == len(set(sent)) > 10 * CAP
    events = [
        make_event(f"e{i}", app=app, retriever=retriever, environment=environment)
        for i, (app, retriever, environment) in enumerate(sent)
    ]
    with TestClient(create_app(settings)) as client:
        for start in range(0, len(events), 100):
            batch = {"events": events[start : start + 100]}
            assert client.post("/v1/events/batch", json=batch).status_code == 200
        page = client.get("/metrics").text
    exported = label_sets(page)
    own = exported - {(OVERFLOW, OVERFLOW, OVERFLOW)}
    print(f"\nlabel sets exported: {len(own)} against a cap of {CAP} ({len(sent)} sent)")
    assert len(own) == CAP
    assert (OVERFLOW, OVERFLOW, OVERFLOW) in exported
    assert own <= set(sent)
