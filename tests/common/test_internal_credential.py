"""The per-call internal credential (``orchard.common.internal_credential``): each way a
credential can be wrong is refused with a message that says which."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchard.common.internal_credential import (
    VALID_SECONDS,
    CredentialError,
    CredentialSigner,
    CredentialVerifier,
)
from orchard.common.internal_pki import InternalPKI, identity_name
from orchard.common.local_ca import cert_pem, issue, key_pem, make_ca


@pytest.fixture
def pki(tmp_path: Path) -> InternalPKI:
    made = InternalPKI(tmp_path / "internal")
    made.ensure()
    return made


def test_the_gateways_credential_names_the_gateway(pki: InternalPKI) -> None:
    value = pki.identity("gateway").signer().credential("scheduler")
    verifier = pki.identity("scheduler").verifier()
    assert verifier.caller(value) == "gateway"
    assert verifier.caller(value) == "gateway"  # remembered: the same answer


def test_a_credential_for_another_service_is_refused(pki: InternalPKI) -> None:
    value = pki.identity("gateway").signer().credential("rewards")
    with pytest.raises(CredentialError, match="is for the 'rewards', not this service"):
        pki.identity("scheduler").verifier().caller(value)


def test_an_old_credential_is_refused(pki: InternalPKI) -> None:
    gateway = pki.identity("gateway")
    then = time.time() - VALID_SECONDS - 5
    old = CredentialSigner(gateway.cert_pem, gateway.key_pem, clock=lambda: then)
    value = old.credential("scheduler")
    with pytest.raises(CredentialError, match=r"signed \d+ s from now"):
        pki.identity("scheduler").verifier().caller(value)
    # Within the window it verifies; past it, even a remembered one is dropped.
    now = [then + VALID_SECONDS - 1]
    verifier = CredentialVerifier("scheduler", gateway.ca_pem, clock=lambda: now[0])
    assert verifier.caller(value) == "gateway"
    now[0] += 10
    with pytest.raises(CredentialError):
        verifier.caller(value)


def test_another_cas_certificate_is_refused(pki: InternalPKI) -> None:
    ca, ca_key = make_ca("Orchard internal CA")  # same name, another key
    leaf, key = issue(ca, ca_key, [identity_name("gateway")])
    value = CredentialSigner(cert_pem(leaf), key_pem(key)).credential("scheduler")
    with pytest.raises(CredentialError, match="not issued by this deployment's internal CA"):
        pki.identity("scheduler").verifier().caller(value)


def test_the_internal_cas_certificate_with_another_key_is_refused(pki: InternalPKI) -> None:
    """The gateway's (public) certificate with a signature made by another key."""
    gateway = pki.identity("gateway")
    _, other_key = issue(*make_ca("x"), [identity_name("gateway")])
    value = CredentialSigner(gateway.cert_pem, key_pem(other_key)).credential("scheduler")
    with pytest.raises(CredentialError, match="signature does not match"):
        pki.identity("scheduler").verifier().caller(value)


@pytest.mark.parametrize(
    "value", ["", "v1", "v1.a.b.c.d", "v2.x.scheduler.1.y", "v1.!!.scheduler.12.x", "é" * 10]
)
def test_malformed_credentials_are_refused(pki: InternalPKI, value: str) -> None:
    with pytest.raises(CredentialError):
        pki.identity("scheduler").verifier().caller(value)
