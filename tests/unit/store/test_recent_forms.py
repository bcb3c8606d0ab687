"""The cache of stored text forms gives what encode_body gives, and stays within its bound."""

from __future__ import annotations

import hashlib

from service.store.passage_body import RecentForms, decode_body, encode_body


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_form_is_the_texts_own_whether_kept_or_not() -> None:
    texts = ["an abstract about folding " * 20, "tiny", "another abstract " * 30]
    # Room for two of the forms (about 300 bytes each with key and overhead), not three.
    recent = RecentForms(budget_bytes=600, max_bytes=4096)
    for _ in range(2):
        for text in texts:
            form = recent.form(_digest(text), text)
            assert form == encode_body(text)
            assert decode_body(form) == text
    assert len(recent) == 2  # the oldest went first


def test_a_large_or_incompressible_text_is_not_kept() -> None:
    recent = RecentForms(max_bytes=100)
    # 20,000 astral characters: 80 kB of UTF-8 that compresses poorly, as a hostile client sends.
    big = "".join(chr(0x10000 + (i * 7919) % 50000) for i in range(20_000))
    assert recent.form(_digest(big), big) == encode_body(big)
    assert len(recent) == 0
