"""The model mirror and the server hosts' model fetch: what tests/ops/test_mirror.py exercises
on the fake connector (deploy.py's branches for these two roles)."""
from roles import speed

speed.applied()  # as deploy.py does
from pyinfra import host

from roles.gateway_api import is_mirror
from roles.mirror import mirror
from roles.model import model
from roles.preflight import preflight

if is_mirror(host):
    mirror()
else:
    model(preflight())
