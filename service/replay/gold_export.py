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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session

from service.analysis.gold_queue import window_agreement
from service.analysis.report import to_jsonable
from service.store import analysis as repo
from service.store import events as event_store
from service.store import gold as gold_store
from service.store.analysis import EventWindow

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
