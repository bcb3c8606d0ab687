"""Cross-process metric values kept in one Redis hash.

Every process (API replicas, worker processes) adds to the same hash, so every scrape of any
replica sees the same global totals. A field is the JSON ``[family, [label values], part]``, where
part is ``""`` for a counter, ``"b<i>"`` for the i-th histogram bucket (not cumulative; the
exporter accumulates; ``b<n>`` past the last bound only shows in the count), ``"sum"`` and
``"count"``.

Redis may lose this hash (restart without persistence, FLUSHALL): the database keeps every score,
and ``rebuild`` recomputes the judged-side aggregates from it.
"""

from __future__ import annotations

import bisect
import functools
import json
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from redis import Redis
from redis.client import Pipeline

from service.primitives.keys import structured_key
from service.telemetry.cardinality import OVERFLOW, LabelSet, LabelSetCap
from service.telemetry.metrics import FAMILIES, Family

HASH_KEY = "rm:metrics:v1"
DONE_PREFIX = "rm:metrics:done:"
# Set once the hash holds everything the database implies (see service.telemetry.rebuild).
# While it is missing (a fresh or flushed Redis), plain increments are dropped: the rebuild counts
# them.
EPOCH_KEY = "rm:metrics:epoch"
# How long a "this event was already counted" marker lives. A second delivery of a judged event
# comes from Redis's redelivery after the visibility timeout (an hour) or a retry countdown shorter
# than that; a day covers both with room, and at one marker of ~125 B per judged event it keeps
# the markers' memory to a day's worth of judging (a week's would be 7.6 GB at 100 events/s).
DONE_TTL_SECONDS = 24 * 3600

# Adds the deltas only if the done-marker did not exist, atomically: a task delivered twice,
# or re-run after a crash between the database commit and this call, never counts twice.
_ADD_IN_EPOCH = """
if redis.call('EXISTS', KEYS[2]) == 1 then
  for i = 1, #ARGV, 2 do
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  return 1
end
return 0
"""

_ADD_ONCE = """
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then
  for i = 2, #ARGV, 2 do
    redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  return 1
end
return 0
"""

# ``_ADD_ONCE`` for many markers and one summed delta: applies it only if no marker existed, and
# then sets them all; otherwise applies nothing and returns the (1-based) positions of the markers
# that existed, for the caller to leave those events out and try again.
_ADD_ALL_ONCE = """
local existing = {}
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    existing[#existing + 1] = i - 1
  end
end
if #existing > 0 then
  return existing
end
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], '1', 'EX', ARGV[1])
end
for i = 2, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
return {}
"""


# Every family's series, each as one list of values: a counter's [total]; a histogram's
# [b0, ..., b(n-1), count, sum] with its n finite bounds (buckets not cumulative).
Series = dict[str, dict[tuple[str, ...], list[float]]]
COUNT: Final = -2  # a histogram's count and sum, from the end of its list
SUM: Final = -1


@dataclass(frozen=True, eq=False, slots=True)
class _SeriesKey:
    """One series; compared by identity, so grouping a scrape's fields hashes no label tuple."""

    family: str
    labels: tuple[str, ...]
    width: int  # how many values the series holds (see ``Series``)


@dataclass(frozen=True, slots=True)
class _Slot:
    """Where one hash field's value goes in ``Series``."""

    series: _SeriesKey
    index: int


def _parse(key: bytes | str) -> tuple[str, tuple[str, ...], int, int] | None:
    """(family, labels, index, width) of a field, or None for a field the exporter leaves out:
    an unknown family (written by another version of the service), labels that do not fit the
    family, or a part that is not exported."""
    try:
        family_name, labels, part = json.loads(key)
    except ValueError:
        return None
    family = FAMILIES.get(family_name) if isinstance(family_name, str) else None
    if (
        family is None
        or not isinstance(labels, list)
        or len(labels) != len(family.labels)
        or not all(isinstance(value, str) for value in labels)
    ):
        return None
    if family.kind == "counter":
        return (family_name, tuple(labels), 0, 1) if part == "" else None
    if family.kind != "histogram":
        return None
    width = len(family.buckets) + 2
    parts = {f"b{i}": i for i in range(len(family.buckets))} | {
        "count": width - 2,
        "sum": width - 1,
    }
    index = parts.get(part) if isinstance(part, str) else None
    return None if index is None else (family_name, tuple(labels), index, width)


# Label sets are bounded (they are metric labels), and the same few fields are written over and
# over: encoding each once saves a json.dumps per increment on the ingest path.
@functools.lru_cache(maxsize=16384)
def _field(family: str, labels: tuple[str, ...], part: str = "") -> str:
    return structured_key([family, list(labels), part])


@functools.lru_cache(maxsize=16384)
def _unfield(key: str) -> tuple[str, tuple[str, ...], str]:
    family, labels, part = json.loads(key)
    return family, tuple(labels), part


@dataclass
class Delta:
    """Increments to apply together; ``tenant`` fills the tenant label where labels omit it."""

    tenant: str = ""
    values: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def inc(self, family: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        fam = FAMILIES[family]
        self.values[_field(family, _label_values(fam, labels, self.tenant))] += amount

    def observe(self, family: str, labels: Mapping[str, str], value: float) -> None:
        fam = FAMILIES[family]
        values = _label_values(fam, labels, self.tenant)
        index = bisect.bisect_left(fam.buckets, value)  # le semantics: value <= bound
        self.values[_field(family, values, f"b{index}")] += 1
        self.values[_field(family, values, "sum")] += value
        self.values[_field(family, values, "count")] += 1

    def observe_many(
        self, family: str, labels: Mapping[str, str], observed: Sequence[float]
    ) -> None:
        """Observe every value with the same labels: one bucket count per bucket hit."""
        if not observed:
            return
        fam = FAMILIES[family]
        values = _label_values(fam, labels, self.tenant)
        buckets = fam.buckets
        # le semantics: a value equal to a bound goes into that bound's bucket.
        for index, hits in Counter(bisect.bisect_left(buckets, v) for v in observed).items():
            self.values[_field(family, values, f"b{index}")] += hits
        self.values[_field(family, values, "sum")] += sum(observed)
        self.values[_field(family, values, "count")] += len(observed)

    def merge(self, other: Delta) -> None:
        """Add ``other``'s increments to these."""
        for key, amount in other.values.items():
            self.values[key] += amount

    def __bool__(self) -> bool:
        return bool(self.values)


def _label_values(family: Family, labels: Mapping[str, str], tenant: str) -> tuple[str, ...]:
    values = tuple(labels.get(name, "") or "" for name in family.labels)
    if tenant and "tenant" in family.labels and not labels.get("tenant"):
        position = family.labels.index("tenant")
        values = (*values[:position], tenant, *values[position + 1 :])
    return values


@functools.lru_cache(maxsize=256)
def _positions(family: str) -> tuple[int, int, int, int] | None:
    """Where tenant, app, retriever and environment sit in a family's labels (-1: absent), or
    None for a family without both tenant and app (nothing of a tenant's to bound)."""
    labels = FAMILIES[family].labels
    if "tenant" not in labels or "app" not in labels:
        return None
    index = {name: position for position, name in enumerate(labels)}
    return (
        index["tenant"],
        index["app"],
        index.get("retriever", -1),
        index.get("environment", -1),
    )


def bounded(delta: Delta, cap: LabelSetCap) -> Delta:
    """``delta`` with the label sets past the cap exported under ``OVERFLOW`` and counted."""
    out = Delta(delta.tenant)
    for key, amount in delta.values.items():
        family, labels, part = _unfield(key)
        positions = _positions(family)
        if positions is None:
            out.values[key] += amount
            continue
        tenant_at, app_at, retriever_at, environment_at = positions
        tenant, app = labels[tenant_at], labels[app_at]
        if retriever_at >= 0 and environment_at >= 0:
            admitted = cap.admits(
                LabelSet(tenant, app, labels[retriever_at], labels[environment_at])
            )
        else:
            admitted = cap.admits_app(tenant, app)
        if admitted:
            out.values[key] += amount
            continue
        replaced = list(labels)
        for position in (app_at, retriever_at, environment_at):
            if position >= 0:
                replaced[position] = OVERFLOW
        out.values[_field(family, tuple(replaced), part)] += amount
        if family == "events_accepted":
            out.values[_field("label_sets_overflow", (tenant,))] += amount
    return out


class Aggregates:
    def __init__(self, redis: Redis, cap: LabelSetCap | None = None) -> None:
        self.redis = redis
        self.cap = cap
        self._add_once = redis.register_script(_ADD_ONCE)
        self._add_in_epoch = redis.register_script(_ADD_IN_EPOCH)
        # Parsed hash fields by their raw bytes: a scrape reads every field, and the set of fields
        # changes only when a new label set appears, so each is parsed about once.
        self._slots: dict[bytes | str, _Slot | None] = {}
        self._series_keys: dict[tuple[str, tuple[str, ...]], _SeriesKey] = {}
        self._add_all_once = redis.register_script(_ADD_ALL_ONCE)

    def add(self, delta: Delta) -> bool:
        """Apply ``delta`` if the aggregates are complete; False when a rebuild is due instead."""
        if not delta:
            return True
        delta = self._bounded(delta)
        args: list[str | float] = []
        for key, amount in delta.values.items():
            args.extend([key, amount])
        return bool(self._add_in_epoch(keys=[HASH_KEY, EPOCH_KEY], args=args))

    def add_in(self, pipe: Pipeline, delta: Delta) -> bool:
        """Queue ``add(delta)`` on ``pipe``, to share a round trip the caller makes anyway.

        The script goes by its SHA only: after a Redis restart its result in the pipeline is a
        ``NoScriptError``, and the caller calls ``add`` instead (which loads it). False when
        there was nothing to queue.
        """
        if not delta:
            return False
        delta = self._bounded(delta)
        args: list[str | float] = []
        for key, amount in delta.values.items():
            args.extend([key, amount])
        pipe.evalsha(self._add_in_epoch.sha, 2, HASH_KEY, EPOCH_KEY, *args)
        return True

    def force_add(self, delta: Delta) -> None:
        """Apply ``delta`` unconditionally (the rebuild's own totals)."""
        delta = self._bounded(delta)
        pipe = self.redis.pipeline(transaction=True)
        for key, amount in delta.values.items():
            pipe.hincrbyfloat(HASH_KEY, key, amount)
        pipe.execute()

    def _bounded(self, delta: Delta) -> Delta:
        return delta if self.cap is None else bounded(delta, self.cap)

    def has_epoch(self) -> bool:
        return bool(self.redis.exists(EPOCH_KEY))

    def start_epoch(self, started_at: float) -> bool:
        """Claim the rebuild: True for the one caller that sets the epoch."""
        return bool(self.redis.set(EPOCH_KEY, started_at, nx=True))

    def add_once(self, done_key: str, delta: Delta) -> bool:
        """Apply ``delta`` unless ``done_key`` was applied before; True when applied now."""
        delta = self._bounded(delta)
        args: list[str | float] = [DONE_TTL_SECONDS]
        for key, amount in delta.values.items():
            args.extend([key, amount])
        return bool(self._add_once(keys=[HASH_KEY, DONE_PREFIX + done_key], args=args))

    def add_many_once(
        self, deltas: Sequence[tuple[str, Delta]], extra: Delta | None = None
    ) -> list[bool]:
        """``add_once`` for many (done key, delta) pairs, plus ``extra`` applied like ``add``;
        one flag per pair, True when applied now.

        The deltas are summed here and sent once, with every marker: events of one slice share
        most of their fields, so this sends a fraction of the arguments. If some markers exist
        (a redelivered slice), nothing is applied and the sum is sent again without them.
        """
        applied = [False] * len(deltas)
        todo = list(range(len(deltas)))
        while todo:
            total = Delta()
            for index in todo:
                total.merge(deltas[index][1])
            total = self._bounded(total)
            args: list[str | float] = [DONE_TTL_SECONDS]
            for key, amount in total.values.items():
                args.extend([key, amount])
            markers = [DONE_PREFIX + deltas[index][0] for index in todo]
            counted = self._add_all_once(keys=[HASH_KEY, *markers], args=args)
            if not counted:
                for index in todo:
                    applied[index] = True
                break
            taken = {int(position) - 1 for position in counted}
            todo = [index for position, index in enumerate(todo) if position not in taken]
        if extra:
            self.add(extra)
        return applied

    def read(self) -> dict[tuple[str, tuple[str, ...], str], float]:
        raw = self.redis.hgetall(HASH_KEY)
        out: dict[tuple[str, tuple[str, ...], str], float] = {}
        for key, value in raw.items():
            family, labels, part = json.loads(key)
            out[(family, tuple(labels), part)] = float(value)
        return out

    def read_series(self) -> Series:
        """Every exported series (see ``Series``), from one HGETALL."""
        raw: dict[bytes | str, bytes | str] = self.redis.hgetall(HASH_KEY)
        slots = self._slots
        by_series: dict[_SeriesKey, list[float]] = {}
        for key, value in raw.items():
            try:
                slot = slots[key]
            except KeyError:
                slot = slots[key] = self._slot(key)
            if slot is None:
                continue
            values = by_series.get(slot.series)
            if values is None:
                values = by_series[slot.series] = [0.0] * slot.series.width
            values[slot.index] = float(value)
        if len(slots) > 2 * len(raw) + 1000:
            # Fields that left the hash (a cleared or rebuilt aggregate) would otherwise stay.
            self._slots = {key: slots[key] for key in raw if key in slots}
            self._series_keys = {(s.family, s.labels): s for s in by_series}
        out: Series = {}
        for series, values in by_series.items():
            family = out.get(series.family)
            if family is None:
                family = out[series.family] = {}
            family[series.labels] = values
        return out

    def _slot(self, key: bytes | str) -> _Slot | None:
        parsed = _parse(key)
        if parsed is None:
            return None
        family, labels, index, width = parsed
        series = self._series_keys.get((family, labels))
        if series is None:
            series = self._series_keys[(family, labels)] = _SeriesKey(family, labels, width)
        return _Slot(series, index)

    def clear(self) -> None:
        """Forget every aggregate (before a rebuild)."""
        self.redis.delete(HASH_KEY, EPOCH_KEY)
        cursor = 0
        while True:
            cursor, keys = self.redis.scan(cursor, match=DONE_PREFIX + "*", count=1000)
            if keys:
                self.redis.delete(*keys)
            if cursor == 0:
                break
