"""Hypothesis strategies for any request message, built from its proto descriptor.

Nothing here names a field: a strategy walks ``Descriptor.fields`` and draws a
value for each by its proto type, biased toward what breaks servers: empty and
huge strings, NUL and non-BMP characters, path-like and id-like text, numbers at
and past their type's limits, NaN and infinities, unknown enum values, every
oneof arm, nested messages a few levels deep. An RPC added to ``protos/`` is
fuzzed by the suite without a line changed here.

Values a typed message cannot hold (invalid UTF-8 in a string field, a varint
of 11 bytes, a length prefix past the end) are made by :func:`raw_messages`,
which writes the wire format by hand.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

FD = FieldDescriptor

HUGE_TEXT_CHARS = 1 << 20  # 1 Mi characters: far past any sane id or path, under the 4 MiB default

_TRICKY_TEXT = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "../../../../etc/passwd",
        "/proc/self/root/etc/shadow",
        "sb-\x00",
        "sb-" + "a" * 200,
        "%2e%2e/%2e%2e",
        "\u202e\ufeff\U0001f600",
        "a\nb\rc",
        "${HOME}$(id)`id`;id|id",
        "-1",
        "NaN",
    ]
)
_TEXT = st.one_of(
    st.text(max_size=40),
    _TRICKY_TEXT,
    st.builds(
        lambda n, c: c * n, st.integers(1 << 12, HUGE_TEXT_CHARS), st.sampled_from("a/\x00é")
    ),
)
_BYTES = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda n: b"\xff" * n, st.integers(1 << 12, 1 << 20)),
)

_INT_LIMITS: dict[int, tuple[int, int]] = {
    FD.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FD.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FD.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    FD.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FD.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    FD.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FD.TYPE_UINT32: (0, (1 << 32) - 1),
    FD.TYPE_FIXED32: (0, (1 << 32) - 1),
    FD.TYPE_UINT64: (0, (1 << 64) - 1),
    FD.TYPE_FIXED64: (0, (1 << 64) - 1),
}


def _integers(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in (lo, lo + 1, -1, 0, 1, hi - 1, hi) if lo <= v <= hi]
    return st.one_of(
        st.sampled_from(edges),
        st.integers(lo, hi),
        st.integers(-1000, 1000).filter(lambda v: lo <= v <= hi),
    )


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FD.TYPE_STRING:
        return _TEXT
    if kind == FD.TYPE_BYTES:
        return _BYTES
    if kind == FD.TYPE_BOOL:
        return st.booleans()
    if kind in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        special = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, -1e-308, -1.0])
        width = 32 if kind == FD.TYPE_FLOAT else 64
        return st.one_of(special, st.floats(width=width, allow_nan=True))
    if kind == FD.TYPE_ENUM:
        # proto3 enums are open: any int32 is a legal wire value, most are unknown.
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), _integers(-(1 << 31), (1 << 31) - 1))
    lo, hi = _INT_LIMITS[kind]
    return _integers(lo, hi)


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FD.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    return _scalar(field)


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FD.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


@st.composite
def _message(draw: st.DrawFn, descriptor: Descriptor, depth: int) -> Message:
    message = GetMessageClass(descriptor)()
    if depth > 3:
        return message
    chosen_oneof_fields = set()
    for oneof in descriptor.oneofs:
        if oneof.fields:
            chosen_oneof_fields.add(draw(st.sampled_from(list(oneof.fields))).name)
    for field in descriptor.fields:
        if field.containing_oneof is not None and field.name not in chosen_oneof_fields:
            continue
        if field.containing_oneof is None and not draw(st.booleans()):
            continue  # leave it unset: absent and default fields matter as much as set ones
        target = getattr(message, field.name) if field.is_repeated else None
        if _is_map(field):
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            entries = draw(
                st.dictionaries(_scalar(key_field), _value(value_field, depth), max_size=4)
            )
            for key, value in entries.items():
                if value_field.type == FD.TYPE_MESSAGE:
                    target[key].CopyFrom(value)  # type: ignore[index]
                else:
                    target[key] = value  # type: ignore[index]
        elif field.is_repeated:
            items = draw(st.lists(_value(field, depth), max_size=4))
            if field.type == FD.TYPE_MESSAGE:
                for item in items:
                    target.add().CopyFrom(item)  # type: ignore[union-attr]
            else:
                target.extend(items)  # type: ignore[union-attr]
        elif field.type == FD.TYPE_MESSAGE:
            getattr(message, field.name).CopyFrom(draw(messages(field.message_type, depth + 1)))
        else:
            setattr(message, field.name, draw(_scalar(field)))
    return message


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Random instances of the message type ``descriptor`` (see the module doc)."""
    return _message(descriptor, depth)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


@st.composite
def _broken_field(draw: st.DrawFn, descriptor: Descriptor) -> bytes:
    """One field of ``descriptor`` written wrongly on the wire."""
    numbers = [f.number for f in descriptor.fields] or [1]
    number = draw(st.sampled_from([*numbers, draw(st.integers(1, (1 << 29) - 1))]))
    how = draw(
        st.sampled_from(["bad-utf8", "long-varint", "length-past-end", "wrong-wire-type", "group"])
    )
    if how == "bad-utf8":
        junk = draw(st.sampled_from([b"\xff\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"a\x80"]))
        return _key(number, 2) + _varint(len(junk)) + junk
    if how == "long-varint":
        return _key(number, 0) + b"\xff" * 10 + b"\x01"
    if how == "length-past-end":
        return _key(number, 2) + _varint(draw(st.integers(1, 1 << 30))) + b"x"
    if how == "wrong-wire-type":
        return _key(number, draw(st.sampled_from([1, 5]))) + b"\x00"  # fixed64/32 cut short
    return _key(number, 3)  # a start-group with no end


@st.composite
def raw_messages(draw: st.DrawFn, descriptor: Descriptor, others: list[Descriptor]) -> bytes:
    """Bytes claiming to be a ``descriptor`` message: random, truncated, broken or another type."""
    kind = draw(st.sampled_from(["random", "truncated", "broken", "confused"]))
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=256))
    if kind == "broken":
        valid = draw(messages(descriptor, 3)).SerializeToString()
        return valid + draw(_broken_field(descriptor))
    if kind == "confused":
        other = draw(st.sampled_from(others))
        return draw(messages(other, 1)).SerializeToString()
    valid = draw(messages(descriptor, 1)).SerializeToString()
    if len(valid) < 2:
        return _key(1, 2) + b"\x05ab"  # a length-delimited field cut short
    return valid[: draw(st.integers(1, len(valid) - 1))]
