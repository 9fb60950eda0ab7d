"""The engine stays framework-free: nothing under medrelease/ imports Prefect or the
orchestration layer (flows, tasks, deployments), not even inside a function."""

from __future__ import annotations

import ast

from .conftest import ROOT

FORBIDDEN = ("prefect", "flows", "tasks", "deployments", "prefect_dask", "dask")


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
