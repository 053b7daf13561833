import os
import tempfile

import pytest

from lab.fleet import STATE_FILE

# The controller's release cache of this test session starts empty: a test that counts
# compiles must not find the archive `make demo` (or an earlier session) left there.
os.environ.setdefault("VOLTAFLEET_RELEASE_CACHE", tempfile.mkdtemp(prefix="voltafleet-releases-"))


def pytest_sessionstart(session):
    """reports/lab-timings.jsonl holds this session's runs only (bench/lab/timings.py sums them)."""
    from tests.lab.helpers import TIMINGS

    TIMINGS.unlink(missing_ok=True)


def pytest_collection_modifyitems(config, items):
    if STATE_FILE.exists():
        return
    if os.environ.get("VOLTAFLEET_REQUIRE_LAB") == "1":
        raise pytest.UsageError(f"the lab fleet is not up ({STATE_FILE} missing): run `python -m lab up`")
    skip = pytest.mark.skip(reason="lab fleet not up (python -m lab up)")
    for item in items:
        if "tests/lab/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def first_rollout():
    """The session's first rollout, whichever lab test asks first: (run, fresh) where
    fresh says whether the hosts had never been rolled out to (`lab up --fresh`). `make test`
    runs it beside the unit tests (tests/lab/first.py, VOLTAFLEET_LAB_FIRST_ROLLOUT: its record);
    the record is taken only when it is this lab's and the hosts still show what it left."""
    from tests.lab.first import fresh_hosts
    from tests.lab.helpers import deploy

    taken = earlier_first_rollout()
    if taken is not None:
        return taken
    fresh = fresh_hosts()
    return deploy(), fresh


def earlier_first_rollout():
    """(run, fresh) from make test's first rollout (tests/lab/first.py), else None."""
    import json
    import subprocess
    from pathlib import Path

    from tests.lab import first
    from tests.lab.helpers import CONVERGED, TIMINGS, Run, fleet_state

    path = os.environ.get("VOLTAFLEET_LAB_FIRST_ROLLOUT")
    if not path or not Path(path).exists():
        return None
    rec = json.loads(Path(path).read_text())
    if rec["lab"] != first.lab_id() or (rec["rc"] == 0 and rec["state"] != fleet_state()):
        return None  # another lab, or the hosts changed since: roll out here
    if rec["rc"] == 0:
        CONVERGED["state"] = rec["state"]
    with open(TIMINGS, "a") as f:  # where the suite's time went, this run included (it ran beside the unit tests)
        f.write(json.dumps({"test": "tests/lab/first.py (beside the unit tests)", "kind": "deploy",
                            "args": ["deploy.py"], "rc": rec["rc"], "seconds": rec["seconds"]}) + "\n")
    return Run(subprocess.CompletedProcess([], rec["rc"], rec["out"], "")), rec["fresh"]


@pytest.fixture
def converged(first_rollout):
    """A fleet rolled out with the repository's own configuration (each test that changes
    it rolls it back at its end; this re-converges if one failed half way). The deploy is
    skipped when every host still shows exactly what it showed after the last plain deploy
    that succeeded (helpers.fleet_state: release, flags, unit, models, each instance's pid,
    the gateway's configuration and server states)."""
    from tests.lab.helpers import deploy, lab, still

    if still():
        return lab()["hosts"]
    run = deploy()
    assert run.rc == 0, run
    return lab()["hosts"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's outcome on its node (the fault cases record it)."""
    outcome = yield
    if call.when == "call":
        item.rep_call = outcome.get_result()


@pytest.fixture
def three(converged):
    """The first three lab hosts, converged (a smaller lab grows to three)."""
    from lab import fleet
    from tests.lab.helpers import deploy, lab

    if len(lab()["hosts"]) < 3:
        fleet.up(3)
        assert deploy().rc == 0
    return lab()["hosts"][:3]


@pytest.fixture
def gw(converged):
    """The lab's HAProxy gateway host, in front of a converged fleet."""
    from tests.lab.helpers import lab

    g = lab().get("gateway")
    assert g, "the lab has no gateway host: run `python -m lab up --gateway`"
    return g
