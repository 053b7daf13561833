"""The gateway group's variables as one address (issue 52): what must hold before two gateways or
more can share `gateway_vip` (voltafleet/front/pair.py decides the rest). The inventory loader
refuses an inventory that breaks them, naming the host, the file and the key, before any host
is touched; the gateway role checks the same in a run given other values (`pyinfra --data`).

    >>> problems([("gw", {"gateway_vip": None}, None)])  # one gateway: nothing to agree on
    []
"""
from __future__ import annotations

import ipaddress

SHARED = ("gateway_vip", "gateway_vip_prefix", "gateway_vrrp_router_id", "gateway_bind", "gateway_peers_port",
          "gateway_budget_peer_port")


def address(name: str, gateway_address: str | None, ssh_hostname: str | None) -> str:
    """Where the other gateways reach gateway `name`: its gateway_address, else its ssh_hostname, else its name."""
    return gateway_address or ssh_hostname or name


def _ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def problems(gateways: list[tuple[str, dict, str | None]]) -> list[tuple[str, str, str, str]]:
    """(host, key, what, fix) for each reason the gateway group cannot run as one address; [] when it can
    (one gateway always can)."""
    if len(gateways) < 2:
        return []
    out = []
    names = ", ".join(n for n, _, _ in gateways)
    first_name, first, _ = gateways[0]
    for name, cfg, ssh_hostname in gateways:
        if not cfg["gateway_vip"]:
            out.append((name, "gateway_vip", f"is null, but the gateway group holds {len(gateways)} hosts ({names}): "
                        "without one address the clients would need a list of gateways",
                        "set gateway_vip to a free address on the gateways' network (group_vars/gateway.yml)"))
            continue
        for key in SHARED:
            if cfg[key] != first[key]:
                out.append((name, key, f"is {cfg[key]!r}, {first_name}'s is {first[key]!r}: the gateways of one "
                            "address must agree", f"set {key} once for the gateway group (group_vars/gateway.yml)"))
        host = cfg["gateway_bind"].rsplit(":", 1)[0].strip("[]")
        if host not in (cfg["gateway_vip"], "0.0.0.0", "*", ""):
            out.append((name, "gateway_bind", f"is {cfg['gateway_bind']}, not on gateway_vip {cfg['gateway_vip']}: "
                        "clients would reach one gateway, not the one holding the address",
                        f'set gateway_bind: "{cfg["gateway_vip"]}:{cfg["gateway_bind"].rsplit(":", 1)[1]}"'))
        me = address(name, cfg.get("gateway_address"), ssh_hostname)
        if not _ipv4(me) or ipaddress.ip_address(me).is_loopback:
            out.append((name, "gateway_address", f"is {me!r} (gateway_address, else ssh_hostname): the other gateways "
                        "need this gateway's own IPv4 address (VRRP unicast, peers, the source its token counts "
                        "are answered to)", "set gateway_address to the host's address on the gateways' network"))
        elif me == cfg["gateway_vip"]:
            out.append((name, "gateway_address", f"is the shared address {me}",
                        "set gateway_address to the host's own address, not gateway_vip"))
    addresses = [address(n, c.get("gateway_address"), h) for n, c, h in gateways]
    for name, a in zip([n for n, _, _ in gateways], addresses):
        if addresses.count(a) > 1:
            out.append((name, "gateway_address", f"is {a}, another gateway's too",
                        "give each gateway its own gateway_address"))
    return out
