"""bench/traffic/README.md's device command, whichever session is the newest: the next session starts from the newest
session's last call (bench/records/proof51/sessionN/callM, the highest N and M), its results.json rebuilt by
analyze.raw with python3's standard library alone (the device has no virtual environment). Each session's records
test (tests/unit/test_records51*.py) checks the README's ranges and sizes it quotes."""
import json
import re
import subprocess
import sys

from tests.unit.records51 import REPO, RECORDS51, last_call, results_of


def test_the_device_command_starts_the_next_session_from_the_newest_session_s_results():
    readme = (REPO / "bench/traffic/README.md").read_text()
    last = re.search(r"^\s*LAST=(\S+);", readme, re.M).group(1)
    newest = max(int(p.name.removeprefix("session")) for p in RECORDS51.glob("session*"))
    assert REPO / last == last_call(newest)
    code = re.search(r"python3 -c '([^']+)'", readme).group(1)
    out = subprocess.run([sys.executable, "-S", "-c", code, f"{last}/results.json.gz"], cwd=REPO, capture_output=True,
                         check=True).stdout
    assert json.loads(out) == results_of(last_call(newest))
