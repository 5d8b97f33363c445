"""PAX extended-header records (``"%d key=value\\n"``), as both ends of a tar stream read them.

The executor reads client uploads and the SDK reads downloads with their own
streaming tar readers; the record format and its bounds checks are the same on
both sides, so they live here once. Errors are ``ValueError``; each reader
wraps them in its own error type.
"""

from __future__ import annotations


def parse_pax_records(data: bytes) -> dict[str, str]:
    """Every ``key=value`` record of a PAX header's payload (trailing NULs end it)."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ValueError("bad pax record length") from None
        if length <= 0 or pos + length > len(data):
            raise ValueError("bad pax record length")
        key, sep, value = data[space + 1 : pos + length - 1].partition(b"=")
        if not sep:
            raise ValueError("pax record without '='")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records
