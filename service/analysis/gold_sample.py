"""Which events a person labels: a sample of a window, stratified by app and retriever, that the
same seed draws again, with no query twice.

Each event gets a key, the SHA-256 of the seed and its event id, so the order does not depend on
how the database returns rows. Queries are compared after normalising (case, spaces): of the
events asking the same question only the one with the smallest key stays. The target is shared
among the (app, retriever) strata in proportion to their distinct queries (largest remainders;
ties to the larger stratum, then by name), and each stratum gives its smallest keys. The
sample is listed stratum by stratum interleaved, so stopping early still covers every stratum.
The same window, strata, seed and target give the same sample: it is recomputed, never stored.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from itertools import zip_longest
from typing import TypeVar

from service.store.gold import SampleCandidate

Stratum = TypeVar("Stratum", bound=Hashable)


def normalised(query: str) -> str:
    return " ".join(query.casefold().split())


def sample_key(seed: int, event_id: str) -> str:
    return hashlib.sha256(f"{seed}\x00{event_id}".encode("utf-8", "surrogatepass")).hexdigest()


def allocate(sizes: Mapping[Stratum, int], target: int) -> dict[Stratum, int]:
    """``target`` shared in proportion to ``sizes`` by largest remainders, never above a size."""
    total = sum(sizes.values())
    if total == 0 or target <= 0:
        return dict.fromkeys(sizes, 0)
    if target >= total:
        return dict(sizes)
    exact = {name: target * size / total for name, size in sizes.items()}
    shares = {name: int(value) for name, value in exact.items()}
    order = sorted(sizes, key=lambda name: (-(exact[name] - shares[name]), -sizes[name], str(name)))
    for name in order[: target - sum(shares.values())]:
        shares[name] += 1
    return shares


def draw(candidates: Sequence[SampleCandidate], seed: int, target: int) -> list[SampleCandidate]:
    """The sample (see the module docstring), in the order to label it."""
    keyed = sorted(candidates, key=lambda c: sample_key(seed, c.event_id))
    seen: set[str] = set()
    strata: dict[tuple[str, str], list[SampleCandidate]] = defaultdict(list)
    for candidate in keyed:
        question = normalised(candidate.query)
        if not question or question in seen:
            continue
        seen.add(question)
        strata[(candidate.app, candidate.retriever)].append(candidate)
    shares = allocate({name: len(members) for name, members in strata.items()}, target)
    picked = [strata[name][: shares[name]] for name in sorted(strata)]
    return [c for round_ in zip_longest(*picked) for c in round_ if c is not None]
