"""The content hash of a text: the identity of a passage text everywhere it is stored or cached."""

from __future__ import annotations

import hashlib


def text_hash(text: str) -> str:
    # surrogatepass: every str hashes, a lone surrogate included.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
