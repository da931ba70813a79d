"""The doctor package has no import cycle, and each of its modules imports on its own.

The graph: one node per module of eagle3_backend, an edge for every import of another
one (top-level or inside a function: a lazy import still closes a circle), plus the
edge to each enclosing package, whose ``__init__`` runs first.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "eagle3_backend"


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PKG) -> dict[str, set[str]]:
    modules = {_module(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = mod.split(".")[: len(mod.split(".")) - node.level + is_pkg]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]
            for name in names:
                while name and name not in modules:   # `from pkg import func`: the module pkg
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
                parts = name.split(".")
                for k in range(1, len(parts)):         # the packages above it run first
                    above = ".".join(parts[:k])
                    if above in modules and not mod.startswith(above + "."):
                        graph[mod].add(above)
    return graph


def cycles_through(graph: dict[str, set[str]], prefix: str) -> list[list[str]]:
    """One cycle per strongly connected component that holds a module under ``prefix``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 and any(m == prefix or m.startswith(prefix + ".") for m in comp):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_check_finds_a_cycle(tmp_path):
    pkg = tmp_path / "eagle3_backend"
    (pkg / "doctor").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "doctor" / "__init__.py").write_text("")
    (pkg / "doctor" / "a.py").write_text("def f():\n    from eagle3_backend.doctor.b import g\n")
    (pkg / "doctor" / "b.py").write_text("from eagle3_backend.doctor import a\n")
    (pkg / "doctor" / "c.py").write_text("from . import a\n")
    graph = import_graph(pkg)
    assert graph["eagle3_backend.doctor.b"] == {"eagle3_backend.doctor.a"}
    assert graph["eagle3_backend.doctor.c"] == {"eagle3_backend.doctor.a"}
    assert cycles_through(graph, "eagle3_backend.doctor") == [
        ["eagle3_backend.doctor.a", "eagle3_backend.doctor.b"]]
    # a module that takes a name from its package's __init__, which imports that module
    (pkg / "doctor" / "__init__.py").write_text("from eagle3_backend.doctor.c import *\nhelper = 1\n")
    (pkg / "doctor" / "c.py").write_text("from eagle3_backend.doctor import helper\n")
    graph = import_graph(pkg)
    assert graph["eagle3_backend.doctor.c"] == {"eagle3_backend.doctor"}
    assert cycles_through(graph, "eagle3_backend.doctor") == [
        ["eagle3_backend.doctor", "eagle3_backend.doctor.c"],
        ["eagle3_backend.doctor.a", "eagle3_backend.doctor.b"]]


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    doctor = sorted(m for m in graph if m.startswith("eagle3_backend.doctor."))
    assert {m.rpartition(".")[2] for m in doctor} >= {
        "candidates", "scoring", "verdict", "diagnose", "serve", "report", "plot", "cli"}
    assert cycles_through(graph, "eagle3_backend") == []
    assert not any(m.startswith("eagle3_backend.doctor") for m in graph["eagle3_backend.doctor"])


@pytest.mark.slow
def test_each_doctor_module_imports_on_its_own():
    mods = sorted(m for m in import_graph() if m.startswith("eagle3_backend.doctor"))
    code = ("import importlib, sys\n"
            "importlib.import_module(sys.argv[1])\n")
    for mod in mods:
        out = subprocess.run([sys.executable, "-c", code, mod], capture_output=True, text=True,
                             timeout=300, cwd=PKG.parent)
        assert out.returncode == 0, f"{mod}: {out.stderr[-2000:]}"
