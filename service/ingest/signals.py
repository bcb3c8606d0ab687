"""Signals that need no judge, computed at ingest for every event (sampled or not).

They are cheap on purpose: the retriever's own scores, how many passages came back, their length,
and near-duplicates among the top k by word-shingle overlap. They cannot say whether a passage is
relevant, but they move when a retriever breaks (an empty index, a changed embedding model, a
chunker that repeats itself), on all traffic and within seconds.
"""

from __future__ import annotations

import math
import re
import string
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from service.primitives.bounded_cache import BoundedCache
from service.primitives.hashing import text_hash
from service.primitives.keys import composite_key

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
# What the shingle prefixes of recent passages may hold in one process: ~20 hashes (under 1 KiB)
# per passage of ordinary length, so some 8,000 passages; keyed by content hash, not the text.
PREFIX_CACHE_BYTES = 8 * 1024 * 1024
# An int in a prefix: a shingle hash is a 64-bit value, 36 bytes as a Python int.
_HASH_INT_BYTES = 36


@dataclass(frozen=True)
class Signals:
    passages: int  # in the top k
    empty: bool
    short: bool
    top_score: float | None  # the retriever's score of the first passage
    score_gap: float | None  # top score minus the score of the k-th passage
    # Top-k passages that nearly repeat a higher-ranked one; None when not counted at ingest
    # (the count only feeds a histogram, computed after the answer: service/ingest/deferred.py).
    duplicates: int | None
    lengths: tuple[int, ...]  # characters of each top-k passage

    @property
    def duplicate_ratio(self) -> float | None:
        if self.duplicates is None or not self.passages:
            return None
        return self.duplicates / self.passages


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
    return sum(near_duplicate_flags(texts, threshold))


def repeats_enough(
    texts: Sequence[str], threshold: float, passages: int, bound: float = 0.5
) -> bool:
    """Whether ``count_near_duplicates(texts, threshold) / passages >= bound``, the condition
    ``looks_bad`` puts on the duplicate ratio, reading no more passages than the answer needs."""
    return NearDuplicateCount(texts, threshold).reaches(passages, bound)


class NearDuplicateCount:
    """``count_near_duplicates``, read one passage at a time, so it can stop and go on later.

    Ingest reads only as far as the urgent-queue decision needs (``reaches``): it stops as soon
    as the count meets the bound, or can no longer meet it with the passages left, so a list
    with no repeat never has the shingles of its last passages built before the answer. The
    thread that exports the ratio after the answer finishes the same count (``total``),
    carrying on from where ingest stopped: no passage is read twice.
    """

    def __init__(
        self, texts: Sequence[str], threshold: float, hashes: Sequence[str] | None = None
    ) -> None:
        self._flags = near_duplicate_flags(texts, threshold, hashes)
        self.found = 0
        self.left = len(texts)

    def reaches(self, passages: int, bound: float = 0.5) -> bool:
        """Whether the full count, over ``passages``, will be at least ``bound``."""
        if passages <= 0:
            return False
        needed = _smallest_count_meeting(passages, bound)
        while self.found < needed <= self.found + self.left:
            self._read_one()
        return self.found >= needed

    def total(self) -> int:
        """The full count (reading whatever is left)."""
        while self.left:
            self._read_one()
        return self.found

    def _read_one(self) -> None:
        self.found += next(self._flags)
        self.left -= 1


def _smallest_count_meeting(passages: int, bound: float) -> int:
    """The smallest d with ``d / passages >= bound`` (the division ``looks_bad`` makes), or
    ``passages + 1`` when none can."""
    needed = max(0, min(passages + 1, math.ceil(bound * passages)))
    # ceil of a float product can be one off the division's own answer: settle it exactly.
    while needed > 0 and (needed - 1) / passages >= bound:
        needed -= 1
    while needed <= passages and needed / passages < bound:
        needed += 1
    return needed


def near_duplicate_flags(
    texts: Sequence[str], threshold: float, hashes: Sequence[str] | None = None
) -> Iterator[bool]:
    """For each passage in rank order, whether it nearly repeats a higher-ranked one.

    Lazy: a caller that stops early never builds the shingles of the passages after.
    ``hashes``, when given, are the texts' content hashes (``text_hash``), made once by ingest
    for the store too.
    """
    prefixes: list[tuple[int, ...]] = []
    sets: dict[int, frozenset[int]] = {}  # full shingle sets, built only for candidates

    def shingle_set(i: int) -> frozenset[int]:
        if i not in sets:
            sets[i] = shingles(texts[i])
        return sets[i]

    seen: set[int] = set()  # the prefixes of every passage ranked above the current one
    for i, text in enumerate(texts):
        prefix = shingle_prefix(text, threshold, hashes[i] if hashes is not None else None)
        prefixes.append(prefix)
        # A passage whose prefix meets no earlier prefix has no near-duplicate above it; only
        # the rest (near-duplicates, and the few passages that share a small shingle by chance)
        # pay for the exact comparison. Empty passages have no prefix and are compared.
        candidate = not prefix or not seen.isdisjoint(prefix)
        seen.update(prefix)
        if not candidate:
            yield False
            continue
        current = shingle_set(i)
        mine = set(prefix)
        repeats = False
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
                repeats = True
                break
        yield repeats


def _prefix_bytes(prefix: tuple[int, ...]) -> int:
    return sys.getsizeof(prefix) + _HASH_INT_BYTES * len(prefix)


PREFIX_CACHE: BoundedCache[tuple[int, ...]] = BoundedCache(
    PREFIX_CACHE_BYTES, size_of=_prefix_bytes
)


def shingle_prefix(text: str, threshold: float, digest: str | None = None) -> tuple[int, ...]:
    """The text's smallest shingle hashes: any near-duplicate shares at least one of them.

    Two sets with Jaccard >= t share at least t * max(|A|, |B|) elements, so the first
    |A| - floor(t * |A|) + 1 elements of A in any fixed order meet the first ones of B (prefix
    filtering, as in all-pairs similarity search). One more element than that keeps float
    rounding on the safe side. Cached by the text's content hash: retrievers return the same
    popular passages again and again, and a hit costs a hash and a lookup instead of building
    ~150 shingles, while the cache never holds a text. ``digest`` is ``text_hash(text)`` when
    the caller has it already.
    """
    key = composite_key(digest if digest is not None else text_hash(text), repr(threshold))
    known = PREFIX_CACHE.get(key)
    if known is not None:
        return known
    found = shingles(text)
    keep = len(found) - math.floor(threshold * len(found)) + 2
    prefix = tuple(sorted(found)[:keep])
    PREFIX_CACHE.put(key, prefix)
    return prefix


def compute_signals(
    texts: Sequence[str],
    scores: Sequence[float | None],
    k: int,
    short_below: int,
    duplicate_similarity: float,
    max_compared: int,
    count_duplicates: bool = True,
) -> Signals:
    """The signals of one event's ranked passages, of which the first ``k`` reach the prompt.

    ``count_duplicates=False`` leaves the near-duplicate count (the costly one) out.
    """
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
        duplicates=(
            count_near_duplicates(top[:max_compared], duplicate_similarity)
            if count_duplicates
            else None
        ),
        lengths=tuple(len(t) for t in top),
    )
