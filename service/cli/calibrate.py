"""``retrieval-monitor calibrate``: fit the local judge's thresholds on a window's gold traffic,
report them on held-out queries, and with ``--apply`` make the workers use them."""

from __future__ import annotations

import argparse
import json
import sys

from sqlalchemy.exc import OperationalError, ProgrammingError

from service.analysis.local_calibration import NotEnoughGoldError, render, run_local_calibration
from service.analysis.report import to_jsonable
from service.cli.window_options import add_window_options, event_window
from service.config.settings import Settings
from service.primitives.clock import utcnow
from service.store.engine import get_engine, session_scope


def add_calibrate_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    calibrate = sub.add_parser(
        "calibrate",
        help="fit the local judge's thresholds on your gold traffic and check them",
        description="Split the gold queries of a window in two halves, fit the local judge's "
        "three similarity thresholds on one and report precision, recall and Cohen's kappa "
        "against the gold labels on the other, next to the thresholds in use. With --apply, "
        "workers grade with the fitted thresholds from then on, under a new prompt version.",
    )
    add_window_options(calibrate, default_since="7d")
    calibrate.add_argument("--seed", type=int, default=0, help="seed of the split and intervals")
    calibrate.add_argument(
        "--apply", action="store_true", help="store the fitted thresholds for the workers"
    )
    calibrate.add_argument("--json", action="store_true", help="print the report as JSON")
    calibrate.set_defaults(handler=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace, settings: Settings) -> int:
    now = utcnow()
    window = event_window(args, "calibrate", now)
    if window is None:
        return 2
    try:
        with session_scope(get_engine(settings.database_url)) as session:
            outcome = run_local_calibration(
                session,
                window,
                configured_thresholds=settings.local_judge_thresholds,
                seed=args.seed,
                apply=args.apply,
                now=now,
            )
            session.commit()
    except NotEnoughGoldError as exc:
        print(f"retrieval-monitor calibrate: {exc}", file=sys.stderr)
        return 1
    except (OperationalError, ProgrammingError) as exc:
        print(
            f"retrieval-monitor calibrate: cannot read the database ({exc.orig}); "
            "is RM_DATABASE_URL right, and has `retrieval-monitor migrate` run?",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps({**to_jsonable(outcome.report), "applied": outcome.applied}, indent=2))
    else:
        print(render(outcome.report, outcome.applied))
    return 0
