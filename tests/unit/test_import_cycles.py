"""No import cycle anywhere in the project (issue 40): every import, at module level or inside a
function, of one project module by another, resolved to its file; the graph must have no cycle.
A cycle means two modules that cannot be read (or moved) apart: gateway.py and teams.py once were."""
import ast
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("voltafleet", "rollout", "roles", "bench", "lab")


def modules() -> dict[str, Path]:
    out = {"deploy": REPO / "deploy.py"}
    for root in ROOTS:
        for p in (REPO / root).rglob("*.py"):
            parts = p.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def resolve(name: str, known: dict[str, Path]) -> str | None:
    return name if name in known else None


def edges(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    out = set()
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for n in names:
            target = resolve(n, known)
            if target and target != mod and known[target].name != "__init__.py":
                out.add(target)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_the_project():
    known = modules()
    graph = {m: edges(m, p, known) for m, p in known.items()}
    assert sum(map(len, graph.values())) > 100  # the graph was read
    assert cycles(graph) == []


def test_bench_is_in_the_graph_by_its_package_names():
    """bench/ imports itself by package (bench.gpu.qwen35_bench), so its edges are read like voltafleet's."""
    known = modules()
    graph = {m: edges(m, p, known) for m, p in known.items()}
    assert {"bench.gpu.tune29", "bench.gpu.groups"} <= graph["bench.gpu.gpu_proof"]
    assert "bench.gpu.qwen35_bench" in graph["bench.gpu.proof_bench"]
    assert "bench.gpu.proof.runner" in graph["bench.gpu.v100_measure"]  # an import inside a function
    assert "bench.gpu.proof.runner" in graph["bench.gpu.proof.loads"]  # the phases' package, by its package names
    assert "bench.gpu.groups" in graph["bench.gpu.tune29"]


def test_a_cycle_in_bench_fails(tmp_path):
    """groups.py importing gpu_proof back (gpu_proof and tune29 once imported each other so) is a cycle."""
    known = modules()
    back = tmp_path / "groups.py"
    back.write_text(known["bench.gpu.groups"].read_text() + "\nfrom bench.gpu.gpu_proof import render\n")
    known["bench.gpu.groups"] = back
    graph = {m: edges(m, p, known) for m, p in known.items()}
    assert cycles(graph) == [["bench.gpu.gpu_proof", "bench.gpu.groups", "bench.gpu.tune29"]]


def test_bench_is_imported_by_its_package_names_only():
    """No module reaches bench/ through sys.path (a script's bare name: `from load import Load`)."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    files = [f for f in files if not f.startswith("bench/records/") and (REPO / f).exists()]
    top = {p.stem for p in REPO.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    bare = {p.stem for p in (REPO / "bench").rglob("*.py")} - top - {"__init__"}
    found = []
    for f in files:
        text = (REPO / f).read_text()
        if re.search(r"sys\.path\.\w+\(.*bench", text):
            found.append(f"{f}: sys.path into bench/")
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else []
            found += [f"{f}: import {n}" for n in names if n.split(".")[0] in bare]
    assert len(bare) > 20 and found == []


def test_the_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
