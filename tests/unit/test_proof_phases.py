"""The GPU proof's phase table (bench/gpu/proof_bench.py PHASES): every phase a caller names is in it,
a phase list it cannot run is refused before anything starts, and a phase that fails is a record."""
import re
import types
from pathlib import Path

import pytest

from bench.gpu import proof_bench
from bench.gpu.proof import runner

REPO = Path(__file__).resolve().parents[2]


def phases_in(text: str) -> list[str]:
    """Every phase of the PHASES=..., PHASES1=... and PHASES2=... assignments in the text (quoted or not)."""
    lists = [q or bare for q, bare in re.findall(r'PHASES\d?=(?:"([^"]*)"|([^\s`"()]+))', text)]
    return [ph for lst in lists for ph in lst.split(",") if ph]


SH = (REPO / "bench/gpu/gpu_proof.sh").read_text()


def callers() -> dict[str, list[str]]:
    """The phase lists each caller passes: gpu_proof.sh's default (what gpu_proof.py's `all` runs) and
    its comments' examples, the runs bench/RESULTS.md and tune29.py quote."""
    (default,) = re.findall(r"PH=\$\{PHASES:-([^}]+)\}", SH)
    tune29 = (REPO / "bench/gpu/tune29.py").read_text()
    return {"gpu_proof.sh": default.split(",") + phases_in(SH),
            "RESULTS.md": phases_in((REPO / "bench/RESULTS.md").read_text()),
            "tune29.py": re.findall(r"phase (\w+) of proof_bench\.py", tune29) + [
                f"tune29:{k}" for k in re.findall(r'results\["(tune29\w*)"', tune29)]}


def test_every_phase_a_caller_names_is_in_the_table():
    got = callers()
    assert {"peak:volta", "bench27:mmq", "serve27:volta", "probe27", "think32:volta"} <= set(got["gpu_proof.sh"])
    assert {"tg", "spec", "think32:volta", "tune29", "tune29:tune29b", "host38:mmq",
            "vram_named:cublas=v32-cp0+v32-np4"} <= set(got["RESULTS.md"])
    assert got["tune29.py"] == ["tune29", "tune29:tune29b"]
    for caller, phases in got.items():
        for ph in phases:
            assert proof_bench.refused([ph]) is None, (caller, ph)
    # the names gpu_proof.sh looks for in the list (to make the MTP files, the probe model)
    case = re.findall(r'case "\$PH" in \*(\w+)\*\)', SH)
    assert case == ["tier41", "traffic51", "probe27"] and set(case) <= set(proof_bench.PHASES)


def test_the_table_is_the_phases_of_the_records():
    """The names stay those of the records (results.json's phase_seconds), each a function of the run
    and at most one argument; no class named after an issue is left."""
    assert list(proof_bench.PHASES) == ["vram", "vram_named", "peak", "pp", "tg", "bench27", "batched", "serve",
                                        "serve27", "spec", "probe27", "tune29", "think32", "host38", "host49", "tier41",
                                        "traffic51"]
    assert [proof_bench.usage(n) for n in ("tg", "think32", "serve", "tune29")] == [
        "tg", "think32:BUILD", "serve[:NAMES]", "tune29[:KEY]"]
    for name, fn in proof_bench.PHASES.items():
        assert fn.__module__.startswith("bench.gpu.proof.") and fn.__doc__, name
    classes = [n for m in (proof_bench, runner) for n, v in vars(m).items() if isinstance(v, type)]
    assert "ProofRun" in classes and not [n for n in classes if re.search(r"\d", n)]


def test_refused_names_the_phase_and_the_known_ones():
    why = proof_bench.refused(["tg", "think33:volta", "peak:volta"])
    assert why.startswith("unknown phase 'think33' (in 'think33:volta'); the phases: vram:BUILD, ")
    assert all(proof_bench.usage(n) in why for n in proof_bench.PHASES)
    assert proof_bench.refused(["peak"]) == "phase 'peak': takes the form peak:BUILD"  # a build to run
    assert proof_bench.refused(["tg:default"]) == "phase 'tg:default': takes the form tg"
    assert proof_bench.refused(["tg", ""]).startswith("unknown phase ''")
    assert proof_bench.refused(["vram:cublas:once", "serve", "serve:v32-ship+v16-ship", "tune29:tune29b",
                                "vram_named:default=v32-ship+v32-cp0"]) is None


def test_main_rejects_an_unknown_phase_before_any_server_starts(tmp_path, monkeypatch, capsys):
    def no_run(a):
        raise AssertionError("the run started")
    monkeypatch.setattr(proof_bench, "ProofRun", no_run)
    argv = ["--plan", str(tmp_path / "plan.json"), "--bin", "/nowhere", "--models", str(tmp_path), "--res", str(tmp_path)]
    with pytest.raises(SystemExit) as e:
        proof_bench.main(argv + ["--phases", "tg,nosuch:volta,think32:volta"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown phase 'nosuch' (in 'nosuch:volta')" in err and "think32:BUILD, host38:BUILD, host49:BUILD, tier41:BUILD" in err
    assert list(tmp_path.iterdir()) == []


def test_each_phase_runs_in_order_and_one_that_fails_is_a_record(tmp_path, monkeypatch):
    """main() calls each phase with the run and its argument (none when the list gives none); an exception
    is an entry of results["errors"], the next phase runs, every phase's seconds are kept and saved."""
    calls, saved = [], []

    def ok(run, names=""):
        calls.append(("ok", names))

    def fails(run, build):
        calls.append(("fails", build))
        raise KeyError(build)

    class Run:
        def __init__(self, a):
            self.a, self.results = a, {}

        def save(self):
            saved.append(dict(self.results))
    monkeypatch.setattr(proof_bench, "PHASES", {"ok": ok, "fails": fails})
    monkeypatch.setattr(proof_bench, "ProofRun", Run)
    proof_bench.main(["--plan", "p", "--bin", "b", "--models", "m", "--res", str(tmp_path),
                      "--phases", "ok,fails:mmq,ok:a+b"])
    assert calls == [("ok", ""), ("fails", "mmq"), ("ok", "a+b")]
    results = saved[-1]
    assert results["errors"] == ["fails:mmq: KeyError('mmq')"] and len(saved) == 3
    assert list(results["phase_seconds"]) == ["ok", "fails:mmq", "ok:a+b"]


def test_the_runner_is_shared_state_not_phases():
    """ProofRun holds what the phases share; the measurements are the table's functions, not its methods."""
    a = types.SimpleNamespace(bins="volta=/v,mmq=/m", cublas_bin="/c", bin="/d")
    run = runner.ProofRun.__new__(runner.ProofRun)
    run.a = a
    assert [run.bindir(x) for x in ("volta", "mmq", "cublas", "default")] == ["/v", "/m", "/c", "/d"]
    assert not set(proof_bench.PHASES) & {n for n in dir(runner.ProofRun) if not n.startswith("_")}
