"""The admin channel's signatures, shared by the driver and the in-sandbox server.

A request carries ``X-Claw-Nonce`` (fresh each time) and ``X-Claw-Auth`` =
HMAC-SHA256(secret, ``request\\n<op>\\n<nonce>\\n<sha256(body)>``); the answer carries
``X-Claw-Signature`` = HMAC-SHA256(secret, ``response\\n<nonce>\\n<sha256(body)>``). The
nonce ties an answer to its request, so a recorded answer cannot be replayed either.
"""

from __future__ import annotations

import hashlib
import hmac


def sign_request(secret: bytes, op: str, nonce: str, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    return hmac.new(secret, f"request\n{op}\n{nonce}\n{digest}".encode(), "sha256").hexdigest()


def sign_response(secret: bytes, nonce: str, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    return hmac.new(secret, f"response\n{nonce}\n{digest}".encode(), "sha256").hexdigest()
