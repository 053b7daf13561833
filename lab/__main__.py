import argparse
import os
import sys

from lab import fleet


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m lab", description=fleet.__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="make and boot the lab hosts and mirrors (idempotent)")
    u.add_argument("--hosts", type=int, default=int(os.environ.get("LAB_HOSTS", "2")))
    u.add_argument("--fresh", action="store_true", help="remove existing lab hosts first (a clean fleet)")
    u.add_argument("--gateway", action="store_true", help="also a gateway host (vf-lab-gw, HAProxy)")
    sub.add_parser("down", help="stop and remove the hosts and mirrors (caches stay)")
    sub.add_parser("status", help="list hosts, ports and mirrors")
    a = p.parse_args()
    if a.cmd == "up":
        if a.fresh:
            fleet.down()
        fleet.up(a.hosts, a.gateway)
        return fleet.status()
    if a.cmd == "down":
        fleet.down()
        return 0
    return fleet.status()


if __name__ == "__main__":
    sys.exit(main())
