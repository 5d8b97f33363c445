"""Registry authentication: the ``WWW-Authenticate`` challenge, bearer tokens, basic credentials.

A registry answers an unauthenticated request with 401 and a challenge:

- ``Bearer realm="…",service="…",scope="…"``: the token flow of the
  distribution spec. The client asks ``realm?service=…&scope=…`` for a token
  (with basic credentials when it has some for the registry, anonymously
  otherwise) and retries with ``Authorization: Bearer <token>``;
- ``Basic realm="…"`` (htpasswd): the client retries with its basic credentials.

Credentials come, first match wins, from ``ORCHARD_REGISTRY_CREDENTIALS``
(``user:password``, for whatever registry is pulled from), then from an auth
file (``--auth-file`` or ``ORCHARD_REGISTRY_AUTH_FILE``) in the ``auths`` format
``docker login``, ``podman login`` and ``skopeo login`` write
(``{"auths": {"host:port": {"auth": base64("user:password")}}}``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import UNAUTHORIZED, PullError
from .ref import DOCKER_HUB

CREDENTIALS_ENV = "ORCHARD_REGISTRY_CREDENTIALS"
AUTH_FILE_ENV = "ORCHARD_REGISTRY_AUTH_FILE"
_PARAM_RE = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^",\s]*))\s*,?')
_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def basic_header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()


@dataclass(frozen=True)
class Challenge:
    scheme: str
    """``bearer`` or ``basic`` (lower case)."""
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge:
    """One ``WWW-Authenticate`` value; a malformed or unknown one is an UNAUTHORIZED error."""
    scheme, _, rest = header.strip().partition(" ")
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        match = _PARAM_RE.match(rest, pos)
        if match is None or match.end() == pos:
            raise PullError(UNAUTHORIZED, f"malformed WWW-Authenticate header {header!r}")
        quoted, bare = match.group(2), match.group(3)
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        params[match.group(1).lower()] = value
        pos = match.end()
    if scheme.lower() not in ("bearer", "basic"):
        raise PullError(UNAUTHORIZED, f"unsupported authentication scheme {scheme!r}")
    return Challenge(scheme.lower(), params)


def _parse_pair(text: str, where: str) -> Credentials:
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise PullError(UNAUTHORIZED, f"{where}: expected user:password")
    return Credentials(user, password)


def _from_auth_file(path: Path, registry: str) -> Credentials | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PullError(UNAUTHORIZED, f"registry auth file {path} does not exist") from None
    except (OSError, ValueError) as err:
        raise PullError(UNAUTHORIZED, f"registry auth file {path} is unreadable: {err}") from None
    auths = data.get("auths") if isinstance(data, dict) else None
    if not isinstance(auths, dict):
        raise PullError(UNAUTHORIZED, f"registry auth file {path} has no 'auths' object")
    keys = [registry, f"https://{registry}", f"http://{registry}"]
    if registry == DOCKER_HUB:
        keys += list(_HUB_KEYS)
    for key in keys:
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("auth"), str):
            try:
                decoded = base64.b64decode(entry["auth"], validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise PullError(
                    UNAUTHORIZED, f"registry auth file {path}: bad base64 for {key!r}"
                ) from None
            return _parse_pair(decoded, f"registry auth file {path}, {key!r}")
        if isinstance(entry.get("username"), str):
            return Credentials(entry["username"], str(entry.get("password", "")))
    return None


def find_credentials(registry: str, auth_file: Path | None = None) -> Credentials | None:
    """The basic credentials for ``registry`` (module docstring), or None: anonymous."""
    pair = os.environ.get(CREDENTIALS_ENV)
    if pair:
        return _parse_pair(pair, CREDENTIALS_ENV)
    path = auth_file or (Path(os.environ[AUTH_FILE_ENV]) if os.environ.get(AUTH_FILE_ENV) else None)
    return None if path is None else _from_auth_file(path, registry)
