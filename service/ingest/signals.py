"""Signals that need no judge, computed at ingest for every event (sampled or not).

They are cheap on purpose: the retriever's own scores, how many passages came back, their length,
and near-duplicates among the top k by word-shingle overlap. They cannot say whether a passage is
relevant, but they move when a retriever breaks (an empty index, a changed embedding model, a
chunker that repeats itself), on all traffic and within seconds.
"""

from __future__ import annotations

import functools
import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

_WORD = re.compile(r"\w+")
# On ASCII text ``\w`` is exactly letters, digits and underscore: mapping every other ASCII
# character to a space and splitting on whitespace gives the same words as ``_WORD`` several
# times faster (str.translate has an ASCII fast path; the regex pays per match).
_ASCII_NON_WORD = str.maketrans(
    {c: " " for c in map(chr, range(128)) if c not in string.ascii_letters + string.digits + "_"}
)
SHINGLE_WORDS = 3
# Near-duplicates share their beginning; comparing only that keeps the cost per passage fixed.
MAX_WORDS = 200
# Distinct passage texts whose shingle prefix is kept (~20 hashes, under 1 KiB each plus the text).
PREFIX_CACHE_SIZE = 4096


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


def words(text: str) -> list[str]:
    """The text's words (runs of ``\\w`` characters), lower case."""
    lowered = text.lower()
    if lowered.isascii():
        return lowered.translate(_ASCII_NON_WORD).split()
    return _WORD.findall(lowered)


def shingles(text: str, size: int = SHINGLE_WORDS) -> frozenset[int]:
    """Hashes of the word n-grams (lower case) of the text's first ``MAX_WORDS`` words.

    The hashes only ever meet hashes of the same process, so Python's own hash does. zip builds
    the n-grams in C: the same tuples, hence the same hashes, as slicing them one by one.
    """
    first = words(text)[:MAX_WORDS]
    if len(first) < size:
        return frozenset({hash(tuple(first))}) if first else frozenset()
    return frozenset(map(hash, zip(*(first[i:] for i in range(size)), strict=False)))


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    if not a and not b:
        return 1.0
    common = len(a & b)
    return common / (len(a) + len(b) - common)


def count_near_duplicates(texts: Sequence[str], threshold: float) -> int:
    """Passages whose shingles overlap a higher-ranked passage's by at least ``threshold``."""
    prefixes = [shingle_prefix(text, threshold) for text in texts]
    sets: dict[int, frozenset[int]] = {}  # full shingle sets, built only for candidates

    def shingle_set(i: int) -> frozenset[int]:
        if i not in sets:
            sets[i] = shingles(texts[i])
        return sets[i]

    duplicates = 0
    seen: set[int] = set()  # the prefixes of every passage ranked above the current one
    for i, prefix in enumerate(prefixes):
        # A passage whose prefix meets no earlier prefix has no near-duplicate above it; only
        # the rest (near-duplicates, and the few passages that share a small shingle by chance)
        # pay for the exact comparison. Empty passages have no prefix and are compared.
        candidate = not prefix or not seen.isdisjoint(prefix)
        seen.update(prefix)
        if not candidate:
            continue
        current = shingle_set(i)
        mine = set(prefix)
        for j in range(i):
            if mine and prefixes[j] and mine.isdisjoint(prefixes[j]):
                continue  # the same argument, pair by pair: B cannot be a near-duplicate of A
            earlier = shingle_set(j)
            # Jaccard is at most min/max of the sizes: most pairs are ruled out without a set
            # operation.
            small, large = sorted((len(current), len(earlier)))
            if large and small < threshold * large:
                continue
            if jaccard(current, earlier) >= threshold:
                duplicates += 1
                break
    return duplicates


@functools.lru_cache(maxsize=PREFIX_CACHE_SIZE)
def shingle_prefix(text: str, threshold: float) -> tuple[int, ...]:
    """The text's smallest shingle hashes: any near-duplicate shares at least one of them.

    Two sets with Jaccard >= t share at least t * max(|A|, |B|) elements, so the first
    |A| - floor(t * |A|) + 1 elements of A in any fixed order meet the first ones of B (prefix
    filtering, as in all-pairs similarity search). One more element than that keeps float
    rounding on the safe side. Cached by text: retrievers return the same popular passages again
    and again, and a hit costs one dictionary lookup instead of building ~150 shingles.
    """
    found = shingles(text)
    keep = len(found) - math.floor(threshold * len(found)) + 2
    return tuple(sorted(found)[:keep])


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
