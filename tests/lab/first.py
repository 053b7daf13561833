"""The lab session's first rollout, run by `make test` beside the unit tests (they need no lab) instead
of at the start of the lab tests: `python -m tests.lab.first RECORD.json`.

It is the rollout the `first_rollout` fixture would run (helpers.deploy(), the repository's own
configuration, into the session's empty release cache: VOLTAFLEET_RELEASE_CACHE, which make test sets
for both). The record keeps what the fixture needs: whether the hosts were fresh, pyinfra's exit code
and output, and what the hosts showed right after it (helpers.fleet_state). The fixture takes the run
from the record only when it is this lab's (lab.json unchanged since) and the hosts still show that;
else it rolls out itself, as before. A failed rollout is recorded too: test_first_rollout_converges
fails on it with pyinfra's output."""
from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path


def lab_id() -> str:
    """This lab's identity: its state file as `lab up` wrote it."""
    from lab.fleet import STATE_FILE

    return hashlib.sha256(STATE_FILE.read_bytes()).hexdigest()


def fresh_hosts() -> bool:
    """Whether no lab host was ever rolled out to (`lab up --fresh`)."""
    from tests.lab.helpers import lab, ssh

    return all(ssh(h, "test -e /opt/voltafleet/current && echo yes || echo no") == "no" for h in lab()["hosts"])


def main(argv: list[str]) -> int:
    from tests.lab.helpers import deploy, fleet_state

    out = Path(argv[0])
    fresh = fresh_hosts()
    t0 = time.monotonic()
    run = deploy()
    record = {"lab": lab_id(), "fresh": fresh, "rc": run.rc, "out": run.out,
              "seconds": round(time.monotonic() - t0, 2), "state": fleet_state() if run.rc == 0 else None}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record))
    print(f"the first rollout: rc {run.rc} in {record['seconds']} s (fresh hosts: {fresh}); record {out}")
    return 0  # the lab tests judge it (test_first_rollout_converges)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
