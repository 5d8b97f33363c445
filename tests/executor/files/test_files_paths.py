"""Lexical path checks: what is refused before any syscall, and what cleaning yields."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from orchard.executor.files.paths import (
    check_link_target,
    parse_member_name,
    parse_sandbox_path,
)

from orchard._proto.orchard.v1 import common_pb2
from orchard.common.errors import ServiceError


@pytest.mark.parametrize(
    ("raw", "parts"),
    [
        ("/", ()),
        (".", ()),
        ("/etc/passwd", ("etc", "passwd")),
        ("etc/passwd", ("etc", "passwd")),
        ("//etc///./passwd/", ("etc", "passwd")),
        ("/a/b/../c", ("a", "c")),
        ("a/..", ()),
    ],
)
def test_clean_paths(raw: str, parts: tuple[str, ...]) -> None:
    assert parse_sandbox_path(raw).parts == parts


@pytest.mark.parametrize("raw", ["..", "../../etc/passwd", "/..", "/a/../../b", "a/b/../../../c"])
def test_climbing_above_root_is_path_escape(raw: str) -> None:
    with pytest.raises(ServiceError) as info:
        parse_sandbox_path(raw)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.reason == "PATH_ESCAPE"
    assert "climbs out of the sandbox root" in info.value.message
    assert repr(raw) in info.value.message


@pytest.mark.parametrize("raw", ["", "a\0b", "/" + "x" * 4096, "/a/" + "n" * 256, "/" + "é" * 128])
def test_malformed_paths_are_invalid(raw: str) -> None:
    with pytest.raises(ServiceError) as info:
        parse_sandbox_path(raw)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.reason == "INVALID_FIELD"


def test_component_of_255_bytes_is_fine() -> None:
    assert parse_sandbox_path("/" + "n" * 255).parts == ("n" * 255,)


@pytest.mark.parametrize("name", ["/abs", "../x", "a/../../x", "./../x"])
def test_member_names_must_stay_in_destination(name: str) -> None:
    with pytest.raises(ServiceError) as info:
        parse_member_name(name, "/dest")
    assert info.value.reason == "PATH_ESCAPE"


@pytest.mark.parametrize(
    ("member", "target", "ok"),
    [
        (("a", "l"), "b", True),
        (("a", "l"), "../b", True),
        (("a", "l"), "../../b", False),
        (("l",), "..", False),
        (("l",), "/etc/passwd", False),
        (("a", "b", "l"), "../../c/../d", True),
    ],
)
def test_symlink_targets(member: tuple[str, ...], target: str, ok: bool) -> None:
    if ok:
        check_link_target(target, member, "/dest", "/".join(member))
    else:
        with pytest.raises(ServiceError) as info:
            check_link_target(target, member, "/dest", "/".join(member))
        assert info.value.reason == "PATH_ESCAPE"


def test_every_reason_used_is_an_error_reason_name() -> None:
    from orchard.executor.files import fserrors

    names = set(common_pb2.ErrorReason.keys())
    used = {v for k, v in vars(fserrors).items() if k.isupper() and isinstance(v, str)}
    assert used <= names, used - names


_segments = st.sampled_from(["..", ".", "", "a", "b", "etc", "é", "x" * 40])


@given(st.lists(_segments, max_size=12), st.booleans())
def test_cleaned_paths_never_climb(segments: list[str], absolute: bool) -> None:
    raw = ("/" if absolute else "") + "/".join(segments)
    try:
        parts = parse_sandbox_path(raw).parts
    except ServiceError as err:
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        return
    assert all(p not in ("", ".", "..") and "/" not in p for p in parts)
    depth = 0
    for seg in segments:  # a lexical walk that never went below 0 must match
        depth = depth - 1 if seg == ".." else depth + (seg not in ("", "."))
        assert depth >= 0
    assert len(parts) == depth


@given(st.text(max_size=300))
def test_arbitrary_text_is_either_refused_or_clean(raw: str) -> None:
    try:
        parts = parse_sandbox_path(raw).parts
    except ServiceError as err:
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT
        assert err.reason in ("PATH_ESCAPE", "INVALID_FIELD")
        return
    assert all(p not in ("", ".", "..") and "/" not in p and "\0" not in p for p in parts)
