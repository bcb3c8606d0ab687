"""Judge-free signals at ingest: pure functions on the passages."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.ingest.signals import (
    PREFIX_CACHE,
    PREFIX_CACHE_BYTES,
    compute_signals,
    count_near_duplicates,
    jaccard,
    looks_bad,
    shingle_prefix,
    shingles,
    words,
)
from service.primitives.hashing import text_hash
from tests.support.near_duplicates import near_duplicate_passages, reference_near_duplicates

TEXT = "the quick brown fox jumps over the lazy dog near the river bank today"


def signals(texts: list[str], scores: list[float | None], k: int | None = None):  # type: ignore[no-untyped-def]
    return compute_signals(texts, scores, k or len(texts), 3, 0.9, 20)


def test_top_score_gap_and_lengths_within_k() -> None:
    s = signals(["a b c", "d e f", "g h i", "j"], [12.0, 9.5, 7.0, 1.0], k=3)
    assert s.passages == 3
    assert not s.empty
    assert not s.short
    assert s.top_score == 12.0
    assert s.score_gap == pytest.approx(5.0)  # the 4th passage is outside k
    assert s.lengths == (5, 5, 5)


def test_missing_scores_and_a_single_passage_give_no_gap() -> None:
    assert signals(["x"], [3.0]).score_gap is None
    assert signals(["x", "y"], [None, None]).top_score is None
    assert signals(["x", "y"], [2.0, None]).score_gap is None


def test_empty_and_short() -> None:
    empty = signals([], [])
    assert empty.empty
    assert empty.short
    assert empty.duplicate_ratio is None
    assert signals(["a", "b"], [None, None]).short
    assert not signals(["a", "b", "c"], [None, None, None]).short


def test_near_duplicates_are_counted_once_per_repeating_passage() -> None:
    variant = TEXT.replace("today", "Today!")  # same words after normalisation
    other = "a completely different passage about invoices and billing cycles"
    assert count_near_duplicates([TEXT, variant, other, TEXT], 0.9) == 2
    assert count_near_duplicates([TEXT, other], 0.9) == 0
    s = signals([TEXT, variant, other], [None, None, None])
    assert s.duplicates == 1
    assert s.duplicate_ratio == pytest.approx(1 / 3)


def test_partial_overlap_is_below_a_strict_threshold() -> None:
    half = " ".join(TEXT.split()[:7]) + " and then something else entirely happens here"
    similarity = jaccard(shingles(TEXT), shingles(half))
    assert 0.1 < similarity < 0.9
    assert count_near_duplicates([TEXT, half], 0.9) == 0
    assert count_near_duplicates([TEXT, half], similarity) == 1


def test_comparison_is_capped_and_cheap() -> None:
    base = " ".join(f"w{j}" for j in range(300))
    texts = [f"{base} tail{i}" for i in range(200)]
    started = time.perf_counter()
    s = compute_signals(texts, [None] * 200, 200, 3, 0.9, 20)
    elapsed = time.perf_counter() - started
    assert s.passages == 200
    assert len(s.lengths) == 200
    assert s.duplicates == 19  # all but the first of the 20 compared repeat the same words
    assert elapsed < 0.5, elapsed


@settings(max_examples=300, deadline=None)
@given(near_duplicate_passages(), st.sampled_from([0.05, 0.3, 0.5, 0.75, 0.9, 0.95, 1.0]))
def test_near_duplicates_match_the_plain_pairwise_definition(
    texts: list[str], threshold: float
) -> None:
    # The prefix filter and the cache only skip work: the count is the definition's.
    assert count_near_duplicates(texts, threshold) == reference_near_duplicates(texts, threshold)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_words_are_the_regex_words_on_any_text(text: str) -> None:
    assert words(text) == re.findall(r"\w+", text.lower())


def test_a_repeated_passage_reuses_its_prefix() -> None:
    unique = f"{TEXT} {time.monotonic_ns()}"
    count_near_duplicates([unique, "something else entirely here"], 0.9)
    first = shingle_prefix(unique, 0.9)
    count_near_duplicates([unique, "and a third text with words"], 0.9)
    # The same tuple object: the second event read it from the cache instead of building it.
    assert shingle_prefix(unique, 0.9) is first
    assert first == tuple(sorted(shingles(unique)))[: len(first)]


def test_the_prefix_cache_holds_digests_within_its_budget() -> None:
    astral = " ".join(chr(0x20000 + i) * 5 for i in range(3_000))
    for i in range(50):
        shingle_prefix(f"{astral} {i}", 0.9)
    assert PREFIX_CACHE.bytes_held <= PREFIX_CACHE_BYTES
    # Keyed by content hash: no text of 18,000 characters sits in the cache as a key.
    assert f"{text_hash(astral + ' 0')}:0.9" in PREFIX_CACHE


def test_empty_or_repetitive_lists_look_bad_short_ones_do_not() -> None:
    assert looks_bad(signals([], []))
    assert looks_bad(signals([TEXT, TEXT], [None, None]))
    assert not looks_bad(signals(["a b c", "d e f"], [1.0, 0.5]))
    assert not looks_bad(signals([TEXT, TEXT, "x y z", "p q r"], [None] * 4))  # 1 of 4 repeats


PURE_PRIMITIVES = {
    "service.primitives.bounded_cache",
    "service.primitives.hashing",
    "service.primitives.keys",
}


def test_the_hot_path_modules_are_pure() -> None:
    """Sampling and signals run on every request: no I/O, and of the project only the primitives'
    pure parts (the content hash and the bounded cache)."""
    import ast

    import service.ingest.sampling
    import service.ingest.signals

    for module in (service.ingest.sampling, service.ingest.signals):
        source = Path(str(module.__file__)).read_text()
        imported: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module in PURE_PRIMITIVES:
                continue
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
        allowed = {
            "__future__",
            "collections",
            "dataclasses",
            "functools",
            "hashlib",
            "math",
            "re",
            "string",
            "sys",
            "typing",
            "zlib",
        }
        assert imported <= allowed, (module.__name__, imported - allowed)
