"""The layers as the code states them: the engine (medrelease/) is framework-free — nothing
under it imports Prefect or the orchestration layer (flows, tasks, deployments), nor jax or
mbi, not even inside a function — and no module of medrelease/, tasks/, flows/ or
deployments/ is part of an import circle, counting imports inside functions and the package
``__init__`` an import runs first."""

from __future__ import annotations

import ast
from pathlib import Path

from ..conftest import ROOT

FORBIDDEN = ("prefect", "flows", "tasks", "deployments", "prefect_dask", "dask",
             # aim's estimator is numpy: jax (mbi's backend) compiled a program per model
             # structure, two thirds of a fresh process's release (docs/results/aim.md)
             "jax", "jaxlib", "mbi")
LAYERS = ("medrelease", "tasks", "flows", "deployments")


def test_the_engine_imports_no_orchestration() -> None:
    found = []
    for path in sorted((ROOT / "medrelease").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] in FORBIDDEN]
    assert found == [], found


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT, layers: tuple[str, ...] = LAYERS) -> dict[str, set[str]]:
    """Module -> the project modules it imports, from the AST (every import statement, at any
    depth: inside functions too). ``from a.b import c`` imports ``a.b.c`` where that is a
    module, else ``a.b``; importing ``a.b.c`` from outside package ``a.b`` also runs
    ``a.b/__init__.py`` first, so it is an edge to that package as well (the edge that makes a
    registry package's import circle)."""
    files = {module_name(p, root): p for layer in layers for p in sorted((root / layer).rglob("*.py"))}
    packages = {name for name, p in files.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if name in packages else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                               for a in node.names)
        edges = set()
        for target in targets:
            while target and target not in files:  # a name inside a module: that module
                target = target.rpartition(".")[0]
            if not target or target == name:
                continue
            edges.add(target)
            parts = target.split(".")
            for i in range(1, len(parts)):  # the packages whose __init__ runs first
                package = ".".join(parts[:i])
                if package in packages and not (name == package
                                                or name.startswith(package + ".")):
                    edges.add(package)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_module_is_part_of_an_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 80 and "medrelease.release" in graph["tasks.lattice"]
    assert cycles(graph) == []


def test_the_walk_finds_a_circle_held_by_an_import_inside_a_function(tmp_path: Path) -> None:
    """The check can fail: the circle the driver had (release.py imported the synthetic
    release inside a function, which imported the driver's types back) is found."""
    package = tmp_path / "medrelease"
    (package / "synthetic").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "synthetic" / "__init__.py").write_text("")
    (package / "release.py").write_text(
        "def release():\n    from medrelease.synthetic.release import release_synthetic\n")
    (package / "synthetic" / "release.py").write_text(
        "from medrelease.release import MaterializedRelease\n")
    (package / "plan.py").write_text("import medrelease.synthetic\n")
    assert cycles(import_graph(tmp_path, ("medrelease",))) == [
        ["medrelease.release", "medrelease.synthetic.release"]]
