"""``retrieval-monitor``: run the API, a worker, the scheduler, migrations, or a replay.

Every setting also comes from the environment (``RM_*``; see ``retrieval-monitor settings``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from service.cli.admin import add_migrate_command, add_settings_command
from service.cli.analyze import add_analyze_command
from service.cli.calibrate import add_calibrate_command
from service.cli.gold import add_gold_command
from service.cli.keys import add_keys_command
from service.cli.rejudge import add_rejudge_command
from service.cli.replay import add_replay_command
from service.cli.serve import add_serve_command
from service.cli.worker import add_worker_commands
from service.config.settings import get_settings
from service.process import logs


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = get_settings()
    logs.configure(settings.log_level, settings.log_json)
    handler = args.handler
    result: int = handler(args, settings)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retrieval-monitor",
        description="Judge live RAG retrievals and export their quality to Prometheus. "
        "Settings come from RM_* environment variables; empty connection settings mean the "
        "embedded defaults (SQLite file, embedded Redis, local embedding judge).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The order of the commands in --help.
    add_serve_command(sub)
    add_worker_commands(sub)
    add_migrate_command(sub)
    add_replay_command(sub)
    add_keys_command(sub)
    add_analyze_command(sub)
    add_rejudge_command(sub)
    add_calibrate_command(sub)
    add_gold_command(sub)
    add_settings_command(sub)
    return parser


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
