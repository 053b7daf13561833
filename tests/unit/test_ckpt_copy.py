"""bench/traffic/ckpt_copy.py's file has the 27B's recurrent state on small weights, and its rounds send
new prompts (every one distinct, so each creates its checkpoints)."""
from bench.traffic import ckpt_copy
from lab import qwen35gen as gen


def test_the_state_is_the_27b_s():
    """The VRAM planner's recurrent state a slot (voltafleet.planning.vram, from the 27B's header) is the 149.6 MiB
    the H100 logged a checkpoint to be, and the small file keeps every field that state is made of."""
    import json
    from pathlib import Path

    from voltafleet.models.gguf_header import from_json
    from voltafleet.planning.vram import ModelShape

    fixture = Path(__file__).resolve().parents[1] / "fixtures/gguf/qwen35-27b-q4ks.json"
    planned = ModelShape.from_header(from_json(json.loads(fixture.read_text()))).recurrent_bytes_per_seq
    assert round(planned / 2**20, 3) == 149.625  # the H100 logs: "size = 149.626 MiB"
    small, big = ckpt_copy.shape(), gen.SHAPES["27b"]
    for field in ("n_layer", "interval", "ssm_d_state", "ssm_n_group", "ssm_dt_rank", "ssm_d_conv"):
        assert getattr(small, field) == getattr(big, field), field
    assert small.n_embd * small.n_ff < big.n_embd * big.n_ff / 500


def test_prompts_are_new_each_round_and_slot():
    seen = [p for r in range(8) for p in ckpt_copy.prompts(r, 4)] + ckpt_copy.prompts(999, 4)
    assert len(seen) == len(set(seen)) == 36
    assert len({p.split()[0] for p in ckpt_copy.prompts(0, 4)}) > 1  # they differ from the first word


def read_record(name: str) -> tuple[dict, dict, dict]:
    """bench/records/ckpt-copy/NAME.json, each run checked against its raw gaps (32 copies of the 27B's state
    alone, no machine's path in its argv): the record, its runs by variant and each variant's median of runs."""
    import json
    import statistics
    from pathlib import Path

    r = json.loads((Path(__file__).resolve().parents[2] / f"bench/records/ckpt-copy/{name}.json").read_text())
    by = {}
    for run in r["runs"]:
        assert run["median_ms"] == statistics.median(run["copy_ms"]) and run["copies_alone"] == 32
        assert run["checkpoint_sizes"] == ["149.626 MiB"] and run["counts"]["created"] == 32
        assert "MODEL" in run["argv"] and not any(a.startswith("/") for a in run["argv"])  # no machine's path
        by.setdefault(run["variant"], []).append(run)
    return r, by, {n: statistics.median(x["median_ms"] for x in v) for n, v in by.items()}


def test_the_record():
    """bench/records/ckpt-copy/run1.json: what bench/RESULTS.md quotes, from each run's raw gaps."""
    r, by, med = read_record("run1")
    assert [len(v) for v in by.values()] == [3, 3] and by["thp"][0]["env"] == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert med == r["median_of_reps_ms"] == {"default": 61.5, "thp": 84.2}
    thp = [g for x in by["thp"] for g in x["copy_ms"]]
    assert (round(min(thp)), round(max(thp))) == (31, 207)  # huge pages when compaction finds them, stalls when not
    assert all(t["median_ms"] > d["median_ms"] for d, t in zip(by["default"], by["thp"]))


def test_the_heap_record():
    """bench/records/ckpt-copy/run2.json: glibc's malloc kept to its heap (gpu_proof.HEAP51) against the default,
    alternating, 3 servers each: what bench/RESULTS.md and plan51's heap51 quote."""
    from bench.gpu import gpu_proof

    r, by, med = read_record("run2")
    assert r["argv"][1:] == ["--rounds", "8", "--variants", "default,heap", "--out", "bench/records/ckpt-copy/run2.json"]
    assert [x["variant"] for x in r["runs"]] == ["default", "heap"] * 3
    assert all(x["env"] == gpu_proof.HEAP51 for x in by["heap"]) and all(x["env"] == {} for x in by["default"])
    assert med == r["median_of_reps_ms"] == {"default": 129.25, "heap": 22.2}
    assert all(h["median_ms"] * 5 < d["median_ms"] for d, h in zip(by["default"], by["heap"]))
    # the price: freed checkpoints stay resident, the peak up to about one checkpoint (149.6 MiB) more
    rss = {n: max(x["rss_peak_mib"] for x in v) for n, v in by.items()}
    assert rss == {"default": 1926.4, "heap": 2090.5} and rss["heap"] - rss["default"] < 1.2 * 149.626


def test_heap51_keeps_a_freed_checkpoint_resident_in_a_real_process():
    """HEAP51's two tunables act in the process that starts with them (glibc reads them at its start): a freed
    149.6 MiB chunk stays resident for the next allocation to reuse; by default glibc gives it back at once."""
    import os
    import subprocess
    import sys

    from bench.gpu import gpu_proof

    code = ("import ctypes, re\n"
            "libc = ctypes.CDLL('libc.so.6'); libc.malloc.restype = ctypes.c_void_p\n"
            "rss = lambda: int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1]) // 1024\n"
            "n = 149626 * 1024; p = libc.malloc(n); ctypes.memset(p, 1, n); a = rss()\n"
            "libc.free(ctypes.c_void_p(p)); print(a, rss())\n")

    def run(env):
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             check=True).stdout.split()
        return [int(x) for x in out]
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    held, after = run({**env, **gpu_proof.HEAP51})
    assert after > held - 20 and held > 140  # still resident after free
    held, after = run(env)
    assert after < held - 140  # the default: given back to the kernel
