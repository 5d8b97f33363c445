"""Sessions: one per rollout, a credential scoped to it, kept on disk.

A session's credential is ``<session id>.<secret>`` (256 random bits); only the secret's
sha256 is stored, and it is compared in constant time. The harness is given it inside its
base URL (``<public>/s/<credential>/v1``), so a harness that knows nothing of Orchard still
carries it on every call, and a harness's own ``Authorization`` header (some send a dummy
key) is never what admits it. Only the tenant that created a session may read, finish or
export it.

Layout under ``<home>/modelproxy/sessions/<id>/``: ``session.json`` (rewritten atomically) and
``calls.jsonl`` (``recording.CallLog``). A restart reloads every session from there.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import ProxyError, bad_request
from .recording import CallLog

SESSION_ID_RE = re.compile(r"^ses_[0-9a-f]{24}$")
FAULTS = ("", "task", "infrastructure", "client")
"""A rollout's fault: none, the task's (scores), the infrastructure's or the client's (mask)."""
MAX_METADATA_BYTES = 16 * 1024


@dataclass
class SessionInfo:
    id: str
    tenant: str
    secret_sha256: str
    model_version: str = ""
    """The policy/model version the rollout samples from (recorded on every call)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    finished_at: float = 0.0
    reward: float | None = None
    fault: str = ""
    fault_message: str = ""

    @property
    def finished(self) -> bool:
        return self.finished_at > 0

    def public(self) -> dict[str, Any]:
        view = asdict(self)
        view.pop("secret_sha256")
        return view


class Session:
    def __init__(self, info: SessionInfo, folder: Path, log: CallLog) -> None:
        self.info = info
        self.folder = folder
        self.calls = log

    def save(self) -> None:
        tmp = self.folder / ".session.json.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(self.info), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.folder / "session.json")


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class SessionStore:
    def __init__(
        self, root: Path, max_calls: int, max_bytes: int, max_open_per_tenant: int
    ) -> None:
        self.root = root
        self._max_calls, self._max_bytes = max_calls, max_bytes
        self._max_open = max_open_per_tenant
        self._sessions: dict[str, Session] = {}
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for folder in sorted(root.iterdir()):
            if SESSION_ID_RE.fullmatch(folder.name) and (folder / "session.json").exists():
                info = SessionInfo(**json.loads((folder / "session.json").read_text()))
                log = CallLog.load(
                    folder / "calls.jsonl", max_calls, max_bytes, lazily=info.finished_at > 0
                )
                self._sessions[info.id] = Session(info, folder, log)

    def create(
        self, tenant: str, model_version: str, metadata: dict[str, Any]
    ) -> tuple[Session, str]:
        """A new session of ``tenant`` and its credential (returned only here)."""
        if len(json.dumps(metadata)) > MAX_METADATA_BYTES:
            raise bad_request(f"metadata: at most {MAX_METADATA_BYTES} bytes of JSON")
        if len(model_version) > 256:
            raise bad_request("model_version: at most 256 characters")
        open_count = sum(
            1 for s in self._sessions.values() if s.info.tenant == tenant and not s.info.finished
        )
        if open_count >= self._max_open:
            raise ProxyError(429, "TOO_MANY_SESSIONS", f"tenant has {open_count} open sessions")
        session_id = "ses_" + secrets.token_hex(12)
        secret = secrets.token_urlsafe(32)
        info = SessionInfo(
            id=session_id, tenant=tenant, secret_sha256=_digest(secret),
            model_version=model_version, metadata=metadata, created_at=time.time(),
        )  # fmt: skip
        folder = self.root / session_id
        folder.mkdir(mode=0o700)
        session = Session(
            info, folder, CallLog(folder / "calls.jsonl", self._max_calls, self._max_bytes)
        )
        session.save()
        self._sessions[session_id] = session
        return session, f"{session_id}.{secret}"

    def all(self) -> list[Session]:
        return list(self._sessions.values())

    def by_credential(self, credential: str) -> Session:
        """The session ``credential`` opens; 401 for anything else (same answer whatever is wrong,
        so a caller learns nothing about which sessions exist)."""
        session_id, _, secret = credential.partition(".")
        session = self._sessions.get(session_id) if SESSION_ID_RE.fullmatch(session_id) else None
        if session is None or not hmac.compare_digest(_digest(secret), session.info.secret_sha256):
            raise ProxyError(401, "SESSION_INVALID", "unknown or invalid session credential")
        return session

    def of_tenant(self, tenant: str, session_id: str) -> Session:
        """``session_id`` if ``tenant`` owns it: 403 otherwise, the same answer for another
        tenant's session and for none at all (existence is not told)."""
        session = self._sessions.get(session_id)
        if session is None or session.info.tenant != tenant:
            raise ProxyError(403, "SESSION_FORBIDDEN", f"no session {session_id[:40]!r} of yours")
        return session

    def finish(
        self, session: Session, reward: float | None, fault: str, fault_message: str
    ) -> None:
        if fault not in FAULTS:
            raise bad_request(f"fault: expected one of {', '.join(repr(f) for f in FAULTS)}")
        if reward is not None and not isinstance(reward, int | float):
            raise bad_request("reward: expected a number or null")
        session.calls.sync()
        session.calls.close()  # a finished session takes no more calls: its fd goes,
        session.calls.release()  # and its records leave memory (read again when asked for)
        session.info.reward = None if reward is None else float(reward)
        session.info.fault, session.info.fault_message = fault, fault_message[:4096]
        session.info.finished_at = session.info.finished_at or time.time()
        session.save()
