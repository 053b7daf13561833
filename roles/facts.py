"""voltafleet's pyinfra facts: what a host has, read before (and during) the rollout.

pyinfra 3 reads facts afresh each time: in the prepare phase they show the state before
the rollout, and operations re-read them when they execute.
"""
from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from voltafleet.front import gateway as gw
from voltafleet.gpu import gpuhealth
from voltafleet.models import mirror
from voltafleet.gpu.nvidia import gpus_from_lspci


class Gpus(FactBase):
    """NVIDIA GPUs as nvidia-smi lists them; with no driver yet, as lspci sees them
    (name and compute capability from the PCI id); [] when there are none.

    .. code:: python

        host.get_fact(Gpus)  # [{"index": 0, "name": "Tesla V100-SXM2-16GB", "compute_cap": "7.0", ...}]
    """

    @staticmethod
    def default():
        return []

    def command(self) -> str:
        return ("nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version "
                "--format=csv,noheader,nounits 2>/dev/null "
                "|| (lspci -Dnn -d 10de: 2>/dev/null | sed 's/^/pci: /') || true")

    def process(self, output):
        pci = [line[5:] for line in output if line.startswith("pci: ")]
        return parse_gpus(output) or gpus_from_lspci(pci)


def parse_gpus(lines) -> list[dict]:
    gpus = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5 or not parts[0].isdigit():
            continue
        gpus.append({"index": int(parts[0]), "name": parts[1], "compute_cap": parts[2],
                     "memory_mib": int(float(parts[3])), "driver_version": parts[4]})
    return gpus


class GpuHealth(FactBase):
    """The boards' health: `nvidia-smi -q` (ECC, page retirement, throttle reasons, clocks,
    temperature, power, PCIe link), `nvidia-smi nvlink -e` and the kernel log's Xid lines
    since boot, parsed by voltafleet.gpu.gpuhealth.parse_fact; "error" says why none could be read.

    .. code:: python

        host.get_fact(GpuHealth)  # {"gpus": [{"index": 0, "pci": "0000:3b:00.0", "retired": {...}, ...}], "xids": [], ...}
    """

    @staticmethod
    def default():
        return gpuhealth.parse_fact([])  # the command printed nothing: an error, never a healthy host

    def command(self) -> str:
        mark = gpuhealth.MARK
        return (f"command -v nvidia-smi >/dev/null 2>&1 || {{ echo {gpuhealth.NO_SMI}; exit 0; }}; "
                f"nvidia-smi -q 2>&1; echo '{mark}nvlink'; nvidia-smi nvlink -e 2>&1; "
                "if log=$(journalctl -k -b --no-pager -o short-monotonic 2>/dev/null); then src=journal; "
                "elif log=$(dmesg 2>/dev/null); then src=dmesg; else src=none; fi; "
                f"echo \"{mark}xid $src\"; printf '%s\\n' \"$log\" | grep -F 'NVRM: Xid' || true")

    def process(self, output):
        return gpuhealth.parse_fact(list(output))


class NvccVersion(FactBase):
    """A CUDA toolkit's version, e.g. "12.9.86"; None if absent. With `path`, that nvcc;
    without, the one a plain build would find (PATH, then /usr/local/cuda).

    .. code:: python

        host.get_fact(NvccVersion, path="/usr/local/cuda-12.9/bin/nvcc")  # "12.9.86"
    """

    def command(self, path: str | None = None) -> str:
        candidates = shlex.quote(path) if path else "nvcc /usr/local/cuda/bin/nvcc"
        return (f"for n in {candidates}; do command -v $n >/dev/null 2>&1 "
                "&& { $n --version; exit 0; }; done; true")

    def process(self, output):
        return parse_nvcc(output)


def parse_nvcc(lines) -> str | None:
    for line in lines:
        # "Cuda compilation tools, release 12.9, V12.9.86"
        if "release" in line and ", V" in line:
            return line.rsplit(", V", 1)[1].strip()
    return None


class HostBasics(FactBase):
    """OS id and version, CPU count, RAM and the C++ compiler of a host; for the host plan
    (voltafleet.planning.hostmem, voltafleet.planning.hostcpu) also MemAvailable, the NUMA nodes' CPU lists and each
    NVIDIA GPU's NUMA node (sysfs, by PCI address: read before any driver is installed).

    .. code:: python

        host.get_fact(HostBasics)
        # {"os": "debian-12", "cpus": 2, "mem_mib": 24000, "cxx": "12.2.0 x86_64-linux-gnu", "systemd": 252,
        #  "mem_total_kib": 24683664, "mem_available_kib": 23626008, "nodes": {0: "0-1"},
        #  "gpu_numa": {"0000:3b:00.0": 0}}
    """

    def command(self) -> str:
        return (". /etc/os-release; echo \"os=$ID-$VERSION_ID\"; echo \"cpus=$(nproc)\"; "
                "echo \"mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)\"; "
                "echo \"mem_available_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)\"; "
                "echo \"systemd=$(systemctl --version 2>/dev/null | awk 'NR==1 {print $2}')\"; "
                "if command -v c++ >/dev/null 2>&1; then "
                "echo \"cxx=$(c++ -dumpfullversion) $(c++ -dumpmachine)\"; fi; "
                "for n in /sys/devices/system/node/node[0-9]*; do [ -r \"$n/cpulist\" ] && "
                "echo \"node=${n##*node} $(cat \"$n/cpulist\")\"; done; "
                "for v in $(grep -lx 0x10de /sys/bus/pci/devices/*/vendor 2>/dev/null); do d=${v%/vendor}; "
                "case $(cat \"$d/class\") in 0x0300*|0x0302*) echo \"gpu_numa=${d##*/} $(cat \"$d/numa_node\")\";; esac; "
                "done; true")

    def process(self, output):
        kv, nodes, gpu_numa = {}, {}, {}
        for line in output:
            key, sep, value = line.partition("=")
            if not sep:
                continue
            parts = value.split()
            if key == "node" and len(parts) == 2 and parts[0].isdigit():
                nodes[int(parts[0])] = parts[1]
            elif key == "gpu_numa" and len(parts) == 2:
                gpu_numa[parts[0]] = int(parts[1]) if parts[1].lstrip("-").isdigit() else -1
            else:
                kv[key] = value
        return {"os": kv.get("os"), "cpus": _int(kv.get("cpus")),
                "mem_mib": int(kv.get("mem_kib", 0)) // 1024, "cxx": kv.get("cxx"),
                "systemd": int(kv["systemd"]) if kv.get("systemd", "").isdigit() else 0,
                "mem_total_kib": _int(kv.get("mem_kib")), "mem_available_kib": _int(kv.get("mem_available_kib")),
                "nodes": nodes, "gpu_numa": gpu_numa}


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


class FreeDisk(FactBase):
    """Filesystem id and free bytes where `path` is (or its nearest existing parent); with
    `releases`, how many built releases (with BUILD_INFO.json) it holds too (the disk plan counts only those
    still to come), None when the command did not say.

    .. code:: python

        host.get_fact(FreeDisk, path="/var/lib/voltafleet/models")  # {"dev": "64768", "free": 85899345920, "releases": None}
        host.get_fact(FreeDisk, path="/opt/voltafleet", releases="/opt/voltafleet/releases")  # ..., "releases": 2
    """

    def command(self, path: str, releases: str | None = None) -> str:
        count = (f"; r={shlex.quote(releases)}; echo \"releases=$(ls \"$r\"/*/BUILD_INFO.json 2>/dev/null | wc -l)\""
                 if releases else "")
        return (f"p={shlex.quote(path)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
                "echo \"$(stat -c %d \"$p\") $(df -PB1 \"$p\" | awk 'NR==2 {print $4}')\"" + count)

    def process(self, output):
        dev, free = output[0].split()
        count = next((line.split("=", 1)[1] for line in output[1:] if line.startswith("releases=")), "")
        return {"dev": dev, "free": int(free), "releases": int(count) if count.isdigit() else None}


class Releases(FactBase):
    """llama.cpp releases under ROOT: which exist, which is current, last good and their build info.

    .. code:: python

        host.get_fact(Releases, root="/opt/voltafleet")
        # {"current": "3f2a...", "good": "3f2a...", "releases": {"3f2a...": {"mtime": 1.7e9, "info": {...}}}}
    """

    @staticmethod
    def default():
        return {"current": None, "good": None, "releases": {}}

    def command(self, root: str) -> str:
        return (f"cd {shlex.quote(root)} 2>/dev/null || exit 0; "
                "echo \"current=$(basename \"$(readlink current 2>/dev/null)\" 2>/dev/null)\"; "
                "echo \"good=$(basename \"$(readlink good 2>/dev/null)\" 2>/dev/null)\"; "
                "for d in releases/*/; do [ -f \"$d/BUILD_INFO.json\" ] || continue; "
                "echo \"release=$(basename \"$d\") $(stat -c %Y \"$d\") $(tr -d '\\n' < \"$d/BUILD_INFO.json\")\"; done")

    def process(self, output):
        out = self.default()
        for line in output:
            key, _, val = line.partition("=")
            if key in ("current", "good"):
                out[key] = val or None
            elif key == "release":
                name, mtime, info = val.split(" ", 2)
                out["releases"][name] = {"mtime": float(mtime), "info": json.loads(info)}
        return out


class FileState(FactBase):
    """Size and mtime of a file plus the content of a small sidecar file; None if absent."""

    def command(self, path: str, sidecar: str) -> str:
        path, sidecar = shlex.quote(path), shlex.quote(sidecar)
        return (f"if [ -f {path} ]; then stat -c 'stat=%s %Y' {path}; "
                f"[ -f {sidecar} ] && sed 's/^/side=/' {sidecar}; fi; true")

    def process(self, output):
        out = {}
        for line in output:
            key, _, val = line.partition("=")
            if key == "stat":
                size, mtime = val.split()
                out.update(size=int(size), mtime=int(mtime))
            elif key == "side":
                out.setdefault("sidecar", []).append(val)
        return out or None


class HelpText(FactBase):
    """`llama-server --help` of a given binary, or None if the binary is not there."""

    def command(self, binary: str) -> str:
        binary = shlex.quote(binary)
        return f"if [ -x {binary} ]; then {binary} --help 2>&1; else echo __voltafleet_missing__; fi; true"

    def process(self, output):
        if output and output[0] == "__voltafleet_missing__":
            return None
        return "\n".join(output)


class ServerInstances(FactBase):
    """llama-server@N units on a host: {index: {"env": True, "active": "active", "enabled": "enabled"}}."""

    @staticmethod
    def default():
        return {}

    def command(self, env_dir: str) -> str:
        return (f"for f in {shlex.quote(env_dir)}/*.env; do [ -f \"$f\" ] || continue; i=$(basename \"$f\" .env); "
                "echo \"$i $(systemctl is-active llama-server@$i.service 2>/dev/null || true) "
                "$(systemctl is-enabled llama-server@$i.service 2>/dev/null || true)\"; done")

    def process(self, output):
        out = {}
        for line in output:
            parts = line.split()
            if parts and parts[0].isdigit():
                out[int(parts[0])] = {"active": parts[1] if len(parts) > 1 else "unknown",
                                      "enabled": parts[2] if len(parts) > 2 else "unknown"}
        return out


ENV_MARK = "@@voltafleet-env"


class EnvFiles(FactBase):
    """Every instance's environment file under env_dir, with its sha1 (what files.put compares):
    {index: {"sha1": ..., "text": ...}}; {} when there is none.

    .. code:: python

        host.get_fact(EnvFiles, env_dir="/etc/voltafleet/llama-server")
        # {0: {"sha1": "3f1e...", "text": "CUDA_VISIBLE_DEVICES=0\nLLAMA_SERVER_ARGS=-m ...\n"}}
    """

    @staticmethod
    def default():
        return {}

    def command(self, env_dir: str) -> str:
        return (f"for f in {shlex.quote(env_dir)}/*.env; do [ -f \"$f\" ] || continue; "
                f"echo \"{ENV_MARK} $(basename \"$f\" .env) $(sha1sum < \"$f\" | cut -d' ' -f1)\"; cat \"$f\"; "
                "[ -z \"$(tail -c1 \"$f\")\" ] || echo; done")  # a last line without its newline stays apart

    def process(self, output):
        out, current = {}, None
        for line in output:
            if line.startswith(ENV_MARK + " "):
                parts = line.split()
                current = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
                if current is not None:
                    out[current] = {"sha1": parts[2], "lines": []}
            elif current is not None:
                out[current]["lines"].append(line)
        return {i: {"sha1": f["sha1"], "text": "".join(line + "\n" for line in f["lines"])} for i, f in out.items()}


class ServiceAccount(FactBase):
    """A service account as pyinfra's Groups and Users facts see it (/etc/group, /etc/passwd,
    the primary group by `id -gn`), in one command: {"group": True, "home": "/nonexistent",
    "shell": "/usr/sbin/nologin", "primary": "llama"}; home, shell and primary are None
    when /etc/passwd has no such user.

    .. code:: python

        host.get_fact(ServiceAccount, user="llama")
    """

    def command(self, user: str) -> str:
        u = shlex.quote(user)
        return (f"awk -F: -v u={u} '$1 == u {{print \"group=yes\"}}' /etc/group; "
                f"awk -F: -v u={u} '$1 == u {{print \"home=\" $6; print \"shell=\" $7}}' /etc/passwd; "
                f"echo \"primary=$(id -gn {u} 2>/dev/null)\"")

    @staticmethod
    def default():
        return {"group": False, "home": None, "shell": None, "primary": None}

    def process(self, output):
        out = self.default()
        for line in output:
            key, _, value = line.partition("=")
            if key == "group":
                out["group"] = True
            elif key in ("home", "shell") and out[key] is None:
                out[key] = value
            elif key == "primary":
                out["primary"] = value or None
        return out




class HAProxyServers(FactBase):
    """{server: status} of every tier's backend (llama, llama_<tier>), from HAProxy's runtime API (`show stat`)."""

    @staticmethod
    def default():
        return {}

    def command(self) -> str:
        return f"[ -S {gw.ADMIN_SOCKET} ] && {gw.runtime('show stat')} || true"

    def process(self, output):
        return gw.server_states("\n".join(output))


class HAProxyBackends(FactBase):
    """Every tier's backend's servers as the live configuration lists them: [(name, address, port, maxconn, tier)]."""

    @staticmethod
    def default():
        return []

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def process(self, output):
        return gw.configured_servers("\n".join(output))


class Nameservers(FactBase):
    """The host's nameservers (/etc/resolv.conf), as nginx's `resolver` takes them.

    .. code:: python

        host.get_fact(Nameservers)  # ["10.0.0.53", "[fd00::53]"]
    """

    @staticmethod
    def default():
        return []

    def command(self) -> str:
        return "grep -s '^nameserver' /etc/resolv.conf || true"

    def process(self, output):
        return mirror.resolvers(output)
