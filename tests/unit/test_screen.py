"""The rollout's screen (voltafleet.state.screen) on a real pyinfra run of the lab (tests/fixtures/pyinfra:
batch 1 of `make demo`, two hosts): one line per host and step, what voltafleet says, nothing else."""
import itertools
import re
from pathlib import Path

from voltafleet.state.screen import RESULT, Condenser

LOG = (Path(__file__).resolve().parents[1] / "fixtures" / "pyinfra" / "batch-1.log").read_text().splitlines()


def shown():
    tick = itertools.count(0, 0.5)
    c = Condenser("batch 1", clock=lambda: next(tick))
    out = []
    for line in LOG:
        out += c.feed(line)
    return out + c.close()


def test_one_line_per_host_and_step_and_nothing_of_pyinfras_narration():
    out = shown()
    # every (host, step) pyinfra reported a result for, skipped ones aside, is one line
    pairs, step = set(), None
    for line in LOG:
        if line.startswith("--> Starting operation: "):
            step = line.split(": ", 1)[1].split(" | ")[0].strip()
        m = RESULT.match(line)
        if m and m.group(2) != "Skipped":
            pairs.add((m.group(1), step))
    steps = [line for line in out if line.startswith("  batch 1 ")]
    assert len(steps) == len(pairs) and len(pairs) >= 10
    assert {(w.split()[2], re.split(r"\s{2,}", w.strip())[2]) for w in steps} == pairs
    assert all(re.search(r" (ok|changed|error) +\d+\.\d s$", w) for w in steps)
    for noise in ("Skipped", "Connected", "Ready: deploy.py", "Grand total", "--> Loading", "No changes"):
        assert not any(noise in line for line in out), noise
    # what voltafleet says passes through: both smoke tables and verdicts
    assert sum(line.startswith("host ") and "TTFT" in line for line in out) == 2
    assert sum(line.endswith("smoke PASSED") for line in out) == 2
    assert len(out) < len(LOG) / 3


def test_a_step_that_changed_or_failed_says_so():
    c = Condenser("canary", clock=iter(range(100)).__next__)
    for line in ("--> Starting operation: Server | A", "    [h1]  No changes", "--> Starting operation: Server | B",
                 "    [h1]  Success", "--> Starting operation: Smoke test | C", "    [h1]  Error",
                 "--> pyinfra error: something broke"):
        c.feed(line)
    out = c.close()
    assert out == ["  canary   h1            Smoke test       error       1.0 s"]
    c = Condenser("x", clock=iter(range(100)).__next__)
    c.feed("--> Starting operation: Server | A")
    c.feed("    [h1]  No changes")
    assert c.feed("--> Starting operation: Smoke test | C") == [] and c.feed("    [h1]  Success") == [
        "  x        h1            Server           ok          1.0 s"]
    assert c.feed("--> pyinfra error: something broke") == ["--> pyinfra error: something broke"]
