"""The local judge's calibration: the similarities it stored on gold events, and the fitted
thresholds applied to it.

Only the local judge stores a similarity with its judgments, so "judgments with a similarity"
are its labels; the part of the prompt version before ``@`` names its encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from service.store.analysis import EventWindow, gold_events_in_window, passage_ids
from service.store.models import Event, Judgment, LocalJudgeCalibration


def local_prompt_version(encoder_version: str, thresholds: Sequence[float]) -> str:
    """``sim-v1@t1,t2,t3``: the mapping from similarity to grade is the local judge's prompt."""
    return f"{encoder_version}@" + ",".join(f"{t:g}" for t in thresholds)


@dataclass(frozen=True)
class GoldSimilarity:
    """One judged passage of a gold event: its cosine with the query and whether it is gold."""

    event_pk: int
    query: str
    rank: int
    similarity: float
    gold: bool


def encoder_of(prompt_version: str) -> str:
    """``sim-v1@0.25,0.4,0.55`` -> ``sim-v1``: the similarity does not depend on thresholds."""
    return prompt_version.split("@", 1)[0]


def gold_similarities(
    session: Session, window: EventWindow, encoder_version: str | None = None
) -> tuple[list[GoldSimilarity], list[str]]:
    """The window's gold passages with a stored similarity, and the encoder versions present.

    With ``encoder_version`` None, the encoder that labelled the most gold passages is used.
    A passage labelled under several thresholds has one similarity; it is read once.
    """
    events = {e.pk: e for e in gold_events_in_window(session, window)}
    if not events:
        return [], []
    found: dict[str, dict[tuple[int, int], float]] = {}
    pks = list(events)
    for start in range(0, len(pks), 900):
        rows = session.execute(
            select(
                col(Judgment.event_pk),
                col(Judgment.rank),
                col(Judgment.prompt_version),
                col(Judgment.similarity),
            ).where(
                col(Judgment.event_pk).in_(pks[start : start + 900]),
                col(Judgment.similarity).is_not(None),
            )
        ).all()
        for event_pk, rank, version, similarity in rows:
            per_encoder = found.setdefault(encoder_of(str(version)), {})
            per_encoder[(int(event_pk), int(rank))] = float(similarity)
    encoders = sorted(found, key=lambda name: (-len(found[name]), name))
    chosen = encoder_version if encoder_version is not None else next(iter(encoders), None)
    if chosen is None or chosen not in found:
        return [], encoders
    ids = passage_ids(session, pks)
    queries = {
        int(pk): str(query)
        for pk, query in session.execute(
            select(col(Event.id), col(Event.query)).where(col(Event.id).in_(pks))
        )
    }
    out: list[GoldSimilarity] = []
    for (event_pk, rank), similarity in sorted(found[chosen].items()):
        ranked = ids.get(event_pk, [])
        if not 1 <= rank <= len(ranked):
            continue
        wanted = set(events[event_pk].gold_passage_ids or ())
        out.append(
            GoldSimilarity(
                event_pk=event_pk,
                query=str(queries.get(event_pk, "")),
                rank=rank,
                similarity=similarity,
                gold=ranked[rank - 1] in wanted,
            )
        )
    return out, encoders


def save_calibration(
    session: Session,
    *,
    tenant: str,
    encoder_version: str,
    thresholds: tuple[float, float, float],
    prompt_version: str,
    fitted_queries: int,
    held_out_queries: int,
    held_out_kappa: float | None,
    report: dict[str, Any],
    now: datetime,
) -> LocalJudgeCalibration:
    row = LocalJudgeCalibration(
        tenant=tenant,
        encoder_version=encoder_version,
        thresholds=list(thresholds),
        prompt_version=prompt_version,
        fitted_queries=fitted_queries,
        held_out_queries=held_out_queries,
        held_out_kappa=held_out_kappa,
        report=report,
        applied_at=now,
    )
    session.add(row)
    session.flush()
    return row


def applied_calibration(session: Session, encoder_version: str) -> LocalJudgeCalibration | None:
    """The newest calibration applied for this encoder, if any."""
    return session.exec(
        select(LocalJudgeCalibration)
        .where(col(LocalJudgeCalibration.encoder_version) == encoder_version)
        .order_by(
            col(LocalJudgeCalibration.applied_at).desc(), col(LocalJudgeCalibration.id).desc()
        )
        .limit(1)
    ).first()
