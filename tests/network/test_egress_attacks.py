"""Attacks on the node from inside a sandbox, through every path out of it
(issue 12, class 2 and the egress part of class 3), on a real ``orchard up``
with real runc sandboxes, veths, nftables, egress proxy and DNS forwarder.

Each attack was shown to work on the code before this file: the proxy ran on
the host and checked destinations only against a short never-allowed list and
the policy, so it reached the host's own addresses; a ClientHello in pieces
skipped the SNI check; the requests after the first on a kept-alive
connection were relayed unchecked; there was no per-sandbox connection cap or
idle timeout, and DNS opened one socket per query.

The node here is this host: its addresses are read the way the proxy reads
them (every interface), plus ``203.0.113.1``, the host's end of the fake
internet's veth: a *public* address of the node, the case ``internet`` got
wrong. A listener on 0.0.0.0 stands for every host service and counts the
connections that reach it: each attack must leave it at zero.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

import orchard
from orchard import NetworkPolicy, Orchard, Sandbox
from tests.stack import REQUIRES_STACK, Stack

from .in_sandbox import FETCH, RESOLVE, py
from .testnet import HOST_END, FakeInternet, stack_on

pytestmark = [*REQUIRES_STACK, pytest.mark.skipif(
    not os.path.exists("/usr/sbin/nft"), reason="needs nftables")]  # fmt: skip

GATEWAY = "10.213.0.1"
PROXY = f"http://{GATEWAY}:3128"
# Small limits for this stack, so each cap is reached in a test's time.
LIMITS = {
    "ORCHARD_NET_PROXY_MAX_CONNECTIONS": "8",
    "ORCHARD_NET_PROXY_IDLE_SECONDS": "2",
    "ORCHARD_NET_PROXY_HEAD_SECONDS": "3",
    "ORCHARD_NET_TLS_HELLO_SECONDS": "3",
    "ORCHARD_NET_DNS_MAX_PENDING": "16",
    "ORCHARD_NET_DNS_MAX_UPSTREAM": "24",
}

# Run inside the sandbox: send each base64 chunk to the proxy (a pause between
# them, so each is its own TCP segment), then read until the proxy closes or
# is quiet for argv[2] seconds. Prints {"state": "closed"|"open", "data": ...}.
SEND = """
import base64, json, socket, sys, time
chunks = [base64.b64decode(c) for c in json.loads(sys.argv[1])]
s = socket.create_connection(("GATEWAY", 3128), timeout=5)
for chunk in chunks:
    s.sendall(chunk)
    time.sleep(0.2)
s.settimeout(float(sys.argv[2]))
out, state = b"", "open"
try:
    while True:
        data = s.recv(65536)
        if not data:
            state = "closed"
            break
        out += data
except TimeoutError:
    pass
except OSError:
    state = "closed"
print(json.dumps({"state": state, "data": out.decode("latin-1")}))
""".replace("GATEWAY", GATEWAY)
# Hold argv[1] idle connections to the proxy, then one more: what does it get?
HOLD = """
import socket, sys, time
held = [socket.create_connection(("GATEWAY", 3128), timeout=5) for _ in range(int(sys.argv[1]))]
time.sleep(0.3)
s = socket.create_connection(("GATEWAY", 3128), timeout=5)
try:
    print("answer", s.recv(4096).decode(errors="replace").replace("\\r\\n", " | "))
except TimeoutError:
    print("no answer")
""".replace("GATEWAY", GATEWAY)
# A burst of argv[1] A queries for names the upstream never answers, from one
# socket (paced a little and answers drained as they come, so no packet is
# lost to a full socket buffer on either side);
# prints how many REFUSED answers came back within 3 s of the last query.
DNS_FLOOD = """
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("GATEWAY", 53))
refused = 0
def drain(until):
    global refused
    while True:
        s.settimeout(max(0.0, until - time.monotonic()))  # 0: non-blocking
        try:
            refused += (s.recv(512)[3] & 0xF) == 5
        except (BlockingIOError, TimeoutError):
            return
for i in range(int(sys.argv[1])):
    name = b"".join(bytes([len(l)]) + l for l in (b"n%d" % i, b"slow", b"test")) + b"\\0"
    s.send(struct.pack("!HHHHHH", i, 0x0100, 1, 0, 0, 0) + name + struct.pack("!HH", 1, 1))
    drain(0)
    time.sleep(0.002)
drain(time.monotonic() + 3)
print("refused", refused)
""".replace("GATEWAY", GATEWAY)


def send(sb: Sandbox, chunks: list[bytes], wait: float = 3.0) -> dict[str, str]:
    encoded = json.dumps([base64.b64encode(c).decode() for c in chunks])
    answer: dict[str, str] = json.loads(py(sb, SEND, encoded, str(wait)))
    return answer


def client_hello(*server_names: str, record_size: int = 0) -> bytes:
    """A TLS 1.3-style ClientHello with one server_name extension per name given;
    ``record_size`` splits the handshake message over TLS records of that size."""
    extensions = b""
    for sni in server_names:
        name = sni.encode()
        entry = struct.pack("!BH", 0, len(name)) + name
        extensions += struct.pack("!HHH", 0, len(entry) + 2, len(entry)) + entry
    body = b"\x03\x03" + os.urandom(32) + b"\x00" + struct.pack("!H", 2) + b"\x13\x01" + b"\x01\x00"
    body += struct.pack("!H", len(extensions)) + extensions
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    size = record_size or len(handshake)
    return b"".join(
        b"\x16\x03\x01" + struct.pack("!H", len(handshake[i : i + size])) + handshake[i : i + size]
        for i in range(0, len(handshake), size)
    )


def connect_head(target: str) -> bytes:
    return f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode()


def get_head(url_authority: str, path: str = "/") -> bytes:
    return f"GET http://{url_authority}{path} HTTP/1.1\r\nHost: {url_authority}\r\n\r\n".encode()


def node_addresses() -> list[str]:
    """Every IPv4 address of this host's interfaces (the node), as ``ip`` lists them."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return sorted({line.split()[3].split("/")[0] for line in out.splitlines()})


class HostService:
    """A listener on every host address; counts the connections that reach it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\nhost-root")
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def stack(internet: FakeInternet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with stack_on(internet, tmp_path_factory.mktemp("attack-home"), LIMITS) as stack:
        yield stack


@pytest.fixture
def host_service() -> Iterator[HostService]:
    service = HostService()
    try:
        yield service
    finally:
        service.close()


def client(stack: Stack) -> Orchard:
    return Orchard(stack.endpoint, (stack.home / "dev-api-key").read_text().strip())


def create(stack: Stack, network: str | NetworkPolicy) -> Sandbox:
    return client(stack).sandboxes.create(network=network, ttl=600)


def status_of(answer: dict[str, str]) -> str:
    """The status line of the proxy's last answer ('' when it answered nothing)."""
    lines = [line for line in answer["data"].split("\r\n") if line.startswith("HTTP/1.")]
    return lines[-1] if lines else ""


# -- policy validation ---------------------------------------------------------


def test_cidrs_over_the_node_the_sandboxes_or_metadata_are_refused(stack: Stack) -> None:
    node = [a for a in node_addresses() if not a.startswith("127.")]
    cases = {
        "10.213.0.0/16": "sandbox subnet",
        "10.0.0.0/8": "sandbox subnet",
        "10.213.0.1/32": "sandbox subnet",
        "203.0.113.0/24": f"address of this node ({HOST_END})",
        f"{HOST_END}/32": f"address of this node ({HOST_END})",
        "192.0.0.192/32": "192.0.0.0/24",  # Oracle Cloud's metadata service
        "100.100.100.200/32": "100.100.100.200/32",  # Alibaba Cloud's metadata service
        **{f"{a}/32": f"address of this node ({a})" for a in node},
    }
    sandboxes = client(stack).sandboxes
    with create(stack, "none") as sb:
        for cidr, names in cases.items():
            policy = NetworkPolicy.allowlist(cidrs=[cidr])
            with pytest.raises(orchard.InvalidRequestError) as at_create:
                sandboxes.create(network=policy, ttl=60)
            with pytest.raises(orchard.InvalidRequestError) as at_update:
                sb.set_network("allowlist", cidrs=[cidr])
            for raised in (at_create.value, at_update.value):
                assert cidr in str(raised) and names in str(raised), (cidr, str(raised))
        assert sb.info().network.mode == "none"
    # A neighbour of the node's address is still a fine destination.
    with create(stack, NetworkPolicy.allowlist(cidrs=["203.0.113.8/29"])) as sb:
        assert sb.info().network.cidrs == ("203.0.113.8/29",)


# -- the egress proxy: destinations are checked after resolution ----------------


def test_the_proxy_never_reaches_an_address_of_the_node(
    stack: Stack, host_service: HostService
) -> None:
    port = host_service.port
    targets = [HOST_END, GATEWAY, *node_addresses()]
    with create(stack, "internet") as sb:
        for address in targets:
            tunnel = send(sb, [connect_head(f"{address}:{port}")])
            assert " 403 " in status_of(tunnel), (address, tunnel)
            plain = send(sb, [get_head(f"{address}:{port}")])
            assert " 403 " in status_of(plain), (address, plain)
            assert "no sandbox may reach it" in plain["data"], (address, plain)
    assert host_service.accepted == 0


IP_SPELLINGS = [
    "3405803777",  # 203.0.113.1 as one decimal number
    "0xcb007101",  # ... in hex
    "0313.0.0161.01",  # ... in octal parts
    "203.0.28929",  # ... as a.b.c
    "0xcb.0.0x71.1",
    "203.0.113.1.",  # trailing dot
    "2130706433",  # 127.0.0.1
    "0x7f.1",
    "127.1",
    "0",
    "[::ffff:203.0.113.1]",  # IPv4-mapped IPv6
    "[::ffff:cb00:7101]",
    "[::ffff:127.0.0.1]",
    "[::1]",
    "[64:ff9b::cb00:7101]",  # NAT64
    "[fe80::1]",
]


@pytest.mark.parametrize("mode", ["internet", "allowlist"])
def test_other_spellings_of_node_addresses_are_refused(
    stack: Stack, host_service: HostService, mode: str
) -> None:
    port = host_service.port
    policy = "internet" if mode == "internet" else NetworkPolicy.allowlist(domains=["allowed.test"])
    with create(stack, policy) as sb:
        for spelling in IP_SPELLINGS:
            for head in (connect_head(f"{spelling}:{port}"), get_head(f"{spelling}:{port}")):
                answer = send(sb, [head])
                assert status_of(answer).split(" ")[1:2] in (["400"], ["403"]), (spelling, answer)
            # The same spelling in the Host header of an allowed URL.
            forged = (
                f"GET http://allowed.test/ HTTP/1.1\r\nHost: {spelling}:{port}\r\n\r\n".encode()
            )
            assert " 403 " in status_of(send(sb, [forged])), spelling
    assert host_service.accepted == 0


def test_names_that_resolve_to_the_node_are_not_followed(
    stack: Stack, host_service: HostService
) -> None:
    port = host_service.port
    for policy in ("internet", NetworkPolicy.allowlist(domains=["node.test", "allowed.test"])):
        with create(stack, policy) as sb:
            assert py(sb, RESOLVE, "node.test") == "err gaierror"  # the forwarder hides it
            assert " 502 " in status_of(send(sb, [connect_head(f"node.test:{port}")]))
            assert py(sb, FETCH, f"http://node.test:{port}/", PROXY).startswith("http 502")
            # A redirect from an allowed host to the node is a new request, refused too.
            redirect = f"http://allowed.test/redirect?to=http://{HOST_END}:{port}/"
            assert py(sb, FETCH, redirect, PROXY).startswith("http 403")
            redirect = f"http://allowed.test/redirect?to=http://node.test:{port}/"
            assert py(sb, FETCH, redirect, PROXY).startswith("http 502")
    assert host_service.accepted == 0


# -- TLS: the SNI check holds whatever the pieces ------------------------------


def test_a_clienthello_in_pieces_is_reassembled_and_checked(stack: Stack) -> None:
    with create(stack, NetworkPolicy.allowlist(domains=["allowed.test"])) as sb:
        head = connect_head("allowed.test:443")
        forged = client_hello("evil.test")
        honest = client_hello("allowed.test")
        # Byte pieces (TCP segments) and TLS records of a few bytes each.
        for pieces in (
            [forged[:1], forged[1:5], forged[5:9], forged[9:]],
            [forged[:20], forged[20:]],
            [client_hello("evil.test", record_size=8)],
            [client_hello("allowed.test", "evil.test")],  # two server_name extensions
        ):
            answer = send(sb, [head, *pieces])
            assert " 200 " in answer["data"], answer
            assert "tls-echo" not in answer["data"], pieces
            assert answer["state"] == "closed"
        # The honest hello still goes through, in pieces or not.
        for pieces in ([honest], [honest[:3], honest[3:]], [client_hello("allowed.test", record_size=16)]):  # fmt: skip
            answer = send(sb, [head, *pieces])
            assert "tls-echo 203.0.113.10" in answer["data"], answer
        # A tunnel that does not start with TLS (plain HTTP with another Host) is closed.
        plain = b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"
        answer = send(sb, [head, plain])
        assert "tls-echo" not in answer["data"] and answer["state"] == "closed"


# -- every request on a kept-alive connection is checked -----------------------


def test_every_request_on_a_kept_alive_connection_is_checked(stack: Stack) -> None:
    with create(stack, NetworkPolicy.allowlist(domains=["allowed.test"])) as sb:
        first = get_head("allowed.test:8080")
        # Pipelined in one segment: the second names a host outside the allowlist.
        for second in (
            get_head("evil.test:8080"),
            b"GET http://allowed.test:8080/ HTTP/1.1\r\nHost: evil.test:8080\r\n\r\n",
            connect_head("evil.test:443"),
            get_head("203.0.113.20:8080"),
        ):
            answer = send(sb, [first + second])
            # The allowed host saw the first request only; the proxy refused the second.
            assert "hosts=allowed.test:8080HTTP/1.1 403 " in answer["data"], answer
        # Two allowed requests on one connection are both served, each checked.
        answer = send(sb, [first + first])
        assert answer["data"].count("hosts=allowed.test:8080") == 2, answer
        # A body is copied exactly (sized or chunked, with Expect answered by the proxy),
        # and what follows it is the next request, checked in turn.
        body = b"x\r\nHost: in-body\r\n"
        sized = (
            b"POST http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test:8080\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        chunked = (
            b"POST http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test:8080\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
        for post in (sized, chunked):
            answer = send(sb, [post + first + get_head("evil.test:8080")])
            assert "hosts=allowed.test:8080,in-body" in answer["data"], answer
            assert "hosts=allowed.test:8080HTTP/1.1 403 " in answer["data"], answer
        # Request bodies are framed, not guessed: both lengths at once is smuggling.
        both = (
            b"POST http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test:8080\r\n"
            b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        )
        assert " 400 " in status_of(send(sb, [both]))


# -- per-sandbox caps and idle timeouts ----------------------------------------


def test_one_sandbox_cannot_hold_the_proxy(stack: Stack) -> None:
    cap = int(LIMITS["ORCHARD_NET_PROXY_MAX_CONNECTIONS"])
    policy = NetworkPolicy.allowlist(domains=["allowed.test"])
    with create(stack, policy) as attacker, create(stack, policy) as other:
        answer = py(attacker, HOLD, str(cap))
        assert answer.startswith("answer HTTP/1.1 429"), answer
        assert f"{cap} open proxy connections" in answer
        # Another sandbox is served meanwhile, and the attacker again once it lets go.
        assert py(other, FETCH, "http://allowed.test/", PROXY) == "ok host=203.0.113.10"
        assert py(attacker, FETCH, "http://allowed.test/", PROXY) == "ok host=203.0.113.10"


def test_idle_tunnels_and_silent_clients_are_closed(stack: Stack) -> None:
    idle = float(LIMITS["ORCHARD_NET_PROXY_IDLE_SECONDS"])
    with create(stack, NetworkPolicy.allowlist(domains=["allowed.test"])) as sb:
        head = connect_head("allowed.test:443")
        answer = send(sb, [head, client_hello("allowed.test")], wait=idle * 4)
        assert "tls-echo" in answer["data"] and answer["state"] == "closed", answer
        # A tunnel that never sends its ClientHello, and a client that never ends its head.
        assert send(sb, [head], wait=idle * 4)["state"] == "closed"
        assert send(sb, [b"GET http://allowed.test/ HTTP/1.1\r\n"], wait=30)["state"] == "closed"


def test_a_dns_flood_holds_a_bounded_number_of_sockets(
    stack: Stack, internet: FakeInternet
) -> None:
    bound = int(LIMITS["ORCHARD_NET_DNS_MAX_UPSTREAM"])
    most = 0
    with create(stack, "internet") as sb:
        flood = threading.Thread(target=lambda: result.append(py(sb, DNS_FLOOD, "400")))
        result: list[str] = []
        flood.start()
        while flood.is_alive():
            out = subprocess.run(
                ["ss", "-u", "-a", "-n", "-H", "dst", internet.dns],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            most = max(most, len(out.splitlines()))
            time.sleep(0.05)
        flood.join()
        assert result and result[0].startswith("refused ")
        # Past its pending cap, the sandbox is told so (REFUSED), not silently dropped.
        assert int(result[0].split()[1]) >= 400 - int(LIMITS["ORCHARD_NET_DNS_MAX_PENDING"])
        assert py(sb, RESOLVE, "allowed.test") == "ok 203.0.113.10"
    assert 0 < most <= bound, most
