"""The gold set leaves the tool: a window's gold questions written as a BEIR dataset that
``retrieval-monitor replay --dataset DIR --gold`` runs a new retriever against.

- ``queries.jsonl``: one line per gold question, ``_id`` the event id, ``text`` its query,
  ``metadata`` its app, retriever and k;
- ``corpus.jsonl``: every passage the questions were sent (top k and the window), each id once,
  plus the text of answering passages that were not sent, when a labeller pasted it;
- ``qrels/test.tsv``: ``query-id corpus-id 1`` for each gold passage;
- ``agreement.json``: the labellers' Cohen's kappa and counts over the window.

Gold is what the analysis uses (``service.store.gold``: sent with the event, or marked later and
agreed on). A gold passage known only by an id whose text nobody gave stays in the qrels without
a corpus line: a new retriever cannot find it either, and the miss is still counted. Passages
whose text is no longer kept (hash-only storage) are left out of the corpus, and counted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlmodel import Session

from service.analysis.gold_queue import window_agreement
from service.analysis.report import to_jsonable
from service.analysis.window import TIME_HELP, resolve_window
from service.kernel.clock import utcnow
from service.kernel.settings import Settings
from service.store import analysis as repo
from service.store import events as event_store
from service.store import gold as gold_store
from service.store.analysis import EventWindow
from service.store.engine import get_engine, session_scope

QRELS_HEADER = "query-id\tcorpus-id\tscore\n"


@dataclass(frozen=True)
class ExportSummary:
    queries: int
    documents: int
    qrels: int
    gold_without_text: int  # gold passages known by id only: in the qrels, not in the corpus
    texts_not_kept: int  # passages sent whose text the store no longer keeps
    skipped_ids: int  # ids a TSV line cannot carry (tab or line break)


def _fits_tsv(value: str) -> bool:
    return not any(c in value for c in "\t\r\n")


def export_gold(session: Session, window: EventWindow, out: Path) -> ExportSummary:
    """Write the window's gold set to ``out`` (created; files in it are replaced)."""
    gold = repo.gold_events_in_window(session, window)
    pks = [e.pk for e in gold]
    events = gold_store.events_by_pk(session, pks)
    labels = gold_store.labels_of(session, pks)
    corpus: dict[str, dict[str, Any]] = {}
    queries: list[dict[str, Any]] = []
    qrels: list[tuple[str, str]] = []
    not_kept = skipped = 0
    for analysed in sorted(gold, key=lambda e: e.pk):
        event = events.get(analysed.pk)
        if event is None or not _fits_tsv(event.event_id):
            skipped += 1
            continue
        for passage in event_store.stored_event(session, event).passages:
            if passage.passage_id in corpus:
                continue
            if not passage.text:
                not_kept += 1
                continue
            if not _fits_tsv(passage.passage_id):
                skipped += 1
                continue
            corpus[passage.passage_id] = {
                "_id": passage.passage_id,
                "title": "",
                "text": passage.text,
            }
        for label in labels.get(analysed.pk, []):
            if label.missing_text and label.passage_ids:
                corpus.setdefault(
                    label.passage_ids[0],
                    {"_id": label.passage_ids[0], "title": "", "text": label.missing_text},
                )
        wanted = [p for p in analysed.gold_passage_ids or [] if _fits_tsv(p)]
        skipped += len(analysed.gold_passage_ids or []) - len(wanted)
        if not wanted:
            continue
        queries.append(
            {
                "_id": event.event_id,
                "text": event.query,
                "metadata": {"app": event.app, "retriever": event.retriever, "k": event.k},
            }
        )
        qrels.extend((event.event_id, passage_id) for passage_id in wanted)
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    _write_jsonl(out / "corpus.jsonl", corpus.values())
    _write_jsonl(out / "queries.jsonl", queries)
    with (out / "qrels" / "test.tsv").open("w", encoding="utf-8") as lines:
        lines.write(QRELS_HEADER)
        lines.writelines(f"{query}\t{doc}\t1\n" for query, doc in qrels)
    agreement = to_jsonable(window_agreement(session, window))
    (out / "agreement.json").write_text(json.dumps(agreement, indent=2) + "\n", encoding="utf-8")
    return ExportSummary(
        queries=len(queries),
        documents=len(corpus),
        qrels=len(qrels),
        gold_without_text=sum(1 for _, doc in qrels if doc not in corpus),
        texts_not_kept=not_kept,
        skipped_ids=skipped,
    )


def _write_jsonl(path: Path, records: Any) -> None:
    with path.open("w", encoding="utf-8") as lines:
        for record in records:
            lines.write(json.dumps(record, ensure_ascii=False) + "\n")


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
    export.add_argument("--since", default="30d", help=f"window start (default 30d). {TIME_HELP}")
    export.add_argument("--until", default=None, help=f"window end (default now). {TIME_HELP}")
    export.add_argument("--app", help="only events of this app")
    export.add_argument("--retriever", help="only events of this retriever")
    export.add_argument("--tenant", default="default", help="whose events (default: default)")
    export.set_defaults(handler=cmd_gold_export)


def cmd_gold_export(args: argparse.Namespace, settings: Settings) -> int:
    try:
        since, until = resolve_window(args.since, args.until, utcnow())
    except ValueError as exc:
        print(f"retrieval-monitor gold export: {exc}", file=sys.stderr)
        return 2
    window = EventWindow(
        since=since, until=until, app=args.app, retriever=args.retriever, tenant=args.tenant
    )
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
