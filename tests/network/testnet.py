"""A fake "internet" for the network tests: a network namespace the test
creates itself, routed from the host over its own veth, with test hosts in it.

    203.0.113.1   the host's end of the veth (TEST-NET-3, RFC 5737)
    203.0.113.10  allowed.test   (HTTP :80, TLS stand-in :443, DNS :53)
    203.0.113.20  evil.test
    203.0.113.30  other.test

``rebind.test`` resolves to 10.99.0.5 (a private address behind an allowed
name: the proxy must refuse it), ``node.test`` to 203.0.113.1 (this host's
own end of the veth: a public address of the node behind a name). Before anything is used the fixture checks
that the host routes 203.0.113.0/24 into this namespace, so no test packet
can leave the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.stack import Stack, running_stack

HOSTS = {
    "allowed.test": "203.0.113.10",
    "evil.test": "203.0.113.20",
    "other.test": "203.0.113.30",
    "rebind.test": "10.99.0.5",
    "node.test": "203.0.113.1",
}
HOST_END = "203.0.113.1"
DNS = "203.0.113.10"


def _ip(*args: str, netns: str | None = None) -> str:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


@dataclass(frozen=True)
class FakeInternet:
    netns: str
    host_link: str

    @property
    def dns(self) -> str:
        return f"{DNS}:53"


@contextmanager
def fake_internet() -> Iterator[FakeInternet]:
    tag = f"{os.getpid() % 100000}"
    netns, host_link = f"orchtest-inet-{tag}", f"otin{tag}"
    server: subprocess.Popen[str] | None = None
    _ip("netns", "add", netns)
    try:
        _ip("link", "add", host_link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("addr", "add", "203.0.113.1/24", "dev", host_link)
        _ip("link", "set", host_link, "up")
        for address in ("203.0.113.10", "203.0.113.20", "203.0.113.30"):
            _ip("addr", "add", f"{address}/24", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        _ip("link", "set", "lo", "up", netns=netns)
        _ip("route", "add", "default", "via", "203.0.113.1", netns=netns)
        route = _ip("route", "get", "203.0.113.10")
        assert f"dev {host_link}" in route, (
            f"203.0.113.10 is not routed into the test netns: {route}"
        )
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable,
             str(Path(__file__).with_name("hosts_server.py")), DNS, json.dumps(HOSTS)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        yield FakeInternet(netns, host_link)
    finally:
        if server is not None:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        subprocess.run(["ip", "link", "del", host_link], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


@contextmanager
def stack_on(
    internet: FakeInternet, home: Path, env: dict[str, str] | None = None
) -> Iterator[Stack]:
    """``orchard up`` in ``home`` whose egress resolves through ``internet``'s DNS,
    started with ``env`` on top (the variables are put back afterwards)."""
    wanted = {"ORCHARD_NET_DNS_UPSTREAM": internet.dns, **(env or {})}
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        with running_stack(home) as stack:
            yield stack
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
