"""How far two labellers agree on which passages answer a question: Cohen's kappa over their
relevant / not-relevant decisions on every (event, passage) both of them saw.

A labeller decides on each passage the event sent: relevant when it is among the passages that
labeller marked, not relevant otherwise (an outcome that marks no sent passage, such as "not in
the corpus", is a "not relevant" for every one of them). Per pair of labellers the decisions on
the events both labelled form a 2x2 table (rows: the first, columns: the second); the pooled
kappa adds every pair's table. Passages of one event are not independent, so the interval is a
little narrow when the labellers' disagreements cluster by question.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from service.analysis import stats
from service.analysis.stats import Kappa
from service.store.gold import LabelRow, consensus


@dataclass(frozen=True)
class PairAgreement:
    first: str
    second: str
    events: int
    passages: int
    table: list[list[int]]  # [[both relevant, first only], [second only, neither]]
    kappa: Kappa


@dataclass(frozen=True)
class Agreement:
    labelled_events: int  # events with at least one label
    shared_events: int  # events with labels from two people or more
    agreed: int  # of the shared events, those where every labeller said the same
    disagreed: int  # ... and those that leave the gold set for it
    pairs: list[PairAgreement]
    pooled: Kappa


def decisions(label: LabelRow, sent_ids: Sequence[str]) -> list[bool]:
    """The labeller's relevant / not decision on each passage sent, in rank order."""
    marked = set(label.passage_ids)
    return [passage_id in marked for passage_id in sent_ids]


def _table(first: Sequence[bool], second: Sequence[bool]) -> list[list[int]]:
    table = [[0, 0], [0, 0]]
    for a, b in zip(first, second, strict=True):
        table[0 if a else 1][0 if b else 1] += 1
    return table


def agreement(
    labels: Mapping[int, Sequence[LabelRow]], sent_ids: Mapping[int, Sequence[str]]
) -> Agreement:
    """Agreement over every event of ``labels`` (event pk -> its labels)."""
    tables: dict[tuple[str, str], list[list[int]]] = defaultdict(lambda: [[0, 0], [0, 0]])
    events: dict[tuple[str, str], int] = defaultdict(int)
    shared = agreed = 0
    for event_pk, rows in labels.items():
        if len(rows) < 2:
            continue
        shared += 1
        agreed += consensus(None, None, rows).status == "agreed"
        ids = sent_ids.get(event_pk, [])
        by_labeller = {row.labeller: row for row in rows}
        for first, second in combinations(sorted(by_labeller), 2):
            cell = _table(decisions(by_labeller[first], ids), decisions(by_labeller[second], ids))
            pair = tables[(first, second)]
            for i in range(2):
                for j in range(2):
                    pair[i][j] += cell[i][j]
            events[(first, second)] += 1
    pairs = [
        PairAgreement(
            first=first,
            second=second,
            events=events[(first, second)],
            passages=sum(map(sum, table)),
            table=table,
            kappa=stats.cohens_kappa(table),
        )
        for (first, second), table in sorted(tables.items())
    ]
    pooled = [[sum(p.table[i][j] for p in pairs) for j in range(2)] for i in range(2)]
    return Agreement(
        labelled_events=sum(1 for rows in labels.values() if rows),
        shared_events=shared,
        agreed=agreed,
        disagreed=shared - agreed,
        pairs=pairs,
        pooled=stats.cohens_kappa(pooled),
    )
