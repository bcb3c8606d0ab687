"""What the pages draw, without a server: chart buckets and broken lines, query words
highlighted in escaped text, and filters read leniently from the query string.

Tests ``service.ui.charts`` and ``service.ui.filters``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from service.store.pages import bucket_seconds
from service.ui.charts import line_chart
from service.ui.filters import parse_filter
from service.ui.render import highlight, query_terms


def test_bucket_width_is_round_and_keeps_charts_small() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert bucket_seconds(start, start) == 1
    assert bucket_seconds(start, start + timedelta(seconds=20)) == 1
    assert bucket_seconds(start, start + timedelta(minutes=5)) == 15
    assert bucket_seconds(start, start + timedelta(days=7)) == 21600
    for span in (timedelta(seconds=s) for s in (0, 7, 95, 4000, 90_000, 3_000_000)):
        width = bucket_seconds(start, start + span)
        assert span.total_seconds() / width < 30 or width == 604800


def test_a_missing_value_breaks_the_line() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    series = [(start + timedelta(seconds=i), v, 1) for i, v in enumerate([0.2, 0.4, None, 0.9])]
    chart = line_chart(series, start, start + timedelta(seconds=3), unit_scale=True, mean=0.5)
    assert len(chart.paths) == 1  # the first two points
    assert [p.value for p in chart.lone] == [0.9]  # the last stands alone
    assert chart.last == 0.9
    ys = [p.y for p in chart.points]
    assert ys[0] > ys[1] > ys[2]  # higher values are drawn higher (smaller y)
    assert line_chart([], start, start, unit_scale=False, mean=None).empty


def test_highlight_marks_query_words_and_escapes_the_rest() -> None:
    terms = query_terms("What is the boiling point of water?")
    assert terms == {"boiling", "point", "water"}
    marked = str(highlight("<b>Water</b> boils; its boiling point is 100", terms))
    assert marked == (
        "&lt;b&gt;<mark>Water</mark>&lt;/b&gt; boils; its <mark>boiling</mark> "
        "<mark>point</mark> is 100"
    )


def test_filters_are_read_leniently() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    chosen = parse_filter(
        {"window": "1h", "measure": "t", "below": "0.3", "outcome": "miss", "gold": "yes"}, now
    )
    assert chosen.window.since == now - timedelta(hours=1)
    assert (chosen.measure, chosen.below, chosen.outcome, chosen.gold) == ("t", 0.3, "miss", True)
    assert not chosen.errors
    again = parse_filter(dict(pair.split("=") for pair in chosen.query_string().split("&")), now)
    assert again == chosen
    bad = parse_filter({"window": "3y", "below": "nan", "page": "-2", "cause": "luck"}, now)
    assert bad.window.name == "7d"
    assert bad.page == 1
    assert bad.below is None
    assert len(bad.errors) == 2
