"""The rolling driver is small modules (issue 40): no function over 60 lines, no module state
(only constants), and no role imported (pyinfra stays out of the driver's process)."""
import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRIVER = sorted((REPO / "rollout").glob("*.py"))
LONGEST = 60


def test_the_driver_is_split_by_job():
    assert {p.stem for p in DRIVER} >= {"__init__", "__main__", "main", "fleet", "runner", "rolling", "plan", "tune"}


def test_no_function_of_the_driver_is_over_60_lines():
    long = [f"{p.name}:{n.name} ({n.end_lineno - n.lineno + 1} lines)" for p in DRIVER
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > LONGEST]
    assert long == []


def test_the_driver_keeps_no_state_in_module_globals():
    """Module-level names are constants (UPPERCASE), set once; no `global` statement anywhere."""
    bad = []
    for p in DRIVER:
        tree = ast.parse(p.read_text())
        bad += [f"{p.name}: global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            bad += [f"{p.name}: {t.id}" for t in targets if isinstance(t, ast.Name) and not t.id.isupper()]
    assert bad == []


def test_the_driver_imports_no_role_and_no_pyinfra():
    code = ("import sys, rollout.main, rollout.rolling, rollout.plan, rollout.tune; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('roles', 'pyinfra')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
