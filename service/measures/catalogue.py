"""Every retrieval measure, declared once: what it is called, what it reads, how it is shown.

The exports (histogram families and their buckets, what a score adds to the aggregates), the rules
and dashboards in ``deploy/``, the pages' titles, units and columns, and the analysis's lists are
all derived from ``MEASURES``; the ``scores`` table has one column per measure, which a test
checks both ways. Adding a measure means its formula (``formulas``), one entry here, and the
``Score`` column with its migration.

The order of ``MEASURES`` is the order of the public ``measures`` map, of the exported families
and of every page and dashboard that lists them all.

Plain data: nothing from the rest of the project is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Source = Literal["top_k", "window", "context", "gold"]
"""What a measure is computed from, which decides when it is missing:
``top_k``: the judge's labels of the top K (missing when one of them is);
``window``: those and the labels after K up to 2K that estimate N_p (missing when any is);
``context``: the judge's rating of the whole context; ``gold``: the gold passage ids sent."""

UNIT_BUCKETS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 11))
# T and T_u grow with the number of relevant passages (up to (1-a)*K) and go down to -a*K.
# fmt: off
T_BUCKETS: tuple[float, ...] = (
    -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)
# fmt: on
RATIO_BUCKETS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0)


Range = tuple[float | None, float | None]
"""The lowest and highest value one event can have; ``None`` where it grows with K."""
UNIT: Range = (0.0, 1.0)
NON_NEGATIVE: Range = (0.0, None)
UNBOUNDED: Range = (None, None)


@dataclass(frozen=True, kw_only=True)
class Measure:
    name: str
    """The key in the public ``measures`` map, the ``scores`` column and the metric suffix."""
    title: str
    """How dashboards name it (panel titles)."""
    short_title: str
    """How the pages name it (table headers, chart labels, the measure filter)."""
    source: Source
    value_range: Range
    buckets: tuple[float, ...]
    """Upper bounds of its exported histogram's buckets."""
    uses_alpha: bool = False
    """Computed at the configured alpha (reported beside it); the analysis looks for its best."""
    correlation_rank: int | None = None
    """Its place in the analysis's table of correlations with the response grades (T first, as
    the paper reads); ``None`` when the analysis does not correlate it."""
    compared: bool = False
    """Whether a comparison of two windows or two retriever versions tests its mean."""
    listed: bool = False
    """Whether the events page shows it as a column of every row."""

    @property
    def needs_gold(self) -> bool:
        return self.source == "gold"

    @property
    def from_judge_labels(self) -> bool:
        """Computed from the judge's passage labels: missing with them."""
        return self.source in ("top_k", "window")

    @property
    def signed(self) -> bool:
        """It can be negative: no ratio to a baseline, and its histogram ``_sum`` can decrease."""
        low = self.value_range[0]
        return low is None or low < 0

    @property
    def unit_interval(self) -> bool:
        """Bounded to [0, 1], so charts can use a fixed axis; the others get a free one."""
        return self.value_range == UNIT


MEASURES: tuple[Measure, ...] = (
    Measure(
        name="precision",
        title="Precision@K",
        short_title="Precision",
        source="top_k",
        value_range=UNIT,
        buckets=UNIT_BUCKETS,
        correlation_rank=3,
        compared=True,
        listed=True,
    ),
    Measure(
        name="hit",
        title="Hit@K",
        short_title="Hit",
        source="top_k",
        value_range=UNIT,
        buckets=(0.5, 1.0),
    ),
    Measure(
        name="rr",
        title="Reciprocal rank",
        short_title="RR",
        source="top_k",
        value_range=UNIT,
        buckets=(0.1, 0.2, 0.25, 1 / 3, 0.5, 1.0),
    ),
    Measure(
        name="ndcg",
        title="nDCG@K",
        short_title="nDCG",
        source="top_k",
        value_range=UNIT,
        buckets=UNIT_BUCKETS,
        correlation_rank=2,
        compared=True,
        listed=True,
    ),
    Measure(
        name="t",
        title="T (alpha)",
        short_title="T",
        source="top_k",
        value_range=UNBOUNDED,
        buckets=T_BUCKETS,
        uses_alpha=True,
        correlation_rank=0,
        compared=True,
        listed=True,
    ),
    Measure(
        name="t_u",
        title="T_u (alpha)",
        short_title="T_u",
        source="top_k",
        value_range=UNBOUNDED,
        buckets=T_BUCKETS,
        uses_alpha=True,
        correlation_rank=1,
    ),
    Measure(
        name="f_e",
        title="F_e (estimated N_p)",
        short_title="F_e",
        source="window",
        value_range=UNIT,
        buckets=UNIT_BUCKETS,
        uses_alpha=True,
        correlation_rank=4,
        compared=True,
        listed=True,
    ),
    Measure(
        name="context_relevance",
        title="Context relevance (judge's rating)",
        short_title="Context relevance",
        source="context",
        value_range=UNIT,
        buckets=(0.0, 0.5, 1.0),
        correlation_rank=5,
        compared=True,
        listed=True,
    ),
    Measure(
        name="k_over_np_est",
        title="K / estimated N_p",
        short_title="K/N^_p",
        source="window",
        value_range=NON_NEGATIVE,
        buckets=RATIO_BUCKETS,
    ),
    Measure(
        name="recall",
        title="Recall@K (gold)",
        short_title="Recall (gold)",
        source="gold",
        value_range=UNIT,
        buckets=UNIT_BUCKETS,
        listed=True,
    ),
    Measure(
        name="f",
        title="F (gold)",
        short_title="F (gold)",
        source="gold",
        value_range=UNIT,
        buckets=UNIT_BUCKETS,
        uses_alpha=True,
        correlation_rank=6,
    ),
    Measure(
        name="ndcg_gold",
        title="nDCG@K (gold, trec_eval's definition)",
        short_title="nDCG (gold)",
        source="gold",
        value_range=UNIT,
        buckets=UNIT_BUCKETS,
    ),
)

BY_NAME: dict[str, Measure] = {m.name: m for m in MEASURES}

EXTRA_KEYS: tuple[str, ...] = ("alpha", "np_window")
"""Reported beside the measures of every score: the alpha used and the window N^_p looked at."""

# The paper's conclusions: T tracks answer quality best where K/N_p is about 1 or below (the
# narrow regime), nDCG where it is high and the order of the many negatives matters.
NARROW_LEAD = "t"
WIDE_LEAD = "ndcg"


def names(where: Callable[[Measure], bool] = lambda _: True) -> tuple[str, ...]:
    """The names of the measures ``where`` accepts, in catalogue order."""
    return tuple(m.name for m in MEASURES if where(m))


MEASURE_NAMES = names()
TOP_K_MEASURES = names(lambda m: m.source == "top_k")
WINDOW_MEASURES = names(lambda m: m.source == "window")
GOLD_MEASURES = names(lambda m: m.needs_gold)
ALPHA_MEASURES = names(lambda m: m.uses_alpha)
SIGNED_MEASURES = frozenset(names(lambda m: m.signed))
UNIT_INTERVAL_MEASURES = frozenset(names(lambda m: m.unit_interval))


def _by_correlation_rank() -> tuple[str, ...]:
    ranked = {m.correlation_rank: m.name for m in MEASURES if m.correlation_rank is not None}
    return tuple(ranked[rank] for rank in sorted(ranked))


CORRELATED = _by_correlation_rank()
COMPARED = names(lambda m: m.compared)
LISTED = names(lambda m: m.listed)
