"""The fake-connector inventory of the CLI runs (`pyinfra tests/ops/inventory.py ...`): the
scenario comes as JSON in VOLTAFLEET_FAKE; tests/ops/fakefleet.py makes its hosts (the same
ones tests/ops/harness.py runs in process), in the group `fleet`, or in the scenario's own
groups ({"groups": {"mirror": [...], "v100_16gb": [...]}}). Fake hosts reboot at once."""
import json
import os

from pyinfra.operations import server as _server

from tests.ops.fakefleet import groups_of, no_reboot_wait

_server.sleep = no_reboot_wait
globals().update(groups_of(json.loads(os.environ["VOLTAFLEET_FAKE"])))
