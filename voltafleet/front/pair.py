"""Two gateways or more behind one address (issue 52): decided once from the gateway group's
variables, pure (no pyinfra).

- **One address.** keepalived on every gateway holds `gateway_vip` on the live one (VRRP, unicast
  to the other gateways: no multicast needed). Its health check is HAProxy itself answering on its
  own stats frontend (ALIVE_PATH), not only its process: a gateway whose HAProxy stops answering
  gives the address up within about two seconds, a dead host within three adverts (~3.6 s). The
  first gateway of the inventory has the highest priority and takes the address back once it has
  been healthy for `gateway_vrrp_preempt_delay_s`. HAProxy binds the address on every gateway
  (`transparent`: a socket may bind an address the host does not hold yet), so the one that gets it
  serves at once, without a reload.
- **One set of limits.** The teams' table (requests in flight, per minute) is one HAProxy `peers`
  section across the gateways: every entry a gateway updates is pushed to the others, so the
  gateway that takes the address over continues each team's counts. The token budgets' counts are
  each gateway's own files (voltafleet/front/budgets.py); every gateway reads the others' counts
  every `gateway_budget_peer_poll_ms` on their budget port (SPENT_PATH, answered to the other
  gateways' addresses only) and adds them to its own before it admits a request.

    >>> p = decide([("gw1", settings.replace(gateway_address="10.0.0.11"), None),
    ...             ("gw2", settings.replace(gateway_address="10.0.0.12"), None)])
    >>> p.priority("gw1"), p.priority("gw2"), [m.address for m in p.others("gw1")]
    (150, 140, ['10.0.0.12'])
"""
from __future__ import annotations

from dataclasses import dataclass

from voltafleet.inputs.pairvars import address
from voltafleet.inputs.settings import Settings

PEERS = "vf_gateways"                      # HAProxy's peers section
ALIVE_PATH = "/voltafleet/alive"           # on the stats frontend: keepalived's check of HAProxy itself
SPENT_PATH = "/voltafleet/budgets/spent"   # on the budget port: this gateway's own token counts
KEEPALIVED_CONF = "/etc/keepalived/keepalived.conf"
KEEPALIVED_STAGED = "/etc/keepalived/keepalived.conf.voltafleet"
KEEPALIVED_DROPIN = "/etc/systemd/system/keepalived.service.d/voltafleet.conf"
ADDRESS_WAIT_S = 30                        # how long keepalived's start waits for the gateway's own address
TOP_PRIORITY = 150                         # the first gateway's; each next one 10 lower
EXAMPLE = {"gateway_vip": "10.0.0.10", "gateway_vip_prefix": 24, "gateway_vip_interface": "eth0",
           "gateway_vrrp_router_id": 52, "gateway_vrrp_preempt_delay_s": 60, "gateway_address": None,
           "gateway_peers_port": 10000, "gateway_budget_peer_port": 10001, "gateway_budget_peer_poll_ms": 1000,
           "gateway_bind": "10.0.0.10:8000", "gateway_metrics_bind": "127.0.0.1:8404"}


@dataclass(frozen=True)
class Member:
    name: str
    address: str       # where the other gateways reach it (VRRP, peers, its counts)
    alive_url: str     # its HAProxy's own check, from the host itself


@dataclass(frozen=True)
class Pair:
    vip: str
    prefix: int
    interface: str
    router_id: int
    preempt_delay_s: int
    peers_port: int
    budget_port: int
    poll_ms: int
    members: tuple[Member, ...]

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    def priority(self, name: str) -> int:
        return TOP_PRIORITY - 10 * [m.name for m in self.members].index(name)

    def others(self, name: str) -> list[Member]:
        return [m for m in self.members if m.name != name]

    def keepalived_vars(self, name: str) -> dict:
        """Everything templates/keepalived.conf.j2 reads, for gateway `name`."""
        me = self.member(name)
        return dict(gateway=name, vip=self.vip, prefix=self.prefix, interface=self.interface, router_id=self.router_id,
                    priority=self.priority(name), preempt_delay_s=self.preempt_delay_s, address=me.address,
                    peers=[m.address for m in self.others(name)], alive_url=me.alive_url)

    def keepalived_dropin(self, name: str) -> str:
        """keepalived's systemd drop-in on gateway `name`: it starts once the gateway's own address (its
        unicast_src) is on an interface. keepalived 2.2.7 puts a VRRP instance whose unicast_src is not
        there yet into FAULT for good ("src address not configured"), and network-online.target does not
        wait for it everywhere (the lab's systemd-networkd reaches it before the link is up): a gateway that
        boots after a power cut would never take the fleet's address back, nor stand by for it."""
        address = self.member(name).address
        return ("# voltafleet (roles/gateway_pair): keepalived starts once this gateway's own address is up\n"
                "[Unit]\nWants=network-online.target\nAfter=network-online.target\n\n[Service]\n"
                f"ExecStartPre=/bin/sh -c 'i=0; until ip -4 -o addr show | grep -qF \" inet {address}/\"; do "
                f"i=$$((i+1)); [ $$i -ge {ADDRESS_WAIT_S * 10} ] && exit 1; sleep 0.1; done'\n"  # $$: systemd's $
                "Restart=on-failure\nRestartSec=5s\n")

    def haproxy_vars(self, name: str) -> dict:
        """The HAProxy template's `pair` block, for gateway `name`."""
        others = self.others(name)
        return dict(peers=PEERS, local=name, port=self.peers_port, members=self.members, alive_path=ALIVE_PATH,
                    budget_bind=f"{self.member(name).address}:{self.budget_port}", spent_path=SPENT_PATH,
                    other_addresses=" ".join(m.address for m in others), poll_ms=self.poll_ms,
                    budget_peers=" ".join(f"{m.name}=http://{m.address}:{self.budget_port}{SPENT_PATH}" for m in others))


def alive_url(cfg: Settings) -> str:
    """The HAProxy check keepalived runs on the gateway itself: its stats frontend (a wildcard bind: loopback)."""
    host, port = cfg.gateway.metrics_bind.rsplit(":", 1)
    host = host.strip("[]")
    return f"http://{'127.0.0.1' if host in ('', '*', '0.0.0.0', '::') else host}:{port}{ALIVE_PATH}"


def decide(gateways: list[tuple[str, Settings, str | None]]) -> Pair | None:
    """The pair from the gateway group's hosts (name, variables, ssh_hostname) in inventory order;
    None for one gateway or none (no keepalived, no peers). Assumes problems() found none (the
    inventory loader refuses such an inventory: voltafleet/inputs/pairvars.py)."""
    if len(gateways) < 2:
        return None
    cfg = gateways[0][1]
    return Pair(vip=cfg.gateway.vip, prefix=cfg.gateway.vip_prefix, interface=cfg.gateway.vip_interface,
                router_id=cfg.gateway.vrrp_router_id, preempt_delay_s=cfg.gateway.vrrp_preempt_delay_s,
                peers_port=cfg.gateway.peers_port, budget_port=cfg.gateway.budget_peer_port,
                poll_ms=cfg.gateway.budget_peer_poll_ms,
                members=tuple(Member(n, address(n, c.gateway.address, h), alive_url(c)) for n, c, h in gateways))
