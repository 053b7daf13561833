"""The fleet's address moving between the lab's two gateways under pooled keep-alive load (issue 52).

Two moves, each under its own load (pooled keep-alive httpx clients through the address, streamed
and whole completions in turn): the holding gateway's HAProxy stopped, then (the first gateway
holding the address again) its whole host killed (its container's init SIGKILLed: processes,
address and link gone at once). For each move it reports how long the address took to move, how
many requests were in flight when it began and how many of those were cut, the requests started
while no gateway answered, and the requests started after the move (every one of them must be
served). The gateway is put back after each move (HAProxy started; the host booted) and the first
gateway takes the address back (gateway_vrrp_preempt_delay_s).

    .venv/bin/python -m bench.lab.failover [--record bench/records/gateway52/failover-run1.json]

tests/lab/test_pair.py runs the same moves and asserts on them. Lab only (its bridge); bounded.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.lab.load import Load
from lab import fleet

AFTER_S = 4.0  # the load keeps running this long after the move: the requests judged "after"


def ssh(g: dict, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", fleet.load_state()["ssh_config"], g["name"], command],
                          capture_output=True, text=True, timeout=60)


def holder(gateways: list[dict]) -> dict | None:
    """The gateway holding the fleet's address (its own interface lists it)."""
    for g in gateways:
        try:
            if ssh(g, f"ip -o -4 addr show | grep -qF ' {fleet.GATEWAY_VIP}/'").returncode == 0:
                return g
        except subprocess.TimeoutExpired:  # a host being killed
            continue
    return None


def wait_holder(gateways: list[dict], name: str | None = None, not_name: str | None = None,
                seconds: float = 60) -> tuple[dict, float]:
    """Until a gateway (that one; or any but `not_name`) holds the address: (it, when it was seen)."""
    deadline = time.monotonic() + seconds
    while True:
        g = holder([x for x in gateways if x["name"] != not_name])
        if g is not None and name in (None, g["name"]):
            return g, time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no gateway{' ' + name if name else ''} holds {fleet.GATEWAY_VIP} after {seconds:.0f} s")
        time.sleep(0.1)


def judge(results: list[dict], began: float, moved: float) -> dict:
    """The load's requests around one move: in flight when it began, started before the address
    moved, started after it."""
    in_flight = [r for r in results if r["start"] < began < r["end"]]
    gap = [r for r in results if began <= r["start"] < moved]
    after = [r for r in results if r["start"] >= moved]
    return {"in_flight": len(in_flight), "in_flight_cut": sum(not r["ok"] for r in in_flight),
            "started_in_gap": len(gap), "gap_failed": sum(not r["ok"] for r in gap),
            "after": len(after), "after_served": sum(r["ok"] for r in after),
            "after_failed": sum(not r["ok"] for r in after),
            "errors": sorted({r["error"] for r in in_flight + gap + after if r["error"]})[:5]}


def move(kind: str, clients: int = 4) -> dict:
    """One move under load: kind "haproxy" (its HAProxy stopped) or "host" (its host killed); then put back."""
    st = fleet.load_state()
    gateways = st["gateways"]
    first, _ = wait_holder(gateways, name=gateways[0]["name"])
    # answers of 128 tokens (a fraction of a second each): every client has one in flight most of the time
    load = Load(st["gateway_url"], clients=clients, tokens=128, seconds=300, max_requests=100000, pause_s=0.05).start()
    try:
        time.sleep(1)  # every client's pool holds a connection
        # then the moment a request has just begun (the clients' identical requests, batched together, end
        # together: all four can be between two requests at one instant, and a move then breaks nothing in flight)
        load.wait_in_flight(began_within_s=0.05)
        began = time.time()
        if kind == "haproxy":
            r = ssh(first, "systemctl stop haproxy")
            assert r.returncode == 0, r.stderr
        else:
            fleet.crash(first)
        to, moved = wait_holder(gateways, not_name=first["name"], seconds=30)
        time.sleep(AFTER_S)
    finally:
        summary = load.stop()
    out = {"kind": kind, "from": first["name"], "to": to["name"], "moved_s": round(moved - began, 2),
           **judge(load.results, began, moved), "requests": summary["requests"], "served": summary["served"]}
    t = time.time()
    if kind == "haproxy":
        assert ssh(first, "systemctl start haproxy").returncode == 0
    else:
        fleet.boot(first)
    wait_holder(gateways, name=first["name"], seconds=120)
    out["back_s"] = round(time.time() - t, 1)  # put back, then the first gateway took the address back
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--record", help="write the raw record (JSON) here")
    a = p.parse_args()
    moves = [move(k, a.clients) for k in ("haproxy", "host")]
    record = {"argv": ["python", "-m", "bench.lab.failover", *sys.argv[1:]], "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "clients": a.clients,
              "after_s": AFTER_S, "moves": moves}
    for m in moves:
        print(f"{m['kind']:>8}: {m['from']} -> {m['to']} in {m['moved_s']} s; in flight {m['in_flight']}, cut "
              f"{m['in_flight_cut']}; started while none answered {m['started_in_gap']} ({m['gap_failed']} failed); "
              f"after the move {m['after_served']} of {m['after']} served; back in {m['back_s']} s")
    if a.record:
        Path(a.record).parent.mkdir(parents=True, exist_ok=True)
        Path(a.record).write_text(json.dumps(record, indent=2) + "\n")
    return 0 if all(m["after_failed"] == 0 and m["after"] > 0 for m in moves) else 1


if __name__ == "__main__":
    sys.exit(main())
