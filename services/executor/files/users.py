"""User lookup in a sandbox's own /etc/passwd and /etc/group.

Exec needs a numeric uid, gid and home for ``ExecStart.user``; the answer
must come from the sandbox's files, not the host's, and the sandbox controls
those files (they may be symlinks, fifos, huge). So they are read through the
confined opener (in-root, regular files only) and capped in size.
"""

from __future__ import annotations

from pathlib import Path

from orchard.common.errors import ServiceError, invalid, not_found, precondition

from .confined import ConfinedRoot
from .fserrors import INVALID_FIELD, PATH_NOT_FOUND, USER_NOT_FOUND
from .paths import SandboxPath

MAX_DB_BYTES = 4 << 20
MAX_ID = 2**32 - 2  # (uid_t)-1 means "unchanged" to setuid
_PASSWD = SandboxPath(("etc", "passwd"))
_GROUP = SandboxPath(("etc", "group"))


def _read_db(confined: ConfinedRoot, path: SandboxPath) -> list[list[str]]:
    """The colon-separated records of a passwd-style file; [] if it is missing."""
    try:
        fd, _ = confined.open_regular(path)
    except ServiceError as err:
        if err.reason == PATH_NOT_FOUND:
            return []
        raise
    with open(fd, "rb") as f:
        data = f.read(MAX_DB_BYTES)
    text = data.decode("utf-8", "replace")
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _parse_id(text: str, what: str) -> int:
    if not _is_number(text):
        raise precondition(f"the sandbox's user database has a bad {what}: {text!r}", INVALID_FIELD)
    value = int(text)
    if not 0 <= value <= MAX_ID:
        raise invalid(f"{what} {text} is out of range", INVALID_FIELD)
    return value


def lookup_user(root: Path, user: str) -> tuple[int, int, str]:
    """Resolve ``user`` ("name", "uid", "name:group", "uid:gid"; "" = root) to (uid, gid, home).

    A numeric uid without a passwd entry is accepted (gid 0, home "/", like
    Docker); an unknown name is NOT_FOUND / USER_NOT_FOUND. Blocking (reads two
    small files): call it from a worker thread when on the event loop.
    """
    spec = user.strip() or "root"
    user_part, has_group, group_part = spec.partition(":")
    if not user_part or (has_group and not group_part):
        raise invalid(f"user {user!r} is not 'name', 'uid' or 'user:group'", INVALID_FIELD)
    with ConfinedRoot.open(root) as confined:
        passwd = _read_db(confined, _PASSWD)
        groups = _read_db(confined, _GROUP) if has_group and not _is_number(group_part) else []

    entry: list[str] | None = None
    if _is_number(user_part):
        uid = _parse_id(user_part, "uid")
        entry = next((e for e in passwd if len(e) >= 6 and e[2] == str(uid)), None)
        gid, home = 0, "/"
        if entry is not None:
            gid, home = _parse_id(entry[3], "gid"), entry[5] or "/"
        elif uid == 0:
            home = "/root"
    else:
        entry = next((e for e in passwd if len(e) >= 6 and e[0] == user_part), None)
        if entry is None:
            if user_part == "root":
                return 0, _group_id(groups, group_part) if has_group else 0, "/root"
            raise not_found(f"user {user_part!r} does not exist in the sandbox", USER_NOT_FOUND)
        uid, gid, home = _parse_id(entry[2], "uid"), _parse_id(entry[3], "gid"), entry[5] or "/"

    if has_group:
        gid = _group_id(groups, group_part)
    return uid, gid, home


def _group_id(groups: list[list[str]], group: str) -> int:
    if _is_number(group):
        return _parse_id(group, "gid")
    entry = next((e for e in groups if len(e) >= 3 and e[0] == group), None)
    if entry is None:
        raise not_found(f"group {group!r} does not exist in the sandbox", USER_NOT_FOUND)
    return _parse_id(entry[2], "gid")
