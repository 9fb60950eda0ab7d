"""The publication audit, engine part: inspect what two neighbouring release runs published.

The audit flow (``flows/audit.py``) runs the *whole release flow* on neighbouring inputs with the
same seed and hands the two published folders to ``compare_neighbours``:

1. boundary — each folder holds exactly the allow-listed files, its manifest exactly the
   ``PUBLISHED`` fields; ``released`` fields equal what the data file gives when recomputed;
   the report is the manifest rendered, the CSV the Parquet written as CSV;
2. neighbour diff — every ``public`` field is byte-identical between the two runs (anything
   computed from the input shows up here: the input's row count, hash, true-count bounds...);
3. ``value_leaks`` — a value only the added person has appears in no published byte (raw file
   bytes and decoded Parquet values). Where the value belongs to a declared public domain, its
   appearance in the *data* is the mechanism's DP output (covered by the statistical test), so
   only the other files are held to this.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from medrelease.evidence.audit import TIPPING_VALUE, UNIQUE_VALUE
from medrelease.mechanisms import capabilities
from medrelease.privacy.publication import (
    PUBLISHED,
    Basis,
    published_file_names,
    released_figures,
    render_public_report,
)
from medrelease.storage.store import find_data_file, neutralise_formulas


@dataclass(frozen=True)
class Finding:
    check: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.where}: {self.detail}"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))


def inspect_folder(folder: Path) -> list[Finding]:
    """Checks one published folder against the boundary (files, fields, re-derivations)."""
    from schemas.manifest import PublicManifest

    folder = Path(folder)
    manifest = _manifest(folder)
    findings: list[Finding] = []
    expected = set(published_file_names(bool(manifest.get("test_release"))))
    for name in sorted({p.name for p in folder.iterdir()} ^ expected):
        state = "missing" if name in expected else "not on the allow-list of published files"
        findings.append(Finding("boundary", name, state))
    for name in sorted(set(manifest) - set(PUBLISHED)):
        findings.append(Finding("boundary", f"manifest.{name}", "field not on the allow-list"))
    try:
        PublicManifest(**manifest)
    except ValidationError as exc:
        findings.append(Finding("boundary", "manifest.json", f"does not validate: {exc}"[:300]))
    if findings:
        return findings
    return _rederive(folder, manifest)


def _rederive(folder: Path, manifest: dict[str, Any]) -> list[Finding]:
    """``released`` fields, the report and the CSV must follow from the published data alone."""
    findings = []
    table = pd.read_parquet(find_data_file(folder, ".parquet"))
    dims = [c for c, spec in manifest["columns"].items()
            if spec["role"] in ("dimension", "set_valued") and c in table.columns]
    figures = released_figures(table, dims)
    for name, field in PUBLISHED.items():
        if field.basis == Basis.RELEASED and _canonical(figures[name]) != _canonical(
                manifest[name]):
            findings.append(Finding("re-derivation", f"manifest.{name}",
                                    "differs from its value recomputed from the data file"))
    if (folder / "report.md").read_text(encoding="utf-8") != render_public_report(manifest):
        findings.append(Finding("re-derivation", "report.md",
                                "is not the public manifest rendered"))
    csv = io.StringIO()
    neutralise_formulas(table).to_csv(csv, index=False)
    if find_data_file(folder, ".csv").read_text(encoding="utf-8") != csv.getvalue():
        findings.append(Finding("re-derivation", find_data_file(folder, ".csv").name,
                                "is not the Parquet data written as CSV"))
    return findings


def compare_neighbours(without: Path, with_target: Path) -> list[Finding]:
    """Boundary checks of both folders, then every ``public`` field compared byte for byte."""
    findings = inspect_folder(without) + inspect_folder(with_target)
    a, b = _manifest(without), _manifest(with_target)
    for name, field in PUBLISHED.items():
        if field.basis == Basis.PUBLIC and _canonical(a.get(name)) != _canonical(b.get(name)):
            findings.append(Finding("neighbour-diff", f"manifest.{name}",
                                    "differs between neighbouring inputs although it is "
                                    "declared public (fixed before the data were read)"))
    for name in sorted((set(a) | set(b)) - set(PUBLISHED)):
        if _canonical(a.get(name)) != _canonical(b.get(name)):
            findings.append(Finding("neighbour-diff", f"manifest.{name}",
                                    "an unlisted field that differs between neighbours"))
    return findings


def value_leaks(folder: Path, value: str) -> list[Finding]:
    """Published bytes that carry ``value`` (data files exempt for a declared public domain)."""
    folder = Path(folder)
    manifest = _manifest(folder)
    public_domain = any("domain" in spec for spec in manifest["columns"].values())
    data_files = {find_data_file(folder, ".parquet").name, find_data_file(folder, ".csv").name}
    needle = value.encode("utf-8")
    findings = []
    for path in sorted(folder.iterdir()):
        if public_domain and path.name in data_files:
            continue
        if needle in path.read_bytes():
            findings.append(Finding("unique-value", path.name, f"contains {value!r}"))
    if not public_domain:
        table = pd.read_parquet(find_data_file(folder, ".parquet"))
        if table.astype(str).isin([value]).to_numpy().any():
            findings.append(Finding("unique-value", "data (decoded)", f"holds {value!r}"))
    return findings


AUDIT_VALUES = [f"d{i}" for i in range(5)] + [UNIQUE_VALUE, TIPPING_VALUE]


def write_audit_dataset(folder: Path, mechanism: str) -> Path:
    """A small dataset (config, taxonomies, extract path) for auditing ``mechanism`` end to end.

    The informative column gets a declared public domain for ``histogram`` (its DP claim needs
    one) and none otherwise; DiffGen gets a class column with declared values instead.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cat.csv").write_text("".join(f"c{i};g{i // 2};*\n" for i in range(4)))
    (folder / "num.yaml").write_text("domain: {min: 0, max: 19}\nlevels:\n  - {width: 5}\n")
    columns: dict[str, Any] = {
        "cat": {"role": "dimension", "taxonomy": "cat.csv"},
        "num": {"role": "dimension", "type": "integer", "taxonomy": "num.yaml"}}
    caps = capabilities(mechanism)
    if caps.needs_class_domain:
        columns["outcome"] = {"role": "class", "values": ["no", "yes"]}
    else:
        columns["inf"] = {"role": "informative"}
        if caps.audit_public_domain:
            (folder / "inf_domain.txt").write_text("\n".join(AUDIT_VALUES) + "\n")
            columns["inf"]["domain"] = "inf_domain.txt"
    config = {"name": f"audit-{mechanism}", "input": {"path": "extract.csv"},
              "columns": columns, "privacy": {"lifetime_epsilon": 1000.0,
                                              "lifetime_delta": 0.5},
              "mechanism": {"name": mechanism},
              # the audit runs what it is asked to, at eps up to 100 (its own scratch data)
              "policy": {"mechanisms": [mechanism], "allow_unproven": True,
                         "max_epsilon": 100.0}}
    path = folder / "dataset.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


def publication_designs(mechanism: str) -> tuple[str, ...]:
    """The neighbour designs the publication audit runs for a mechanism (its declaration)."""
    return capabilities(mechanism).audit_designs


def publication_neighbours(design: str, mechanism: str, epsilon: float
                           ) -> tuple[pd.DataFrame, pd.DataFrame, str | None]:
    """(D, D', the value only the added row has, if any) for one publication-audit design."""
    from medrelease.evidence.audit import (
        classification_tables,
        common_tables,
        neighbouring_tables,
        tipping_tables,
    )

    if design == "unique":
        return (*neighbouring_tables(), UNIQUE_VALUE)
    if design == "tipping":
        return (*tipping_tables(mechanism, epsilon), None)
    if design == "classification":
        return (*classification_tables(), None)
    if design == "common":
        if capabilities(mechanism).needs_class_domain:
            base, _ = classification_tables()
            return base, pd.concat([base, base.iloc[:1]], ignore_index=True), None
        return (*common_tables(), None)
    raise ValueError(f"unknown publication-audit design {design!r}")
