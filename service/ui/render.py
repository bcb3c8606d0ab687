"""Templates and the small formatting helpers they use.

Autoescaping is on for every template: queries and passages are untrusted text. An undefined
name fails the render rather than showing as a blank.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from service.measures.catalogue import MEASURES, NARROW_LEAD
from service.primitives.clock import as_utc
from service.store.models import MissCauseKind

TEMPLATES = Path(__file__).resolve().parent / "templates"

MEASURE_TITLES: dict[str, str] = {m.name: m.short_title for m in MEASURES}
GRADE_TITLES = {0: "irrelevant", 1: "related", 2: "highly relevant", 3: "perfectly relevant"}
CONTEXT_TITLES = {0: "does not answer", 1: "partly answers", 2: "fully answers"}

# Words too common to say anything about whether a passage matches a query.
# fmt: off
_STOPWORDS = frozenset({
    "a", "about", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does", "for", "from",
    "has", "have", "how", "i", "in", "is", "it", "its", "of", "on", "or", "that", "the", "their",
    "there", "this", "to", "was", "what", "when", "where", "which", "who", "why", "will", "with",
    "you", "your",
})
# fmt: on
_WORD = re.compile(r"[^\W_]+", re.UNICODE)

# How each miss cause reads on the pages.
MISS_CAUSE_TITLES: dict[MissCauseKind, str] = {
    MissCauseKind.VOCABULARY_MISMATCH: "Vocabulary mismatch",
    MissCauseKind.SPANS_PASSAGES: "Answer spans two passages",
    MissCauseKind.NOT_IN_CORPUS: "Document not in the corpus",
    MissCauseKind.AMBIGUOUS_QUESTION: "Ambiguous question",
    MissCauseKind.OTHER: "Other",
}


def query_terms(query: str) -> frozenset[str]:
    return frozenset(
        word for word in (w.lower() for w in _WORD.findall(query)) if word not in _STOPWORDS
    )


def highlight(text: str, terms: frozenset[str]) -> Markup:
    """The text, escaped, with the query's words marked: a vocabulary gap shows at a glance."""
    if not terms:
        return escape(text)
    out: list[str] = []
    position = 0
    for match in _WORD.finditer(text):
        if match.group().lower() in terms:
            out.append(str(escape(text[position : match.start()])))
            out.append(f"<mark>{escape(match.group())}</mark>")
            position = match.end()
    out.append(str(escape(text[position:])))
    return Markup("".join(out))  # noqa: S704  (every piece above is escaped)


def number(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return "—"
    if float(value).is_integer() and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.{digits}f}"


def moment(value: datetime | None) -> str:
    if value is None:
        return "—"
    return as_utc(value).strftime("%Y-%m-%d %H:%M:%S UTC")


def short_moment(value: datetime) -> str:
    return as_utc(value).strftime("%m-%d %H:%M:%S")


def percent(part: int, whole: int) -> str:
    return "—" if whole == 0 else f"{100 * part / whole:.0f}%"


def cause_title(value: str | None) -> str:
    if value is None:
        return "unclassified"
    try:
        return MISS_CAUSE_TITLES[MissCauseKind(value)]
    except ValueError:
        return value


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        # A name the template uses but nobody passed is an error, not a silent blank on the page.
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        number=number,
        moment=moment,
        short_moment=short_moment,
        cause_title=cause_title,
        pairs=lambda values: [(v, v) for v in values],
        pathpart=lambda value: quote(str(value), safe=""),
    )
    env.globals.update(
        MEASURE_TITLES=MEASURE_TITLES,
        NARROW_LEAD=NARROW_LEAD,
        GRADE_TITLES=GRADE_TITLES,
        CONTEXT_TITLES=CONTEXT_TITLES,
        MISS_CAUSE_TITLES=MISS_CAUSE_TITLES,
        percent=percent,
    )
    return env


ENVIRONMENT = _environment()


def render(template: str, **context: Any) -> str:
    return ENVIRONMENT.get_template(template).render(**context)
