"""The one in-process cache of the package: least recently used entries go first, under a budget
in bytes, and keys are short (a content hash, a key digest), never a client's text.

A cache keyed by whole texts, or bounded by a count of entries, holds whatever the largest texts
clients send weigh: 4,096 entries of 20,000 astral characters are 300 MiB. Here a key longer than
``MAX_KEY_BYTES`` is refused outright, and every entry is charged its key, its value (by
``sys.getsizeof`` or a size function the owner gives) and a fixed overhead, so a process holds at
most ``max_bytes`` per cache whatever the traffic. tests/unit/primitives/test_cache_inventory.py
finds every other cache in the source and fails on one not listed with why it is bounded.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

Value = TypeVar("Value")

# A SHA-256 hex digest with a short prefix or suffix is about 120 bytes as a str; 512 leaves room
# for a few such parts and nothing like a passage.
MAX_KEY_BYTES = 512
# What an OrderedDict node and the bookkeeping cost per entry beyond the key and the value.
ENTRY_OVERHEAD_BYTES = 120


class KeyTooLargeError(ValueError):
    """A key that is not a fixed-size digest: a cache must never be keyed by client text."""


class BoundedCache(Generic[Value]):
    """Values by short key, least recently used dropped first, at most ``max_bytes`` held.

    Thread-safe: ingest's commit writers and request handlers share caches. A value larger than
    the whole budget is not kept (``put`` returns False).
    """

    def __init__(
        self,
        max_bytes: int,
        *,
        size_of: Callable[[Value], int] = sys.getsizeof,
    ) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._entries: OrderedDict[str, tuple[Value, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> Value | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: str, value: Value) -> bool:
        """Keep ``value`` under ``key``, dropping the least recently used past the budget."""
        key_bytes = sys.getsizeof(key)
        if key_bytes > MAX_KEY_BYTES:
            raise KeyTooLargeError(f"cache key of {key_bytes} bytes; key by a digest instead")
        cost = key_bytes + self._size_of(value) + ENTRY_OVERHEAD_BYTES
        if cost > self.max_bytes:
            return False
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self._held -= previous[1]
            self._entries[key] = (value, cost)
            self._held += cost
            while self._held > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._held -= dropped
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0

    @property
    def bytes_held(self) -> int:
        """What the entries are charged now, always at most ``max_bytes``."""
        return self._held

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries
