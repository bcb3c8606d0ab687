"""Queries on API keys."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlmodel import Session, col

from service.store.models import ApiKey


@dataclass(frozen=True)
class KeyRecord:
    tenant: str
    key_hash: str
    is_admin: bool
    key_id: int | None = None
    name: str = ""


def active_key(session: Session, key_hash: str) -> KeyRecord | None:
    row = session.execute(
        select(
            col(ApiKey.tenant),
            col(ApiKey.key_hash),
            col(ApiKey.is_admin),
            col(ApiKey.id),
            col(ApiKey.name),
        ).where(col(ApiKey.key_hash) == key_hash, col(ApiKey.revoked_at).is_(None))
    ).first()
    return KeyRecord(row[0], row[1], bool(row[2]), row[3], row[4] or "") if row else None


def add_key(
    session: Session, tenant: str, key_hash: str, name: str, is_admin: bool, now: datetime
) -> None:
    session.add(
        ApiKey(tenant=tenant, name=name, key_hash=key_hash, is_admin=is_admin, created_at=now)
    )


def revoke_keys(session: Session, key_hash_prefix: str, now: datetime) -> int:
    result = session.execute(
        update(ApiKey)
        .where(
            # autoescape: a % or _ in the prefix is a character, not a LIKE wildcard that could
            # revoke every key.
            col(ApiKey.key_hash).startswith(key_hash_prefix, autoescape=True),
            col(ApiKey.revoked_at).is_(None),
        )
        .values(revoked_at=now)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def key_tenants(session: Session) -> set[str]:
    """Every tenant that has an active key."""
    rows = session.execute(
        select(col(ApiKey.tenant)).where(col(ApiKey.revoked_at).is_(None)).distinct()
    )
    return {row[0] for row in rows}


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.execute(select(ApiKey).order_by(col(ApiKey.id))).scalars())
