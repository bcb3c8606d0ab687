"""Hostile records and hostile servers never lose an event silently: after every flush and close,
``recorded + feedback == accepted + duplicate + feedback_sent + rejected + failed + dropped +
pending``, nothing is left pending, every rejected or failed record was reported to
``on_rejected``, and what the client counts as stored is what the server acknowledged.

Hypothesis draws the records (NaN and infinite numbers, lone surrogates, huge and deep values,
objects of the wrong type or that raise when read) and a script for the server on 127.0.0.1
(garbage, truncated or deeply nested JSON, an endless body, 5xx, closed connections, an answer
held until every ``record()`` returned)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from hypothesis import Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from retrieval_monitor_client import MonitorClient, Stats

from tests.support.hostile_monitor import BEHAVIOURS, ENDLESS_LIMIT, HostileMonitor
from tests.support.hostile_values import BUDGET, JSON_VALUE, TEXT, nested

EXAMPLES = 60


class Explosive:
    """Raises from whatever the client might call on it."""

    def __bool__(self) -> bool:
        raise RuntimeError("no truth")

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("no items")

    def __len__(self) -> int:
        raise RuntimeError("no length")

    def keys(self) -> Iterator[Any]:
        raise RuntimeError("no keys")


class Deep(dict[str, Any]):
    """Nested past the recursion limit, and printed short when hypothesis shows an example."""

    def __init__(self) -> None:
        super().__init__(deep=nested(5000))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("Deep()")


class Huge(int):
    """More digits than Python turns into text."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("Huge()")


GOOD = st.fixed_dictionaries(
    {"query": st.text("abcdef ", min_size=1, max_size=10)},
    optional={"metadata": st.dictionaries(st.text("xyz", max_size=3), JSON_VALUE, max_size=3)},
)
# Each of these makes the event unsendable however the server behaves.
UNSENDABLE: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e300, "yesterday"]).map(
        lambda t: {"timestamp": t}
    ),
    st.just({"timestamp": datetime.max}).map(lambda d: {"metadata": {"when": d["timestamp"]}}),
    st.sampled_from(["\ud800", "x\udfff"]).map(lambda s: {"query": s}),
    st.sampled_from([math.nan, math.inf]).map(lambda n: {"passages": [{"text": "t", "score": n}]}),
    st.builds(Deep).map(lambda deep: {"metadata": deep}),
    st.just({"passages": "a string, not a list"}),
    st.just({"passages": ["fine", 42]}),
    st.just({"passages": Explosive()}),
    st.just({"metadata": Explosive()}),
    st.just({"metadata": [1, 2, 3]}),
    st.just({"gold_passage_ids": Explosive()}),
    st.just({"app": Explosive()}),
    st.just({"metadata": {"big": Huge(10**5000)}}),
)
# Sendable or not, the server decides; the books must balance either way.
ODD: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.fixed_dictionaries({"query": TEXT}),
    st.fixed_dictionaries({"k": st.one_of(st.integers(-3, 9), st.floats())}),
    st.just({"metadata": {"big": "x" * 300_000}}),
    st.just({"event_id": 12345}),
    st.just({"event_id": "\ud800"}),
)

FEEDBACK: list[dict[str, Any]] = [
    {"answer_correct": True},
    {"response_grade": math.nan},
    {"response": "\udfff"},
]


@dataclass
class Call:
    kind: str
    """"good", "unsendable", "odd", or "feedback"."""
    arguments: dict[str, Any] = field(default_factory=dict)


CALLS = st.lists(
    st.one_of(
        GOOD.map(lambda a: Call("good", a)),
        UNSENDABLE.map(lambda a: Call("unsendable", a)),
        ODD.map(lambda a: Call("odd", a)),
        st.sampled_from(FEEDBACK).map(lambda a: Call("feedback", a)),
    ),
    min_size=1,
    max_size=25,
)
SCRIPT = st.lists(st.sampled_from(BEHAVIOURS), max_size=6)


@pytest.fixture(scope="module")
def monitor() -> Iterator[HostileMonitor]:
    with HostileMonitor() as server:
        yield server


def balance(stats: Stats) -> tuple[int, int]:
    handed_over = stats.recorded + stats.feedback
    accounted = (
        stats.accepted
        + stats.duplicate
        + stats.feedback_sent
        + stats.rejected
        + stats.failed
        + stats.dropped
        + stats.pending
    )
    return handed_over, accounted


@given(calls=CALLS, script=SCRIPT, batch_size=st.integers(1, 8), max_pending=st.integers(8, 40))
# No shrinking: an example that fails waits out its flush bound, and shrinking would repeat it.
@hypothesis_settings(BUDGET, max_examples=EXAMPLES, phases=(Phase.explicit, Phase.generate))
def test_every_record_is_accounted_for_whatever_the_records_and_the_server(
    monitor: HostileMonitor,
    calls: list[Call],
    script: list[str],
    batch_size: int,
    max_pending: int,
) -> None:
    monitor.play(script)
    reported: list[tuple[Any, str]] = []
    client = MonitorClient(
        monitor.url,
        app="shop",
        retriever="bm25",
        batch_size=batch_size,
        max_pending=max_pending,
        max_batch_bytes=100_000,
        flush_interval=0.01,
        max_backoff=0.01,
        max_retry_wait=0.01,
        server_error_attempts=2,
        timeout=30,
        on_rejected=lambda event_id, reason: reported.append((event_id, reason)),
    )
    unsendable: list[Any] = []
    last_id: Any = "never-recorded"
    for call in calls:
        if call.kind == "feedback":
            client.feedback(last_id, **call.arguments)
            continue
        arguments = {"passages": ["a passage"], "query": "q", **call.arguments}
        event_id = client.record(arguments.pop("query"), arguments.pop("passages"), **arguments)
        assert event_id is not None
        last_id = event_id
        if call.kind == "unsendable":
            unsendable.append(event_id)

    # Every record() returned while a held answer was still held: the books balance mid-flight.
    during = client.stats()
    assert balance(during)[0] == balance(during)[1] == len(calls)
    monitor.release.set()

    # A bound on a hang, not a measure: a healthy example settles in well under a second.
    assert client.flush(15), client.stats()
    stats = client.close()
    handed_over, accounted = balance(stats)
    assert handed_over == accounted == len(calls)
    assert stats.pending == 0
    assert len(reported) == stats.rejected + stats.failed
    assert stats.accepted + stats.duplicate == monitor.acknowledged
    if stats.dropped == 0:
        # Rejected alone, on the client: the rest of their batches went on.
        rejected_ids = [event_id for event_id, _ in reported]
        assert all(event_id in rejected_ids for event_id in unsendable)
        if not script:
            good = sum(call.kind == "good" for call in calls)
            assert stats.accepted >= good
    # Read with a size cap: the client hung up on an endless body long before its end.
    assert monitor.largest_body_sent < ENDLESS_LIMIT // 4
