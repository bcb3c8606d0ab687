"""The window options that the commands reading stored events share: ``--since``, ``--until``,
``--app``, ``--retriever`` and ``--tenant``, read into the store's ``EventWindow``."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

from service.analysis.window import TIME_HELP, resolve_window
from service.primitives.clock import utcnow
from service.store.analysis import EventWindow


def add_window_options(parser: argparse.ArgumentParser, default_since: str) -> None:
    parser.add_argument(
        "--since",
        default=default_since,
        help=f"window start (default {default_since}). {TIME_HELP}",
    )
    parser.add_argument("--until", default=None, help=f"window end (default now). {TIME_HELP}")
    parser.add_argument("--app", help="only events of this app")
    parser.add_argument("--retriever", help="only events of this retriever")
    parser.add_argument("--tenant", default="default", help="whose events (default: default)")


def event_window(
    args: argparse.Namespace, command: str, now: datetime | None = None
) -> EventWindow | None:
    """The window the options name, relative to ``now``; None after telling the user why the
    times are wrong."""
    try:
        since, until = resolve_window(args.since, args.until, now or utcnow())
    except ValueError as exc:
        print(f"retrieval-monitor {command}: {exc}", file=sys.stderr)
        return None
    return EventWindow(
        since=since, until=until, app=args.app, retriever=args.retriever, tenant=args.tenant
    )
