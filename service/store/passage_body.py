"""How a passage text is kept in ``passage_texts.body``: one format byte, then the payload.

Each distinct text is compressed once, when it is first stored, and only when that saves bytes
(a short or already dense text is kept as its UTF-8). PostgreSQL compresses only values over
about 2 kB on its own and SQLite never does, while a retriever's chunks are mostly shorter: a
corpus of abstracts takes about half the space this way. Readers pay one decompression per
distinct text they read.

Migration 0006 writes the same form with its own copy of these rules (a migration must not change
when this module does); tests/integration/store/test_passage_store.py reads its output through here.
"""

from __future__ import annotations

import zlib

from service.primitives.bounded_cache import BoundedCache
from service.store.readable import readable_text

PLAIN = b"u"  # the text's UTF-8
ZLIB = b"z"  # the text's UTF-8, zlib-compressed
# zlib's default level, a balance of size and ingest time.
LEVEL = 6


def encode_body(text: str) -> bytes:
    """The stored form of a text: compressed when that is shorter, else plain."""
    raw = text.encode("utf-8")
    packed = zlib.compress(raw, LEVEL)
    return ZLIB + packed if len(packed) < len(raw) else PLAIN + raw


def decode_body(body: bytes | None) -> str:
    """The text of a stored form; None (no text stored, or released) reads as an empty text.

    Tolerant as every read is (``service.store.readable``): bytes that are not UTF-8, and NULs,
    come back as U+FFFD; a body that cannot be decompressed reads as U+FFFD too, never an error.
    """
    if not body:
        return ""
    kind, payload = body[:1], bytes(body[1:])
    if kind == ZLIB:
        try:
            payload = zlib.decompress(payload)
        except zlib.error:
            return "\ufffd"
    elif kind != PLAIN:
        # Not a form this version writes: the whole value as text, as a plain column would read.
        payload = bytes(body)
    return readable_text(payload)


class RecentForms:
    """The stored forms of recent texts, by content hash.

    A retriever's popular chunks recur across events, and ingest writes every text of a commit
    group (the database skips those it has, which only another round trip could tell in
    advance); compressing a 1.4 kB text costs about 50 us, a hit a dictionary lookup. Keyed by
    the hash, not the text, and keeping only forms up to ``max_bytes``: a passage may be 20,000
    characters, so keeping every text would let the cache grow to hundreds of MB; the cache
    (``service.primitives.bounded_cache``) holds at most ``budget_bytes``, 16 MiB by default.
    """

    def __init__(self, budget_bytes: int = 16 * 1024 * 1024, max_bytes: int = 4096) -> None:
        self.max_bytes = max_bytes
        self._forms: BoundedCache[bytes] = BoundedCache(budget_bytes)

    def form(self, digest: str, text: str) -> bytes:
        """``encode_body(text)``, where ``digest`` is the text's content hash."""
        form = self._forms.get(digest)
        if form is not None:
            return form
        form = encode_body(text)
        if len(form) <= self.max_bytes:
            self._forms.put(digest, form)
        return form

    def __len__(self) -> int:
        return len(self._forms)
