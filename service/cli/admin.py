"""``retrieval-monitor migrate`` and ``settings``: the database schema brought up to date, and
every setting shown with its value."""

from __future__ import annotations

import argparse
import logging

from service.config.settings import Settings

log = logging.getLogger("retrieval_monitor")


def add_migrate_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    migrate = sub.add_parser("migrate", help="bring the database schema up to date")
    migrate.set_defaults(handler=cmd_migrate)


def add_settings_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    show = sub.add_parser("settings", help="print every setting with its value and description")
    show.set_defaults(handler=cmd_settings)


def cmd_migrate(_args: argparse.Namespace, settings: Settings) -> int:
    from service.store.migrate import upgrade

    upgrade(settings.database_url)
    log.info("database schema is up to date")
    return 0


def cmd_settings(_args: argparse.Namespace, settings: Settings) -> int:
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        shown = "********" if "key" in name and str(value) else value
        print(f"RM_{name.upper()}={shown}\n    {field.description}")
    return 0
