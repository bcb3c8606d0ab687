"""The stored form of a passage text: compressed only when shorter, read back identical, and
read tolerantly whatever the bytes (U+FFFD, never an error)."""

from __future__ import annotations

import zlib

import pytest

from service.store.passage_body import PLAIN, ZLIB, decode_body, encode_body

PROSE = " ".join(f"sentence {i} of an abstract about protein folding." for i in range(12))


@pytest.mark.parametrize(
    "text", [PROSE, PROSE.upper() + " ünïcode ✓ 蛋白质 🧬", "tiny", "ü✓ 🧬", "tab\there \\ '"]
)
def test_a_text_reads_back_identical(text: str) -> None:
    body = encode_body(text)
    assert decode_body(body) == text
    assert len(body) <= len(text.encode("utf-8")) + 1


def test_only_a_text_that_gets_shorter_is_compressed() -> None:
    assert encode_body(PROSE)[:1] == ZLIB
    assert encode_body("tiny") == PLAIN + b"tiny"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (None, ""),
        (b"", ""),
        (PLAIN + b"old \x00 value \xed\xa0\x80", "old \ufffd value \ufffd\ufffd\ufffd"),
        (ZLIB + zlib.compress(b"bad \xff byte"), "bad \ufffd byte"),
        (ZLIB + b"not zlib", "\ufffd"),
        (b"an unknown form", "an unknown form"),
    ],
)
def test_any_body_reads_as_text(body: bytes | None, expected: str) -> None:
    assert decode_body(body) == expected
