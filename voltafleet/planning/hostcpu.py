"""CPU plan: do a host's llama-servers' threads fit its CPUs, and on which NUMA node does each run?

Each instance runs max(server_threads, server_threads_batch) threads (-t, -tb). The host's
instances together must fit its CPUs (nproc) less hostcpu_reserve (the system, sshd, HAProxy's
checks). Where the host has several NUMA nodes and each GPU's node is known (sysfs numa_node of
its PCI device), each instance runs on its GPU's node: the threads of the instances of a node
must fit that node's CPUs, and the instance's argv gets llama-server's affinity masks for that
node (-C for generation, -Cb for prompt batches: llama.cpp copies -C to the batch threads only
when -tb is not given). ggml sets them with pthread_setaffinity_np on each worker thread: the
kernel enforces them. One node, or an unknown topology: no placement flags.

    >>> p = plan(cfg, [0, 1, 2, 3], cpus=64, nodes={0: "0-31", 1: "32-63"}, gpu_nodes={0: 0, 1: 0, 2: 1, 3: 1})
    >>> p.args(2)
    ['-C', 'ffffffff00000000', '-Cb', 'ffffffff00000000']
"""
from __future__ import annotations

from voltafleet.inputs.settings import Settings

from dataclasses import dataclass, field


def cpulist(text: str) -> list[int]:
    """sysfs's CPU list ("0-15,32-47") as CPU numbers."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def mask(cpus: list[int]) -> str:
    """llama.cpp's -C mask: hex, the highest CPU's digit first (common.cpp parse_cpu_mask)."""
    return format(sum(1 << c for c in set(cpus)), "x")


def gpu_nodes(by_address: dict, gpu_addresses: dict | None = None) -> dict[int, int]:
    """{GPU index: NUMA node} from sysfs's {PCI address: node} (roles/facts.py HostBasics): by each
    GPU's address where nvidia-smi gave it ({index: "0000:3b:00.0"}, the GpuHealth fact), else in
    bus order (how nvidia-smi numbers GPUs by default, and voltafleet.gpu.nvidia.gpus_from_lspci before
    a driver). A node of -1 (the firmware gives none) is left out: not known."""
    if gpu_addresses:
        pairs = [(i, by_address.get(a.lower())) for i, a in gpu_addresses.items()]
    else:
        pairs = list(enumerate(by_address[a] for a in sorted(by_address)))
    return {int(i): n for i, n in pairs if n is not None and n >= 0}


def threads(cfg: Settings) -> int:
    """Threads one instance runs: the larger of -t and -tb (server_threads_batch null: same as -t)."""
    return max(int(cfg.server.threads), int(cfg.server.threads_batch or cfg.server.threads))


@dataclass(frozen=True)
class CpuPlan:
    """A host's CPU plan: its instances' threads against its CPUs, and each instance's NUMA placement."""

    threads: int                        # one instance's
    instances: tuple[int, ...]          # their indexes (the GPU index on CUDA hosts)
    reserve: int                        # hostcpu_reserve: CPUs kept for the system
    cpus: int | None                    # CPUs the host's processes may use (nproc); None: not read
    nodes: dict = field(default_factory=dict)      # {NUMA node: its CPU list}; {}: not read
    placement: dict = field(default_factory=dict)  # {instance index: NUMA node}; {}: no placement

    @property
    def need(self) -> int:
        return len(self.instances) * self.threads + self.reserve

    def on_node(self, node: int) -> list[int]:
        return [i for i in self.instances if self.placement.get(i) == node]

    def largest_threads(self) -> int:
        """The most threads an instance may run so that the host and every node fit."""
        best = (self.cpus - self.reserve) // len(self.instances) if self.cpus is not None and self.instances else 0
        for node in set(self.placement.values()):
            best = min(best, len(cpulist(self.nodes[node])) // len(self.on_node(node)))
        return best

    def problems(self) -> list[str]:
        out = []
        if self.cpus is not None and self.need > self.cpus:
            out.append(f"{len(self.instances)} instances x {self.threads} threads + {self.reserve} reserved "
                       f"(hostcpu_reserve) = {self.need} of {self.cpus} CPUs")
        for node in sorted(set(self.placement.values())):
            on, n = self.on_node(node), len(cpulist(self.nodes[node]))
            if len(on) * self.threads > n:
                out.append(f"NUMA node {node} (CPUs {self.nodes[node]}): instances {', '.join(map(str, on))} "
                           f"(their GPUs' node) x {self.threads} threads = {len(on) * self.threads} of {n} CPUs")
        return out

    def refusal(self, host: str) -> str | None:
        problems = self.problems()
        if not problems:
            return None
        best = self.largest_threads()
        fix = (f"set server_threads (and server_threads_batch) to {best} or fewer" if best >= 1
               else "run fewer instances (server_instances)")
        if self.reserve:
            fix += ", or lower hostcpu_reserve"
        return f"{host}: the servers' threads do not fit the host's CPUs: {'; '.join(problems)}. Fix: {fix}"

    def args(self, index: int) -> list[str]:
        """The instance's placement flags (none without a placement)."""
        node = self.placement.get(index)
        if node is None:
            return []
        m = mask(cpulist(self.nodes[node]))
        return ["-C", m, "-Cb", m]

    def text(self) -> str:
        line = f"CPU: {len(self.instances)} x {self.threads} threads + {self.reserve} reserved = {self.need}"
        line += f" of {self.cpus} CPUs" if self.cpus is not None else " (CPUs not read: not checked)"
        if self.placement:
            line += "; " + ", ".join(f"node {n} (CPUs {self.nodes[n]}): instances {', '.join(map(str, self.on_node(n)))}"
                                     for n in sorted(set(self.placement.values())))
        elif len(self.nodes) > 1:
            line += f"; {len(self.nodes)} NUMA nodes, the GPUs' nodes unknown: no placement"
        return line + (": fits" if not self.problems() else ": does not fit")


def plan(cfg: Settings, indexes: list[int], cpus: int | None = None, nodes: dict | None = None,
         gpu_nodes: dict | None = None) -> CpuPlan:
    """The host's CPU plan. `nodes`: {NUMA node: CPU list} (sysfs); `gpu_nodes`: {GPU index: node}
    (None or missing: not known). Instances are placed only when there are several nodes and every
    instance's GPU has a known node among them."""
    nodes = {int(k): v for k, v in (nodes or {}).items()}
    gpu_nodes = {int(k): v for k, v in (gpu_nodes or {}).items()}
    placement = {}
    if len(nodes) > 1 and indexes and all(gpu_nodes.get(i) in nodes for i in indexes):
        placement = {i: gpu_nodes[i] for i in indexes}
    return CpuPlan(threads(cfg), tuple(indexes), int(cfg.server.hostcpu_reserve), cpus, nodes, placement)
