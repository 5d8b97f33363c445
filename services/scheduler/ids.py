"""Sandbox ids: ``sb-`` + 12 random lowercase letters and digits (~62 bits)."""

from __future__ import annotations

import secrets
import string

_ALPHABET = string.ascii_lowercase + string.digits


def new_sandbox_id() -> str:
    return "sb-" + "".join(secrets.choice(_ALPHABET) for _ in range(12))
