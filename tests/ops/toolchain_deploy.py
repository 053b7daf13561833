"""Preflight and toolchain only: what the fake-connector tests exercise. The drain hook logs a
command, so the tests see when (and whether) it runs."""
from roles import speed

speed.applied()  # as deploy.py does
from roles.preflight import preflight
from roles.toolchain import toolchain


def drain(state, host):
    host.run_shell_command("echo voltafleet-test-drain-hook")
    return True


toolchain(preflight(), before_driver_change=drain)
