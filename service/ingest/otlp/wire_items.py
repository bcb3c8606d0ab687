"""How many fields a protobuf body holds, counted on its wire bytes before it is parsed.

The parser builds every message of a body in memory: two bytes of an empty span become about 180
bytes, so a 4 MB body of them holds over 300 MiB. The fields are counted here without building
anything, descending only into the fields the message's descriptor says are messages, and the
count stops as soon as it passes the limit, so the walk costs at most ``limit`` steps whatever the
body's size. An item is a field as it occurs on the wire (a repeated field once per element).
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
# No field of a protobuf message takes less than two bytes: a tag, then a value or a length.
_SMALLEST_FIELD = 2


class WireError(ValueError):
    """The bytes are not a protobuf message (the parser would refuse them too)."""


def wire_items_over(body: bytes, descriptor: Descriptor, limit: int) -> int | None:
    """The number of fields of ``body`` read as ``descriptor``, once it is past ``limit``;
    None when it is within it."""
    if len(body) <= limit * _SMALLEST_FIELD:
        return None  # too short to hold more
    count = 0
    stack: list[tuple[int, int, Descriptor | None]] = [(0, len(body), descriptor)]
    while stack:
        at, end, message = stack.pop()
        fields = message.fields_by_number if message is not None else {}
        while at < end:
            tag, at = _varint(body, at)
            count += 1
            if count > limit:
                return count
            wire_type = tag & 7
            if wire_type == _VARINT:
                _, at = _varint(body, at)
            elif wire_type == _FIXED64:
                at += 8
            elif wire_type == _FIXED32:
                at += 4
            elif wire_type == _LENGTH:
                size, at = _varint(body, at)
                field = fields.get(tag >> 3)
                if field is not None and field.type == FieldDescriptor.TYPE_MESSAGE:
                    stack.append((at, at + size, field.message_type))
                at += size
            else:
                raise WireError(f"wire type {wire_type} at byte {at}")
            if at > end:
                raise WireError(f"a field runs past its message's end at byte {end}")
    return None


def _varint(body: bytes, at: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if at >= len(body) or shift > 63:
            raise WireError(f"truncated or overlong varint at byte {at}")
        byte = body[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
