"""A dropped token key stops verifying everywhere a verifier lives (issue 12, class 6).

Before: ``orchard token-key rotate --drop KID`` removed the key from the keyring,
but (1) a long-running node executor or gateway that had verified a token of it kept
the sandbox's derived key cached (and the executor the verified token remembered),
so that token kept working in the very process the CLI docstring relied on; and
(2) an executor holding its own sandbox's keys (injected, runsc, a pod) never heard
of the drop. Now the keyring is checked before the cache and a remembered token's
key on every call, and a **key-drop notice** (``d1``) makes an own-key executor
forget the dropped key. Notices only remove keys; they are signed with a live key
the sandbox holds, never with the one they drop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from orchard.executor.auth import CallAuthorizer

from orchard.common.errors import ServiceError
from orchard.common.layout import NodeLayout
from orchard.common.tokens import (
    KEYRING_CHECK_SECONDS,
    Keyring,
    KeyringFile,
    Revocations,
    TokenError,
    TokenSigner,
    TokenVerifier,
    _mac,
)

A, B = "sb-aaaaaaaa", "sb-bbbbbbbb"


def signer(home: Path) -> TokenSigner:
    layout = NodeLayout(home)
    return TokenSigner(layout.keyring_file(), Revocations(layout.revocations))


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def refused(authorizer: CallAuthorizer, sandbox_id: str, token: str) -> str:
    with pytest.raises(ServiceError) as err:
        authorizer.check(sandbox_id, bearer(token))
    assert err.value.reason == "TOKEN_INVALID"
    return str(err.value)


def two_key_sandbox(home: Path) -> tuple[TokenSigner, KeyringFile, str, str, float]:
    """A node whose keyring has two keys and a sandbox made after both (it holds both; its
    tokens are signed with the newer). Returns (node, keyring, older, newer, created)."""
    node = signer(home)
    older = node.ring.ring().current
    ring = KeyringFile(NodeLayout(home).token_keyring)
    newer = ring.rotate()
    node.ring.ring(force=True)
    time.sleep(0.01)
    return node, ring, older, newer, time.time()


def test_a_long_running_node_verifier_refuses_a_dropped_keys_token(tmp_path: Path) -> None:
    node = signer(tmp_path)
    authorizer = CallAuthorizer(node)
    token, _ = node.issue(A, 600, tenant="t")
    kid = token.split(".")[1]
    authorizer.check(A, bearer(token))  # verified: the derived key cached, the token remembered
    KeyringFile(NodeLayout(tmp_path).token_keyring).rotate(drop=(kid,))
    time.sleep(KEYRING_CHECK_SECONDS + 0.1)  # the verifier's next look at the keyring
    assert "dropped" in refused(authorizer, A, token)
    with pytest.raises(TokenError, match="unknown key"):
        node.verify(token, A)
    fresh, _ = node.issue(A, 600, tenant="t")
    assert authorizer.check(A, bearer(fresh)).kid != kid


def test_the_keyring_remembers_what_was_dropped_and_when(tmp_path: Path) -> None:
    _node, ring, older, newer, _ = two_key_sandbox(tmp_path)
    at = time.time()
    ring.rotate(drop=(older,))
    body = json.loads(NodeLayout(tmp_path).token_keyring.read_text())
    assert older not in body["keys"] and body["dropped"][older] >= at
    again = ring.rotate(drop=(newer,))
    read = Keyring.from_json(NodeLayout(tmp_path).token_keyring.read_bytes(), "test")
    assert set(read.dropped) == {older, newer} and read.current == again
    # A keyring written before drops were recorded reads as one with none.
    legacy = {"current": again, "keys": {again: "ab" * 32}}
    assert Keyring.from_json(json.dumps(legacy).encode(), "old").dropped == {}


def test_a_key_drop_notice_makes_an_own_key_executor_forget_the_key(tmp_path: Path) -> None:
    node, ring, older, newer, created = two_key_sandbox(tmp_path)
    inside = TokenVerifier.for_sandbox(A, node.sandbox_keys_for(A))
    authorizer = CallAuthorizer(inside)
    token, _ = node.issue(A, 600, tenant="t", created=created)
    assert token.split(".")[1] == newer
    authorizer.check(A, bearer(token))  # remembered
    revocation = node.sign_revocation(A, "t", time.time(), created=created)  # signed with newer
    ring.rotate(drop=(newer,))
    node.ring.ring(force=True)  # the scheduler's next look at the keyring
    notice = node.sign_key_drop(A, newer, created=created)
    assert notice.split(".")[:2] == ["d1", older]
    assert authorizer.drop_key(A, notice) == (newer, True)
    assert "dropped" in refused(authorizer, A, token)
    # Told twice: harmless. A token the scheduler issues now (the older, live key) works.
    assert authorizer.drop_key(A, notice) == (newer, False)
    fresh, _ = node.issue(A, 600, tenant="t", created=created)
    assert authorizer.check(A, bearer(fresh)).kid == older
    # A revocation notice signed with the dropped key is refused now too.
    with pytest.raises(ServiceError, match="unknown key"):
        authorizer.revoke(A, revocation)


def hostile_drops(
    node: TokenSigner,
    held: Mapping[str, bytes],
    older: str,
    newer: str,
    created: float,
    a: str = A,
    b: str = B,
) -> dict[str, str]:
    """Key-drop notices for sandbox ``a`` (holding ``held``) that must all be refused by its
    executor once it has been told that ``newer`` is dropped (``older`` still live)."""
    real = node.sign_key_drop(a, newer, created=created)
    body, sig = real.rsplit(".", 1)
    stranger = TokenSigner.from_key(b"s" * 32)
    by_dropped = f"d1.{newer}.{a}.{older}"
    self_signed = f"d1.{newer}.{a}.{newer}"
    no_kid = f"d1.{older}.{a}.k-1"
    return {
        "empty": "",
        "random": "d1.k1.x.y.z",
        "oversized": "d1." + "A" * 100_000,
        "flipped signature": f"{body}.{'A' if sig[0] != 'A' else 'B'}{sig[1:]}",
        "another node's key": stranger.sign_key_drop(a, older, created=created),
        "for another sandbox": node.sign_key_drop(b, newer, created=created),
        "signed with the key it drops": f"{self_signed}.{_mac(held[newer], self_signed)}",
        "signed with a key dropped already": f"{by_dropped}.{_mac(held[newer], by_dropped)}",
        "an unknown key id": real.replace(f"d1.{older}.", "d1.k999.", 1),
        "a dropped kid that is no key id": f"{no_kid}.{_mac(held[older], no_kid)}",
        "a dropped kid with dots": f"d1.{older}.{a}.../..",
        "non-ascii": real.replace("d1", "d\u0661", 1),
        "a revocation's shape": f"d1.{older}.{a}.x.1.{sig}",
    }


def test_hostile_key_drop_notices_are_refused_and_remove_nothing(tmp_path: Path) -> None:
    node, ring, older, newer, created = two_key_sandbox(tmp_path)
    held = node.sandbox_keys_for(A)
    inside = TokenVerifier.for_sandbox(A, held)
    authorizer = CallAuthorizer(inside)
    old_token, _ = node.issue(A, 600, tenant="t", created=time.time() - 3600)  # older key
    ring.rotate(drop=(newer,))
    node.ring.ring(force=True)
    inside.drop_key(newer)  # told of the first drop already
    hostile = hostile_drops(node, held, older, newer, created)
    for what, notice in hostile.items():
        with pytest.raises(ServiceError) as err:
            authorizer.drop_key(A, notice)
        assert err.value.reason == "REVOCATION_INVALID", what
        assert authorizer.check(A, bearer(old_token)).kid == older, what
    # Under another sandbox's id, the real notice for A names A: refused.
    with pytest.raises(ServiceError, match="another sandbox"):
        authorizer.drop_key(B, node.sign_key_drop(A, newer, created=created))


def test_a_sandbox_holding_no_live_key_cannot_be_told(tmp_path: Path) -> None:
    node = signer(tmp_path)
    only = node.ring.ring().current
    created = time.time()
    KeyringFile(NodeLayout(tmp_path).token_keyring).rotate(drop=(only,))
    node.ring.ring(force=True)
    with pytest.raises(TokenError, match="holds no live token key"):
        node.sign_key_drop(A, only, created=created)
    assert node.ring.ring().live_kid_held(created) is None


def test_a_node_verifier_takes_a_valid_notice_and_changes_nothing(tmp_path: Path) -> None:
    """The node executor believes the keyring, not notices: a notice (one sandbox code
    could sign with its own keys) is verified and then does nothing to any other sandbox."""
    node, _ring, _older, newer, created = two_key_sandbox(tmp_path)
    authorizer = CallAuthorizer(node)
    token_b, _ = node.issue(B, 600, tenant="t", created=created)
    notice = node.sign_key_drop(A, newer, created=created)
    assert authorizer.drop_key(A, notice) == (newer, False)
    assert authorizer.check(B, bearer(token_b)).kid == newer
