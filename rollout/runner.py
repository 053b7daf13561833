"""The driver's pyinfra runs and the signals that stop a rollout between them.

    runner = Runner("inventory/prod.py", Interrupt(grace=900), lock_fds=(lock.fd,))
    rc = runner.run(["gpu-01", "gw-1"], ctx, run_dir / "batch-1.log", label="batch 1")

Each run is `pyinfra -y INVENTORY deploy.py` limited to its hosts, in its own process group
(a terminal's Ctrl-C reaches the driver only), with the run context in its environment and the
fleet lock's descriptor passed on (the lock stays held while it runs, even if the driver is
killed). Its output goes to its log, and to the terminal condensed (voltafleet.state.screen), or
whole with -v. A run's verdicts are its records (voltafleet.state.runctx.RunDir), never its text.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from voltafleet.state import runctx
from voltafleet.state.screen import Condenser

REPO = Path(__file__).resolve().parents[1]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def say(msg: str) -> None:
    print(f"[rollout {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Interrupt:
    """SIGINT, SIGTERM and SIGHUP of the driver. The first signal lets the pyinfra run in
    progress finish (every host of it drains, restarts, smokes and goes back into rotation
    or rolls back) for up to `grace` seconds, then no further run starts; a second signal, or
    the grace running out, stops the run (SIGTERM to its process group, SIGKILL 30 s later).
    The fleet report and the textfile then say `interrupted`; the exit code is 128 + signal."""

    NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}

    def __init__(self, grace: float):
        self.grace, self.signum, self.at, self.forced = grace, None, None, False
        self.child: subprocess.Popen | None = None

    def install(self) -> None:
        for sig in self.NAMES:
            signal.signal(sig, self.handle)

    def handle(self, signum, _frame) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
            say(f"{self.NAMES[signum]}: the pyinfra run in progress finishes its hosts (up to {self.grace:.0f} s), "
                "then the rollout stops; send it again to stop that run now")
        else:
            self.force("a second signal")

    def force(self, why: str) -> None:
        if self.forced or self.child is None or self.child.poll() is not None:
            return
        self.forced = True
        say(f"stopping the pyinfra run (pid {self.child.pid}) now: {why}")
        try:
            os.killpg(self.child.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def expired(self) -> bool:
        return self.at is not None and time.monotonic() - self.at > self.grace

    @property
    def name(self) -> str | None:
        return self.NAMES.get(self.signum)

    @property
    def code(self) -> int:
        return 128 + int(self.signum)

    @property
    def asked(self) -> bool:
        """A signal came: no further run starts."""
        return self.signum is not None

    def why_forced(self) -> str:
        return f"{self.name}, then {'a second signal' if not self.expired() else 'the grace ran out'}"


@dataclass
class Runner:
    """How this rollout starts its pyinfra runs (one at a time)."""
    inventory: str
    interrupt: Interrupt
    verbose: bool = False             # -v: pyinfra's whole output on the terminal
    lock_fds: tuple = ()              # the fleet lock's descriptor: every run shares the driver's flock
    env: dict = field(default_factory=lambda: dict(os.environ))

    def run(self, limit: list[str] | None, ctx: runctx.RunContext, log: Path, echo: bool = True,
            label: str = "", serial: bool = False) -> int:
        """One pyinfra run of deploy.py limited to `limit` (None: every host): its exit code. serial: host by
        host, each host's whole deploy before the next, the run stopped at the first host that fails
        (pyinfra --serial --fail-percent 0)."""
        cmd = [PYINFRA, "-y", *(["--serial", "--fail-percent", "0"] if serial else []), self.inventory, "deploy.py"]
        for name in limit or []:
            cmd[1:1] = ["--limit", name]
        proc = subprocess.Popen(cmd, cwd=REPO, env={**self.env, **ctx.to_env()}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
                                pass_fds=self.lock_fds)
        self.interrupt.child = proc
        threading.Thread(target=self._watch, args=(proc,), daemon=True).start()
        self._copy(proc, log, Condenser(label or ctx.phase) if echo and not self.verbose else None, echo)
        rc = proc.wait()
        self.interrupt.child = None
        return rc

    def _copy(self, proc: subprocess.Popen, log: Path, screen: Condenser | None, echo: bool) -> None:
        """The run's output to its log, and to the terminal (condensed by `screen`, or whole)."""
        with open(log, "w") as f:
            for line in proc.stdout:
                f.write(line)
                f.flush()
                if echo and screen is None:
                    sys.stdout.write("    " + line)
                for shown in (screen.feed(line) if screen else ()):
                    print(shown, flush=True)
        for shown in (screen.close() if screen else ()):
            print(shown, flush=True)

    def _watch(self, proc: subprocess.Popen) -> None:
        """Stop the run when an interrupt's grace runs out; SIGKILL 30 s after a SIGTERM."""
        it = self.interrupt
        while proc.poll() is None:
            if it.expired():
                it.force(f"the {it.grace:.0f} s grace ran out")
            if it.forced:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.5)
