"""The layers as the code states them (docs/ARCHITECTURE.md, "The layers"), bottom to top:
the engine (``medrelease/``), the output suite and the manifest's JSON Schema (``schemas/``),
the tasks, the flows, the deployments and CLI, and on top the tools that use them all
(``benchmarks/``, ``scripts/``, ``tests/``). A module imports only its own layer and the layers
below it — counting imports inside functions and the package ``__init__`` an import runs first
— and no module is part of an import circle. The engine is framework-free: nothing under it
imports Prefect, nor jax or mbi, not even inside a function."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from ..conftest import ROOT

FORBIDDEN = ("prefect", "flows", "tasks", "deployments", "prefect_dask", "dask",
             # aim's estimator is numpy: jax (mbi's backend) compiled a program per model
             # structure, two thirds of a fresh process's release (docs/results/aim.md)
             "jax", "jaxlib", "mbi")
# bottom to top; every top-level folder with Python in it is one (the test below checks)
LAYERS = ("medrelease", "schemas", "tasks", "flows", "deployments", "benchmarks", "scripts",
          "tests")
# the tools on top: each may import any layer, and no layer imports them
TOOLS = ("benchmarks", "scripts", "tests")


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


@functools.cache  # one walk of the repository for every test here
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


def layer_of(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every edge from a module to a module of a higher layer (the tools may import each
    other: a test imports a benchmark's helper)."""
    return sorted(f"{source} -> {target}" for source, targets in graph.items()
                  for target in targets
                  if layer_of(target) > layer_of(source)
                  and not (source.split(".")[0] in TOOLS and target.split(".")[0] in TOOLS))


def test_every_top_level_package_is_a_layer() -> None:
    with_python = {p.parent.relative_to(ROOT).parts[0] for p in ROOT.glob("*/**/*.py")
                   if not p.relative_to(ROOT).parts[0].startswith(".")}
    assert with_python <= set(LAYERS), sorted(with_python - set(LAYERS))


def test_no_layer_imports_a_layer_above_it() -> None:
    graph = import_graph()
    assert {"schemas.output", "tasks.checks", "flows.release", "deployments.cli",
            "tests.unit.test_layering"} <= set(graph)
    assert upward_imports(graph) == []


def test_a_planted_upward_import_is_found(tmp_path: Path) -> None:
    """The direction check can fail: an engine module importing the tasks inside a function,
    and a package ``__init__`` importing the layer above it (the edge ``tasks/__init__`` had to
    ``deployments``), are both found."""
    for name, text in {
        "medrelease/__init__.py": "",
        "medrelease/release.py": "def run():\n    from tasks.lattice import score\n",
        "tasks/__init__.py": "from deployments.defaults import apply\n",
        "tasks/lattice.py": "from medrelease.release import run\n",
        "deployments/__init__.py": "",
        "deployments/defaults.py": "def apply():\n    pass\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("medrelease", "tasks", "deployments"))
    assert upward_imports(graph) == ["medrelease.release -> tasks",
                                     "medrelease.release -> tasks.lattice",
                                     "tasks -> deployments", "tasks -> deployments.defaults"]


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


def test_the_unit_tier_imports_nothing_but_the_engine() -> None:
    """Files under tests/unit import none of what the unit tier's guard refuses (Prefect, the
    flows and tasks, the browser and PostgreSQL drivers), not even inside a test: the whole
    suite runs the tiers together with the guard off, so this is where a slip is caught."""
    from .conftest import NOT_THE_ENGINE

    found = []
    for path in sorted((ROOT / "tests" / "unit").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     and not node.level else [])
            found += [f"{path.name}:{node.lineno} {name}" for name in names
                      if name.split(".")[0] in NOT_THE_ENGINE]
    assert found == [], found


def test_the_unit_tiers_guard_refuses_prefect() -> None:
    """With ``MEDRELEASE_UNIT_TIER=1`` (``test-fast``) importing Prefect is an ImportError that
    says where the test belongs."""
    import os
    import subprocess
    import sys

    code = ("import tests.unit.conftest\ntry:\n    import prefect\nexcept ImportError as exc:\n"
            "    print('refused:', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "MEDRELEASE_UNIT_TIER": "1"}, timeout=120)
    assert "refused:" in out.stdout and "tests/flow" in out.stdout, out.stdout + out.stderr


# What the release flow may not do itself: dispatch on a mechanism's kind or run a loop of
# the engine's (``medrelease.release.choose`` and the stages do, through the flow's executor).
KIND_DISPATCH = ("capabilities(", ".kind", "uses_counts", "uses_lattice", "score_lattice",
                 "run_rounds", "synthesize", "release_without_lattice")
FLOW_LINES = 250


def _dispatch_in(source: str) -> list[str]:
    tree = ast.parse(source)
    loops = [f"a loop at line {n.lineno}" for n in ast.walk(tree)
             if isinstance(n, ast.For | ast.While)]
    return [t for t in KIND_DISPATCH if t in source] + loops


def test_the_release_flow_is_wiring() -> None:
    """``flows/release.py`` at most 250 lines, with no kind dispatch and no loop (read as
    text: the unit tier never imports a flow)."""
    source = (ROOT / "flows" / "release.py").read_text()
    assert len(source.splitlines()) <= FLOW_LINES
    assert _dispatch_in(source) == []


def test_a_planted_kind_dispatch_in_the_flow_is_found() -> None:
    planted = ("def f(plan, pieces):\n    if capabilities(plan.mechanism).kind == 'rows':\n"
               "        for piece in pieces:\n            pass\n")
    assert _dispatch_in(planted) == ["capabilities(", ".kind", "a loop at line 3"]
