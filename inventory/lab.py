"""The lab fleet on this machine (`python -m lab up` makes it): real Debian hosts in
systemd-nspawn containers, reached over SSH with strict host key checking, serving a
tiny real GGUF from a local mirror on the CPU backend."""
import os

import yaml

from lab.fleet import MIRROR_ENV, load_state
from voltafleet.inputs.groupvars import load_or_exit

# VOLTAFLEET_LAB_MIRROR=1: the gateway host (vf-lab-gw) is also in the `mirror` group (roles/mirror).
# Per-host variables for one run, e.g. to change a flag on one lab host only:
# VOLTAFLEET_LAB_HOST_VARS=file.yml holding {vf-lab-2: {server_threads: 2}}
_per_host = {}
if os.environ.get("VOLTAFLEET_LAB_HOST_VARS"):
    with open(os.environ["VOLTAFLEET_LAB_HOST_VARS"]) as f:
        _per_host = yaml.safe_load(f) or {}

_lab = load_state()
_overrides = {
    "llama_cpp_repo": _lab["llama_cpp_repo"],
    "llama_cpp_ref": _lab["llama_cpp_ref"],
    "model_url": _lab["model_url"],
    "model_sha256": _lab["model_sha256"],
}


def _connect(h: dict) -> dict:
    return {"ssh_hostname": h["address"], "ssh_port": h["ssh_port"], "ssh_user": "root",
            "ssh_key": _lab["ssh_key"], "ssh_known_hosts_file": _lab["known_hosts"],
            "ssh_strict_host_key_checking": "yes"}


_hosts = [
    (h["name"], {**_connect(h), "server_port_base": h["server_port_base"], **_per_host.get(h["name"], {})})
    for h in _lab["hosts"]
]
_groups = {"lab": _hosts}
if _lab.get("gateways"):  # `python -m lab up --gateway`: the HAProxy pair in front of the lab's servers, each
    # with its own address on the lab's bridge (VRRP, peers, its exporter, the model cache), the fleet's between them
    _groups["gateway"] = [(g["name"], {**_connect(g), "gateway_address": g["address"], "gateway_metrics_bind": g["metrics"],
                                       "mirror_listen": g["address"], **_per_host.get(g["name"], {})})
                          for g in _lab["gateways"]]
    _groups["lab"] = _hosts + [(g["name"], {}) for g in _lab["gateways"]]  # group_vars/lab.yml applies to them too
    if os.environ.get(MIRROR_ENV) == "1":  # the first gateway host is the model mirror too: nginx caching the lab's
        _groups["mirror"] = [(_lab["gateway"]["name"], {})]  # model mirror on <its address>:<mirror_port>
elif os.environ.get(MIRROR_ENV) == "1":
    raise SystemExit(f"lab: {MIRROR_ENV}=1 makes the gateway host the model mirror, and the lab has no gateway. "
                     "Fix: run `python -m lab up --gateway`.")
_loaded = load_or_exit(_groups, origin="inventory/lab.py", overrides=_overrides)
lab = [h for h in _loaded["lab"] if h[0] not in {g["name"] for g in _lab.get("gateways", [])}]
if "gateway" in _loaded:
    gateway = _loaded["gateway"]
if "mirror" in _loaded:
    mirror = _loaded["mirror"]
