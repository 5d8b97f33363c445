"""Network policy on real runc sandboxes, through a real ``orchard up`` and the SDK.

Every destination is a test host in a network namespace this module creates
(``testnet.fake_internet``: 203.0.113.0/24, routed only into that namespace)
or an address on this host; nothing leaves the machine. Real veths, the real
bridge, real nftables, the real egress proxy and DNS forwarder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchard.scheduler.backends.netpolicy.nftables import table_exists
from orchard.scheduler.backends.netpolicy.settings import NetworkSettings

from orchard import NetworkPolicy, Orchard, Sandbox
from tests.stack import REQUIRES_STACK, Stack, running_stack

from .leftovers import network_leftovers
from .testnet import FakeInternet, fake_internet

pytestmark = [*REQUIRES_STACK, pytest.mark.skipif(
    not os.path.exists("/usr/sbin/nft"), reason="needs nftables")]  # fmt: skip

SETTINGS = NetworkSettings()
GATEWAY = str(SETTINGS.gateway)

# Python run inside the sandbox: prints "ok <first line of the answer>" or "err <errno name>".
CONNECT = """
import errno, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((host, port), timeout=3)
    s.sendall(b"GET / HTTP/1.0\\r\\nHost: " + host.encode() + b"\\r\\n\\r\\n")
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    print("ok", data.decode(errors="replace").splitlines()[-1] if data else "")
except OSError as e:
    print("err", errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__)
"""
FETCH = """
import sys, urllib.request, urllib.error
try:
    print("ok", urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except urllib.error.HTTPError as e:
    print("http", e.code, e.read().decode().strip())
except OSError as e:
    print("err", e)
"""
RESOLVE = """
import socket, sys
try:
    print("ok", socket.gethostbyname(sys.argv[1]))
except OSError as e:
    print("err", type(e).__name__)
"""
# A CONNECT through the proxy, then a TLS ClientHello carrying the given SNI.
TUNNEL = r"""
import os, socket, struct, sys
target, sni = sys.argv[1], sys.argv[2].encode()
s = socket.create_connection((os.environ["HTTPS_PROXY"].split("//")[1].split(":")[0], 3128), timeout=5)
s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
head = s.recv(4096).decode().splitlines()[0]
if " 200 " not in head:
    print("refused", head); sys.exit()
name = struct.pack("!BH", 0, len(sni)) + sni
ext = struct.pack("!HH", 0, len(name) + 2) + struct.pack("!H", len(name)) + name
body = b"\x03\x03" + os.urandom(32) + b"\x00" + struct.pack("!H", 2) + b"\x13\x01" + b"\x01\x00"
body += struct.pack("!H", len(ext)) + ext
hello = b"\x01" + len(body).to_bytes(3, "big") + body
s.sendall(b"\x16\x03\x01" + struct.pack("!H", len(hello)) + hello)
try:
    data = s.recv(4096)
    print(("answer " + data.decode()) if data else "closed")
except OSError as e:
    print("closed", e)
"""
FORGED_HOST = r"""
import socket
s = socket.create_connection(("GATEWAY", 3128), timeout=5)
s.sendall(b"GET http://allowed.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n")
print(s.recv(4096).decode().splitlines()[0])
""".replace("GATEWAY", GATEWAY)


def py(sb: Sandbox, code: str, *args: str) -> str:
    result = sb.exec(["python3", "-c", code, *args], timeout=30)
    assert result.exit_code == 0, result.stderr_text
    return result.stdout_text.strip()


@pytest.fixture(scope="module")
def internet() -> Iterator[FakeInternet]:
    with fake_internet() as net:
        yield net


@pytest.fixture(scope="module")
def stack(internet: FakeInternet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    saved = os.environ.get("ORCHARD_NET_DNS_UPSTREAM")
    os.environ["ORCHARD_NET_DNS_UPSTREAM"] = internet.dns
    try:
        with running_stack(tmp_path_factory.mktemp("net-home")) as stack:
            yield stack
    finally:
        if saved is None:
            os.environ.pop("ORCHARD_NET_DNS_UPSTREAM", None)
        else:
            os.environ["ORCHARD_NET_DNS_UPSTREAM"] = saved


def create(stack: Stack, network: str | NetworkPolicy | None = None) -> Sandbox:
    key = (stack.home / "dev-api-key").read_text().strip()
    return Orchard(stack.endpoint, key).sandboxes.create(network=network, ttl=600)


def address_of(sb: Sandbox) -> str:
    return py(
        sb,
        "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        f"s.connect(('{GATEWAY}', 9)); print(s.getsockname()[0])",
    )


def test_none_has_no_route_at_all(stack: Stack) -> None:
    with create(stack) as sb:
        assert sb.info().network.mode == "none"
        assert py(sb, "import os; print(sorted(os.listdir('/sys/class/net')))") == "['lo']"
        assert py(sb, "print(open('/proc/net/route').read().count(chr(10)))") == "1"  # header only
        assert py(sb, CONNECT, "203.0.113.10", "80") == "err ENETUNREACH"
        assert py(sb, CONNECT, GATEWAY, "53") == "err ENETUNREACH"


def test_internet_reaches_public_hosts_but_not_the_host_or_private_nets(stack: Stack) -> None:
    listener = socket.create_server(("0.0.0.0", 0))  # a host service on every host address
    port = str(listener.getsockname()[1])
    host_address = (
        subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
        )
        .stdout.split()[3]
        .split("/")[0]
    )
    gateway_port = stack.endpoint.rsplit(":", 1)[1]
    try:
        with create(stack, "internet") as sb:
            executor_port = sb._access.address.rsplit(":", 1)[1]
            assert py(sb, CONNECT, "203.0.113.10", "80") == "ok host=203.0.113.10"
            assert py(sb, CONNECT, "203.0.113.20", "80") == "ok host=203.0.113.20"
            assert py(sb, RESOLVE, "other.test") == "ok 203.0.113.30"
            for target in (GATEWAY, host_address, "203.0.113.1"):
                for p in (port, gateway_port, executor_port):
                    assert py(sb, CONNECT, target, p).startswith("err"), (target, p)
            assert py(sb, CONNECT, "10.99.0.5", "80").startswith("err")
            assert py(sb, CONNECT, "169.254.169.254", "80").startswith("err")
            # The host itself can reach its listener: the refusal above is the policy.
            socket.create_connection((host_address, int(port)), timeout=2).close()
    finally:
        listener.close()


def test_allowlist_cidrs_and_ports(stack: Stack) -> None:
    policy = NetworkPolicy.allowlist(cidrs=["203.0.113.10/32"], ports=[80])
    with create(stack, policy) as sb:
        info = sb.info()
        assert (info.network.mode, info.network.cidrs, info.network.ports) == (
            "allowlist", ("203.0.113.10/32",), (80,))  # fmt: skip
        assert py(sb, CONNECT, "203.0.113.10", "80") == "ok host=203.0.113.10"
        assert py(sb, CONNECT, "203.0.113.10", "443").startswith("err")
        assert py(sb, CONNECT, "203.0.113.20", "80").startswith("err")


def test_policy_changes_take_effect_on_a_running_sandbox(stack: Stack) -> None:
    with create(stack) as sb:
        assert py(sb, CONNECT, "203.0.113.20", "80") == "err ENETUNREACH"
        assert sb.set_network("internet").network.mode == "internet"
        assert py(sb, CONNECT, "203.0.113.20", "80") == "ok host=203.0.113.20"
        sb.set_network("allowlist", cidrs=["203.0.113.10/32"])
        assert py(sb, CONNECT, "203.0.113.10", "80") == "ok host=203.0.113.10"
        assert py(sb, CONNECT, "203.0.113.20", "80").startswith("err")
        assert sb.info().network.cidrs == ("203.0.113.10/32",)
        sb.set_network("none")
        assert py(sb, "import os; print(sorted(os.listdir('/sys/class/net')))") == "['lo']"
        assert py(sb, CONNECT, "203.0.113.10", "80") == "err ENETUNREACH"
        assert network_leftovers(sb.id) == []


def test_domain_allowlist_through_the_proxy(stack: Stack) -> None:
    policy = NetworkPolicy.allowlist(domains=["allowed.test", "rebind.test"])
    with create(stack, policy) as sb:
        assert py(sb, RESOLVE, "allowed.test") == "ok 203.0.113.10"
        assert py(sb, RESOLVE, "evil.test") == "err gaierror"
        assert py(sb, FETCH, "http://allowed.test/") == "ok host=203.0.113.10"
        assert py(sb, FETCH, "http://evil.test/").startswith("http 403")
        assert py(sb, FETCH, "http://203.0.113.20/").startswith("http 403")
        # An allowed name that resolves to a private address is not followed.
        assert py(sb, FETCH, "http://rebind.test/").startswith("http 502")
        # Direct connections to the allowed name's address are not allowed: only the proxy.
        assert py(sb, CONNECT, "203.0.113.10", "80").startswith("err")


def test_forged_host_and_sni_are_refused(stack: Stack) -> None:
    with create(stack, NetworkPolicy.allowlist(domains=["allowed.test"])) as sb:
        assert py(sb, FORGED_HOST).startswith("HTTP/1.1 403")
        assert py(sb, TUNNEL, "allowed.test:443", "allowed.test") == "answer tls-echo 203.0.113.10"
        assert py(sb, TUNNEL, "allowed.test:443", "evil.test").startswith("closed")
        assert py(sb, TUNNEL, "evil.test:443", "allowed.test").startswith("refused HTTP/1.1 403")
        assert py(sb, TUNNEL, "203.0.113.20:443", "allowed.test").startswith("refused HTTP/1.1 403")


def test_sandboxes_cannot_reach_each_other(stack: Stack) -> None:
    with create(stack, "internet") as a, create(stack, "internet") as b:
        a.exec("nohup python3 -m http.server 8000 >/dev/null 2>&1 &", timeout=10)
        a_address = address_of(a)
        probe = "import socket,time\nfor _ in range(50):\n try: socket.create_connection(('127.0.0.1',8000),1).close(); break\n except OSError: time.sleep(0.1)"
        py(a, probe)
        assert py(a, CONNECT, a_address, "8000").startswith("ok")  # it serves
        assert py(b, CONNECT, a_address, "8000").startswith("err")
        assert address_of(b) != a_address


def test_delete_removes_veth_rules_and_lease(stack: Stack) -> None:
    sb = create(stack, NetworkPolicy.allowlist(cidrs=["203.0.113.0/24"], domains=["allowed.test"]))
    assert len(network_leftovers(sb.id)) >= 3  # the probe sees the live sandbox's network
    sb.delete()
    # The delete answers once the sandbox is DELETING; the teardown follows in the background.
    deadline = time.monotonic() + 20
    while network_leftovers(sb.id) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert network_leftovers(sb.id) == []


def test_update_errors_are_clear(stack: Stack) -> None:
    import orchard

    with create(stack) as sb:
        with pytest.raises(orchard.InvalidRequestError, match="cidrs"):
            sb.set_network("allowlist", cidrs=["not-a-net"])
        with pytest.raises(orchard.InvalidRequestError, match=r"169\.254"):
            sb.set_network("allowlist", cidrs=["169.254.0.0/16"])
        with pytest.raises(orchard.InvalidRequestError, match="only allowed with mode ALLOWLIST"):
            sb.set_network("internet", domains=["allowed.test"])
        assert sb.info().network.mode == "none"
    # DELETING until the background teardown is done, then DELETED.
    with pytest.raises(orchard.SandboxNotReadyError, match=r"DELET(ING|ED)"):
        Orchard(stack.endpoint, sb.config.api_key).sandboxes.connect(sb.id).set_network("internet")


def test_stack_stop_removes_the_bridge_and_tables(tmp_path: Path, internet: FakeInternet) -> None:
    """Run last (its own stack): once no sandbox uses it, nothing of the network remains."""
    with running_stack(tmp_path / "home") as stack:
        sb = create(stack, "internet")
        assert os.path.exists(f"/sys/class/net/{SETTINGS.bridge}")
        sb.delete()
    leases = SETTINGS.state_dir / "leases"
    if not (leases.is_dir() and any(leases.iterdir())):  # no other stack on the host uses it
        assert not os.path.exists(f"/sys/class/net/{SETTINGS.bridge}")
        assert not table_exists()
