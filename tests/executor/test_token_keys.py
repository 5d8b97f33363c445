"""Token keys: key ids and rotation, per-sandbox derived keys, revocation (issue 12, class 6).

Before: one node key signed every sandbox's tokens and every injected sandbox
held it (a key leaked from one sandbox minted tokens for any other), a rotation
invalidated every token at once, and a revoked tenant's tokens worked until they
expired.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from orchard.executor.auth import CallAuthorizer
from orchard.executor.server import token_verifier
from orchard.executor.settings import ExecutorSettings

from orchard.common.layout import NodeLayout
from orchard.common.tokens import (
    LEGACY_KID,
    KeyringFile,
    Revocations,
    TokenError,
    TokenSigner,
    TokenVerifier,
    decode_sandbox_keys,
    encode_sandbox_keys,
)

A, B = "sb-aaaaaaaa", "sb-bbbbbbbb"


def signer(home: Path) -> TokenSigner:
    layout = NodeLayout(home)
    return TokenSigner(layout.keyring_file(), Revocations(layout.revocations))


def test_a_sandboxs_own_keys_verify_its_tokens_and_mint_none_for_another(tmp_path: Path) -> None:
    node = signer(tmp_path)
    sandbox_id, keys = decode_sandbox_keys(encode_sandbox_keys(A, node.sandbox_keys_for(A)))
    inside = TokenVerifier.for_sandbox(sandbox_id, keys)
    token, _ = node.issue(A, 60, tenant="t")
    assert inside.verify(token, A).tenant == "t"
    # What sandbox A holds cannot make a token B's executor (or the node) accepts.
    leaked = TokenSigner.from_key(next(iter(keys.values())))
    forged, _ = leaked.issue(B, 60, tenant="t")
    for verifier in (node, inside):
        with pytest.raises(TokenError):
            verifier.verify(forged, B)
    # Nor is A's key the node key: no derived key equals a node key.
    assert set(keys.values()).isdisjoint(node.ring.ring().keys.values())


def test_rotation_keeps_old_tokens_valid_and_drop_retires_them(tmp_path: Path) -> None:
    node = signer(tmp_path)
    first = node.ring.ring().current
    old, _ = node.issue(A, 600, tenant="t")
    time.sleep(0.01)
    ring = KeyringFile(NodeLayout(tmp_path).token_keyring)
    second = ring.rotate()
    assert second != first
    fresh = signer(tmp_path)  # another process (the executor) reads the file
    assert fresh.verify(old, A).kid == first
    new, _ = fresh.issue(A, 600, tenant="t")  # a sandbox made now gets the new key
    assert fresh.verify(new, A).kid == second
    # A sandbox made before the rotation keeps being signed with the key its
    # injected executor knows.
    made_before, _ = fresh.issue(A, 600, tenant="t", created=time.time() - 3600)
    assert made_before.split(".")[1] == first
    ring.rotate(drop=(first,))
    with pytest.raises(TokenError, match="unknown key"):
        signer(tmp_path).verify(old, A)
    with pytest.raises(TokenError, match="no such token key"):
        ring.rotate(drop=("k-missing",))


def test_a_node_made_before_keyrings_keeps_its_key_as_k0(tmp_path: Path) -> None:
    layout = NodeLayout(tmp_path)
    layout.token_key.parent.mkdir(parents=True)
    layout.token_key.write_bytes(b"L" * 32)
    ring = layout.keyring_file().ring()
    assert ring.current == LEGACY_KID and ring.keys[LEGACY_KID] == b"L" * 32
    token, _ = TokenSigner.from_key(b"L" * 32).issue(A, 60)
    assert signer(tmp_path).verify(token, A).kid == LEGACY_KID


def test_revocation_voids_a_tenants_tokens_also_when_remembered(tmp_path: Path) -> None:
    node = signer(tmp_path)
    authorizer = CallAuthorizer(token_verifier(ExecutorSettings(home=tmp_path)))
    victim, _ = node.issue(A, 600, tenant="revoked-team", now=time.time() - 5)
    bystander, _ = node.issue(B, 600, tenant="other-team", now=time.time() - 5)
    bearer = (("authorization", f"Bearer {victim}"),)
    assert authorizer.check(A, bearer).tenant == "revoked-team"  # now remembered
    Revocations.revoke(NodeLayout(tmp_path).revocations, "revoked-team")
    time.sleep(0.6)  # the file is looked at at most every REVOCATION_CHECK_SECONDS
    with pytest.raises(Exception, match="revoked"):
        authorizer.check(A, bearer)
    assert authorizer.check(B, (("authorization", f"Bearer {bystander}"),)).tenant == ("other-team")
    # Tokens issued after the revocation (a new key's) work again.
    later, _ = node.issue(A, 600, tenant="revoked-team")
    assert authorizer.check(A, (("authorization", f"Bearer {later}"),)).tenant == "revoked-team"
