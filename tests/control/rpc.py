"""Reading a grpc.RpcError in tests (the grpc-stubs types hide code/details/trailers)."""

from __future__ import annotations

from typing import Any

import grpc


def code(err: grpc.RpcError) -> grpc.StatusCode:
    value: grpc.StatusCode = getattr(err, "code")()  # noqa: B009
    return value


def details(err: grpc.RpcError) -> str:
    return str(getattr(err, "details")() or "")  # noqa: B009


def trailers(err: grpc.RpcError) -> dict[str, str]:
    md: Any = getattr(err, "trailing_metadata")() or ()  # noqa: B009
    return {str(k): str(v) for k, v in md}
