"""The GPU proof's runner and its instruments, stdlib only.

ProofRun holds what every phase shares: the command line, plan.json, results.json (saved after every
step), the port and each build's binaries, and starts the servers. Sampler and HostSampler read a
server's GPU and host memory while a workload runs; concurrent releases a round's requests at once.
bench/gpu/v100_measure.py ships this module to a V100 host for Sampler and concurrent.
"""
from __future__ import annotations

import os
import threading
import time

from bench.gpu.qwen35_bench import KEEP, Record, Server, gpu_mem

MIB = 1 << 20


def log_name(label: str, name: str) -> str:
    """The file a config's server writes its log to (in /tmp; gpu_proof.sh packs every load-*.log in logs.tgz)."""
    return f"load-{label}-{name}.log"


class ProofRun(Record):
    """One run of the GPU proof: qwen35_bench's Record (plan, results.json, the GPU's baseline), the
    builds' binaries by label and the model file every phase serves unless it names another."""

    def __init__(self, a):
        super().__init__(a)
        self.model_path = os.path.join(a.models, "q4ks.gguf")

    def bindir(self, label: str) -> str:
        """A build's bin folder: --bins LABEL=DIR, else --cublas-bin for `cublas`, else --bin."""
        bins = dict(kv.split("=", 1) for kv in (self.a.bins or "").split(",") if kv)
        if label in bins:
            return bins[label]
        return self.a.cublas_bin if label == "cublas" else self.a.bin

    def server(self, label: str, name: str, args: list, model: str | None = None, cgroup: str | None = None,
               env: dict | None = None) -> Server:
        """llama-server of build `label` with `args` (MODEL: the model file), up or failed; its log in /tmp;
        in the cgroup v2 folder `cgroup` when given, with the variables `env` beside this process's."""
        return Server(f"{self.bindir(label)}/llama-server", args, model or self.model_path, self.port,
                      f"/tmp/{log_name(label, name)}", cgroup=cgroup, env=env)

    @staticmethod
    def loglines(s: Server) -> list:
        """The load log's lines a record keeps: buffers, offload, context, graph, errors, the build's features."""
        return [line for line in s.log().splitlines() if KEEP.search(line) or "system_info" in line
                or "FORCE" in line][:120]

    def close(self, s: Server, r: dict, out: list) -> None:
        """Stop the server; its record goes to the results with its log lines, saved."""
        s.stop()
        r["log"] = self.loglines(s)
        out.append(r)
        self.save()


class Sampler:
    """The process's GPU memory every 0.1 s while a workload runs: the peak."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.stop_ = pid, 0, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop_:
            m = gpu_mem(self.pid).get("proc_mib") or 0
            self.peak = max(self.peak, m)
            time.sleep(0.1)

    def stop(self) -> int:
        self.stop_ = True
        self.t.join()
        return self.peak


STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")


def proc_mem(pid: int) -> dict:
    """The process's resident memory now, MiB: VmRSS and its parts (anonymous, file pages, shared)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in STATUS_KEYS:
                    out[k] = int(v.split()[0]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


# memory.stat's kernel memory (v2): what the charge holds beside anonymous memory and page cache
KERNEL_STAT = ("kernel", "pagetables", "slab_reclaimable", "slab_unreclaimable", "kernel_stack", "sock", "percpu",
               "shmem", "workingset_nodes")


def cgroup_mem(path: str | None) -> dict:
    """A cgroup v2 folder's memory now, MiB (as voltafleet.measure.cgroupmem reads it): charged
    (memory.current), its page cache (file), anonymous, the charge less its page cache (unreclaimable: what
    the OOM killer weighs at the limit), the kernel's own peak, and memory.events; {} without a cgroup."""
    if not path:
        return {}
    try:
        stat = dict(line.split() for line in open(f"{path}/memory.stat"))
        events = dict(line.split() for line in open(f"{path}/memory.events"))
        current = int(open(f"{path}/memory.current").read())
        peak = int(open(f"{path}/memory.peak").read()) if os.path.exists(f"{path}/memory.peak") else None
    except (OSError, ValueError):
        return {}
    file = int(stat.get("active_file", 0)) + int(stat.get("inactive_file", 0))
    return {"cg_current": current / MIB, "cg_file": file / MIB, "cg_anon": int(stat.get("anon", 0)) / MIB,
            "cg_unreclaimable": (current - file) / MIB, "cg_peak": peak / MIB if peak is not None else None,
            "cg_events": {k: int(v) for k, v in events.items()},
            "cg_kernel": {k: int(stat[k]) / MIB for k in KERNEL_STAT if k in stat}}


class HostSampler:
    """The process's host memory every 0.2 s while a workload runs: the peak of VmRSS, with its
    parts at that moment; with a cgroup, also the peak of its charge less its page cache."""

    def __init__(self, pid: int, cgroup: str | None = None):
        self.pid, self.cgroup, self.peak, self.cg_peak, self.samples, self.stop_ = pid, cgroup, {}, {}, 0, False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop_:
            m = proc_mem(self.pid)
            if m.get("VmRSS", 0) > self.peak.get("VmRSS", -1):
                self.peak = m
            c = cgroup_mem(self.cgroup)
            if c and c["cg_unreclaimable"] > self.cg_peak.get("cg_unreclaimable", -1):
                self.cg_peak = c
            self.samples += 1
            time.sleep(0.2)

    def stop(self) -> dict:
        self.stop_ = True
        self.t.join()
        return {**self.peak, "samples": self.samples, **({"cgroup": self.cg_peak} if self.cgroup else {})}


def concurrent(port: int, jobs: list) -> list:
    """Run each job (a function of no arguments) in its own thread, all released at once."""
    out = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def go(i):
        barrier.wait()
        try:
            out[i] = jobs[i]()
        except Exception as e:  # noqa: BLE001
            out[i] = {"error": repr(e)}
    th = [threading.Thread(target=go, args=(i,)) for i in range(len(jobs))]
    [t.start() for t in th]
    [t.join() for t in th]
    return out


def wall_rate(recs: list) -> float | None:
    """Tokens of a round over its wall time, first request to last token (for the progress log)."""
    good = [q for q in recs if q.get("times_ms")]
    if not good:
        return None
    end = max(q["t_start"] + q["times_ms"][-1] / 1000 for q in good)
    return round(sum(len(q["times_ms"]) for q in good) / (end - min(q["t_start"] for q in good)), 1)
