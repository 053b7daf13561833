"""The fixtures a test of one issue-51 GPU call's records takes: its results.json, its servers' whole logs
(logs.tgz) and item 3's rounds against a seed of the same run. `results, logs, rounds = call_fixtures(CALL)` at a
test module's top makes them that module's fixtures."""
from pathlib import Path

import pytest

from bench.traffic import analyze


def results_of(call: Path) -> dict:
    """A call's results.json, or its gzip'd copy once a later session's records are in."""
    plain = call / "results.json"
    return analyze.load(str(plain if plain.exists() else call / "results.json.gz"))


def config_named(results: dict, name: str) -> dict:
    """The traffic config's record that stands for `name`: a config run again from its start beside an earlier
    partial record of it is its complete one (analyze.configs keeps that)."""
    return next(c for c in analyze.configs(results) if c["name"] == name)


def call_fixtures(call: Path, seed: str = "thr-seed"):
    @pytest.fixture(scope="module")
    def results():
        return results_of(call)

    @pytest.fixture(scope="module")
    def logs():
        return analyze.logs_of(str(call / "logs.tgz"))

    @pytest.fixture(scope="module")
    def rounds(results):
        return analyze.rounds(results, seed=seed)

    return results, logs, rounds
