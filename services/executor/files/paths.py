"""Lexical checks on the paths clients send, before any syscall sees them.

Client paths are sandbox paths: absolute, or relative to the sandbox's "/".
They are cleaned lexically (``.`` and empty components dropped, ``..`` popped)
so the kernel only ever sees plain names, and a ``..`` that would climb above
"/" is refused outright instead of being silently clamped: a client that sends
``../../etc/passwd`` is confused or hostile, and either way should be told.
Symlinks are then resolved by the kernel (openat2 RESOLVE_IN_ROOT), never here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from orchard.common.errors import ServiceError, invalid

from .fserrors import INVALID_FIELD, PATH_ESCAPE, escape

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255


@dataclass(frozen=True)
class SandboxPath:
    """A cleaned path: the components below the sandbox root (empty for "/")."""

    parts: tuple[str, ...]

    @property
    def display(self) -> str:
        """The path as the sandbox sees it, for messages ("/etc/passwd")."""
        return "/" + "/".join(self.parts)

    @property
    def relative(self) -> str:
        """The path relative to the root fd ("." for the root itself)."""
        return "/".join(self.parts) or "."

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else ""

    @property
    def parent(self) -> SandboxPath:
        return SandboxPath(self.parts[:-1])

    def child(self, name: str) -> SandboxPath:
        return SandboxPath((*self.parts, name))


def _check_raw(path: str, what: str) -> None:
    if not path:
        raise invalid(f"{what} is empty", INVALID_FIELD)
    if "\0" in path:
        raise invalid(f"{what} {path!r} contains a NUL byte", INVALID_FIELD)
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise invalid(f"{what} is longer than {MAX_PATH_BYTES} bytes", INVALID_FIELD)


def clean_parts(
    path: str, what: str = "path", base: tuple[str, ...] = (), shown: str = "the sandbox root"
) -> tuple[str, ...]:
    """Clean ``path`` lexically on top of ``base``; refuse climbing above ``base``'s top."""
    _check_raw(path, what)
    stack = list(base)
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                raise escape(f"{what} {path!r} climbs out of {shown}")
            stack.pop()
            continue
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise invalid(
                f"{what} {path!r} has a component longer than {MAX_NAME_BYTES} bytes",
                INVALID_FIELD,
            )
        stack.append(part)
    return tuple(stack)


def parse_sandbox_path(path: str, what: str = "path") -> SandboxPath:
    """Validate and clean a client path; raise ServiceError (INVALID_ARGUMENT) if bad."""
    return SandboxPath(clean_parts(path, what))


def parse_member_name(name: str, dest: str) -> tuple[str, ...]:
    """Clean a tar member name, relative to the upload destination.

    Absolute names and names that climb out of the destination are refused:
    an archive is data from the client and must only ever fill its destination.
    """
    if name.startswith("/"):
        raise escape(f"tar member {name!r} has an absolute path (unpacking into {dest})")
    return clean_parts(name, "tar member", shown=f"the upload destination {dest}")


def check_link_target(target: str, member: tuple[str, ...], dest: str, name: str) -> None:
    """Refuse a symlink member whose target is absolute or leaves the destination."""
    if not target:
        raise invalid(f"tar member {name!r} is a symlink with an empty target", INVALID_FIELD)
    if target.startswith("/"):
        raise escape(
            f"tar member {name!r} is a symlink to the absolute path {target!r}; only "
            f"relative symlinks inside {dest} are accepted"
        )
    try:
        clean_parts(target, "symlink target", base=member[:-1], shown=f"the destination {dest}")
    except ServiceError as err:
        if err.reason != PATH_ESCAPE:
            raise
        raise escape(
            f"tar member {name!r} is a symlink to {target!r}, which points out of {dest}"
        ) from err
