"""Signals that need no judge, computed at ingest for every event (sampled or not).

They are cheap on purpose: the retriever's own scores, how many passages came back, their length,
and near-duplicates among the top k by word-shingle overlap. They cannot say whether a passage is
relevant, but they move when a retriever breaks (an empty index, a changed embedding model, a
chunker that repeats itself), on all traffic and within seconds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_WORD = re.compile(r"\w+")
SHINGLE_WORDS = 3
# Near-duplicates share their beginning; comparing only that keeps the cost per passage fixed.
MAX_WORDS = 200


@dataclass(frozen=True)
class Signals:
    passages: int  # in the top k
    empty: bool
    short: bool
    top_score: float | None  # the retriever's score of the first passage
    score_gap: float | None  # top score minus the score of the k-th passage
    duplicates: int  # top-k passages that nearly repeat a higher-ranked one
    lengths: tuple[int, ...]  # characters of each top-k passage

    @property
    def duplicate_ratio(self) -> float | None:
        return self.duplicates / self.passages if self.passages else None


def looks_bad(signals: Signals, duplicate_ratio_bound: float = 0.5) -> bool:
    """Whether the judge should see this event before the others.

    A short list is not enough: an app may carry two passages by design, and then every event
    would jump the queue.
    """
    ratio = signals.duplicate_ratio
    return signals.empty or (ratio is not None and ratio >= duplicate_ratio_bound)


def shingles(text: str, size: int = SHINGLE_WORDS) -> frozenset[int]:
    """Hashes of the word n-grams (lower case) of the text's first ``MAX_WORDS`` words.

    The hashes only ever meet hashes of the same process, so Python's own hash does.
    """
    words = _WORD.findall(text.lower())[:MAX_WORDS]
    if len(words) < size:
        return frozenset({hash(tuple(words))}) if words else frozenset()
    return frozenset(hash(tuple(words[i : i + size])) for i in range(len(words) - size + 1))


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    if not a and not b:
        return 1.0
    common = len(a & b)
    return common / (len(a) + len(b) - common)


def count_near_duplicates(texts: Sequence[str], threshold: float) -> int:
    """Passages whose shingles overlap a higher-ranked passage's by at least ``threshold``."""
    sets = [shingles(t) for t in texts]
    duplicates = 0
    for i, current in enumerate(sets):
        for earlier in sets[:i]:
            # Jaccard is at most min/max of the sizes: most pairs are ruled out without a set
            # operation.
            small, large = sorted((len(current), len(earlier)))
            if large and small < threshold * large:
                continue
            if jaccard(current, earlier) >= threshold:
                duplicates += 1
                break
    return duplicates


def compute_signals(
    texts: Sequence[str],
    scores: Sequence[float | None],
    k: int,
    short_below: int,
    duplicate_similarity: float,
    max_compared: int,
) -> Signals:
    """The signals of one event's ranked passages, of which the first ``k`` reach the prompt."""
    top = list(texts[:k])
    top_scores = list(scores[:k])
    n = len(top)
    top_score = top_scores[0] if n else None
    last = top_scores[-1] if n else None
    gap = top_score - last if top_score is not None and last is not None and n > 1 else None
    return Signals(
        passages=n,
        empty=n == 0,
        short=n < short_below,
        top_score=top_score,
        score_gap=gap,
        duplicates=count_near_duplicates(top[:max_compared], duplicate_similarity),
        lengths=tuple(len(t) for t in top),
    )
