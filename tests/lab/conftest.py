import os

import pytest

from lab.fleet import STATE_FILE


def pytest_collection_modifyitems(config, items):
    if STATE_FILE.exists():
        return
    if os.environ.get("VOLTAFLEET_REQUIRE_LAB") == "1":
        raise pytest.UsageError(f"the lab fleet is not up ({STATE_FILE} missing): run `python -m lab up`")
    skip = pytest.mark.skip(reason="lab fleet not up (python -m lab up)")
    for item in items:
        if "tests/lab/" in str(item.fspath):
            item.add_marker(skip)
