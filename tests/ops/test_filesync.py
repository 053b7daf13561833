"""roles/filesync.synced against pyinfra's own files.directory and files.put, run one after
the other as they were: on the same host (a small simulated file system, each command
applied as it is yielded, as pyinfra executes it), the same commands in the same order and
the same files left, whatever the host had; and one fact read instead of three per file."""
from __future__ import annotations

import copy
import hashlib
import re
from types import SimpleNamespace

import pytest
from pyinfra.api import FileUploadCommand
from pyinfra.context import ctx_host, ctx_inventory, ctx_state
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.operations import files as pyinfra_files

from roles.filesync import ChangeLog, FileChange, FilesState, Wanted, synced
from tests.ops.fakes import FakeHost, FakeInventory, FakeOp

D = "/opt/voltafleet/bin"
A = Wanted(f"{D}/vf-a", "755", text="#!/bin/sh\necho a\n")
B = Wanted(f"{D}/vf-b", "755", text="#!/bin/sh\necho b\n")


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


class Disk(FakeHost):
    """A host whose facts come from its paths {path: {"type", "mode", "text"}}; a command
    changes them as it would on the host."""

    def __init__(self, paths: dict, executing: bool = True):
        super().__init__({}, executing=executing)
        self.paths, self.reads = paths, []
        self.state.cwd, self.state.config = "/", SimpleNamespace(DIFF=False)
        self.current_op_global_arguments = None

    def noop(self, description):
        pass

    def get_temp_filename(self, key, temp_directory=None):
        return f"/tmp/pyinfra-{hashlib.sha1(key.encode()).hexdigest()}"

    def get_fact(self, cls, *args, **kwargs):
        self.reads.append(cls.__name__)
        if cls is FilesState:
            return FilesState().process([self.line(p) for p in kwargs["paths"]])
        p = self.paths.get(kwargs["path"])
        kind = {File: "file", Directory: "dir", Link: "link"}.get(cls)
        if kind:
            return None if p is None else (False if p["type"] != kind else {"mode": p["mode"], "user": "root",
                                                                              "group": "root"})
        if cls is Sha1File:
            return sha1(p["text"]) if p and p["type"] == "file" else None
        raise AssertionError(cls)

    def line(self, path: str) -> str:
        p = self.paths.get(path)
        if p is None:
            return "none"
        if p["type"] == "file":
            return f"file {p['mode']} {sha1(p['text'])}"
        return f"dir {p['mode']}" if p["type"] == "dir" else p["type"]

    def run(self, generator) -> list[str]:
        """Iterate an operation's commands, applying each as pyinfra executes it; an error
        the operation raises ends the list."""
        out = []
        with ctx_host.use(self), ctx_state.use(self.state), ctx_inventory.use(FakeInventory()):
            try:
                for c in generator:
                    out.append(self.apply(c))
            except Exception as e:
                out.append(f"raised {type(e).__name__}: {e}")
        return out

    def apply(self, c) -> str:
        """One command, as the host would carry it out; its text."""
        if isinstance(c, FileUploadCommand):
            if hasattr(c.src, "seek"):
                c.src.seek(0)  # as pyinfra's connectors read it (its checksum read it before)
            text = c.src.read() if hasattr(c.src, "read") else open(c.src).read()
            self.paths[c.dest] = {"type": "file", "mode": 644, "text": text}
            return f"upload {c.dest} {sha1(text)}"
        cmd = str(c.get_raw_value() if hasattr(c, "get_raw_value") else c)
        if m := re.fullmatch(r"mkdir -p (\S+)", cmd):
            self.paths.setdefault(m.group(1), {"type": "dir", "mode": 755})
        elif m := re.fullmatch(r"chmod (\d+) (\S+)", cmd):
            self.paths[m.group(2)]["mode"] = int(m.group(1))
        return cmd


def theirs(disk: Disk, files: list[Wanted], directories: list) -> list[str]:
    """files.directory, then one files.put per file: the operations synced stands for."""
    out = []
    for path, mode in directories:
        out += disk.run(pyinfra_files.directory._inner(path=path, mode=mode))
    for f in files:
        out += disk.run(pyinfra_files.put._inner(src=f.source(), dest=f.dest, mode=f.mode))
    return out


def f(text, mode=755):
    return {"type": "file", "mode": mode, "text": text}


DIR = {"type": "dir", "mode": 755}
HOSTS = {
    "fresh": {},
    "converged": {D: DIR, A.dest: f(A.text), B.dest: f(B.text)},
    "one changed": {D: DIR, A.dest: f("old"), B.dest: f(B.text)},
    "mode only": {D: DIR, A.dest: f(A.text, 644), B.dest: f(B.text)},
    "directory mode": {D: {"type": "dir", "mode": 700}, A.dest: f(A.text), B.dest: f(B.text)},
    "a link in place": {D: DIR, A.dest: {"type": "link"}, B.dest: f(B.text)},
    "a directory in place": {D: DIR, A.dest: DIR, B.dest: f(B.text)},
    "one missing": {D: DIR, B.dest: f(B.text)},
}


@pytest.mark.parametrize("name", HOSTS)
@pytest.mark.parametrize("directories", [[(D, "755")], []], ids=["with its directory", "directory made by put"])
@pytest.mark.parametrize("source", ["text", "local file"])
def test_same_commands_and_files_as_directory_and_put(name, directories, source, tmp_path):
    files = [A, B]
    if source == "local file":  # the helper scripts: files of the repository
        for w in files:
            (tmp_path / w.dest.rsplit("/", 1)[1]).write_text(w.text)
        files = [Wanted(w.dest, w.mode, path=str(tmp_path / w.dest.rsplit("/", 1)[1])) for w in files]
    ours, other = Disk(copy.deepcopy(HOSTS[name])), Disk(copy.deepcopy(HOSTS[name]))
    assert ours.run(synced._inner(files=files, directories=directories)) == theirs(other, files, directories)
    assert ours.paths == other.paths
    if name != "a directory in place":
        assert ours.reads == ["FilesState"]  # one fact for every file (pyinfra's: up to 3 a file, 1 a directory)


def test_the_log_says_which_files_change_before_any_command():
    disk = Disk(copy.deepcopy(HOSTS["one changed"]))
    log = ChangeLog()
    disk.run(synced._inner(files=[A, B], directories=[(D, "755")], log=log))
    assert log.changed == {True: {A.dest}}
    # as pyinfra's OperationMeta answers: the operation changed, and this file with it
    assert FileChange(FakeOp(True), log, A.dest).did_change() and not FileChange(FakeOp(True), log, B.dest).did_change()
    assert not FileChange(FakeOp(False), log, A.dest).did_change()
    prepare = Disk(copy.deepcopy(HOSTS["mode only"]), executing=False)
    prepare.run(synced._inner(files=[A, B], directories=[(D, "755")], log=log))
    assert log.changed[False] == {A.dest}
    assert FileChange(FakeOp(True, complete=False), log, A.dest).will_change
    assert not FileChange(FakeOp(True, complete=False), log, B.dest).will_change


def test_then_runs_after_a_change_only():
    unit = Wanted("/etc/systemd/system/llama-server@.service", "644", text="[Unit]\n")
    disk = Disk({"/etc/systemd/system": DIR})
    cmds = disk.run(synced._inner(files=[unit], then=["systemctl daemon-reload"]))
    assert cmds == [f"upload {unit.dest} {sha1(unit.text)}", f"chmod 644 {unit.dest}", "systemctl daemon-reload"]
    assert disk.run(synced._inner(files=[unit], then=["systemctl daemon-reload"])) == []


def test_fact_command_and_answer():
    cmd = FilesState().command(paths=["/a b", "/c"])
    assert cmd.startswith("for p in '/a b' /c; do ")
    assert FilesState().process(["dir 755", "file 644 " + "f" * 40, "none", "link", "other"]) == [
        {"type": "dir", "mode": 755}, {"type": "file", "mode": 644, "sha1": "f" * 40}, {"type": "none"},
        {"type": "link"}, {"type": "other"}]
