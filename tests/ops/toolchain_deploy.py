"""Preflight and toolchain only: what the fake-connector tests exercise."""
from roles.preflight import preflight
from roles.toolchain import toolchain

toolchain(preflight())
