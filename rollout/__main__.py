"""Roll a fleet out in batches that keep it serving.

    python -m rollout inventory/prod.py [--canary 1] [--batch 25%] [--fail-percent 10]

1. preflight on every host (pyinfra, VOLTAFLEET_PHASE=preflight): any refusal stops the
   rollout before any host changes;
2. the gateway (HAProxy) gets the fleet's backends (VOLTAFLEET_PHASE=gateway);
3. the canary, then the other hosts `--batch` at a time: each batch is one pyinfra run of
   deploy.py limited to its hosts (plus the gateway, which drains each instance before
   its restart and takes it back once its host's smoke test passed); a host whose smoke
   test fails is rolled back, restarted and smoked again;
4. the canary's quality probe (greedy tokens and log-probabilities) is the reference every
   later host is compared with;
5. the rollout stops when the canary fails or the failed share exceeds --fail-percent;
   the fleet report (JSON and a table) names every host. Exit 0 only if every host passed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from voltafleet import rolling  # noqa: E402

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
GATEWAY_GROUP = "gateway"


def say(msg: str) -> None:
    print(f"[rollout {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_inventory(path: str) -> dict[str, list[str]]:
    """{host: [groups]} in inventory order, from the inventory file as pyinfra reads it:
    every public list of hosts is a group (our loader validates every host's variables)."""
    import runpy

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        attrs = runpy.run_path(str(REPO / path) if not os.path.isabs(path) else path)
    finally:
        os.chdir(cwd)
    hosts: dict[str, list[str]] = {}
    for group, value in attrs.items():
        if group.startswith("_") or not isinstance(value, (list, tuple)):
            continue
        for entry in value:
            name = entry[0] if isinstance(entry, tuple) else entry
            if isinstance(name, str):
                hosts.setdefault(name, []).append(group)
    return hosts


def pyinfra(inventory: str, limit: list[str] | None, env: dict, log: Path) -> tuple[int, str]:
    """One pyinfra run of deploy.py; its output goes to the terminal and to `log`."""
    cmd = [PYINFRA, "-y", inventory, "deploy.py"]
    for name in limit or []:
        cmd[1:1] = ["--limit", name]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = []
    with open(log, "w") as f:
        for line in proc.stdout:
            lines.append(line)
            f.write(line)
            if not line.startswith("    [") or "Success" not in line:  # keep the terminal readable
                sys.stdout.write("    " + line)
    return proc.wait(), "".join(lines)


def host_error(out: str, host: str) -> str | None:
    """The error pyinfra printed for a host, if any."""
    found = [line.strip() for line in out.splitlines()
             if f"[{host}]" in line and re.search(r"error|Error|failed|Could not connect", line)]
    if not found:
        return None
    idx = out.find(found[0])
    tail = out[idx: idx + 600].splitlines()
    return " ".join(t.strip() for t in tail[:6])


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("inventory", help="pyinfra inventory file, e.g. inventory/prod.py")
    p.add_argument("--canary", default="1",
                   help="the canary: a host count from the top of the inventory, a group, or comma-separated host names (default 1)")
    p.add_argument("--batch", default="25%", help="hosts per batch after the canary: a count or a percentage (default 25%%)")
    p.add_argument("--fail-percent", type=float, default=0.0,
                   help="stop when more than this share of the hosts tried failed (default 0: stop at the first failure)")
    p.add_argument("--report-dir", default="reports", help="where the fleet report goes (default reports/)")
    a = p.parse_args(argv)

    inventory = load_inventory(a.inventory)
    gateways = [h for h, groups in inventory.items() if GATEWAY_GROUP in groups]
    servers = [h for h, groups in inventory.items() if GATEWAY_GROUP not in groups]
    if a.canary.isdigit():
        canary = servers[:int(a.canary)]
    elif any(a.canary in groups for groups in inventory.values()):
        canary = [h for h, groups in inventory.items() if a.canary in groups and h in servers]
    else:
        canary = [c.strip() for c in a.canary.split(",") if c.strip()]
    try:
        plan = rolling.batches(servers, canary, a.batch)
    except rolling.RollingError as e:
        print(f"voltafleet: {e}", file=sys.stderr)
        return 2

    rollout_id = time.strftime("%Y%m%d-%H%M%S")
    report_dir = (REPO / a.report_dir) if not os.path.isabs(a.report_dir) else Path(a.report_dir)
    run_dir = report_dir / f"rollout-{rollout_id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    base_env = {"VOLTAFLEET_ROLLOUT": rollout_id, "VOLTAFLEET_REPORT_DIR": str(run_dir)}
    say(f"{len(servers)} server host(s), gateway: {', '.join(gateways) or 'none'}; batches: "
        + " | ".join(", ".join(b) for b in plan))

    t0 = time.time()
    rc, out = pyinfra(a.inventory, None, {**base_env, "VOLTAFLEET_PHASE": "preflight"}, run_dir / "preflight.log")
    if rc != 0:
        say("preflight refused the rollout: no host was changed")
        return 2
    if gateways:
        rc, out = pyinfra(a.inventory, None, {**base_env, "VOLTAFLEET_PHASE": "gateway"}, run_dir / "gateway.log")
        if rc != 0:
            say("the gateway could not be configured: no server host was changed")
            return 2

    results: dict[str, rolling.HostResult] = {}
    stopped = None
    probe_ref = run_dir / "probe-reference.json"
    for n, batch in enumerate(plan):
        what = "canary" if n == 0 and canary else f"batch {n}"
        say(f"{what}: {', '.join(batch)}")
        env = {**base_env, "VOLTAFLEET_PHASE": "batch", "VOLTAFLEET_BATCH": str(n)}
        if probe_ref.exists():
            env["VOLTAFLEET_PROBE_REFERENCE"] = str(probe_ref)
        for h in batch:
            for kind in ("smoke", "status"):
                (run_dir / f"{kind}-{h}.json").unlink(missing_ok=True)
        rc, out = pyinfra(a.inventory, batch + gateways, env, run_dir / f"batch-{n}.log")
        for h in batch:
            results[h] = rolling.host_result(h, n, read_json(run_dir / f"smoke-{h}.json"),
                                             read_json(run_dir / f"status-{h}.json"), host_error(out, h))
            say(f"{h}: {results[h].status}" + (f" ({results[h].detail})" if results[h].detail else ""))
        if n == 0 and not probe_ref.exists():
            ref = next((read_json(run_dir / f"smoke-{h}.json") for h in batch
                        if results[h].status == "passed"), None)
            if ref and ref.get("probe", {}).get("tokens"):
                probe_ref.write_text(json.dumps(ref["probe"], indent=1) + "\n")
        stopped = rolling.should_stop({h: r.status for h, r in results.items()}, a.fail_percent, canary)
        if stopped:
            say(f"stopping: {stopped}")
            break

    every = [results.get(h) or rolling.HostResult(h, next(i for i, b in enumerate(plan) if h in b),
                                                  detail="not tried: the rollout stopped") for h in servers]
    report = {"rollout": rollout_id, "inventory": a.inventory, "seconds": round(time.time() - t0, 1),
              "canary": canary, "batches": plan, "fail_percent": a.fail_percent,
              **rolling.summary(every, stopped), "hosts": [r.to_dict() for r in every]}
    (report_dir / f"rollout-{rollout_id}.json").write_text(json.dumps(report, indent=2) + "\n")
    (report_dir / "rollout-latest.json").write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + rolling.table(every))
    say(f"{'OK' if report['ok'] else 'FAILED'} in {report['seconds']} s; report: "
        f"{report_dir / f'rollout-{rollout_id}.json'}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
