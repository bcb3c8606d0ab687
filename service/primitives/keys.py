"""Every key built from more than one string: Redis keys, cache keys, hash inputs, identities.

A key joined with a separator its parts may contain is not injective: ``("a:b", "c")`` and
``("a", "b:c")`` give one key, so a client can make two things count as one (a label set as
another already admitted, a budget as another tenant's). Every composite key of the project is
built here, injective by construction:

- ``composite_key``: each part percent-encoded (every byte but ASCII letters, digits and
  ``_.-~`` becomes ``%XX``, ``:`` and ``%`` included), the parts joined by ``:``. No encoded part
  holds a ``:``, so splitting at ``:`` gives back exactly the parts, and decoding each gives back
  its text. Plain names (``gpt-4o-mini``, ``v3``, ``42``) read as themselves.
- ``redis_key``: a constant namespace of the code, then ``:``, then the composite key.
- ``structured_key``: canonical JSON (sorted object keys, no spaces, ASCII only) of nested lists
  and objects, for identities with structure; JSON text decodes back to its value.
- ``digest_key``: SHA-256 hex digests concatenated; every one is checked to be 64 lowercase hex
  characters, so the widths alone split them back.

Lone surrogates are encoded as their UTF-8 bytes (surrogatepass), so every ``str`` has a key.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote, unquote_to_bytes

SEPARATOR = ":"
_DIGEST = re.compile(r"[0-9a-f]{64}")
# The structures ``structured_key`` takes: what JSON writes back as the same value.
Structure = (
    str | int | bool | None | list["Structure"] | tuple["Structure", ...] | dict[str, "Structure"]
)


# What percent-encoding leaves as it is; such a part (a digest, a number, most names) is its own
# encoding, and skipping the encoder keeps keys built on every ingested passage cheap.
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]*")


def _encoded(part: str) -> str:
    # Letters and digits alone (every hex digest) are told without the regex.
    if (part.isalnum() and part.isascii()) or _UNRESERVED.fullmatch(part):
        return part
    return quote(part.encode("utf-8", "surrogatepass"), safe="")


def composite_key(*parts: str) -> str:
    """The parts, percent-encoded and joined by ``:``; at least one part."""
    if not parts:
        # With no part the key would be "", as with one empty part.
        raise ValueError("a composite key needs at least one part")
    return SEPARATOR.join(map(_encoded, parts))


def composite_parts(key: str) -> tuple[str, ...]:
    """The parts ``composite_key`` was given: its exact inverse."""
    return tuple(
        unquote_to_bytes(piece).decode("utf-8", "surrogatepass") for piece in key.split(SEPARATOR)
    )


def redis_key(namespace: str, *parts: str) -> str:
    """``<namespace>:<composite key of the parts>``; the namespace is a constant of the code."""
    return namespace + SEPARATOR + composite_key(*parts)


def structured_key(value: Structure) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest_key(*digests: str) -> str:
    """SHA-256 hex digests in the given order, concatenated; refuses anything else."""
    for digest in digests:
        if not _DIGEST.fullmatch(digest):
            raise ValueError(f"not a SHA-256 hex digest: {digest[:80]!r}")
    return "".join(digests)
