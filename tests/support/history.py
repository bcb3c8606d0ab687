"""A database that already holds a history of judged traffic, filled fast enough for a test.

``fill`` stores events through the store's own ingest write, in commit groups, then judges them
with set-based statements (a score, a judge run and a judgment per passage), as a worker would
have, and gives some of them what the pages read besides: gold passages (every fifth, one that
was never sent, so each is a miss), a miss cause (every tenth) and a person's label (every
fiftieth). All of it lands in the current hour, inside every window the pages show by default.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.engine import Engine

from service.contract.schemas import EventIn
from service.store.engine import session_scope
from service.store.events import insert_events

GROUP = 1000
JUDGE = "history-judge"
PROMPT_VERSION = "history"
K = 6

# Each statement judges every event of the range [:first, :last) at once, whatever the count.
_JUDGED = (
    """
INSERT INTO scores (event_pk, judge, prompt_version, alpha, np_window, precision, ndcg, rr, hit,
                    created_at)
SELECT id, :judge, :version, 0.5, 0, 0.5, 0.5, 0.5, 1, received_at FROM events
WHERE event_id >= :first AND event_id < :last AND event_id LIKE 'hist-%'
""",
    """
INSERT INTO judge_runs (event_pk, judge, model, prompt_version, context_rating, calls,
                        prompt_tokens, completion_tokens, cache_hits, missing_labels,
                        malformed_replies, created_at)
SELECT id, :judge, :judge, :version, 2, 1, 0, 0, 0, 0, 0, received_at FROM events
WHERE event_id >= :first AND event_id < :last AND event_id LIKE 'hist-%'
""",
    """
INSERT INTO judgments (event_pk, rank, judge, model, prompt_version, grade, relevant, from_cache,
                       created_at)
SELECT p.event_pk, p.rank, :judge, :judge, :version, p.rank % 4, p.rank % 4 >= 2, false,
       e.received_at
FROM passages p JOIN events e ON e.id = p.event_pk
WHERE e.event_id >= :first AND e.event_id < :last AND e.event_id LIKE 'hist-%'
""",
    """
UPDATE events SET status = 'judged', judged_at = received_at
WHERE event_id >= :first AND event_id < :last AND event_id LIKE 'hist-%'
""",
)


def event_id(n: int) -> str:
    """Ids that sort as their numbers do, so a range of numbers is a range of ids."""
    return f"hist-{n:09d}"


def history_event(n: int) -> EventIn:
    return EventIn.model_validate(
        {
            "event_id": event_id(n),
            "app": f"app{n % 3}",
            "retriever": f"r{n % 2}",
            "query": f"question number {n} about the monitored corpus",
            "passages": [
                {"id": f"p{j}", "text": f"passage {j} of answer {n % 97} in the corpus"}
                for j in range(K)
            ],
            "k": K,
            "gold_passage_ids": ["never-sent"] if n % 5 == 0 else None,
        }
    )


def fill(engine: Engine, first: int, count: int, now: datetime) -> None:
    """Store and judge events ``first`` .. ``first + count - 1`` received at ``now``."""
    for start in range(first, first + count, GROUP):
        batch = [
            (event_id(n), history_event(n)) for n in range(start, min(start + GROUP, first + count))
        ]
        with session_scope(engine) as session:
            insert_events(session, "default", batch, now)
            session.commit()
    bounds = {
        "judge": JUDGE,
        "version": PROMPT_VERSION,
        "first": event_id(first),
        "last": event_id(first + count),
    }
    with engine.begin() as conn:
        for statement in _JUDGED:
            conn.execute(text(statement), bounds)
        conn.execute(
            text(
                "INSERT INTO miss_causes (event_pk, cause, note, recorded_at) "
                "SELECT id, 'vocabulary_mismatch', NULL, received_at FROM events "
                "WHERE event_id >= :first AND event_id < :last AND event_id LIKE 'hist-%' "
                "AND gold AND id % 2 = 0"
            ),
            bounds,
        )
        conn.execute(
            text(
                "INSERT INTO gold_labels (event_pk, labeller, labeller_name, outcome, "
                "passage_ids, missing_text, answer_correct, labelled_at) "
                "SELECT id, 'person', 'person', 'answered', '[\"p1\"]', NULL, NULL, received_at "
                "FROM events WHERE event_id >= :first AND event_id < :last "
                "AND event_id LIKE 'hist-%' AND id % 50 = 0"
            ),
            bounds,
        )
