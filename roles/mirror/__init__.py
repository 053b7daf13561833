"""Mirror: one download of the model per mirror host, not one per server host. Hosts of the
`mirror` group run Debian's nginx as a pull-through cache of model_url's origin
(templates/nginx-mirror.conf.j2): the slice module fetches and caches the file in
mirror_slice_mb pieces, so Range requests and resumed downloads work through it, and one
host fetches each piece while the others wait for it (proxy_cache_lock). Server hosts fetch
through it (voltafleet.models.mirror.fetch_url) and still verify the sha256.

Debian 12's `nginx` package has the slice module built in (nginx-light, -core and -full are
only sets of extra modules on top of it). A new configuration goes live only once `nginx -t`
accepts it; an invalid one is put back and leaves the running mirror untouched.
"""
from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.files import Sha1File
from pyinfra.operations import apt, files, systemd

from roles.gateway_api import is_server, server_address

from roles.run import changes, config, fleet_plan
from roles.facts import Nameservers
from voltafleet.models.mirror import allow_list, nginx_vars

TEMPLATE = Path(__file__).resolve().parents[2] / "templates" / "nginx-mirror.conf.j2"
LIVE = "/etc/nginx/conf.d/voltafleet-mirror.conf"
STAGED = "/etc/nginx/voltafleet-mirror.conf.staged"  # outside conf.d: nginx never reads it
DEFAULT_SITE = "/etc/nginx/sites-enabled/default"
PACKAGES = ["nginx", "ca-certificates"]


def install_command(staged: str, live: str) -> str:
    """Put the staged configuration in place, keep it only if `nginx -t` accepts nginx's whole
    configuration with it (else put the previous one back and fail), then reload."""
    q = shlex.quote
    prev = f"{live}.voltafleet-prev"
    return (f"if [ -e {q(live)} ]; then cp -p {q(live)} {q(prev)}; else rm -f {q(prev)}; fi"
            f" && cp {q(staged)} {q(live)}.tmp && mv -f {q(live)}.tmp {q(live)}"
            f" && if ! out=$(nginx -t 2>&1); then"
            f" if [ -e {q(prev)} ]; then mv -f {q(prev)} {q(live)}; else rm -f {q(live)}; fi;"
            f" echo 'voltafleet: the new mirror configuration is invalid; the running mirror is untouched' >&2;"
            f" echo \"$out\" >&2; exit 1; fi"
            f" && rm -f {q(prev)} && systemctl reload-or-restart nginx")


@operation()
def installed(staged: str, live: str, staged_op=None, site_op=None):
    """Install the staged nginx configuration after `nginx -t`, and reload nginx (also when
    only Debian's default site went: its port 80 closes).

    .. code:: python

        mirror.installed(staged="/etc/nginx/voltafleet-mirror.conf.staged",
                         live="/etc/nginx/conf.d/voltafleet-mirror.conf")
    """
    if not changes(staged_op) and not changes(site_op) and host.get_fact(Sha1File, path=live) == host.get_fact(Sha1File, path=staged):
        return
    yield install_command(staged, live)


def fetchers(state) -> list[str] | None:
    """The addresses the server hosts fetch from: the fleet plan's in a rollout, else each
    server host's as the gateway reaches it; None unless every one is an IP address."""
    plan = fleet_plan()
    if plan is not None:
        return allow_list([s.address for s in plan.servers])
    return allow_list([server_address(h) for h in state.inventory if is_server(h)])


@deploy("Mirror")
def mirror() -> None:
    """nginx caching the model for the server hosts (hosts of the `mirror` group).

    .. code:: python

        mirror()
    """
    cfg = config()
    apt.packages(name="nginx (Debian's: the slice module built in)", packages=PACKAGES, update=True,
                 cache_time=24 * 3600, no_recommends=True)
    # the mirror host serves the mirror: Debian's welcome page on port 80 goes
    site = files.link(name="Debian's default site off", path=DEFAULT_SITE, present=False)
    files.directory(name=f"Cache directory {cfg.mirror.cache_dir}", path=cfg.mirror.cache_dir,
                    user="www-data", group="www-data", mode="700")
    values = nginx_vars(cfg, host.get_fact(Nameservers), fetchers(host.state))
    staged = files.template(
        name=f"nginx mirror of {values['upstream']} on port {values['port']} (staged)", src=str(TEMPLATE),
        dest=STAGED, mode="644", jinja_env_kwargs={"trim_blocks": True, "lstrip_blocks": True}, **values)
    installed(name="Check (nginx -t), then install and reload", staged=STAGED, live=LIVE, staged_op=staged,
              site_op=site)
    systemd.service(name="nginx running and enabled", service="nginx", running=True, enabled=True)
