"""``retrieval-monitor keys``: create, list and revoke the API keys tenants authenticate with."""

from __future__ import annotations

import argparse
import re
import sys

from service.config.settings import Settings


def add_keys_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    keys = sub.add_parser("keys", help="create, list and revoke API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it (shown only once)")
    create.add_argument("--tenant", required=True, help="the tenant the key acts for")
    create.add_argument("--name", default="", help="a note on who uses the key")
    create.add_argument("--admin", action="store_true", help="may read /metrics when protected")
    create.set_defaults(handler=cmd_keys_create)
    revoke = keys_sub.add_parser("revoke", help="revoke keys by the prefix of their hash")
    revoke.add_argument("hash_prefix", help="at least 8 characters of the key's hash (keys list)")
    revoke.set_defaults(handler=cmd_keys_revoke)
    listing = keys_sub.add_parser("list", help="list keys (hash prefix, tenant, state)")
    listing.set_defaults(handler=cmd_keys_list)


def cmd_keys_create(args: argparse.Namespace, settings: Settings) -> int:
    from service.auth.keys import key_hash, new_key
    from service.primitives.clock import utcnow
    from service.store import keys as keys_repository
    from service.store.engine import get_engine, session_scope
    from service.store.migrate import upgrade

    upgrade(settings.database_url)
    key = new_key()
    with session_scope(get_engine(settings.database_url)) as session:
        keys_repository.add_key(
            session, args.tenant, key_hash(key), args.name, args.admin, utcnow()
        )
        session.commit()
    print(key)
    print(f"hash {key_hash(key)[:12]}  tenant {args.tenant}  (store the key now)", file=sys.stderr)
    return 0


def cmd_keys_revoke(args: argparse.Namespace, settings: Settings) -> int:
    from redis import Redis

    from service.auth.keys import announce_revocation
    from service.primitives.clock import utcnow
    from service.store import keys as keys_repository
    from service.store.engine import get_engine, session_scope

    if not re.fullmatch(r"[0-9a-f]{8,64}", args.hash_prefix):
        print("give at least 8 hex characters of the hash (keys list)", file=sys.stderr)
        return 2
    with session_scope(get_engine(settings.database_url)) as session:
        count = keys_repository.revoke_keys(session, args.hash_prefix, utcnow())
        session.commit()
    if count and settings.redis_url:
        # Every API process drops its cached lookups within a second.
        announce_revocation(Redis.from_url(settings.redis_url))
    print(f"revoked {count} key(s)")
    return 0 if count else 1


def cmd_keys_list(_args: argparse.Namespace, settings: Settings) -> int:
    from service.store import keys as keys_repository
    from service.store.engine import get_engine, session_scope

    with session_scope(get_engine(settings.database_url)) as session:
        for key in keys_repository.list_keys(session):
            state = "revoked" if key.revoked_at else "active"
            role = "admin" if key.is_admin else "tenant"
            print(f"{key.key_hash[:12]}  {key.tenant:<20} {role:<6} {state:<8} {key.name}")
    return 0
