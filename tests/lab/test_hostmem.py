"""The host-memory ceiling and the OOM preference on the lab fleet (issue 38). The lab's
containers cannot enforce a memory limit (their memory cgroup is read-only: `systemctl show`
reads MemoryMax=infinity there), so the lab shows what it can: each unit as rendered carries
the plan's MemoryMax (no MemoryHigh, issue 49) and the stop that folds its memory events, each
server's oom_score_adj is server_oom_score_adjust and above sshd's, and voltafleet-memory.timer's
textfile holds each server's VmRSS and its plan. What the kernel does at the ceiling is proven
outside the lab, on this machine's memory cgroup (tests/kernel).
The expected numbers come from voltafleet.planning.hostplan.make_plan (voltafleet.planning.hostmem), from the
lab inventory's values, the lab model's header and each host's own memory, as preflight makes
them. A few seconds: no deploy beyond the `converged` fixture's."""
from __future__ import annotations

import re

import pytest

from tests.lab.helpers import main_pid, ssh
from voltafleet.models import gguf_header
from voltafleet.inputs.config import SCHEMA, settings_of
from voltafleet.planning.hostplan import HostFacts, make_plan
from voltafleet.planning.unitfile import MEMORY_TEXTFILE


@pytest.fixture
def hosts(converged):
    return converged


def host_cfg(name: str) -> dict:
    """The host's variables as the lab inventory gives them (group_vars/all.yml, lab.yml, the lab's state)."""
    from inventory import lab as inventory

    data = dict(next(d for n, d in inventory.lab if n == name))
    return settings_of(name, {k: data.get(k) for k in SCHEMA})


def memory_facts(h: dict) -> dict:
    """The host's MemTotal and MemAvailable in bytes (/proc/meminfo), as preflight reads them."""
    info = dict(re.findall(r"^(\w+):\s+(\d+) kB$", ssh(h, "cat /proc/meminfo"), re.M))
    return {"mem_total": int(info["MemTotal"]) * 1024, "mem_available": int(info["MemAvailable"]) * 1024}


def planned(h: dict):
    """(the host's variables, its host-memory plan: voltafleet.planning.hostmem.HostMemoryPlan) as a rollout plans it."""
    cfg = host_cfg(h["name"])
    systemd = int(ssh(h, "systemctl --version | awk 'NR == 1 {print $2}'"))
    facts = HostFacts(os="debian-12", systemd=systemd, model_present=True, **memory_facts(h))
    plan = make_plan(h["name"], cfg, facts, gguf_header.read_url(cfg.model.url), cfg.build.ref)
    assert plan.hostmem is not None, f"{h['name']}: no host-memory plan ({plan.refusals})"
    return plan.settings, plan.hostmem


def instances(cfg) -> range:
    return range(cfg.server.instances)


def directive(text: str, key: str) -> list[str]:
    return re.findall(rf"^{key}=(.*)$", text, re.M)


def test_every_server_is_the_kernels_first_choice_never_sshd(hosts):
    for h in hosts:
        want = host_cfg(h["name"]).server.oom_score_adjust
        sshd = int(ssh(h, "cat /proc/$(pgrep -o -x sshd)/oom_score_adj"))
        for i in instances(host_cfg(h["name"])):
            unit = f"llama-server@{i}.service"
            assert ssh(h, f"systemctl show -P OOMScoreAdjust {unit}") == str(want), (h["name"], unit)
            adj = int(ssh(h, f"cat /proc/{main_pid(h, i)}/oom_score_adj"))
            assert adj == want, (h["name"], unit)
            assert sshd < adj, (h["name"], unit, sshd)


def test_each_unit_carries_the_plans_ceiling(hosts):
    for h in hosts:
        cfg, mem = planned(h)
        for i in instances(cfg):
            unit = ssh(h, f"systemctl cat llama-server@{i}.service")
            assert directive(unit, "MemoryHigh") == [], h["name"]  # one ceiling (docs/host.md)
            assert directive(unit, "MemoryMax") == [str(mem.memory_max)], h["name"]
            assert mem.instance.total < mem.memory_max
            assert directive(unit, "ExecStopPost") == [f"-+{cfg.preflight.root}/bin/vf-memory-textfile --fold %i"]
            assert directive(unit, "MemorySwapMax") == ["0"] and directive(unit, "OOMPolicy") == ["stop"]
            assert directive(unit, "Restart") == ["on-failure"]  # an oom-kill result restarts it


def samples(text: str) -> dict[tuple[str, str], int]:
    """{(metric, instance): value} of voltafleet-memory.prom."""
    out = {}
    for m in re.finditer(r'^(voltafleet_instance_memory_\w+)\{host="[^"]*",instance="(\d+)",unit="[^"]*"\} (\d+)$',
                         text, re.M):
        out[(m.group(1), m.group(2))] = int(m.group(3))
    return out


def test_the_memory_textfile_holds_each_servers_rss_and_its_plan(hosts):
    for h in hosts:
        cfg, mem = planned(h)
        assert ssh(h, "systemctl is-enabled voltafleet-memory.timer") == "enabled"
        assert ssh(h, "systemctl is-active voltafleet-memory.timer") == "active"
        prom = f"{cfg.smoke.textfile_dir}/{MEMORY_TEXTFILE}"
        pids = {i: main_pid(h, i) for i in instances(cfg)}
        # the timer's service has written the file since the rollout (it runs every 30 s)
        assert ssh(h, f"test -s {prom} && echo ok") == "ok", h["name"]
        # the service's own command once more (a `systemctl start` of a short-lived unit races the timer's run in
        # the lab's containers, whose cgroups sometimes fail to clean up: 219/CGROUP), then each server's VmRSS
        cmd = ssh(h, "systemctl show -P ExecStart voltafleet-memory.service")
        script = re.search(r"argv\[\]=([^;]+);", cmd).group(1).strip()
        out = ssh(h, f"{script} && stat -c %a {prom} && cat {prom} && echo @@ && "
                  + " && ".join(f"awk '/^VmRSS:/ {{print {i}, $2}}' /proc/{p}/status" for i, p in pids.items()))
        mode, _, rest = out.partition("\n")
        text, _, rss = rest.partition("@@\n")
        assert mode == "644"
        got = samples(text)
        for line in rss.splitlines():
            i, kib = line.split()
            now, written = int(kib) * 1024, got[("voltafleet_instance_memory_rss_bytes", i)]
            assert abs(written - now) <= 0.1 * now, (h["name"], i, written, now)
            # the plan's terms other than the prompt cache's limit hold the real server (the lab's states are tiny)
            assert now <= mem.instance.total - mem.instance.cache_ram, (h["name"], i, now, mem.instance.describe())
            assert got[("voltafleet_instance_memory_plan_bytes", i)] == mem.instance.total, (h["name"], i)
            assert got[("voltafleet_instance_memory_plan_held_bytes", i)] == mem.instance.held, (h["name"], i)
        assert ssh(h, f"grep -c '^# TYPE voltafleet_instance_memory_rss_bytes gauge$' {prom}") == "1"
