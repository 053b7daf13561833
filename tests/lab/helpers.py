"""Helpers for tests against the real lab fleet: hosts through pytest-testinfra (SSH with
the lab's ssh_config: strict host keys), pyinfra runs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import testinfra
import yaml

from lab.fleet import BRIDGE_ADDR, GATEWAY_PORT, GATEWAY_VIP, MIRROR_ENV, load_state
from voltafleet.front import gateway

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


GATEWAY_URL = f"http://{GATEWAY_VIP}:{GATEWAY_PORT}"  # the fleet's one address, on whichever gateway holds it
SERVER_HOST = BRIDGE_ADDR  # where every lab host's servers listen (the lab's bridge)


def lab() -> dict:
    return load_state()


def gateways() -> list[dict]:
    """The lab's gateway hosts (the pair), the first one first."""
    return lab().get("gateways") or []


def wait_holder(name: str | None = None, seconds: float = 30) -> dict:
    """Until a gateway (that one, when named) holds the fleet's address; it (bench/lab/failover.py's check:
    the address on the gateway's own interface)."""
    from bench.lab.failover import wait_holder as wait

    return wait(gateways(), name=name, seconds=seconds)[0]


def metrics_url(path: str = "/metrics", g: dict | None = None) -> str:
    """A gateway's own stats frontend (default: the one holding the fleet's address)."""
    return f"http://{(g or wait_holder())['metrics']}{path}"


_HOSTS: dict[str, testinfra.host.Host] = {}


def th(host: dict) -> testinfra.host.Host:
    """The lab host as a testinfra Host (services, users, files, sockets, commands)."""
    if host["name"] not in _HOSTS:
        _HOSTS[host["name"]] = testinfra.get_host(f"ssh://{host['name']}", ssh_config=lab()["ssh_config"])
    return _HOSTS[host["name"]]


def ssh(host: dict, cmd: str, check: bool = True, stdin: str | None = None) -> str:
    """Run a shell command on the lab host; its stdout, stripped."""
    r = th(host).run(cmd) if stdin is None else th(host).run(f"{cmd} <<'VF_STDIN_EOF'\n{stdin}\nVF_STDIN_EOF")
    if check and r.rc != 0:
        raise AssertionError(f"{host['name']}: {cmd!r} failed ({r.rc}): {r.stderr}")
    return r.stdout.strip()


class Run:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.rc, self.out = proc.returncode, proc.stdout + proc.stderr

    @property
    def changed(self) -> int:
        """pyinfra's Grand total 'Success' column: operations that changed something."""
        m = re.search(r"Grand total\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", self.out)
        assert m, f"no results table in pyinfra output:\n{self.out[-3000:]}"
        return 0 if m.group(2) == "-" else int(m.group(2))

    def why(self) -> str:
        """The lines that say why a run failed (pyinfra's errors, the smoke test's verdicts, rollbacks), not the
        results table's rows: a failed run's repr begins with them, where a cut log still shows them."""
        return "\n".join([ln for ln in self.out.splitlines()
                          if re.search(r"error|fail|rolled back|smoke|refus", ln, re.I) and " | " not in ln][-40:])

    def __repr__(self):
        return f"Run(rc={self.rc}):\n{self.why() if self.rc else ''}\n--- the output's end:\n{self.out[-3000:]}"


# every pyinfra run and driver of this lab test session, timed (the lab's conftest empties it first)
TIMINGS = REPO / "reports" / "lab-timings.jsonl"


def timed(kind: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    """subprocess.run, its wall time appended to TIMINGS with the test that ran it (where the
    lab suite's time goes: bench/lab/timings.py sums it)."""
    t0 = time.monotonic()
    proc = subprocess.run(argv, **kw)
    TIMINGS.parent.mkdir(exist_ok=True)
    with open(TIMINGS, "a") as f:
        f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "kind": kind,
                            "args": argv[3:], "rc": proc.returncode,
                            "seconds": round(time.monotonic() - t0, 2)}) + "\n")
    return proc


def run_env(vars: dict | None, host_vars: dict | None, tmp: Path | None, env: dict | None = None) -> dict:
    """The environment of a run: `vars` for every host (VOLTAFLEET_VARS), `host_vars`
    {host: {...}} for single ones (VOLTAFLEET_LAB_HOST_VARS), each written to a YAML file."""
    e = {**os.environ, **(env or {})}
    e.pop("VOLTAFLEET_VARS", None)
    e.pop("VOLTAFLEET_LAB_HOST_VARS", None)
    for data, var, name in ((vars, "VOLTAFLEET_VARS", "vars"), (host_vars, "VOLTAFLEET_LAB_HOST_VARS", "hosts")):
        if data:
            path = (tmp or Path("/tmp")) / f"voltafleet-test-{name}.yml"
            path.write_text(yaml.safe_dump(data))
            e[var] = str(path)
    return e


# What the hosts showed (fleet_state) right after the last plain deploy() that succeeded ("state"),
# or the last one with the gateway host as the model mirror too ("mirror", env MIRROR): the
# `converged` and `mirrored` fixtures skip their deploy when they still show exactly that. None: not
# known (any other run since, of any kind, forgets both: forget()).
CONVERGED: dict = {"state": None, "mirror": None}
MIRROR = {MIRROR_ENV: "1"}


def forget() -> None:
    """A run is about to change the fleet: no converged state is known any more."""
    CONVERGED.update(state=None, mirror=None)


def still(kind: str = "state") -> bool:
    """Whether the fleet still shows exactly what it showed after the last deploy of that kind
    that succeeded ("state": plain, "mirror": env MIRROR); False when none is known."""
    return CONVERGED[kind] is not None and fleet_state() == CONVERGED[kind]

# Everything a deploy of the repository's configuration manages or depends on, one line each:
# the release, the flags, the unit, the model files, each instance's state and main pid, the
# compiler the build fingerprint reads, the helper scripts.
_HOST_STATE = ("readlink /opt/voltafleet/current; readlink /opt/voltafleet/good; "
               "md5sum /etc/voltafleet/llama-server/*.env /etc/systemd/system/llama-server@.service "
               "/usr/local/bin/* 2>&1; ls -R /var/lib/voltafleet/models 2>&1; "
               "for i in 0 1 2 3; do systemctl show -P ActiveState,MainPID,NRestarts llama-server@$i.service "
               "| tr '\\n' ' '; echo; done; c++ -dumpfullversion; mount | grep -c vf- ; "
               "systemctl list-units --failed --plain --no-legend | wc -l")
_GATEWAY_STATE = ("md5sum /etc/haproxy/haproxy.cfg /etc/keepalived/keepalived.conf 2>&1; "
                  "systemctl show -P MainPID haproxy keepalived; "
                  "echo 'show servers state llama' | socat stdio UNIX-CONNECT:/run/haproxy/admin.sock "
                  "| awk 'NR>2 {print $4, $6, $7}'")


def fleet_state() -> dict:
    """{host: what it shows now} for every lab host and the gateway (see _HOST_STATE)."""
    st = lab()
    out = {h["name"]: th(h).run(_HOST_STATE).stdout for h in st["hosts"]}
    for g in st.get("gateways") or []:
        out[g["name"]] = th(g).run(_GATEWAY_STATE).stdout
    return out


def deploy(vars: dict | None = None, tmp: Path | None = None, env: dict | None = None,
           host_vars: dict | None = None, limit: str | None = None) -> Run:
    """Run the lab rollout; `vars` apply to every host, `host_vars` {host: {...}} to one each;
    `limit`: only these hosts (pyinfra --limit), e.g. the gateway alone."""
    forget()
    e = run_env(vars, host_vars, tmp, env)
    proc = timed("deploy", [PYINFRA, "-y", "inventory/lab.py", "deploy.py", *(["--limit", limit] if limit else [])],
                 cwd=REPO, env=e, capture_output=True, text=True, timeout=3000)
    run = Run(proc)
    if run.rc == 0 and not (vars or host_vars or limit) and (env or {}) in ({}, MIRROR):
        CONVERGED["mirror" if env else "state"] = fleet_state()
    return run


def current_release(host: dict) -> str:
    return ssh(host, "basename $(readlink /opt/voltafleet/current)")


def build_info(host: dict) -> dict:
    return json.loads(ssh(host, "cat /opt/voltafleet/current/BUILD_INFO.json"))


def compiled_here(host: dict) -> list[str]:
    """Fingerprints this host compiled (a CMake build tree exists only where it compiled)."""
    out = ssh(host, "ls -d /opt/voltafleet/build/*/ 2>/dev/null | xargs -rn1 basename", check=False)
    return out.split()


def main_pid(host: dict, instance: int) -> int:
    return int(ssh(host, f"systemctl show -P MainPID llama-server@{instance}.service"))


def report(host: dict) -> dict:
    return json.loads((REPO / "reports" / f"smoke-{host['name']}.json").read_text())


def rollout(args: list[str] = (), vars: dict | None = None, host_vars: dict | None = None,
            tmp: Path | None = None, timeout: int = 1800, env: dict | None = None) -> tuple[Run, dict]:
    """Run the rolling driver on the lab inventory; (its output, the fleet report)."""
    forget()
    e = run_env(vars, host_vars, tmp, env)
    latest = REPO / "reports" / "rollout-latest.json"
    latest.unlink(missing_ok=True)
    proc = timed("rollout", [sys.executable, "-m", "rollout", "inventory/lab.py", *args], cwd=REPO, env=e,
                 capture_output=True, text=True, timeout=timeout)
    return Run(proc), (json.loads(latest.read_text()) if latest.exists() else {})


def env_file(host: dict, i: int = 0) -> str:
    return ssh(host, f"cat /etc/voltafleet/llama-server/{i}.env")


def fresh_cache(tmp: Path) -> dict:
    """A run environment with an empty controller release cache: a test that counts compiles
    must not find the archive an earlier test's build left there."""
    return {"VOLTAFLEET_RELEASE_CACHE": str(tmp / "release-cache")}


def pids(hosts) -> dict:
    """{(host, instance): MainPID} of both instances of each host: unchanged means not restarted."""
    return {(h["name"], i): main_pid(h, i) for h in hosts for i in (0, 1)}


def gateway_stat(gw) -> dict:
    """{server: HAProxy's `show stat` row as a dict} of the llama backend's instances."""
    return gateway.server_rows(ssh(gw, gateway.runtime("show stat")))
