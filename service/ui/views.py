"""What a page shows, built from the repository's rows: charts per group, passage rows of an event,
the two sides of a miss. No database access and no HTML here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup

from service.measures.catalogue import (
    GOLD_MEASURES,
    MEASURE_NAMES,
    UNIT_INTERVAL_MEASURES,
)
from service.measures.formulas import first_gold_ranks
from service.store.events import StoredEvent
from service.store.pages import GroupOverview, JudgeSlice, Overview
from service.ui.charts import Chart, line_chart
from service.ui.render import highlight, query_terms


@dataclass(frozen=True)
class MeasureChart:
    measure: str
    chart: Chart
    lead: bool


@dataclass(frozen=True)
class GroupPanel:
    group: GroupOverview
    judge: JudgeSlice | None
    charts: list[MeasureChart]
    others: list[JudgeSlice]
    """Judges or prompt versions also seen in the window (not mixed into the charts)."""


def overview_panels(data: Overview) -> list[GroupPanel]:
    panels = []
    for group in data.groups:
        judge = group.in_use
        charts: list[MeasureChart] = []
        first, last = data.first, data.last
        if judge is not None and first is not None and last is not None:
            names = [judge.lead] + [m for m in MEASURE_NAMES if m != judge.lead]
            for name in names:
                if name in GOLD_MEASURES and judge.means.get(name) is None:
                    continue
                charts.append(
                    MeasureChart(
                        name,
                        _chart(data, judge, name, first, last, lead=name == judge.lead),
                        name == judge.lead,
                    )
                )
        panels.append(GroupPanel(group, judge, charts, group.judges[1:]))
    return panels


def _chart(
    data: Overview,
    judge: JudgeSlice,
    measure: str,
    first: datetime,
    last: datetime,
    *,
    lead: bool,
) -> Chart:
    width = timedelta(seconds=data.bucket_seconds)
    by_start = {point.start: point for point in judge.series}
    series: list[tuple[datetime, float | None, int]] = []
    moment = first
    # Every bucket of the axis is listed, so a bucket with no event breaks the line.
    while moment <= last:
        point = by_start.get(moment)
        series.append(
            (moment, None, 0) if point is None else (moment, point.means.get(measure), point.events)
        )
        moment += width
    end = max(last, first + width)
    size = {"width": 360, "height": 96} if lead else {"width": 180, "height": 48}
    return line_chart(
        series,
        first,
        end,
        # Measures bounded to [0, 1] are drawn on that scale, the others over their data's range.
        unit_scale=measure in UNIT_INTERVAL_MEASURES,
        mean=judge.means.get(measure),
        **size,
    )


@dataclass(frozen=True)
class PassageRow:
    rank: int
    passage_id: str
    score: float | None
    grade: int | None
    relevant: bool | None
    gold: bool | None
    in_prompt: bool
    in_window: bool
    """Judged only to estimate N^_p: after k, up to 2k."""
    text: Markup | None
    """None when the text is no longer kept (hash-only storage, retention)."""


def passage_rows(stored: StoredEvent) -> list[PassageRow]:
    event = stored.event
    gold = set(event.gold_passage_ids) if event.gold_passage_ids else None
    # A repeat of a gold passage (the same text sent twice without an id) is not gold again.
    gold_ranks = first_gold_ranks([p.passage_id for p in stored.passages], gold or set())
    terms = query_terms(event.query)
    rows = []
    for passage in stored.passages:
        judgment = stored.judgments.get(passage.rank)
        rows.append(
            PassageRow(
                rank=passage.rank,
                passage_id=passage.passage_id,
                score=passage.score,
                grade=judgment.grade if judgment else None,
                relevant=judgment.relevant if judgment else None,
                gold=None if gold is None else passage.rank in gold_ranks,
                in_prompt=passage.rank <= event.k,
                in_window=event.k < passage.rank <= 2 * event.k,
                text=highlight(passage.text, terms) if passage.text else None,
            )
        )
    return rows


@dataclass(frozen=True)
class GoldSide:
    passage_id: str
    row: PassageRow | None
    """The passage as sent, below the prompt's cut; None when the retriever did not send it."""


def gold_side(stored: StoredEvent, rows: list[PassageRow]) -> list[GoldSide]:
    by_id: dict[str, PassageRow] = {}
    for row in rows:
        by_id.setdefault(row.passage_id, row)
    return [GoldSide(gid, by_id.get(gid)) for gid in stored.event.gold_passage_ids or []]


def measures_of(stored: StoredEvent) -> dict[str, float | None]:
    if stored.score is None:
        return {}
    return {name: getattr(stored.score, name) for name in MEASURE_NAMES}


def passage_groups(rows: list[PassageRow], k: int) -> list[tuple[str, str, list[PassageRow]]]:
    """The passages split where the prompt ends and where judging ends."""
    groups = [
        ("prompt", f"In the prompt (top {k})", [r for r in rows if r.in_prompt]),
        ("window", "Below the cut, judged to estimate N^_p", [r for r in rows if r.in_window]),
        ("rest", "Not judged", [r for r in rows if not r.in_prompt and not r.in_window]),
    ]
    return [group for group in groups if group[2]]
