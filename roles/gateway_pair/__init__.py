"""Gateway pair: the fleet's one address (gateway_vip) on a live gateway, when the gateway group
holds two hosts or more (voltafleet/front/pair.py decides who holds it first and what each sends).

keepalived from the distribution, VRRP unicast between the gateways, its health check HAProxy's own
answer on the stats frontend. A new configuration is checked with `keepalived --config-test` before
it replaces the running one, then keepalived reloads (the address stays where it is). With one
gateway this role does nothing: keepalived is neither installed nor touched.
"""
from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files, systemd

from roles.gateway_api import fleet_pair
from roles.run import changes
from voltafleet.front import pair

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "keepalived.conf.j2"


@operation()
def installed(staged: str, live: str, staged_op=None):
    """Check the staged keepalived configuration, then install it and reload keepalived.

    .. code:: python

        gateway_pair.installed(staged="/etc/keepalived/keepalived.conf.voltafleet", live="/etc/keepalived/keepalived.conf")
    """
    if not changes(staged_op) and host.get_fact(Sha1File, path=live) == host.get_fact(Sha1File, path=staged):
        return
    q = shlex.quote
    # keepalived 2.2.7 (Debian 12) kills its own config test when a script runs as another user than root
    # (acassen/keepalived#2587, fixed in 2.2.8): the test reads a copy whose script_user alone is root
    test = f"{staged}.test"
    yield (f"sed 's/^    script_user .*/    script_user root/' {q(staged)} > {q(test)} && keepalived --config-test -f {q(test)}; "
           f"rc=$?; rm -f {q(test)}; [ $rc -eq 0 ] || {{ echo 'voltafleet: the new keepalived configuration is invalid "
           f"(keepalived --config-test: '$rc'); the running one is untouched' >&2; exit 1; }}")
    yield f"cp {q(staged)} {q(live)}.tmp && mv -f {q(live)}.tmp {q(live)}"
    yield "systemctl reload-or-restart keepalived"


@deploy("Gateway pair")
def gateway_pair() -> None:
    """keepalived holding gateway_vip on the live gateway of the group (nothing with one gateway).

    .. code:: python

        gateway_pair()
    """
    p = fleet_pair(host.state)
    if p is None:
        return
    apt.packages(name="keepalived and curl (its check of HAProxy)", packages=["keepalived", "curl"],
                 update=True, cache_time=24 * 3600, no_recommends=True)
    files.directory(name="keepalived's folder", path=str(Path(pair.KEEPALIVED_CONF).parent), mode="755")
    files.directory(name="keepalived's drop-in folder", path=str(Path(pair.KEEPALIVED_DROPIN).parent), mode="755")
    dropin = files.put(name="keepalived starts once this gateway's own address is up (drop-in)",
                       src=StringIO(p.keepalived_dropin(host.name)), dest=pair.KEEPALIVED_DROPIN, mode="644")
    staged = files.template(
        name=f"keepalived: {p.vip} (priority {p.priority(host.name)} of {len(p.members)} gateways, staged)",
        src=str(TEMPLATE), dest=pair.KEEPALIVED_STAGED, mode="644",
        jinja_env_kwargs={"trim_blocks": True, "lstrip_blocks": True}, **p.keepalived_vars(host.name))
    installed(name="Check (keepalived --config-test), then install and reload", staged=pair.KEEPALIVED_STAGED,
              live=pair.KEEPALIVED_CONF, staged_op=staged)
    systemd.service(name="keepalived running and enabled", service="keepalived", running=True, enabled=True,
                    daemon_reload=changes(dropin))
