"""Real V100 outputs (tests/fixtures/gpu/, each file's header names its public source) and
the variants derived from them: a sick board is the real healthy one with the few lines
that change replaced (derive() fails when a line to replace is not there), an 8-GPU host
is the real PCIe 32 GB block repeated with derived bus ids and serials."""
from __future__ import annotations

import stat
from pathlib import Path

from voltafleet.gpu import gpuhealth

DIR = Path(__file__).resolve().parent / "fixtures" / "gpu"


def text(name: str) -> str:
    """A fixture without its "#" header lines (the source note)."""
    return "\n".join(line for line in (DIR / name).read_text().splitlines() if not line.startswith("#")) + "\n"


PCIE_32 = text("v100-pcie-32gb-microway.txt")     # GPU 0 of a real 4x V100-PCIE-32GB host, under load
SXM2_32 = text("v100-sxm2-32gb-traverse.txt")     # GPU 0 of a real 4x V100-SXM2-32GB POWER9 host (PCIe x2 by design)
SXM2_16_HEAD = text("v100-sxm2-16gb-aws-head.txt")  # head only: the health sections were not found
PCIE_16_HEAD = text("v100-pcie-16gb-head.txt")
NVLINK = text("v100-sxm2-nvlink-e.txt")
XIDS = text("xid-kernel-log.txt")
# Bus ids: 18, 3B, 86, AF are the real host's (Microway's nvidia-smi table); the other four are derived.
BUSES = ("18", "3B", "86", "AF", "19", "3C", "87", "B0")


def derive(source: str, changes: dict[str, str]) -> str:
    """`source` with each line (or fragment) of `changes` replaced once; a change whose
    old text is missing fails, so a derived variant can never silently equal its source."""
    out = source
    for old, new in changes.items():
        assert old in out, f"derive: {old!r} is not in the source"
        out = out.replace(old, new, 1)
    return out


def block(source: str) -> str:
    """The GPU part of a -q output (from the "GPU ..." header line on)."""
    return source[source.index("\nGPU ") + 1:]


def host_query(n: int = 8, source: str = PCIE_32, sick: dict[int, dict[str, str]] | None = None) -> str:
    """A derived n-GPU `nvidia-smi -q`: the real block per GPU with its bus id and serial
    changed; `sick` {index: changes} derives the named GPUs further."""
    head = source[:source.index("\nGPU ") + 1].replace("Attached GPUs                       : 4",
                                                         f"Attached GPUs                       : {n}")
    blocks = []
    for i in range(n):
        b = derive(block(source), {"GPU 00000000:18:00.0": f"GPU 00000000:{BUSES[i]}:00.0",
                                   "00000000:18:00.0\n": f"00000000:{BUSES[i]}:00.0\n",
                                   "032161808xxxx": f"03216180800{i:02d}",
                                   "Minor Number                    : 0": f"Minor Number                    : {i}"})
        blocks.append(derive(b, (sick or {}).get(i, {})))
    return head + "\n".join(blocks)


def fact_output(query: str, nvlink: str = "", xids: str = "", source: str = "journal") -> str:
    """What the GpuHealth fact's command prints for these outputs (roles/facts.py)."""
    return (query + f"{gpuhealth.MARK}nvlink\n" + nvlink + f"{gpuhealth.MARK}xid {source}\n"
            + "".join(line + "\n" for line in xids.splitlines() if "NVRM: Xid" in line))


def health(query: str, nvlink: str = "", xids: str = "", source: str = "journal") -> dict:
    return gpuhealth.parse_fact(fact_output(query, nvlink, xids, source).splitlines())


# The sick variants, each derived from the real healthy PCIe 32 GB block.
PENDING = {"Single Bit ECC              : 0\n        Double Bit ECC              : 0\n        Pending                     : No":
           "Single Bit ECC              : 2\n        Double Bit ECC              : 1\n        Pending                     : Yes"}
DBE = {"            Double Bit            \n                Device Memory       : 0":
       "            Double Bit            \n                Device Memory       : 1",
       "                CBU                 : 0\n                Total               : 0\n        Aggregate":
       "                CBU                 : 0\n                Total               : 1\n        Aggregate"}
NEAR_LIMIT = {"Single Bit ECC              : 0\n        Double Bit ECC              : 0":
              "Single Bit ECC              : 51\n        Double Bit ECC              : 3"}
THERMAL = {"        HW Slowdown                 : Not Active\n            HW Thermal Slowdown     : Not Active":
           "        HW Slowdown                 : Active\n            HW Thermal Slowdown     : Active",
           "GPU Current Temp            : 40 C": "GPU Current Temp            : 88 C",
           "        SM                          : 1380 MHz\n        Memory                      : 877 MHz\n        Video"
           "                       : 1237 MHz\n    Applications":
           "        SM                          : 1020 MHz\n        Memory                      : 877 MHz\n        Video"
           "                       : 1237 MHz\n    Applications"}
POWER_CAP = {"SW Power Cap                : Not Active": "SW Power Cap                : Active"}
NARROW = {"                Max                 : 16x\n                Current             : 16x":
          "                Max                 : 16x\n                Current             : 8x"}
SLOW_GEN = {"                Max                 : 3\n                Current             : 3":
            "                Max                 : 3\n                Current             : 1"}
ECC_OFF = {"Ecc Mode\n        Current                     : Enabled": "Ecc Mode\n        Current                     : Disabled"}


def stub_tool(bindir: Path, name: str, body: str) -> None:
    """An executable `name` in `bindir` running the shell `body` (nvidia-smi, journalctl on a
    machine without them)."""
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
