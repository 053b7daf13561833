"""The server role alone on fake hosts (tests/ops/test_server_memory.py): each host's plan made
from its variables and fixed facts (a Debian 12 CPU host), with the host-memory plan the test
puts in place (tests/ops/test_server_memory.py HOSTMEM), then roles/server as deploy.py runs it."""
from pyinfra import host

from roles import speed

speed.applied()  # as deploy.py does
from roles.run import config
from roles.server import server
from tests.ops.test_server_memory import host_plan

server(host_plan(host.name, config()))
