"""The health of old GPU boards, read and judged in pure Python (no pyinfra).

A V100 fleet fails in its boards, not in llama.cpp: a page pending retirement (needs a
reset), uncorrectable (double-bit) ECC errors, Xids in the kernel log (79 fallen off the
bus, 48 DBE, 64 retirement failed), a PCIe link trained below its width or generation,
thermal or power throttling, NVLink errors. The fact GpuHealth (roles/facts.py) runs
`nvidia-smi -q`, `nvidia-smi nvlink -e` and greps the kernel log since boot; `parse_fact`
reads what it printed and `judge` decides:

    >>> health = parse_fact(lines)        # {"gpus": [...], "nvlink": {...}, "xids": [...], "error": None}
    >>> refusals, warnings = judge("gpu-01", cfg, health)
    >>> refusals[0]
    'gpu-01: GPU 3 (0000:3b:00.0, serial 0323817105647): a retired page is pending (...). Fix: ...'

A record that is missing or unreadable refuses the GPU with the reason; it never passes.
"""
from __future__ import annotations

import re

from voltafleet.inputs.settings import Settings
from voltafleet.ground.errors import Problem

# the throttle reasons that cost tok/s, in words (the smoke client samples them by these names: THROTTLE_BITS)
REASON_WORDS = {"sw_thermal_slowdown": "thermal slowdown", "hw_thermal_slowdown": "thermal slowdown",
                "sw_power_cap": "power cap", "hw_power_brake_slowdown": "power brake slowdown",
                "hw_slowdown": "hardware slowdown"}
SLOWDOWNS = frozenset(REASON_WORDS)  # the reasons that cost tok/s (not idle, sync boost, clock settings)


def reason_words(reasons) -> str:
    """"thermal slowdown, power cap" for the slowdown reasons among `reasons` (HW Slowdown
    only when no more precise hardware reason says why)."""
    seen = [r for r in REASON_WORDS if r in reasons]
    if len(seen) > 1 and "hw_slowdown" in seen:
        seen.remove("hw_slowdown")
    return ", ".join(dict.fromkeys(REASON_WORDS[r] for r in seen))


NO_SMI = "__voltafleet_no_nvidia_smi__"
MARK = "=== voltafleet "   # the fact's section markers: query, nvlink, xid <source>
VOLTA_RETIRED_PAGES_MAX = 64  # Volta retires at most 64 pages (4 MB of 64 KiB pages, NVIDIA's page retirement FAQ)
XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?\): (\d+),\s*(.*)")
NVLINK_GPU_RE = re.compile(r"^GPU (\d+): ")
NVLINK_ERR_RE = re.compile(r"Link (\d+): (Replay|Recovery|CRC(?: Flit| Data)?) Errors: (\d+)")


# ---------------------------------------------------------------- parsers


def _tree(lines: list[str]) -> list[tuple[str, dict]]:
    """`nvidia-smi -q` as [(bus id of the "GPU ..." header, {key: value or section})].
    A value line's deeper lines (HW Slowdown's thermal and power brake) join its section."""
    gpus: list[tuple[str, dict]] = []
    stack: list[tuple[int, dict]] = []
    for raw in lines:
        line = raw.rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent == 0:
            stack = []
            if line.startswith("GPU "):
                gpus.append((line[4:].strip(), {}))
                stack = [(0, gpus[-1][1])]
            continue
        if not stack:
            continue
        while len(stack) > 1 and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        key, sep, value = line.strip().partition(":")
        if sep and (value.startswith(" ") or not value):
            parent[key.strip()] = value.strip()
            stack.append((indent, parent))
        else:
            parent[line.strip()] = section = {}
            stack.append((indent, section))
    return gpus


def _num(value) -> float | None:
    """38 from "38 C", 58.81 from "58.81 W", 16 from "16x"; None from N/A or a missing value."""
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value) if isinstance(value, str) else None
    return float(m.group(1)) if m else None


def _int(value) -> int | None:
    n = _num(value)
    return None if n is None else int(n)


def _get(d: dict, *path):
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def pci_address(bus_id: str) -> str:
    """"00000000:3B:00.0" (nvidia-smi) and "0000:3b:00" (an Xid) -> "0000:3b:00.0" / "0000:3b:00"."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{domain[-4:]:0>4}:{rest}"


def _ecc(section: dict | None, single: str) -> int | None:
    """The Total of "Single Bit"/"Double Bit" (Volta), else the sum of the SRAM/DRAM
    (Un)correctable counters newer drivers print."""
    if not isinstance(section, dict):
        return None
    if isinstance(section.get(single), dict):
        return _int(section[single].get("Total"))
    kind = "Correctable" if single == "Single Bit" else "Uncorrectable"
    found = [n for k, v in section.items() if k.endswith(" " + kind) and (n := _int(v)) is not None]
    return sum(found) if found else None


def _reasons(section) -> list[str] | None:
    """Active throttle ("event" since R535) reasons, as REASON_WORDS keys; None when absent."""
    if not isinstance(section, dict):
        return None
    return [k.lower().replace(" ", "_") for k, v in section.items() if v == "Active"]


def _gpu(index: int, bus: str, d: dict) -> dict:
    retired = _get(d, "Retired Pages")
    pending = None
    if isinstance(retired, dict):
        flag = retired.get("Pending", retired.get("Pending Page Blacklist"))
        pending = {"Yes": True, "No": False}.get(flag)
    link = _get(d, "PCI", "GPU Link Info") or {}
    return {
        "index": index, "pci": pci_address(bus), "name": d.get("Product Name"),
        "serial": d.get("Serial Number"), "uuid": d.get("GPU UUID"),
        "ecc_mode": _get(d, "Ecc Mode", "Current"),
        "ecc": {"volatile_sbe": _ecc(_get(d, "ECC Errors", "Volatile"), "Single Bit"),
                "volatile_dbe": _ecc(_get(d, "ECC Errors", "Volatile"), "Double Bit"),
                "aggregate_sbe": _ecc(_get(d, "ECC Errors", "Aggregate"), "Single Bit"),
                "aggregate_dbe": _ecc(_get(d, "ECC Errors", "Aggregate"), "Double Bit")},
        "retired": None if not isinstance(retired, dict) else {
            "sbe": _int(retired.get("Single Bit ECC")), "dbe": _int(retired.get("Double Bit ECC")), "pending": pending},
        "pstate": d.get("Performance State"),
        "throttle": _reasons(d.get("Clocks Throttle Reasons", d.get("Clocks Event Reasons"))),
        "clocks": {"sm": _int(_get(d, "Clocks", "SM")), "mem": _int(_get(d, "Clocks", "Memory")),
                   "sm_max": _int(_get(d, "Max Clocks", "SM"))},
        "temperature": {"gpu": _int(_get(d, "Temperature", "GPU Current Temp")),
                        "slowdown": _int(_get(d, "Temperature", "GPU Slowdown Temp"))},
        "power": {"draw": _num(_get(d, "Power Readings", "Power Draw")),
                  "limit": _num(_get(d, "Power Readings", "Power Limit"))},
        "pcie": None if not link else {
            "gen": _int(_get(link, "PCIe Generation", "Current")), "gen_max": _int(_get(link, "PCIe Generation", "Max")),
            "width": _int(_get(link, "Link Width", "Current")), "width_max": _int(_get(link, "Link Width", "Max"))},
    }


def parse_query(lines: list[str]) -> list[dict]:
    """Every GPU of `nvidia-smi -q`, in its order (the index CUDA_VISIBLE_DEVICES uses)."""
    return [_gpu(i, bus, d) for i, (bus, d) in enumerate(_tree(lines))]


def parse_nvlink(lines: list[str]) -> dict[int, dict[str, int]]:
    """`nvidia-smi nvlink -e`: {gpu index: {"replay": n, "recovery": n, "crc": n}} summed over links."""
    out: dict[int, dict[str, int]] = {}
    gpu = None
    for line in lines:
        m = NVLINK_GPU_RE.match(line)
        if m:
            gpu = out.setdefault(int(m.group(1)), {"replay": 0, "recovery": 0, "crc": 0})
            continue
        m = NVLINK_ERR_RE.search(line)
        if m and gpu is not None:
            gpu[m.group(2).split()[0].lower()] += int(m.group(3))
    return out


def parse_xids(lines: list[str]) -> list[dict]:
    """Xid lines of the kernel log: [{"pci": "0000:3b:00", "xid": 79, "text": "GPU has fallen off the bus"}]."""
    return [{"pci": pci_address(m.group(1)), "xid": int(m.group(2)), "text": m.group(3).strip()}
            for m in map(XID_RE.search, lines) if m]


def parse_fact(lines: list[str]) -> dict:
    """What the GpuHealth fact printed (sections after MARK lines), parsed; "error" says why
    nothing could be read (no nvidia-smi, a driver that does not answer)."""
    if any(line.strip() == NO_SMI for line in lines):
        return {"error": "nvidia-smi is not installed (no NVIDIA driver tools on this host)",
                "gpus": [], "nvlink": {}, "xids": [], "xid_source": None}
    parts: dict[str, list[str]] = {}
    current = parts.setdefault("query", [])
    for line in lines:
        if line.startswith(MARK):
            current = parts.setdefault(line[len(MARK):].strip(), [])
        else:
            current.append(line)
    source = next((k.split()[1] for k in parts if k.startswith("xid ") and len(k.split()) > 1), None)
    gpus = parse_query(parts.get("query", []))
    error = None
    if not gpus:
        said = next((line.strip() for line in parts.get("query", []) if line.strip()), "nothing")
        error = f"nvidia-smi -q listed no GPU (it printed: {said[:200]})"
    return {"error": error, "gpus": gpus, "nvlink": parse_nvlink(parts.get("nvlink", [])),
            "xids": parse_xids(next((v for k, v in parts.items() if k.startswith("xid")), [])),
            "xid_source": None if source == "none" else source}


# ---------------------------------------------------------------- the verdict


def who(g: dict) -> str:
    return f"GPU {g['index']} ({g['pci']}, serial {g.get('serial') or 'unknown'})"


def _line(host: str, what: str, fix: str) -> str:
    return f"{host}: {Problem(what, fix).line()} Fix: {fix.rstrip('.')}."


def _gpu_refusals(g: dict, cfg: Settings) -> list[tuple[str, str]]:
    """(what, fix) for each reason this GPU must not serve."""
    i, out = g["index"], []
    r = g.get("retired")
    if r is None or r.get("pending") is None:
        out.append(("nvidia-smi -q has no page-retirement record (Retired Pages / Pending)",
                    "check the driver: a V100 under R580 prints it; a GPU whose health cannot be read is not served"))
    elif r["pending"]:
        out.append((f"a retired page is pending ({r['sbe']} single-bit, {r['dbe']} double-bit pages retired): "
                    "the page stays in use until the GPU is reset",
                    f"drain the host and reset the GPU (nvidia-smi -r -i {i}) or reboot it, then roll out again"))
    dbe = (g.get("ecc") or {}).get("volatile_dbe")
    if g.get("ecc_mode") == "Disabled":
        out.append(("ECC is disabled, so memory errors go unseen",
                    f"enable it (nvidia-smi -i {i} -e 1) and reboot"))
    elif dbe is None:
        out.append(("nvidia-smi -q has no uncorrectable (double-bit) ECC count",
                    "check the driver and that ECC is enabled (nvidia-smi -q -d ECC)"))
    elif dbe > 0:
        out.append((f"{dbe} uncorrectable (double-bit) ECC error(s) since the driver loaded",
                    "reboot or reset the GPU so the page retires; if they come back, replace the board"))
    p = g.get("pcie")
    if not p or None in (p.get("width"), p.get("width_max"), p.get("gen"), p.get("gen_max")):
        out.append(("nvidia-smi -q has no PCIe link record", f"check the driver (nvidia-smi -q -i {i})"))
    elif cfg.gpu_health.refuse_pcie_downtrained:
        if p["width"] < p["width_max"]:
            out.append((f"its PCIe link is x{p['width']} of x{p['width_max']}",
                        "reseat the board or its riser; or set gpu_refuse_pcie_downtrained: false where a "
                        "narrow link is by design"))
        elif p["gen"] < p["gen_max"] and g.get("pstate") == "P0":
            out.append((f"its PCIe link runs at gen {p['gen']} of {p['gen_max']} under P0",
                        "reseat the board, check the slot's BIOS setting; or set gpu_refuse_pcie_downtrained: false"))
    return out


def _gpu_warnings(g: dict, cfg: Settings, nvlink: dict) -> list[str]:
    out = []
    r = g.get("retired") or {}
    pages = (r.get("sbe") or 0) + (r.get("dbe") or 0)
    if pages >= cfg.gpu_health.retired_pages_warn:
        out.append(f"{pages} pages retired of the {VOLTA_RETIRED_PAGES_MAX} a V100 can retire: plan its "
                   "replacement (gpu_retired_pages_warn)")
    reasons = g.get("throttle")
    if reasons is None:
        out.append("nvidia-smi -q has no throttle record")
    elif reason_words(reasons):
        words = reason_words(reasons)
        t = (g.get("temperature") or {}).get("gpu")
        out.append(f"throttled now: {words}" + (f" at {t} C" if t is not None else ""))
    errs = nvlink.get(g["index"]) or {}
    if sum(errs.values()) > cfg.gpu_health.nvlink_errors_warn:
        out.append("NVLink errors: " + ", ".join(f"{k} {v}" for k, v in errs.items() if v)
                   + " (nvidia-smi nvlink -e; gpu_nvlink_errors_warn)")
    return out


def judge(host: str, cfg: Settings, health: dict | None) -> tuple[list[str], list[str]]:
    """(refusals, warnings) of a host's GPUs, each line naming the GPU (index, PCI address,
    serial) and what to do. `health` is parse_fact's result; None: it was not read."""
    if health is None or health.get("error"):
        why = health["error"] if health else "it was not read"
        return [_line(host, f"the GPUs' health could not be read: {why}",
                      "install or repair the NVIDIA driver (nvidia-smi -q must answer) before serving")], []
    refusals, warnings = [], []
    gpus = health["gpus"]
    for g in gpus:
        refusals += [_line(host, f"{who(g)}: {what}", fix) for what, fix in _gpu_refusals(g, cfg)]
        warnings += [f"{host}: {who(g)}: {w}" for w in _gpu_warnings(g, cfg, health.get("nvlink") or {})]
    if health.get("xid_source") is None:
        refusals.append(_line(host, "the kernel log since boot could not be read for Xid errors",
                              "let the connecting user read it (journalctl -k -b or dmesg, e.g. through sudo)"))
    for x in health.get("xids", []):
        g = next((g for g in gpus if g["pci"].startswith(x["pci"])), None)
        name = who(g) if g else f"the GPU at {x['pci']} (not listed by nvidia-smi)"
        if x["xid"] in cfg.gpu_health.fatal_xids:
            refusals.append(_line(host, f"{name}: Xid {x['xid']} since boot: {x['text'][:120]}",
                                  "drain the host and reboot it; a GPU whose Xid comes back goes to repair "
                                  "(gpu_fatal_xids lists the Xids that refuse)"))
        elif x["xid"] in cfg.gpu_health.warn_xids:
            warnings.append(f"{host}: {name}: Xid {x['xid']} since boot: {x['text'][:120]}")
    return refusals, warnings


def summary(host: str, cfg: Settings, health: dict) -> dict:
    """The health as the smoke report and the textfile keep it: each GPU with "healthy",
    its Xid counts since boot ({xid: n}) and NVLink counters, plus the refusals and warnings.

        >>> summary("gpu-01", cfg, parse_fact(lines))["gpus"][0]["healthy"]
        True
    """
    refusals, warnings = judge(host, cfg, health)
    gpus = []
    for g in health.get("gpus", []):
        xids: dict[int, int] = {}
        for x in health.get("xids", []):
            if g["pci"].startswith(x["pci"]):
                xids[x["xid"]] = xids.get(x["xid"], 0) + 1
        gpus.append({**g, "healthy": not any(f" {who(g)}: " in r for r in refusals), "xids": xids,
                     "nvlink": (health.get("nvlink") or {}).get(g["index"], {})})
    return {"gpus": gpus, "refusals": refusals, "warnings": warnings, "error": health.get("error"),
            "xid_source": health.get("xid_source")}
