"""The outbox's bound and its accounting: everything handed over is in exactly one state."""

from __future__ import annotations

import threading

from retrieval_monitor_client.outbox import Outbox, Stats
from retrieval_monitor_client.wire import EventRecord, FeedbackRecord


def event(n: int) -> EventRecord:
    return EventRecord(f"e-{n}", None, "shop", "bm25", None, "q", ["p"], None, None, None, None)


def accounted(stats: Stats) -> int:
    return (
        stats.accepted
        + stats.duplicate
        + stats.feedback_sent
        + stats.rejected
        + stats.failed
        + stats.dropped
        + stats.pending
    )


def test_past_its_capacity_the_outbox_drops_and_counts_from_many_threads() -> None:
    outbox = Outbox(capacity=500, batch_size=50)

    def put_many() -> None:
        for n in range(200):
            outbox.put(event(n))

    threads = [threading.Thread(target=put_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = outbox.stats()
    assert (stats.recorded, stats.pending, stats.dropped) == (800, 500, 300)
    assert len(outbox.items) == 500
    assert outbox.wake.is_set()


def test_settling_frees_room_and_keeps_the_books_balanced() -> None:
    outbox = Outbox(capacity=3, batch_size=10)
    assert [outbox.put(event(n)) for n in range(4)] == [True, True, True, False]
    mark = outbox.mark()
    assert not outbox.wait_settled(mark, timeout=0)
    for _ in range(3):
        outbox.items.popleft()
    outbox.settle(accepted=1, duplicate=1, rejected=1)
    assert outbox.wait_settled(mark, timeout=0)
    assert outbox.put(FeedbackRecord("e-0", {"answer_correct": True}))
    outbox.refuse(event(9))
    stats = outbox.stats()
    assert (stats.recorded, stats.feedback, stats.pending, stats.dropped) == (5, 1, 1, 2)
    assert accounted(stats) == stats.recorded + stats.feedback
