"""``retrieval-monitor analyze``: the analysis of a window as a table, JSON and PNG figures."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlmodel import Session

from service.analysis.plots import write_comparison_plots, write_plots
from service.analysis.report import render_comparison, render_table, to_jsonable
from service.analysis.runner import (
    DEFAULT_MAX_EVENTS,
    AnalysisRequest,
    run_analysis,
    run_comparison,
)
from service.analysis.window import parse_moment, preceding, resolve_window
from service.cli.window_options import add_window_options
from service.config.settings import Settings
from service.primitives.clock import utcnow
from service.store.analysis import EventWindow
from service.store.engine import get_engine, session_scope


def add_analyze_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    analyze = sub.add_parser(
        "analyze",
        help="which measure tracks answer quality, gold recall and conversion, judge vs gold",
        description="Analyse the stored events of a time window: the correlation of each "
        "measure with the response grades (narrow and wide K/N_p, best alpha), recall, MRR, "
        "ceiling and conversion on gold traffic, and the judge's agreement with gold labels. "
        "With --compare-retriever or --compare-windows, test whether two sides really differ.",
    )
    add_window_options(analyze, default_since="7d")
    analyze.add_argument("--judge", help="whose labels to use (default: the busiest judge)")
    analyze.add_argument("--prompt-version", help="the judge's prompt version")
    side = analyze.add_mutually_exclusive_group()
    side.add_argument(
        "--compare-retriever",
        nargs=2,
        metavar=("A", "B"),
        help="compare retriever B against retriever A in the window",
    )
    side.add_argument(
        "--compare-windows",
        action="store_true",
        help="compare the window against the one just before it (or --baseline)",
    )
    analyze.add_argument(
        "--baseline",
        nargs=2,
        metavar=("SINCE", "UNTIL"),
        help="baseline window for --compare-windows",
    )
    analyze.add_argument("--json", action="store_true", help="print the report as JSON")
    analyze.add_argument("--plots", type=Path, metavar="DIR", help="write PNG figures into DIR")
    analyze.add_argument(
        "--max-events",
        type=int,
        default=DEFAULT_MAX_EVENTS,
        help=f"analyse at most this many of the most recent events (default {DEFAULT_MAX_EVENTS})",
    )
    analyze.add_argument("--seed", type=int, default=0, help="seed of the bootstrap intervals")
    analyze.set_defaults(handler=cmd_analyze)


def _request(
    args: argparse.Namespace,
    settings: Settings,
    window: tuple[datetime, datetime],
    retriever: str | None,
) -> AnalysisRequest:
    since, until = window
    return AnalysisRequest(
        window=EventWindow(
            since=since,
            until=until,
            app=args.app,
            retriever=retriever,
            tenant=args.tenant,
            max_events=args.max_events,
        ),
        judge=args.judge,
        prompt_version=args.prompt_version,
        relevance_threshold=settings.relevance_threshold,
        alpha=settings.alpha,
        seed=args.seed,
    )


def cmd_analyze(args: argparse.Namespace, settings: Settings) -> int:
    now = utcnow()
    try:
        window = resolve_window(args.since, args.until, now)
        baseline = preceding(*window)
        if args.baseline:
            baseline = (parse_moment(args.baseline[0], now), parse_moment(args.baseline[1], now))
            if baseline[0] >= baseline[1]:
                raise ValueError("the baseline window is empty")
    except ValueError as exc:
        print(f"retrieval-monitor analyze: {exc}", file=sys.stderr)
        return 2
    if args.baseline and not args.compare_windows:
        print("retrieval-monitor analyze: --baseline needs --compare-windows", file=sys.stderr)
        return 2
    engine = get_engine(settings.database_url)
    try:
        with session_scope(engine) as session:
            if args.compare_retriever or args.compare_windows:
                return _compare(args, settings, session, window, baseline)
            report = run_analysis(session, _request(args, settings, window, args.retriever))
    except (OperationalError, ProgrammingError) as exc:
        print(
            f"retrieval-monitor analyze: cannot read the database ({exc.orig}); "
            "is RM_DATABASE_URL right, and has `retrieval-monitor migrate` run?",
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps(to_jsonable(report), indent=2))
    else:
        print(render_table(report), end="")
    if args.plots is not None:
        outcome = write_plots(report, args.plots)
        _tell_plots(outcome.paths, outcome.message)
    return 0


def _compare(
    args: argparse.Namespace,
    settings: Settings,
    session: Session,
    window: tuple[datetime, datetime],
    baseline: tuple[datetime, datetime],
) -> int:
    if args.compare_retriever:
        first, second = args.compare_retriever
        a = _request(args, settings, window, first)
        b = _request(args, settings, window, second)
        labels = (f"retriever {first}", f"retriever {second}")
    else:
        a = _request(args, settings, baseline, args.retriever)
        b = _request(args, settings, window, args.retriever)
        labels = (_label(a), _label(b))
    report = run_comparison(session, a, b, labels)
    if args.json:
        print(json.dumps(to_jsonable(report), indent=2))
    else:
        print(render_comparison(report), end="")
    if args.plots is not None:
        outcome = write_comparison_plots(report, args.plots)
        _tell_plots(outcome.paths, outcome.message)
    return 0


def _label(request: AnalysisRequest) -> str:
    window = request.window
    return f"{window.since:%Y-%m-%d %H:%M} .. {window.until:%Y-%m-%d %H:%M}"


def _tell_plots(paths: list[Path], message: str | None) -> None:
    # stderr, so that --json output stays parseable
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    if message:
        print(message, file=sys.stderr)
