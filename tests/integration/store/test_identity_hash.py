"""The identity hash changed form (orjson instead of json.dumps): an event stored under the old
form, sent again, is still a duplicate, and a different event under its id still a conflict."""

from __future__ import annotations

from sqlalchemy import update
from sqlmodel import col

from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.store.engine import make_engine, session_scope
from service.store.events import insert_events, legacy_payload_hash, payload_hash
from service.store.models import Event
from tests.support.helpers import make_event


def test_events_stored_under_the_legacy_hash_stay_duplicates(store_url: str) -> None:
    engine = make_engine(store_url)
    # Non-ASCII text and a float: where the two serializations write different bytes.
    body = make_event("old", n=2, query="café 1e-05")
    body["passages"][0]["score"] = 1e16
    event = EventIn.model_validate(body)
    assert payload_hash(event) != legacy_payload_hash(event)
    with session_scope(engine) as session:
        insert_events(session, "t1", [("old", event)], utcnow())
        # As a release before this change stored it.
        session.execute(
            update(Event)
            .where(col(Event.event_id) == "old")
            .values(payload_hash=legacy_payload_hash(event))
        )
        session.commit()
    changed = EventIn.model_validate({**body, "query": "another question"})
    with session_scope(engine) as session:
        again = insert_events(session, "t1", [("old", event), ("old2", changed)], utcnow())
        session.commit()
        conflict = insert_events(session, "t1", [("old", changed)], utcnow())
        session.rollback()
    assert [r.outcome for r in again] == ["duplicate", "accepted"]
    assert [r.outcome for r in conflict] == ["conflict"]
    engine.dispose()
