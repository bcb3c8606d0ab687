"""Small line charts drawn as SVG on the server, so the pages need no charting library.

A bucket without a value (no event, or a measure that could not be computed) breaks the line
rather than being drawn as 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

PAD = 3.0


@dataclass(frozen=True)
class ChartPoint:
    x: float
    y: float
    at: datetime
    value: float
    events: int


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    paths: list[str]
    points: list[ChartPoint]
    """Every drawn point; the template marks those that stand alone (no line through them)."""
    lone: list[ChartPoint]
    y_min: float
    y_max: float
    start: datetime
    end: datetime
    last: float | None
    mean: float | None

    @property
    def empty(self) -> bool:
        return not self.points


def line_chart(
    series: Sequence[tuple[datetime, float | None, int]],
    start: datetime,
    end: datetime,
    *,
    unit_scale: bool,
    mean: float | None,
    width: int = 180,
    height: int = 48,
) -> Chart:
    """``series``: (bucket start, mean value or None, events in the bucket), in time order."""
    values = [v for _, v, _ in series if v is not None]
    if unit_scale:
        low, high = 0.0, 1.0
    elif values:
        low, high = min(min(values), 0.0), max(max(values), 0.0)
        if high == low:
            high = low + 1.0
    else:
        low, high = 0.0, 1.0
    span = max((end - start).total_seconds(), 1e-9)

    def x_of(moment: datetime) -> float:
        share = min(max((moment - start).total_seconds() / span, 0.0), 1.0)
        return round(PAD + share * (width - 2 * PAD), 1)

    def y_of(value: float) -> float:
        share = (min(max(value, low), high) - low) / (high - low)
        return round(height - PAD - share * (height - 2 * PAD), 1)

    paths: list[str] = []
    points: list[ChartPoint] = []
    lone: list[ChartPoint] = []
    run: list[ChartPoint] = []

    def close_run() -> None:
        if len(run) == 1:
            lone.append(run[0])
        elif run:
            paths.append(
                "M" + " L".join(f"{p.x:g} {p.y:g}" for p in run)  # absolute moves and lines
            )
        run.clear()

    for moment, value, events in series:
        if value is None:
            close_run()
            continue
        point = ChartPoint(x_of(moment), y_of(value), moment, value, events)
        points.append(point)
        run.append(point)
    close_run()
    return Chart(
        width=width,
        height=height,
        paths=paths,
        points=points,
        lone=lone,
        y_min=low,
        y_max=high,
        start=start,
        end=end,
        last=values[-1] if values else None,
        mean=mean,
    )
