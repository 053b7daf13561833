"""The fake-connector inventory of the CLI runs (`pyinfra tests/ops/inventory.py ...`): the
scenario comes as JSON in VOLTAFLEET_FAKE; tests/ops/fakefleet.py makes its hosts (the same
ones tests/ops/harness.py runs in process). Fake hosts reboot at once (no 10 s wait)."""
import json
import os

from pyinfra.operations import server as _server

from tests.ops.fakefleet import fleet_of, no_reboot_wait

_server.sleep = no_reboot_wait
fleet = fleet_of(json.loads(os.environ["VOLTAFLEET_FAKE"]))
