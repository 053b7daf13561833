"""Records and docs name no machine's paths (issue 40): a checkout, a worktree or a home directory
is this machine's, not the project's. The project's own install paths on a host (/var/lib/voltafleet,
/opt/voltafleet) and the device's scratch folders (/tmp/...) named in a record's recipe are not."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MACHINE = re.compile(r"(?<![\w.])/(?:work|root|home|Users)/[\w.-]+")


def tracked(*roots: str) -> list[Path]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "--", *roots], capture_output=True, text=True,
                         check=True).stdout.split()
    return [REPO / p for p in out if not p.endswith((".gguf", ".tgz", ".gz", ".png"))]


def test_no_record_or_doc_names_a_machines_path():
    found = []
    for path in tracked("bench/records", "docs", "README.md", "bench/RESULTS.md", "group_vars"):
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in MACHINE.finditer(text)]
    assert not found, found[:20]


def test_the_pattern_finds_a_worktree_and_a_home_but_not_the_projects_paths():
    assert MACHINE.search("how this record was made (worktree /work/wt-gpu32, on 67e8e13)")
    assert MACHINE.search("cd /home/alice/voltafleet && make demo")
    assert not MACHINE.search("-m /var/lib/voltafleet/models/a5fd/gemma.gguf /opt/voltafleet/releases/x")
