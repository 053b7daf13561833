"""Several files in place in one operation that reads one fact: what a files.directory
and one files.put per file do (the same commands, in the same order), for a controller
that pays pyinfra's cost per operation and per fact on every host (bench/controller/scale.py): the
helper scripts were eight operations reading 22 facts, the instances' environment files
nine reading 25.

    synced(name="Helper scripts", files=[Wanted("/opt/voltafleet/bin/vf-good", "755", path="roles/activation/files/vf-good.sh")],
           directories=[("/opt/voltafleet/bin", "755")])

Per file, as files.put(src, dest, mode) does: missing (or a symbolic link) or another
content (sha1): upload it and chmod it; the same content with another mode: chmod it; its
directory missing: mkdir -p first. Per directory, as files.directory(path, mode): missing:
mkdir -p and chmod; another mode: chmod. Anything else at a path (a directory where a file
belongs, a file where a directory does) is left to pyinfra's own operation code, which says
what it says there; so is every changed file under `pyinfra --diff` (which prints its diff).

`log` (a ChangeLog) learns which files the operation changes before it yields a command,
in the prepare phase (pyinfra's will_change) and when it executes (did_change): an
instance's environment file restarts that instance only (roles/activation).
"""
from __future__ import annotations

import hashlib
import posixpath
import shlex
from dataclasses import dataclass
from functools import lru_cache
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, QuoteString, StringCommand, operation
from pyinfra.operations import files as pyinfra_files
from pyinfra.operations.util import files as file_utils


@dataclass(frozen=True)
class Wanted:
    """A file as it should be on the host: its content from a local file (path) or a text."""
    dest: str
    mode: str
    path: str | None = None
    text: str | None = None

    def source(self):
        """What files.put would be given: the local file's path, or the text as a file object."""
        return self.path if self.path is not None else StringIO(self.text)

    def sha1(self) -> str:
        return _path_sha1(self.path, Path(self.path).stat().st_mtime_ns) if self.path is not None \
            else _text_sha1(self.text)


@lru_cache(maxsize=256)
def _path_sha1(path: str, mtime_ns: int) -> str:
    return hashlib.sha1(Path(path).read_bytes()).hexdigest()


@lru_cache(maxsize=4096)
def _text_sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()  # as pyinfra's get_file_sha1 reads a StringIO


class FilesState(FactBase):
    """Each path's type (file, dir, link, other or none), mode and, for a file, sha1:
    [{"type": "file", "mode": 755, "sha1": "..."}, {"type": "dir", "mode": 755}, {"type": "none"}, ...]
    in the order of `paths`.

    .. code:: python

        host.get_fact(FilesState, paths=["/opt/voltafleet/bin", "/opt/voltafleet/bin/vf-good"])
    """

    @staticmethod
    def default():
        return []

    def command(self, paths: list[str]) -> str:
        return ("for p in " + " ".join(shlex.quote(p) for p in paths) + "; do "
                "if [ -L \"$p\" ]; then echo link; "
                "elif [ -d \"$p\" ]; then echo \"dir $(stat -c %a \"$p\")\"; "
                "elif [ -f \"$p\" ]; then echo \"file $(stat -c %a \"$p\") $(sha1sum < \"$p\" | cut -d' ' -f1)\"; "
                "elif [ -e \"$p\" ]; then echo other; else echo none; fi; done")

    def process(self, output):
        out = []
        for line in output:
            parts = line.split()
            if not parts:
                continue
            entry = {"type": parts[0]}
            if len(parts) > 1 and parts[1].isdigit():
                entry["mode"] = int(parts[1])
            if len(parts) > 2:
                entry["sha1"] = parts[2]
            out.append(entry)
        return out


def fact_paths(files: list[Wanted], directories: list[tuple[str, str]]) -> list[str]:
    """The paths the operation's one fact reads: the directories, the files' own
    directories, the files (each once, in that order)."""
    paths = [d for d, _ in directories] + [posixpath.dirname(f.dest) for f in files] + [f.dest for f in files]
    return list(dict.fromkeys(p for p in paths if p))


class ChangeLog:
    """Which files a synced operation changes, per run stage (prepare: will, execute: did)."""

    def __init__(self):
        self.changed: dict[bool, set[str]] = {}

    def changes(self, dest: str, executing: bool) -> bool:
        return dest in self.changed.get(executing, set())


class FileChange:
    """One file of a synced operation, as pyinfra's OperationMeta answers (is_complete,
    did_change, will_change): changed when the operation changed this file."""

    def __init__(self, op, log: ChangeLog, dest: str):
        self.op, self.log, self.dest = op, log, dest

    def is_complete(self) -> bool:
        return self.op.is_complete()

    def did_change(self) -> bool:
        return bool(self.op.did_change()) and self.log.changes(self.dest, True)

    @property
    def will_change(self) -> bool:
        return bool(self.op.will_change) and self.log.changes(self.dest, False)

    def __repr__(self):
        return f"FileChange({self.dest})"


def _mode(mode: str) -> int:
    return int(mode)  # pyinfra's ensure_mode_int of "755": 755, as its File fact gives a mode


@operation()
def synced(files: list[Wanted], directories: list[tuple[str, str]] = (), log: ChangeLog | None = None,
           then: list[str] = ()):
    """Directories and files in place, in one operation reading one fact (FilesState).

    + files: the Wanted files
    + directories: (path, mode) of directories to create or chmod first (files.directory)
    + log: a ChangeLog told which files change, before any command
    + then: commands to run after any change (systemctl daemon-reload after a unit changed)

    .. code:: python

        synced(files=[Wanted("/etc/voltafleet/llama-server/0.env", "644", text="...")],
               directories=[("/etc/voltafleet/llama-server", "755")])
    """
    paths = fact_paths(files, directories)
    state = dict(zip(paths, host.get_fact(FilesState, paths=paths)))
    todo: list[tuple[str, object]] = []  # ("dir", (path, mode)) | ("mkdir", path) | ("put", Wanted) | ("chmod", Wanted) | (pyinfra's, ...)
    made: set[str] = set()
    for path, mode in directories:
        s = state.get(path, {"type": "none"})
        if s["type"] == "none":
            todo.append(("dir", (path, mode)))
            made.add(path)
        elif s["type"] != "dir":
            todo.append(("pyinfra_dir", (path, mode)))
            made.add(path)
        elif s.get("mode") != _mode(mode):
            todo.append(("chmod_dir", (path, mode)))
        else:
            host.noop(f"directory {path} already exists")  # pyinfra's words (shown with -v)
    for f in files:
        parent = posixpath.dirname(f.dest)
        p = state.get(parent, {"type": "dir"}) if parent else {"type": "dir"}
        s = state.get(f.dest, {"type": "none"})
        if s["type"] not in ("file", "none", "link") or (p["type"] not in ("dir", "link", "none") and parent not in made):
            todo.append(("pyinfra_put", f))
            continue
        if p["type"] == "none" and parent not in made:
            todo.append(("mkdir", parent))
            made.add(parent)
        if s["type"] != "file" or s.get("sha1") != f.sha1():
            todo.append(("put", f))
        elif s.get("mode") != _mode(f.mode):
            todo.append(("chmod", f))
        else:
            host.noop(f"file {f.dest} is already uploaded")
    if log is not None:
        log.changed[host.state.is_executing] = {f.dest for kind, f in todo if kind in ("put", "chmod", "pyinfra_put")}
    if getattr(getattr(host.state, "config", None), "DIFF", False):  # `pyinfra --diff`: pyinfra's own code prints what it changes
        todo = [("pyinfra_put" if kind in ("put", "chmod") else kind, item) for kind, item in todo]
    if not todo:
        return
    temp_dir = (host.current_op_global_arguments or {}).get("_temp_dir")
    for kind, item in todo:
        if kind == "dir":
            path, mode = item
            yield StringCommand("mkdir", "-p", QuoteString(path))
            yield file_utils.chmod(path, _mode(mode))
        elif kind == "chmod_dir":
            path, mode = item
            yield file_utils.chmod(path, _mode(mode))
        elif kind == "pyinfra_dir":
            path, mode = item
            yield from pyinfra_files.directory._inner(path=path, mode=mode)
        elif kind == "mkdir":
            yield StringCommand("mkdir", "-p", QuoteString(item))
        elif kind == "put":
            yield FileUploadCommand(item.source(), item.dest,
                                    remote_temp_filename=host.get_temp_filename(item.dest, temp_directory=temp_dir))
            yield file_utils.chmod(item.dest, _mode(item.mode))
        elif kind == "chmod":
            yield file_utils.chmod(item.dest, _mode(item.mode))
        elif kind == "pyinfra_put":
            yield from pyinfra_files.put._inner(src=item.source(), dest=item.dest, mode=item.mode)
    for command in then:
        yield command
