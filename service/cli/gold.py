"""``retrieval-monitor gold export``: a window's gold set written as a BEIR dataset
(``service.replay.gold_export``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sqlalchemy.exc import OperationalError, ProgrammingError

from service.cli.window_options import add_window_options, event_window
from service.config.settings import Settings
from service.replay.gold_export import export_gold
from service.store.engine import get_engine, session_scope


def add_gold_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    gold = sub.add_parser("gold", help="the gold set labelled in the tool")
    actions = gold.add_subparsers(dest="gold_command", required=True, metavar="ACTION")
    export = actions.add_parser(
        "export",
        help="write a window's gold set as a BEIR dataset (corpus, queries, qrels)",
        description="Write the gold questions of a window (gold sent with events, and gold "
        "marked in the tool that the labellers agree on) as a BEIR dataset that "
        "`retrieval-monitor replay --dataset DIR --gold` replays through another retriever.",
    )
    export.add_argument("--out", required=True, type=Path, help="folder to write")
    add_window_options(export, default_since="30d")
    export.set_defaults(handler=cmd_gold_export)


def cmd_gold_export(args: argparse.Namespace, settings: Settings) -> int:
    window = event_window(args, "gold export")
    if window is None:
        return 2
    try:
        with session_scope(get_engine(settings.database_url)) as session:
            summary = export_gold(session, window, args.out)
    except (OperationalError, ProgrammingError) as exc:
        print(
            f"retrieval-monitor gold export: cannot read the database ({exc.orig}); "
            "is RM_DATABASE_URL right, and has `retrieval-monitor migrate` run?",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"retrieval-monitor gold export: cannot write {args.out}: {exc}", file=sys.stderr)
        return 1
    print(
        f"{summary.queries} queries, {summary.documents} passages, {summary.qrels} qrels "
        f"written to {args.out}"
        + (
            f"; {summary.gold_without_text} gold passages have no text (in the qrels only)"
            if summary.gold_without_text
            else ""
        )
        + (
            f"; {summary.texts_not_kept} passages left out: their text is no longer kept"
            if summary.texts_not_kept
            else ""
        )
    )
    return 0
