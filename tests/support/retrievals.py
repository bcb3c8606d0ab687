"""Retrievals for the local judge's vector tests and benchmark: SciFact claims through the
replay's BM25 retriever, the same claims reworded, and storing them as the API stores events.

A reworded claim asks the same thing in other words ("Is it true that ...?"), so it shares no
label with the claim (labels are per query text) while its passages repeat: what is left to pay
for is encoding the query.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.replay.beir import BeirDataset, load_beir
from service.replay.bm25 import Bm25Index
from service.store.engine import session_scope
from service.store.events import insert_events
from service.store.migrate import upgrade
from service.wiring.runtime import Runtime
from tests.support.paths import shared_data_dir

SCIFACT = shared_data_dir() / "scifact"


@dataclass(frozen=True)
class Retrieval:
    query: str
    passages: tuple[str, ...]  # in rank order
    k: int


# Ways to ask a claim again; each gives other query texts, so none shares a label with another.
REWORDINGS = ("Is it true that {}?", "Does the evidence show that {}?")


def reword(claim: str, style: int = 0) -> str:
    """The claim as a question: other words, the same need."""
    body = claim.strip().rstrip(".")
    return REWORDINGS[style].format(f"{body[:1].lower()}{body[1:]}")


def load_scifact(path: Path = SCIFACT) -> BeirDataset | None:
    return load_beir(path) if path.is_dir() else None


def bm25_retrievals(
    dataset: BeirDataset, count: int, k: int, *, reworded: int | None = None
) -> list[Retrieval]:
    """The first ``count`` claims (in rewording style ``reworded``, or as they are) with BM25's
    top 2k passages each."""
    index = Bm25Index.build({doc_id: d.full_text for doc_id, d in dataset.corpus.items()})
    found = []
    for claim in list(dataset.queries.values())[:count]:
        query = claim if reworded is None else reword(claim, reworded)
        hits = index.search(query, 2 * k)
        texts = tuple(dataset.corpus[doc_id].full_text for doc_id, _ in hits)
        found.append(Retrieval(query, texts, min(k, len(texts))))
    return found


def with_reworded_queries(retrievals: Sequence[Retrieval]) -> list[Retrieval]:
    """The same passages, each query reworded."""
    return [replace(r, query=reword(r.query)) for r in retrievals]


def store_retrievals(
    settings: Settings, retrievals: Sequence[Retrieval], prefix: str, tenant: str = "default"
) -> tuple[Runtime, list[int]]:
    """Migrate, open the shared aggregates as the API does at start, and store the retrievals
    as events; the runtime and their primary keys, in order."""
    upgrade(settings.database_url)
    runtime = Runtime(settings)
    runtime.aggregates.start_epoch(time.time())
    batch = [
        (
            f"{prefix}-{i}",
            EventIn.model_validate(
                {
                    "app": "scifact",
                    "retriever": "bm25",
                    "query": r.query,
                    "k": r.k,
                    "passages": [{"id": f"d{j}", "text": t} for j, t in enumerate(r.passages)],
                }
            ),
        )
        for i, r in enumerate(retrievals)
    ]
    with session_scope(runtime.engine) as session:
        inserted = insert_events(session, tenant, batch, utcnow())
        session.commit()
    pks = [row.pk for row in inserted]
    assert all(pk is not None for pk in pks), [row.outcome for row in inserted]
    return runtime, [pk for pk in pks if pk is not None]
