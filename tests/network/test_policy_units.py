"""The pure parts of network policy: validation, matching, DNS, SNI, host and request
parsing, nft scripts.

No root, no namespaces: these run everywhere and pin the rules the runc tests rely on.
"""

from __future__ import annotations

import ipaddress
import os
import struct

import pytest
from orchard.scheduler.backends.netpolicy import dns, nftables
from orchard.scheduler.backends.netpolicy.addresses import veth_name
from orchard.scheduler.backends.netpolicy.destinations import Refused, parse_host
from orchard.scheduler.backends.netpolicy.guard import NodeGuard, interface_addresses
from orchard.scheduler.backends.netpolicy.http_requests import body_length, parse_head
from orchard.scheduler.backends.netpolicy.policy import (
    NetworkPolicySpec,
    PolicyError,
    build_policy,
    check_reserved,
)
from orchard.scheduler.backends.netpolicy.settings import EgressLimits, NetworkSettings
from orchard.scheduler.backends.netpolicy.tls_hello import HelloError, server_name

A = ipaddress.IPv4Address


def test_modes_and_field_rules() -> None:
    assert build_policy("none", [], [], []) == NetworkPolicySpec()
    assert not build_policy("none", [], [], []).networked
    assert build_policy("internet", [], [], []).networked
    with pytest.raises(PolicyError, match="only allowed with mode ALLOWLIST"):
        build_policy("internet", ["203.0.113.0/24"], [], [])
    with pytest.raises(PolicyError, match="at least one"):
        build_policy("allowlist", [], [80], [])
    with pytest.raises(PolicyError, match="not one of"):
        build_policy("everything", [], [], [])


@pytest.mark.parametrize(
    ("cidr", "why"),
    [
        ("203.0.113.1/24", "host bits"),
        ("nope", "not an IPv4 network"),
        ("2001:db8::/32", "only IPv4"),
        ("127.0.0.0/8", "overlaps"),
        ("169.254.169.254/32", "overlaps"),
        ("0.0.0.0/0", "overlaps"),
        ("224.0.0.1/32", "overlaps"),
    ],
)
def test_bad_cidrs_are_refused(cidr: str, why: str) -> None:
    with pytest.raises(PolicyError, match=r"network\.cidrs") as err:
        build_policy("allowlist", [cidr], [], [])
    assert why in str(err.value)


@pytest.mark.parametrize(
    "domain", ["", "a..b", "-a.com", "a_b.com", "1.2.3.4", "*", "a.*.com", "x" * 64 + ".com"]
)
def test_bad_domains_are_refused(domain: str) -> None:
    with pytest.raises(PolicyError, match=r"network\.domains"):
        build_policy("allowlist", [], [], [domain])


def test_bad_ports_and_too_many_entries() -> None:
    with pytest.raises(PolicyError, match="not a port"):
        build_policy("allowlist", ["203.0.113.0/24"], [0], [])
    with pytest.raises(PolicyError, match="at most 64"):
        build_policy("allowlist", [f"203.0.113.{i}/32" for i in range(65)], [], [])


def test_normalised_and_json_round_trip() -> None:
    policy = build_policy(
        "allowlist", ["203.0.113.0/24", "203.0.113.0/24"], [443, 80], ["Example.COM."]
    )
    assert policy.cidrs == ("203.0.113.0/24",) and policy.ports == (80, 443)
    assert policy.domains == ("example.com",)
    assert NetworkPolicySpec.from_json(policy.to_json()) == policy


def test_name_matching() -> None:
    policy = build_policy("allowlist", [], [], ["example.com", "*.pkg.test"])
    assert policy.allows_name("example.com")
    assert not policy.allows_name("www.example.com")
    assert not policy.allows_name("example.com.evil.test")
    assert policy.allows_name("a.pkg.test") and policy.allows_name("b.a.pkg.test")
    assert not policy.allows_name("pkg.test") and not policy.allows_name("xpkg.test")
    assert NetworkPolicySpec("internet").allows_name("anything.test")
    assert not NetworkPolicySpec().allows_name("example.com")


def test_address_rules() -> None:
    allow = build_policy("allowlist", ["10.5.0.0/16"], [], ["example.com"])
    # An IP literal must be listed; a name's addresses must be public or listed.
    assert allow.allows_address(A("10.5.1.1"), listed_only=True)
    assert not allow.allows_address(A("203.0.113.5"), listed_only=True)
    assert allow.allows_address(A("203.0.113.5"), listed_only=False)
    assert not allow.allows_address(A("10.6.0.1"), listed_only=False)  # rebinding
    assert not allow.allows_address(A("169.254.169.254"), listed_only=False)
    internet = NetworkPolicySpec("internet")
    assert internet.allows_address(A("203.0.113.5"), listed_only=True)
    for private in ("10.0.0.1", "192.168.1.1", "172.16.0.1", "100.64.0.1", "127.0.0.1"):
        assert not internet.allows_address(A(private), listed_only=True)


def test_dns_query_and_answer() -> None:
    query = dns.parse_query(dns.a_query(0x1234, "allowed.test"))
    assert (query.id, query.name, query.qtype) == (0x1234, "allowed.test", dns.TYPE_A)
    reply = dns.answer(query, [A("203.0.113.10"), A("203.0.113.11")])
    assert dns.parse_a_answer(reply, 0x1234)[0] == [A("203.0.113.10"), A("203.0.113.11")]
    nx = dns.answer(query, [], rcode=dns.RCODE_NXDOMAIN)
    assert dns.parse_a_answer(nx, 0x1234) == ([], dns.MAX_CACHE_SECONDS, dns.RCODE_NXDOMAIN)
    with pytest.raises(dns.DnsError):
        dns.parse_a_answer(reply, 0x9999)


@pytest.mark.parametrize(
    "packet",
    [
        b"",
        b"\x00" * 11,
        struct.pack("!HHHHHH", 1, 0x8000, 1, 0, 0, 0) + b"\x01a\x00\x00\x01\x00\x01",  # a response
        struct.pack("!HHHHHH", 1, 0, 2, 0, 0, 0) + b"\x01a\x00\x00\x01\x00\x01",  # two questions
        struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0) + b"\xc0\x0c",  # pointer loop
        struct.pack("!HHHHHH", 1, 0, 1, 0, 0, 0) + b"\x3fabc",  # label past the end
    ],
)
def test_hostile_dns_packets_raise_dns_error(packet: bytes) -> None:
    with pytest.raises(dns.DnsError):
        dns.parse_query(packet)


def client_hello(sni: bytes) -> bytes:
    name = struct.pack("!BH", 0, len(sni)) + sni
    ext = struct.pack("!HH", 0, len(name) + 2) + struct.pack("!H", len(name)) + name
    body = b"\x03\x03" + os.urandom(32) + b"\x00" + struct.pack("!H", 2) + b"\x13\x01\x01\x00"
    body += struct.pack("!H", len(ext)) + ext
    hello = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(hello)) + hello


def test_sni_is_read_from_a_client_hello() -> None:
    assert server_name(client_hello(b"allowed.test")[9:]) == "allowed.test"
    with pytest.raises(HelloError):
        server_name(client_hello(b"x")[9:20])  # truncated: refused, no crash
    for _ in range(200):  # noise refuses or reads, never raises anything else
        try:
            result = server_name(os.urandom(250))
        except HelloError:
            continue
        assert result is None or isinstance(result, str)


@pytest.mark.parametrize(
    "host",
    ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "0", "1.2.3.4.", "a.0x1f", "a b", "*.x"],
)
def test_odd_ip_spellings_and_non_names_are_refused(host: str) -> None:
    with pytest.raises(Refused) as refused:
        parse_host(host)
    assert refused.value.status == 400


def test_hosts_are_canonical_addresses_or_names() -> None:
    assert parse_host("203.0.113.1") == A("203.0.113.1")
    assert parse_host("Allowed.Test.") == "allowed.test"
    assert parse_host("1a.example") == "1a.example"
    for v6 in ("[::1]", "[::ffff:127.0.0.1]", "::1"):
        with pytest.raises(Refused, match="IPv4 only"):
            parse_host(v6)


@pytest.mark.parametrize(
    "head",
    [
        b"GET http://a/ HTTP/1.1\r\nHost : a\r\n\r\n",  # space before the colon
        b"GET http://a/ HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
        b"GET http://a/ HTTP/2\r\n\r\n",
    ],
)
def test_ambiguous_heads_are_refused(head: bytes) -> None:
    with pytest.raises(Refused):
        parse_head(head)


def test_request_bodies_are_framed_or_refused() -> None:
    def framing(*headers: str) -> int | None:
        return body_length(
            parse_head(
                (
                    "GET http://a/ HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
                ).encode()
            )
        )

    assert framing() == 0
    assert framing("Content-Length: 12") == 12
    assert framing("Transfer-Encoding: chunked") is None
    for bad in (
        ("Content-Length: 1", "Transfer-Encoding: chunked"),
        ("Content-Length: 1", "Content-Length: 2"),
        ("Content-Length: -1",),
        ("Transfer-Encoding: gzip, chunked",),
    ):
        with pytest.raises(Refused):
            framing(*bad)


def test_nft_scripts_name_only_the_sandbox() -> None:
    settings = NetworkSettings()
    address = A("10.213.7.9")
    policy = build_policy("allowlist", ["203.0.113.0/24"], [443], [])
    script = nftables.apply_script("sb-abc", address, policy, settings, 4000, 4001)
    assert "allow_sb_abc { 203.0.113.0/24 }" in script
    assert "th dport @ports_sb_abc accept" in script
    assert "redirect to :4000" in script and "redirect to :4001" in script
    assert script.strip().endswith("reject with icmpx type admin-prohibited")
    removal = nftables.remove_script("sb-abc", address)
    assert "delete chain inet orchard sb_sb_abc" in removal
    assert f'"{veth_name("sb-abc")}" . 10.213.7.9' in removal
    base = nftables.base_script(settings)
    assert "10.213.0.0/16" in base and "169.254.0.0/16" in base
    assert len(veth_name("sb-" + "x" * 60)) <= 15


def test_the_guard_refuses_the_node_the_subnet_and_the_deny_list() -> None:
    guard = NodeGuard(NetworkSettings(deny_cidrs=("198.51.100.0/24",)))
    own = [a for a in interface_addresses() if a.version == 4 and not a.is_loopback]
    for address in own:  # every interface address of this machine, whatever it is
        assert isinstance(address, A)
        assert guard.refusal(address) == "an address of this node"
    assert "sandbox subnet" in (guard.refusal(A("10.213.0.1")) or "")
    assert "control-plane" in (guard.refusal(A("198.51.100.7")) or "")
    assert "metadata" in (guard.refusal(A("169.254.169.254")) or "")
    assert guard.refusal(A("203.0.113.77")) is None or A("203.0.113.77") in own
    overlapping = build_policy("allowlist", ["10.0.0.0/8"], [], [])
    with pytest.raises(PolicyError, match=r"'10.0.0.0/8' overlaps the sandbox subnet"):
        check_reserved(overlapping, guard.reserved())


def test_egress_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCHARD_NET_PROXY_MAX_CONNECTIONS", "12")
    monkeypatch.setenv("ORCHARD_NET_PROXY_IDLE_SECONDS", "1.5")
    limits = EgressLimits.from_env()
    assert (limits.max_connections, limits.idle_seconds) == (12, 1.5)
    for bad in ("0", "-3", "lots"):
        monkeypatch.setenv("ORCHARD_NET_DNS_MAX_PENDING", bad)
        with pytest.raises(ValueError, match="ORCHARD_NET_DNS_MAX_PENDING"):
            EgressLimits.from_env()
    monkeypatch.delenv("ORCHARD_NET_DNS_MAX_PENDING")
    monkeypatch.setenv("ORCHARD_NET_DENY_CIDRS", "10.96.0.0/12, nonsense")
    with pytest.raises(ValueError, match="ORCHARD_NET_DENY_CIDRS: 'nonsense'"):
        NetworkSettings.from_env()
