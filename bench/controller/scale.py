"""The controller's cost per host: a converged no-op `pyinfra -y` run of deploy.py on N
simulated V100 hosts (bench/controller/scale_inventory.py: pyinfra's fake connector answering every
fact of a converged 8-GPU host, the real inventory loader, group_vars and deploy.py) plus
one HAProxy gateway. No SSH; the model's GGUF header (the real Qwen3.6-27B tensor table and
a vocabulary of its size, ~7 MiB) is served over HTTP Range from this process.

    nice -n 10 .venv/bin/python -m bench.controller.scale --hosts 10 100 [--compilers 2] [--json out.json] [--profile /tmp/p]

Prints per N: wall time, the pyinfra process's CPU seconds (user+sys: on a shared machine
the wall time says little) and per host, its peak RSS, operations and remote commands per
server host, cross-host fact reads (Host.get_fact on a host other than the one whose
operation or deploy is running), model header / HEAD requests, changes (must be 0) and the
exit code.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADER_FIXTURE = REPO / "tests" / "fixtures" / "gguf" / "qwen35-27b-q4ks.json"


def write_header(src: Path, out: Path) -> None:
    """A GGUF file holding only the header of `src` (a tests/fixtures/gguf JSON): the same
    metadata and tensor table, the vocabulary and merges as synthetic strings of their count."""
    import gguf
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFValueType as V

    d = json.loads(src.read_text())
    w = gguf.GGUFWriter(str(out), d["meta"]["general.architecture"])
    for k, v in d["meta"].items():
        if k == "general.architecture":
            continue
        if isinstance(v, dict) and "array_len" in v:
            n = v["array_len"]
            if k.endswith("token_type"):
                w.add_key_value(k, [1] * n, V.ARRAY, V.INT32)
            else:
                w.add_key_value(k, [f"t{i} x" for i in range(n)], V.ARRAY, V.STRING)
        elif isinstance(v, bool):
            w.add_key_value(k, v, V.BOOL)
        elif isinstance(v, int):
            w.add_key_value(k, v, V.UINT32)
        elif isinstance(v, float):
            w.add_key_value(k, v, V.FLOAT32)
        elif isinstance(v, str):
            w.add_key_value(k, v, V.STRING)
        elif isinstance(v, list):
            sub = V.INT32 if all(isinstance(x, int) for x in v) else V.FLOAT32
            w.add_key_value(k, v, V.ARRAY, sub)
    for name, shape, t in d["tensors"]:
        block, size = GGML_QUANT_SIZES[T(t)]
        byte_shape = tuple(reversed(shape[1:])) + (shape[0] // block * size,)
        w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=T(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


class Mirror:
    """The model URL: HEAD and ranged GET of the header file, every request counted."""

    def __init__(self, path: Path):
        data = path.read_bytes()
        counts = self.counts = {"GET": 0, "HEAD": 0, "bytes": 0}

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                counts["HEAD"] += 1
                self.send_response(200)
                self.send_header("Content-Length", str(15575320576 + len(data)))
                self.end_headers()

            def do_GET(self):
                counts["GET"] += 1
                m = re.match(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
                start, end = (int(m.group(1)), int(m.group(2))) if m else (0, len(data) - 1)
                chunk = data[start:end + 1]
                counts["bytes"] += len(chunk)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{start + len(chunk) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(chunk)))
                self.end_headers()
                self.wfile.write(chunk)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/Qwen3.6-27B-Q4_K_S.gguf"

    def take(self) -> dict:
        out = dict(self.counts)
        self.counts.update(GET=0, HEAD=0, bytes=0)
        return out


# ---------------------------------------------------------------- the pyinfra process


def child(out_path: str, argv: list[str]) -> None:
    """Run pyinfra's CLI in this process with counters, written to out_path at exit."""
    import atexit
    import resource

    from pyinfra.api import host as host_mod
    from pyinfra.connectors.fake import FakeConnector
    from pyinfra.context import ctx_host, ctx_state

    commands: dict[str, int] = {}
    cross = {"reads": 0, "by_fact": {}}
    real_get_fact = host_mod.Host.get_fact
    real_run = FakeConnector.run_shell_command

    def get_fact(self, cls, *args, **kwargs):
        current = ctx_host.get() if ctx_host.isset() else None
        if current is not None and current is not self:
            cross["reads"] += 1
            cross["by_fact"][cls.__name__] = cross["by_fact"].get(cls.__name__, 0) + 1
        return real_get_fact(self, cls, *args, **kwargs)

    def run_shell_command(self, command, *a, **kw):
        commands[self.host.name] = commands.get(self.host.name, 0) + 1
        return real_run(self, command, *a, **kw)

    host_mod.Host.get_fact = get_fact
    FakeConnector.run_shell_command = run_shell_command

    def dump():
        state = ctx_state.get() if ctx_state.isset() else None
        ops, changed, names = {}, {}, {}
        if state is not None:
            for h, by_hash in state.ops.items():
                ops[h.name] = len(by_hash)
                did = [op_hash for op_hash, d in by_hash.items() if d.operation_meta.is_complete()
                       and d.operation_meta.did_change()]
                changed[h.name] = len(did)
                for op_hash in did:
                    name = ", ".join(sorted(state.op_meta[op_hash].names))
                    names[name] = names.get(name, 0) + 1
        Path(out_path).write_text(json.dumps({
            "commands": commands, "ops": ops, "changed": changed, "changed_names": names, "cross": cross,
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))

    atexit.register(dump)
    from pyinfra_cli.main import main

    sys.argv = ["pyinfra", *argv]
    main()


def run_once(n: int, compilers: int, mirror: Mirror, header: Path, parallel: int | None,
             profile: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "counts.json"
        env = {**os.environ, "VOLTAFLEET_SCALE": json.dumps({"hosts": n, "compilers": compilers,
                                                               "model_url": mirror.url, "header": str(header)}),
               "VOLTAFLEET_REPORT_DIR": str(Path(tmp) / "reports"),
               "VOLTAFLEET_RELEASE_CACHE": str(Path(tmp) / "releases")}
        argv = ["-y", "bench/controller/scale_inventory.py", "deploy.py"] + (["--parallel", str(parallel)] if parallel else [])
        prof = ["-m", "cProfile", "-o", f"{profile}.{n}"] if profile else []
        t0 = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, *prof, "-m", "bench.controller.scale", "--child", str(out), "--", *argv], cwd=REPO, env=env,
                              capture_output=True, text=True)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        counts = json.loads(out.read_text()) if out.exists() else {}
        sys.path.insert(0, str(REPO))
        from voltafleet.state.records import Outcome  # the fake hosts' names are "@fake/NAME": outcome-@fake_NAME.json
        from voltafleet.state.runctx import RunDir

        passed = sum(r.status == "passed" for r in RunDir(Path(tmp) / "reports").all(Outcome))
    if proc.returncode != 0 or not counts:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
    servers = [h for h in counts.get("ops", {}) if h != "@fake/gw"]
    per = lambda key: sum(counts[key].get(h, 0) for h in servers) / max(len(servers), 1)  # noqa: E731
    http = mirror.take()
    return {"hosts": n, "compilers": compilers, "rc": proc.returncode, "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "cpu_ms_per_host": round(1000 * cpu / max(n, 1)),
            "peak_mib": round(counts.get("peak_rss_kib", 0) / 1024), "ops_per_host": round(per("ops"), 1),
            "commands_per_host": round(per("commands"), 1), "gateway_commands": counts.get("commands", {}).get("@fake/gw", 0),
            "cross_host_reads": counts.get("cross", {}).get("reads", 0),
            "cross_by_fact": counts.get("cross", {}).get("by_fact", {}),
            "changed_ops": sum(counts.get("changed", {}).values()), "changed_names": counts.get("changed_names"), "passed": passed,
            "header_gets": http["GET"], "model_heads": http["HEAD"], "http_mib": round(http["bytes"] / 2 ** 20, 1)}


COLUMNS = ("hosts", "compilers", "wall_s", "cpu_s", "cpu_ms_per_host", "peak_mib", "ops_per_host", "commands_per_host", "cross_host_reads",
           "header_gets", "model_heads", "http_mib", "changed_ops", "passed", "rc")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[4:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[10, 100])
    p.add_argument("--compilers", type=int, default=1, choices=(1, 2))
    p.add_argument("--parallel", type=int, default=None, help="pyinfra --parallel (default: pyinfra's own)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--profile", metavar="PREFIX", help="run the pyinfra process under cProfile: PREFIX.N per N")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="vf-scale-") as tmp:
        header = Path(tmp) / "header.gguf"
        write_header(HEADER_FIXTURE, header)
        mirror = Mirror(header)
        rows = []
        print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS), flush=True)
        for n in a.hosts:
            row = run_once(n, a.compilers, mirror, header, a.parallel, a.profile)
            rows.append(row)
            print("| " + " | ".join(str(row[c]) for c in COLUMNS) + " |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["rc"] == 0 and r["changed_ops"] == 0 and r["passed"] == r["hosts"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
