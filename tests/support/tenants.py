"""Tenants for a test: an API key made for a tenant, admin or not."""

from __future__ import annotations

from service.auth.keys import key_hash, new_key
from service.config.settings import Settings
from service.primitives.clock import utcnow
from service.store import keys as keys_repository
from service.store.engine import make_engine, session_scope


def add_key(settings: Settings, tenant: str, admin: bool = False) -> str:
    key = new_key()
    engine = make_engine(settings.database_url)
    with session_scope(engine) as session:
        keys_repository.add_key(session, tenant, key_hash(key), "", admin, utcnow())
        session.commit()
    engine.dispose()
    return key
