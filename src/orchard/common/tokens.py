"""Per-sandbox data-plane tokens: signed, scoped to one sandbox, expiring, revocable.

A token is ``v3.<kid>.<sandbox_id>.<tenant>.<max_execs>.<issued>.<expiry>.<signature>``
where ``<tenant>`` is the owning tenant's name in unpadded url-safe base64 (a
tenant name may hold dots), ``<max_execs>`` the tenant's concurrent-exec quota
(0 = unlimited), ``<issued>`` unix milliseconds, ``<expiry>`` unix seconds, and the signature
HMAC-SHA256 over everything before it with **the sandbox's own key**:
``HMAC(node key <kid>, "orchard-sandbox-token\\0" + sandbox_id)``.

Why each part:

- **Per-sandbox keys.** A sandbox that runs its own executor (the injected
  runtime, a Kubernetes pod) holds a key to verify its tokens; it is given only
  its own derived key, so a key leaked from one sandbox cannot mint tokens for
  another (the node key never enters a sandbox).
- **Key ids.** The node keeps a keyring (``secrets/token-keys.json``): tokens
  name the key that signed them, so rotating (``orchard token-key rotate``)
  signs new tokens with a new key while tokens of the old one stay valid until
  they expire, instead of invalidating every token at once.
- **Revocation.** ``<home>/revocations.json`` says, per tenant, "tokens issued
  before T are void" (written when a tenant is revoked or its key rotated);
  verifiers re-read it when it changes (at most once per
  :data:`REVOCATION_CHECK_SECONDS`), so a revoked tenant's tokens stop working
  within about a second on the node executor. An executor with no such file (a
  Kubernetes pod's, a local injected or runsc sandbox's) is told instead: the
  scheduler pushes a **revocation notice**
  (``r1.<kid>.<sandbox_id>.<tenant>.<before_ms>.<signature>``, signed like a
  token with the sandbox's own key, so only the holder of that key can make one:
  the scheduler, or the sandbox voiding its own tokens) to each of the tenant's
  sandboxes (:meth:`TokenSigner.sign_revocation`, :meth:`TokenVerifier.verify_revocation`).
- **Dropping a key** (``orchard token-key rotate --drop KID``) removes it from the
  keyring and records when (``dropped`` in the file): the node executor and the
  gateway refuse its tokens at their next keyring check (about a second). An
  executor that got its keys at creation is told instead: the scheduler pushes a
  **key-drop notice** (``d1.<kid>.<sandbox_id>.<dropped kid>.<signature>``, signed
  with the sandbox's own key of a key id that is still live, never with the
  dropped one), and that executor forgets the dropped key
  (:meth:`TokenSigner.sign_key_drop`, :meth:`TokenVerifier.verify_key_drop`).
  Notices only ever remove keys.
- **Tenant and exec quota in the token**: the executor is the only place that
  sees execs and must enforce the tenant's concurrent-exec quota without a call
  back to the control plane; the signature makes both claims unforgeable.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

_VERSION = "v3"
_REVOCATION_VERSION = "r1"
KEY_DROP_VERSION = "d1"
"""The prefix of a key-drop notice (the same ``ExecutorService.Revoke`` carries both)."""
MAX_KID_CHARS = 32
MAX_NOTICE_SKEW_SECONDS = 300
"""A revocation notice may not be dated further ahead than this (a clock skew bound)."""
KEY_BYTES = 32
LEGACY_KID = "k0"
"""The key id of a node key made before keyrings (``secrets/token.key``)."""
REVOCATION_CHECK_SECONDS = 0.5
KEYRING_CHECK_SECONDS = 1.0


class TokenError(Exception):
    """The token is malformed, forged, expired, revoked or for another sandbox."""


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def load_or_create_key(path: Path) -> bytes:
    """Read a raw key file, making it (0600, atomically, first writer wins) if missing."""
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
        try:
            os.link(tmp, path)  # first writer wins; never overwrite a key in use
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        key = path.read_bytes()
    if len(key) < KEY_BYTES:
        raise TokenError(f"token key {path} is shorter than {KEY_BYTES} bytes")
    return key


def _kid_time(kid: str) -> float:
    """When key ``kid`` was made (``k<ns>``); the legacy key ``k0`` counts as always."""
    digits = kid[1:]
    return int(digits) / 1e9 if digits.isdigit() else 0.0


def derive_sandbox_key(node_key: bytes, sandbox_id: str) -> bytes:
    """The key that signs and verifies ``sandbox_id``'s tokens."""
    return hmac.new(node_key, b"orchard-sandbox-token\0" + sandbox_id.encode(), "sha256").digest()


@dataclass(frozen=True)
class Keyring:
    """Key ids -> node keys, and which one signs new tokens."""

    keys: Mapping[str, bytes]
    current: str
    dropped: Mapping[str, float] = field(default_factory=dict)
    """Key id -> when it was dropped (unix seconds): what executors that got their keys at
    creation must be told (``scheduler/key_drops.py``), also after a scheduler restart."""

    def to_json(self) -> bytes:
        body: dict[str, object] = {
            "current": self.current,
            "keys": {k: v.hex() for k, v in self.keys.items()},
        }
        if self.dropped:
            body["dropped"] = dict(self.dropped)
        return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()

    def ring(self, force: bool = False) -> Keyring:
        """Itself (a keyring held in memory; :class:`KeyringFile` re-reads its file)."""
        return self

    def kid_for(self, created: float | None) -> str:
        """The key that signs tokens of a sandbox created at ``created`` (unix seconds): the
        newest key made before it, so a sandbox whose executor got its keys at creation
        (the injected runtime) can verify them; the current key when ``created`` is None."""
        if created is None:
            return self.current
        made_before = [k for k in self.keys if _kid_time(k) <= created]
        if not made_before:
            return min(self.keys, key=_kid_time)
        return max(made_before, key=_kid_time)

    def live_kid_held(self, created: float, besides: str = "") -> str | None:
        """A live key id (not ``besides``) a sandbox created at ``created`` holds (it got
        every key of the ring at its creation): the newest made before it; None if every
        such key is dropped."""
        made_before = [k for k in self.keys if _kid_time(k) <= created and k != besides]
        return max(made_before, key=_kid_time) if made_before else None

    @classmethod
    def single(cls, key: bytes, kid: str = LEGACY_KID) -> Keyring:
        if len(key) < KEY_BYTES:
            raise TokenError(f"a token key must be at least {KEY_BYTES} bytes")
        return cls({kid: key}, kid)

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Keyring:
        try:
            body = json.loads(data)
            keys = {str(k): bytes.fromhex(v) for k, v in dict(body["keys"]).items()}
            current = str(body["current"])
            dropped = {str(k): float(v) for k, v in dict(body.get("dropped", {})).items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TokenError(f"token keyring {where} is not valid: {exc}") from None
        if current not in keys or any(len(k) < KEY_BYTES for k in keys.values()):
            raise TokenError(f"token keyring {where}: no current key, or a key under 32 bytes")
        return cls(keys, current, {k: v for k, v in dropped.items() if k not in keys})


class KeyringFile:
    """The node's keyring on disk (``secrets/token-keys.json``), re-read when it changes.

    A node made before keyrings has ``secrets/token.key``: it becomes key ``k0``
    of the new keyring, so tokens already issued stay valid.
    """

    def __init__(self, path: Path, legacy_key: Path | None = None) -> None:
        self.path = path
        self.legacy_key = legacy_key
        self._mtime_ns = -2
        self._checked = 0.0
        self._ring = self._load_or_create()

    def _load_or_create(self) -> Keyring:
        try:
            data = self.path.read_bytes()
            self._mtime_ns = self.path.stat().st_mtime_ns
            return Keyring.from_json(data, str(self.path))
        except FileNotFoundError:
            pass
        if self.legacy_key is not None and self.legacy_key.exists():
            ring = Keyring({LEGACY_KID: load_or_create_key(self.legacy_key)}, LEGACY_KID)
            if not os.access(self.path.parent, os.W_OK):
                # A read-only secrets folder holding one key (the Helm chart's Secret):
                # that key is the keyring; it is rotated by replacing the Secret.
                self._mtime_ns = -1
                return ring
        else:
            kid = f"k{time.time_ns()}"
            ring = Keyring({kid: secrets.token_bytes(KEY_BYTES)}, kid)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(ring.to_json())
        try:
            os.link(tmp, self.path)  # first writer wins: every process uses one keyring
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return self._load_or_create()

    def ring(self, force: bool = False) -> Keyring:
        """The keyring, re-read if the file changed (checked at most once a second)."""
        now = time.monotonic()
        if force or now - self._checked >= KEYRING_CHECK_SECONDS:
            self._checked = now
            try:
                mtime = self.path.stat().st_mtime_ns
            except FileNotFoundError:
                return self._ring
            if mtime != self._mtime_ns:
                self._ring = Keyring.from_json(self.path.read_bytes(), str(self.path))
                self._mtime_ns = mtime
        return self._ring

    def rotate(self, drop: tuple[str, ...] = ()) -> str:
        """Add a new current key (tokens of the old ones stay valid) and drop the key ids in
        ``drop`` (their tokens stop working; the moment is kept under ``dropped`` so the
        scheduler can tell the executors holding them). Returns the new key id."""
        ring = self.ring(force=True)
        unknown = [kid for kid in drop if kid not in ring.keys]
        if unknown:
            raise TokenError(f"no such token key: {', '.join(unknown)}")
        kid = f"k{time.time_ns()}"
        keys = {k: v for k, v in ring.keys.items() if k not in drop}
        keys[kid] = secrets.token_bytes(KEY_BYTES)
        now = time.time()
        dropped = {**ring.dropped, **{k: now for k in drop}}
        _write_private(self.path, Keyring(keys, kid, dropped).to_json())
        return self.ring(force=True).current


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a verified token says."""

    sandbox_id: str
    tenant: str
    max_execs: int
    """The tenant's concurrent-exec quota on this node; 0 = unlimited."""
    expiry: int
    issued_ms: int = 0
    """When the token was issued, unix milliseconds (revocations compare it)."""
    kid: str = ""


class Revocations:
    """``<home>/revocations.json``: ``{"tenant": unix seconds}``; tokens of that tenant
    issued before that moment are void. Re-read when the file changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime_ns = -2
        self._checked = 0.0
        self._before: dict[str, float] = {}
        self._noted: dict[str, float] = {}

    def note(self, tenant: str, before: float) -> None:
        """Void ``tenant``'s tokens issued before ``before`` (a pushed notice; only grows)."""
        if len(self._noted) >= 65_536 and tenant not in self._noted:
            raise TokenError("too many revoked tenants noted")
        self._noted[tenant] = max(before, self._noted.get(tenant, 0.0))

    def revoked_before(self, tenant: str) -> float:
        noted = self._noted.get(tenant, 0.0)
        return max(noted, self._from_file(tenant)) if self.path is not None else noted

    def table(self) -> dict[str, float]:
        """Every tenant's revocation moment known here (the file's and the noted)."""
        if self.path is not None:
            self._from_file("")
        merged = dict(self._before)
        for tenant, before in self._noted.items():
            merged[tenant] = max(before, merged.get(tenant, 0.0))
        return merged

    def _from_file(self, tenant: str) -> float:
        assert self.path is not None
        now = time.monotonic()
        if now - self._checked >= REVOCATION_CHECK_SECONDS:
            self._checked = now
            try:
                mtime = self.path.stat().st_mtime_ns
            except FileNotFoundError:
                self._before, self._mtime_ns = {}, -1
                return 0.0
            if mtime != self._mtime_ns:
                try:
                    data = json.loads(self.path.read_text())
                    self._before = {str(k): float(v) for k, v in dict(data).items()}
                except (ValueError, TypeError, AttributeError, OSError):
                    pass  # a torn write: keep the last good table, read again next time
                else:
                    self._mtime_ns = mtime
        return self._before.get(tenant, 0.0)

    def is_revoked(self, claims: TokenClaims) -> bool:
        return claims.issued_ms / 1000 < self.revoked_before(claims.tenant)

    @staticmethod
    def revoke(path: Path, tenant: str, at: float | None = None) -> None:
        """Void every token of ``tenant`` issued before ``at`` (default: now)."""
        try:
            table = dict(json.loads(path.read_text()))
        except FileNotFoundError:
            table = {}
        table[tenant] = time.time() if at is None else at
        _write_private(path, (json.dumps(table, indent=1, sort_keys=True) + "\n").encode())


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode()


def _unb64(text: str) -> str:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise TokenError("malformed token") from None


def _mac(key: bytes, payload: str) -> str:
    digest = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def unverified_claims(token: str) -> tuple[str, str]:
    """(sandbox id, tenant) as the token states them, signature NOT checked: only for
    routing a call to the executor that will verify it."""
    parts = token.split(".")
    if not token.isascii() or len(parts) != 8 or parts[0] != _VERSION:
        raise TokenError("malformed token")
    return parts[2], _unb64(parts[3])


@dataclass
class TokenVerifier:
    """Checks tokens with per-sandbox keys: from the node's keyring (any sandbox), or
    from one sandbox's own keys (:meth:`for_sandbox`: all an injected executor holds)."""

    keyring: Keyring | KeyringFile | None = None
    sandbox_keys: Mapping[str, bytes] = field(default_factory=dict)
    """kid -> derived key, for exactly :attr:`sandbox_id`."""
    sandbox_id: str = ""
    revocations: Revocations = field(default_factory=lambda: Revocations(None))
    _derived: dict[tuple[str, str], bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def for_sandbox(
        cls, sandbox_id: str, keys: Mapping[str, bytes], revocations: Revocations | None = None
    ) -> TokenVerifier:
        return cls(
            sandbox_keys=dict(keys),
            sandbox_id=sandbox_id,
            revocations=revocations or Revocations(None),
        )

    def _key(self, kid: str, sandbox_id: str) -> bytes | None:
        if self.keyring is None:
            return self.sandbox_keys.get(kid) if sandbox_id == self.sandbox_id else None
        # The keyring first, the cache after: a key dropped from the keyring must stop
        # verifying even for a sandbox whose derived key is cached.
        node_key = self.keyring.ring().keys.get(kid)
        if node_key is None:
            node_key = self.keyring.ring(force=True).keys.get(kid)  # rotated since
            if node_key is None:
                return None
        cached = self._derived.get((kid, sandbox_id))
        if cached is not None:
            return cached
        if len(self._derived) >= 65_536:
            self._derived.clear()
        derived = self._derived[(kid, sandbox_id)] = derive_sandbox_key(node_key, sandbox_id)
        return derived

    def verify_revocation(
        self, notice: str, sandbox_id: str, now: float | None = None
    ) -> tuple[str, float]:
        """(tenant, before) of a revocation notice for ``sandbox_id``; :class:`TokenError`
        unless its signature is this sandbox's."""
        parts = notice.split(".")
        if not notice.isascii() or len(parts) != 6 or parts[0] != _REVOCATION_VERSION:
            raise TokenError("malformed revocation notice")
        _, kid, notice_sandbox, tenant_b64, before_text, sig = parts
        if notice_sandbox != sandbox_id:
            raise TokenError("revocation notice is for another sandbox")
        key = self._key(kid, sandbox_id)
        if key is None:
            raise TokenError("revocation notice signed with an unknown key")
        if not hmac.compare_digest(sig, _mac(key, notice.rsplit(".", 1)[0])):
            raise TokenError("revocation notice signature does not match")
        if not before_text.isdigit() or len(before_text) > 16:
            raise TokenError("malformed revocation notice")
        before = int(before_text) / 1000
        if before > (time.time() if now is None else now) + MAX_NOTICE_SKEW_SECONDS:
            raise TokenError("revocation notice is dated in the future")
        return _unb64(tenant_b64), before

    def knows_key(self, kid: str, sandbox_id: str) -> bool:
        """Key ``kid`` still verifies ``sandbox_id``'s tokens (not dropped): checked for a
        token remembered as verified too (``executor/auth.py``)."""
        return self._key(kid, sandbox_id) is not None

    def verify_key_drop(self, notice: str, sandbox_id: str) -> str:
        """The key id a key-drop notice for ``sandbox_id`` drops; :class:`TokenError` unless
        it is signed with this sandbox's key of another key id that is still live here."""
        parts = notice.split(".")
        if not notice.isascii() or len(parts) != 5 or parts[0] != KEY_DROP_VERSION:
            raise TokenError("malformed key-drop notice")
        _, kid, notice_sandbox, dropped, sig = parts
        if notice_sandbox != sandbox_id:
            raise TokenError("key-drop notice is for another sandbox")
        if not (dropped and len(dropped) <= MAX_KID_CHARS and dropped.isalnum()):
            raise TokenError("malformed key-drop notice")
        if kid == dropped:
            raise TokenError("key-drop notice is signed with the key it drops")
        key = self._key(kid, sandbox_id)
        if key is None:
            raise TokenError("key-drop notice signed with an unknown or dropped key")
        if not hmac.compare_digest(sig, _mac(key, notice.rsplit(".", 1)[0])):
            raise TokenError("key-drop notice signature does not match")
        return dropped

    def drop_key(self, kid: str) -> bool:
        """Forget this sandbox's key ``kid`` (a verified key-drop notice): its tokens, and
        notices signed with it, are refused from now on. True if it was held. A verifier
        over the node's keyring does nothing: the keyring itself is what it believes."""
        if self.keyring is not None or kid not in self.sandbox_keys:
            return False
        self.sandbox_keys = {k: v for k, v in self.sandbox_keys.items() if k != kid}
        return True

    def verify(self, token: str, sandbox_id: str, now: float | None = None) -> TokenClaims:
        """The token's claims; :class:`TokenError` unless it is valid for ``sandbox_id``.

        The signature is checked before anything else is believed, so a forged
        token cannot even probe which of its fields is wrong.
        """
        parts = token.split(".")
        # Tokens are ASCII; anything else would reach compare_digest (TypeError on
        # non-ASCII str) and str.isdigit (true for other scripts' digits). Found by atheris.
        if not token.isascii() or len(parts) != 8 or parts[0] != _VERSION:
            raise TokenError("malformed token")
        _, kid, token_sandbox, tenant_b64, max_execs_text, issued_text, expiry_text, sig = parts
        if token_sandbox != sandbox_id:
            raise TokenError("token is for another sandbox")
        key = self._key(kid, sandbox_id)
        if key is None:
            raise TokenError("token signed with an unknown key")
        if not hmac.compare_digest(sig, _mac(key, token.rsplit(".", 1)[0])):
            raise TokenError("token signature does not match")
        if not (expiry_text.isdigit() and max_execs_text.isdigit() and issued_text.isdigit()):
            raise TokenError("malformed token")
        if int(expiry_text) < (time.time() if now is None else now):
            raise TokenError("token has expired")
        claims = TokenClaims(
            token_sandbox, _unb64(tenant_b64), int(max_execs_text), int(expiry_text),
            int(issued_text), kid,
        )  # fmt: skip
        if self.revocations.is_revoked(claims):
            raise TokenError("token was revoked (its tenant's keys were revoked or rotated)")
        return claims


class TokenSigner(TokenVerifier):
    """Issues tokens (the control plane) and verifies them (node executor, gateway proxy)."""

    def __init__(
        self, keyring: Keyring | KeyringFile, revocations: Revocations | None = None
    ) -> None:
        super().__init__(keyring=keyring, revocations=revocations or Revocations(None))

    @classmethod
    def from_key(cls, key: bytes, revocations: Revocations | None = None) -> TokenSigner:
        """A signer over one key held in memory (tests, tools)."""
        return cls(Keyring.single(key), revocations)

    @property
    def ring(self) -> Keyring | KeyringFile:
        assert self.keyring is not None
        return self.keyring

    def sandbox_keys_for(self, sandbox_id: str) -> dict[str, bytes]:
        """Every key id's derived key for ``sandbox_id`` (what an injected executor gets)."""
        return {kid: derive_sandbox_key(k, sandbox_id) for kid, k in self.ring.ring().keys.items()}

    def issue(
        self,
        sandbox_id: str,
        ttl_seconds: float,
        now: float | None = None,
        *,
        tenant: str = "",
        max_execs: int = 0,
        created: float | None = None,
    ) -> tuple[str, int]:
        """A token for ``tenant``'s ``sandbox_id`` and its expiry (unix seconds);
        ``created`` (the sandbox's creation time) picks the key (:meth:`Keyring.kid_for`)."""
        ring = self.ring.ring()
        kid = ring.kid_for(created)
        now = time.time() if now is None else now
        issued = int(now * 1000)
        expiry = int(now + ttl_seconds)
        payload = (
            f"{_VERSION}.{kid}.{sandbox_id}.{_b64(tenant)}."
            f"{max(0, int(max_execs))}.{issued}.{expiry}"
        )
        key = derive_sandbox_key(ring.keys[kid], sandbox_id)
        return f"{payload}.{_mac(key, payload)}", expiry

    def sign_revocation(
        self, sandbox_id: str, tenant: str, before: float, *, created: float | None = None
    ) -> str:
        """A notice telling ``sandbox_id``'s own executor that ``tenant``'s tokens issued
        before ``before`` (unix seconds) are void; signed with the key its tokens use."""
        ring = self.ring.ring()
        kid = ring.kid_for(created)
        payload = (
            f"{_REVOCATION_VERSION}.{kid}.{sandbox_id}.{_b64(tenant)}.{max(0, int(before * 1000))}"
        )
        key = derive_sandbox_key(ring.keys[kid], sandbox_id)
        return f"{payload}.{_mac(key, payload)}"

    def sign_key_drop(self, sandbox_id: str, dropped: str, *, created: float) -> str:
        """A notice telling ``sandbox_id``'s own executor to forget key ``dropped``, signed
        with a live key it holds (:meth:`Keyring.live_kid_held`); :class:`TokenError` if it
        holds none (every key it got at ``created`` is dropped: it cannot be told)."""
        ring = self.ring.ring()
        kid = ring.live_kid_held(created, besides=dropped)
        if kid is None:
            raise TokenError(f"sandbox {sandbox_id} holds no live token key to be told with")
        payload = f"{KEY_DROP_VERSION}.{kid}.{sandbox_id}.{dropped}"
        key = derive_sandbox_key(ring.keys[kid], sandbox_id)
        return f"{payload}.{_mac(key, payload)}"


def encode_sandbox_keys(sandbox_id: str, keys: Mapping[str, bytes]) -> bytes:
    """The file an injected executor reads at start (its own keys, nothing else)."""
    body = {"sandbox_id": sandbox_id, "keys": {k: v.hex() for k, v in keys.items()}}
    return json.dumps(body).encode()


def decode_sandbox_keys(data: bytes) -> tuple[str, dict[str, bytes]]:
    try:
        body = json.loads(data)
        return str(body["sandbox_id"]), {str(k): bytes.fromhex(v) for k, v in body["keys"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TokenError(f"sandbox token keys are not valid: {exc}") from None
