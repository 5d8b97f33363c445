"""The nftables rules of the local network, as ``nft -f`` scripts.

Two tables, shared by every backend on the host:

- ``bridge orchard`` (layer 2, on the bridge ports): a sandbox's veth may only
  send IPv4 and ARP from its own address (the ``bound`` set of
  ``veth . address``), never IPv6, and never to another sandbox's port
  (besides the ports being ``isolated``).
- ``inet orchard`` (layer 3): packets from the bridge are judged by their
  (anti-spoofed) source address through verdict maps: ``egress`` jumps to the
  sandbox's own chain ``sb_<id>`` (its policy: every packet, so a tightened
  policy also stops connections already open), ``redirects`` to ``nat_<id>``
  (the proxy's and DNS forwarder's ports of the backend that owns it). Input
  from the bridge is refused except those redirected connections, so no
  sandbox reaches the gateway, scheduler, executor or any host port. Egress is
  masqueraded.

Every per-sandbox change is one ``nft -f`` run, one atomic transaction.
"""

from __future__ import annotations

import ipaddress
import subprocess

from .addresses import nft_name, veth_name
from .policy import MODE_INTERNET, NEVER_ALLOWED, PRIVATE, NetworkPolicySpec
from .settings import DNS_PORT_IN_SANDBOX, PROXY_PORT_IN_SANDBOX, NetworkSettings

TABLE = "orchard"
REJECT = "reject with icmpx type admin-prohibited"


class NftError(RuntimeError):
    pass


def run_nft(script: str) -> None:
    proc = subprocess.run(
        ["nft", "-f", "-"], input=script, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise NftError(f"nft failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def table_exists() -> bool:
    proc = subprocess.run(["nft", "list", "table", "inet", TABLE], capture_output=True, check=False)
    return proc.returncode == 0


def base_script(settings: NetworkSettings) -> str:
    """Both tables with their base chains (run once, under the host lock)."""
    br = settings.bridge
    never = ", ".join(
        [*(str(n) for n in NEVER_ALLOWED), str(settings.network), *settings.deny_cidrs]
    )
    private = ", ".join(str(n) for n in PRIVATE)
    return f"""
table bridge {TABLE} {{
  set bound {{ type ifname . ipv4_addr; }}
  chain prerouting {{
    type filter hook prerouting priority -200; policy accept;
    iifname "ov*" ether type ip6 drop
    iifname "ov*" ether type ip iifname . ip saddr != @bound drop
    iifname "ov*" ether type arp iifname . arp saddr ip != @bound drop
  }}
  chain forward {{
    type filter hook forward priority 0; policy accept;
    iifname "ov*" oifname "ov*" drop
  }}
}}
table inet {TABLE} {{
  set never {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {never} }}; }}
  set private {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {private} }}; }}
  map egress {{ type ipv4_addr : verdict; }}
  map redirects {{ type ipv4_addr : verdict; }}
  chain forward {{
    type filter hook forward priority 0; policy accept;
    iifname "{br}" meta nfproto ipv6 drop
    iifname "{br}" ip daddr @never {REJECT}
    iifname "{br}" ip saddr vmap @egress
    iifname "{br}" {REJECT}
    oifname "{br}" ct state established,related accept
    oifname "{br}" drop
  }}
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname "{br}" ct status dnat accept
    iifname "{br}" {REJECT}
  }}
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "{br}" ip saddr vmap @redirects
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {settings.network} oifname != "{br}" masquerade
  }}
}}
"""


def delete_tables_script() -> str:
    return f"delete table bridge {TABLE}\ndelete table inet {TABLE}\n"


def _declare(sandbox_id: str, address: ipaddress.IPv4Address) -> list[str]:
    """Every per-sandbox object, added (idempotent) so a flush or delete always finds it."""
    n = nft_name(sandbox_id)
    return [
        f"add chain inet {TABLE} sb_{n}",
        f"add chain inet {TABLE} nat_{n}",
        f"add set inet {TABLE} allow_{n} {{ type ipv4_addr; flags interval; auto-merge; }}",
        f"add set inet {TABLE} ports_{n} {{ type inet_service; }}",
        f"add element inet {TABLE} egress {{ {address} : jump sb_{n} }}",
        f"add element inet {TABLE} redirects {{ {address} : jump nat_{n} }}",
        f'add element bridge {TABLE} bound {{ "{veth_name(sandbox_id)}" . {address} }}',
    ]


def apply_script(
    sandbox_id: str,
    address: ipaddress.IPv4Address,
    policy: NetworkPolicySpec,
    settings: NetworkSettings,
    proxy_port: int,
    dns_port: int,
) -> str:
    """Install or replace the sandbox's rules for ``policy`` (atomically)."""
    n = nft_name(sandbox_id)
    gw = settings.gateway
    lines = _declare(sandbox_id, address)
    lines += [
        f"flush chain inet {TABLE} sb_{n}",
        f"flush chain inet {TABLE} nat_{n}",
        f"flush set inet {TABLE} allow_{n}",
        f"flush set inet {TABLE} ports_{n}",
        f"add rule inet {TABLE} nat_{n} ip daddr {gw} udp dport {DNS_PORT_IN_SANDBOX}"
        f" redirect to :{dns_port}",
        f"add rule inet {TABLE} nat_{n} ip daddr {gw} tcp dport {PROXY_PORT_IN_SANDBOX}"
        f" redirect to :{proxy_port}",
    ]
    if policy.mode == MODE_INTERNET:
        lines += [
            f"add rule inet {TABLE} sb_{n} ip daddr @private {REJECT}",
            f"add rule inet {TABLE} sb_{n} accept",
        ]
    else:
        if policy.cidrs:
            lines.append(f"add element inet {TABLE} allow_{n} {{ {', '.join(policy.cidrs)} }}")
        if policy.ports:
            ports = ", ".join(str(p) for p in policy.ports)
            lines.append(f"add element inet {TABLE} ports_{n} {{ {ports} }}")
            lines.append(
                f"add rule inet {TABLE} sb_{n} ip daddr @allow_{n}"
                f" meta l4proto {{ tcp, udp }} th dport @ports_{n} accept"
            )
        else:
            lines.append(f"add rule inet {TABLE} sb_{n} ip daddr @allow_{n} accept")
        lines.append(f"add rule inet {TABLE} sb_{n} {REJECT}")
    return "\n".join(lines) + "\n"


def remove_script(sandbox_id: str, address: ipaddress.IPv4Address) -> str:
    """Remove every per-sandbox object; declares them first, so it never fails on a missing one."""
    n = nft_name(sandbox_id)
    lines = _declare(sandbox_id, address)
    lines += [
        f"delete element inet {TABLE} egress {{ {address} }}",
        f"delete element inet {TABLE} redirects {{ {address} }}",
        f'delete element bridge {TABLE} bound {{ "{veth_name(sandbox_id)}" . {address} }}',
        f"flush chain inet {TABLE} sb_{n}",
        f"flush chain inet {TABLE} nat_{n}",
        f"delete chain inet {TABLE} sb_{n}",
        f"delete chain inet {TABLE} nat_{n}",
        f"delete set inet {TABLE} allow_{n}",
        f"delete set inet {TABLE} ports_{n}",
    ]
    return "\n".join(lines) + "\n"


def sandbox_objects() -> list[str]:
    """Names of every per-sandbox chain and set in the table (for leak checks)."""
    proc = subprocess.run(
        ["nft", "-t", "list", "table", "inet", TABLE], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return []
    names = []
    for line in proc.stdout.splitlines():
        words = line.split()
        if (
            len(words) >= 2
            and words[0] in ("chain", "set")
            and words[1].startswith(("sb_", "nat_", "allow_", "ports_"))
        ):
            names.append(words[1])
    return names
