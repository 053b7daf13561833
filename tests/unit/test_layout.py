"""Rooms for the flow (issue 40): voltafleet/ is subpackages named for the stage they serve,
each saying what it holds; no module lies loose beside them, and none imports pyinfra."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "voltafleet"
ROOMS = {"inputs", "planning", "state", "front", "gpu", "models", "measure"}


def test_voltafleet_is_rooms_and_nothing_lies_loose():
    assert sorted(p.name for p in CORE.glob("*.py")) == ["__init__.py"]
    assert {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()} == ROOMS


def test_every_room_says_what_it_holds_and_names_its_modules():
    for room in ROOMS:
        doc = ast.get_docstring(ast.parse((CORE / room / "__init__.py").read_text()))
        assert doc and len(doc) > 40, room
        modules = sorted(p.stem for p in (CORE / room).glob("*.py") if p.stem != "__init__")
        assert modules and all(m in doc for m in modules), (room, modules)


def test_the_pure_core_imports_no_pyinfra():
    found = []
    for p in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{p.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "pyinfra"]
    assert found == []
