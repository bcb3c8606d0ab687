"""How many items a JSON body holds and how deep it nests, read from its bytes before it is decoded.

Decoding is what costs memory: three bytes of ``{},`` become a 64-byte dict, a validation error
of about a kilobyte, and a line of the answer. So the work a body may cause is bounded by its
items, not its bytes, and they are counted here on the raw bytes with ``bytes`` methods (numpy for
the depth), so a hostile body is refused before a single object of it exists.

An item is an object, an array, or a member or element after the first one in its container
(the commas). The figures are exact for valid JSON; for invalid JSON they are whatever the bytes
say, which only decides between two 4xx answers, since the decoder refuses such a body anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_KEPT = b'[]{},"'
_DROP = bytes(b for b in range(256) if b not in _KEPT)
_STEP = np.zeros(256, dtype=np.int8)  # what each structural character does to the depth
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1
_ITEM = np.zeros(256, dtype=np.int8)  # which characters start an item
_ITEM[list(b"[{,")] = 1
_QUOTE = ord('"')
# The exact figures are summed over slices of this many characters, so measuring a body holds a
# few megabytes at most, whatever its size, and builds no object per string.
_SLICE = 1 << 18


@dataclass(frozen=True)
class JsonShape:
    """At most ``items`` items nested at most ``depth`` deep: exact when either is over the
    limits ``json_shape`` was given, upper bounds (the same characters counted inside strings
    too) when both are within them."""

    items: int
    depth: int


def json_shape(body: bytes, max_items: int, max_depth: int) -> JsonShape:
    """The items and nesting depth of ``body``, exact where it matters for the limits given."""
    # One pass over the bytes, usually a short copy: the structural characters and the quotes,
    # which the exact count below needs too (a batch of events is past the depth bound).
    kept = body.translate(None, _DROP)
    opened = kept.count(b"[") + kept.count(b"{")
    items = opened + kept.count(b",")
    if items <= max_items and opened <= max_depth:
        return JsonShape(items=items, depth=opened)  # the common case: no string is looked at
    if b"\\" in body:
        # Escaped backslashes first, so that what is left of a run escapes the next character;
        # then no string holds a quote but its two ends.
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
        kept = body.translate(None, _DROP)
    return _exact(kept)


def _exact(kept: bytes) -> JsonShape:
    """Items and depth of the structural characters and quotes of a body: a character counts
    when an even number of quotes comes before it (it is outside every string)."""
    items = deepest = level = inside = 0
    view = memoryview(kept)
    for start in range(0, len(kept), _SLICE):
        codes = np.frombuffer(view[start : start + _SLICE], dtype=np.uint8)
        quotes = codes == _QUOTE
        parity = (np.cumsum(quotes, dtype=np.int32) + inside) & 1
        outside = (parity == 0) & ~quotes
        items += int(np.count_nonzero(_ITEM[codes] & outside))
        levels = np.cumsum(_STEP[codes] * outside, dtype=np.int32) + level
        deepest = max(deepest, int(levels.max()))
        level = int(levels[-1])
        inside = int(parity[-1])
    return JsonShape(items=items, depth=max(deepest, 0))
