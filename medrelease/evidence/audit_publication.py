"""The publication audit, engine part: inspect what two neighbouring release runs published.

The audit flow (``flows/audit.py``) runs the *whole release flow* on neighbouring inputs with the
same seed and hands the two published folders to ``compare_neighbours``:

1. boundary — each folder holds exactly the allow-listed files, its manifest exactly the
   ``PUBLISHED`` fields; ``released`` fields equal what the data file gives when recomputed
   (the publication verdict from the data, the published manifest and the dataset config's
   public declarations); the report is the manifest rendered, the CSV the Parquet written as
   CSV;
2. neighbour diff — every ``public`` field is byte-identical between the two runs (anything
   computed from the input shows up here: the input's row count, hash, true-count bounds...);
3. ``value_leaks`` — a value only the added person has appears in no published byte and in no
   *decoded* text: raw file bytes, the manifest's strings after JSON decoding (escapes defeat a
   byte scan), the Parquet file decoded (values, schema and key-value metadata, row-group
   statistics: compression defeats a byte scan) and the CSV parsed. Where the value belongs to
   a declared public domain, its appearance in the *data* is the mechanism's DP output (covered
   by the statistical test), so only the other files are held to this.

Every manifest field is compared: ``public`` fields byte for byte; ``output`` fields and each
``mechanism_details`` entry by their basis (``DETAILS``: public entries byte for byte, output
entries by shape — same keys and types); the decoded Parquet's schema and key-value metadata
byte for byte; its row-group statistics re-derived from its own values.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from medrelease.data.config import DatasetConfig, find_config
from medrelease.errors import MedreleaseError, ParameterError
from medrelease.evidence.audit import TIPPING_VALUE, UNIQUE_VALUE
from medrelease.evidence.audit_intervals import header_of, intervals_findings, read_intervals
from medrelease.evidence.verdict import publication_verdict
from medrelease.mechanisms import capabilities
from medrelease.privacy.publication import (
    DETAILS,
    PUBLISHED,
    Basis,
    published_file_names,
    released_figures,
    render_public_report,
    table_columns_allowed,
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


def data_tables(manifest: dict[str, Any]) -> tuple[str, ...]:
    """A relational release's table names (its data files are named after them), else ()."""
    tables = (manifest.get("mechanism_details") or {}).get("tables") or []
    return tuple(t["table"] for t in tables if isinstance(t, dict) and "table" in t)


def data_files(folder: Path, manifest: dict[str, Any], suffix: str) -> list[Path]:
    """Every data file of one format: ``data.*``, or one per table of a relational release
    (the parent table first)."""
    tables = data_tables(manifest)
    if not tables:
        return [find_data_file(folder, suffix)]
    prefix = "TEST-" if manifest.get("test_release") else ""
    return [folder / f"{prefix}{name}{suffix}" for name in tables]


def released_dimensions(manifest: dict[str, Any], table: pd.DataFrame) -> list[str]:
    """The dimensions the released figures are computed over (a relational release: its parent
    table's, whose manifest names are ``<table>.<column>``)."""
    tables = data_tables(manifest)
    out = []
    for name, spec in manifest["columns"].items():
        if spec.get("role") not in ("dimension", "set_valued"):
            continue
        if tables:
            owner, _, name = name.partition(".")
            if owner != tables[0]:
                continue
        if name in table.columns:
            out.append(name)
    return out


def inspect_folder(folder: Path, config: DatasetConfig | None = None) -> list[Finding]:
    """Checks one published folder against the boundary (files, fields, re-derivations).

    ``config``: the release's dataset config, whose public declarations (analyses, domains,
    taxonomies, impossible combinations) the verdict is recomputed with; default: the dataset
    of that name in the dataset roots."""
    from medrelease.storage.manifest_model import PublicManifest

    folder = Path(folder)
    manifest = _manifest(folder)
    findings: list[Finding] = []
    expected = set(published_file_names(bool(manifest.get("test_release")),
                                        published_tables(manifest), data_tables(manifest)))
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
    return _rederive(folder, manifest, config)


def published_tables(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The tables the release's mechanism declares it publishes beside the data."""
    try:
        return capabilities(manifest.get("mechanism", "")).published_tables
    except ParameterError:  # a mechanism no longer registered: only the standard files
        return ()


def _tables_checked(folder: Path, manifest: dict[str, Any],
                    config: DatasetConfig | None = None) -> list[Finding]:
    """Each published table: its columns on its allow-list (or a released column's labels),
    its statistics its own values' (a Parquet table), what the data file determines re-derived
    (``intervals.csv``: ``audit_intervals``)."""
    import pyarrow.parquet as pq

    findings = []
    for name in published_tables(manifest):
        path = folder / name
        columns = (list(read_intervals(path).columns) if path.suffix == ".csv"
                   else pq.read_schema(path).names)
        for column in table_columns_allowed(name, columns, list(manifest["columns"])):
            findings.append(Finding("boundary", f"{name} column {column!r}",
                                    "not on the allow-list of the table's columns"))
        if path.suffix == ".csv" and data_tables(manifest):
            continue  # relational: 'released' is the released tables' own patient-normalised
            # marginal, re-derived by tests/unit/test_relational_product.py, not here
        if path.suffix == ".csv":
            data = pd.read_parquet(find_data_file(folder, ".parquet"))
            findings += [Finding("re-derivation", where, what) for where, what in
                         intervals_findings(folder, manifest, data, config)]
        else:
            findings += _statistics_rederived(path)
    return findings


def _rederive(folder: Path, manifest: dict[str, Any], config: DatasetConfig | None = None
              ) -> list[Finding]:
    """``released`` fields, the report, the CSV and the Parquet statistics must follow from the
    published data alone (the verdict: with the published manifest and the config's public
    declarations)."""
    findings = [f for path in data_files(folder, manifest, ".parquet")
                for f in _statistics_rederived(path)]
    findings += _tables_checked(folder, manifest, config or _dataset_config(manifest))
    for name in sorted(set(manifest.get("mechanism_details") or {}) - set(DETAILS)):
        findings.append(Finding("boundary", f"manifest.mechanism_details.{name}",
                                "entry not on the allow-list of mechanism details"))
    table = pd.read_parquet(data_files(folder, manifest, ".parquet")[0])
    if data_tables(manifest):  # the parent table's released columns (its key is not one)
        table = table[[c.split(".", 1)[1] for c, spec in manifest["columns"].items()
                       if spec.get("table") == data_tables(manifest)[0]]]
    figures = released_figures(table, released_dimensions(manifest, table))
    config = config or _dataset_config(manifest)
    if config is None:
        findings.append(Finding("re-derivation", "manifest.verdict",
                                f"cannot be recomputed: no dataset config named "
                                f"{manifest.get('dataset')!r} in the dataset roots"))
    else:
        figures["verdict"] = publication_verdict(manifest, table, config).as_dict()
    for name, field in PUBLISHED.items():
        if field.basis == Basis.RELEASED and name in figures and _canonical(
                figures[name]) != _canonical(manifest[name]):
            findings.append(Finding("re-derivation", f"manifest.{name}",
                                    "differs from its value recomputed from the data file"))
    if (folder / "report.md").read_text(encoding="utf-8") != render_public_report(manifest):
        findings.append(Finding("re-derivation", "report.md",
                                "is not the public manifest rendered"))
    for parquet, csv_path in zip(data_files(folder, manifest, ".parquet"),
                                 data_files(folder, manifest, ".csv"), strict=True):
        csv = io.StringIO()
        neutralise_formulas(pd.read_parquet(parquet)).to_csv(csv, index=False)
        if csv_path.read_text(encoding="utf-8") != csv.getvalue():
            findings.append(Finding("re-derivation", csv_path.name,
                                    "is not the Parquet data written as CSV"))
    return findings


def _dataset_config(manifest: dict[str, Any]) -> DatasetConfig | None:
    """The dataset config a published manifest names, from the dataset roots (None: absent)."""
    try:
        return find_config(str(manifest.get("dataset") or ""))
    except MedreleaseError:
        return None


def compare_neighbours(without: Path, with_target: Path, config: DatasetConfig | None = None
                       ) -> list[Finding]:
    """Boundary checks of both folders, then every ``public`` field compared byte for byte
    (``config``: the neighbours' dataset config, for the verdict's re-derivation)."""
    findings = inspect_folder(without, config) + inspect_folder(with_target, config)
    a, b = _manifest(without), _manifest(with_target)
    for name, field in PUBLISHED.items():
        if field.basis == Basis.PUBLIC and _canonical(a.get(name)) != _canonical(b.get(name)):
            findings.append(Finding("neighbour-diff", f"manifest.{name}",
                                    "differs between neighbouring inputs although it is "
                                    "declared public (fixed before the data were read)"))
        if field.basis == Basis.OUTPUT and _shape(a.get(name)) != _shape(b.get(name)) \
                and name != "mechanism_details":
            findings.append(Finding("neighbour-diff", f"manifest.{name}",
                                    "an output field whose shape (keys, types) differs"))
    for name in sorted((set(a) | set(b)) - set(PUBLISHED)):
        if _canonical(a.get(name)) != _canonical(b.get(name)):
            findings.append(Finding("neighbour-diff", f"manifest.{name}",
                                    "an unlisted field that differs between neighbours"))
    return findings + _details_compared(a, b) + _parquet_compared(without, with_target)


def _shape(value: Any) -> Any:
    """Keys and types, not values (an output may differ between neighbours, its form not)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return ["list"]
    return type(value).__name__


def _details_compared(a: dict[str, Any], b: dict[str, Any]) -> list[Finding]:
    """Each mechanism-details entry by its basis: public ones identical, output ones alike."""
    da, db = a.get("mechanism_details") or {}, b.get("mechanism_details") or {}
    findings = []
    for name in sorted(set(da) | set(db)):
        basis = DETAILS.get(name)
        if basis is None:
            continue  # reported by the boundary check of each folder
        if basis == Basis.PUBLIC and _canonical(da.get(name)) != _canonical(db.get(name)):
            findings.append(Finding("neighbour-diff", f"manifest.mechanism_details.{name}",
                                    "a public entry that differs between neighbours"))
        elif name in da and name in db and _shape(da[name]) != _shape(db[name]) \
                and not isinstance(da[name], list):
            findings.append(Finding("neighbour-diff", f"manifest.mechanism_details.{name}",
                                    "an output entry whose shape (keys, types) differs"))
    return findings


def _parquet_compared(without: Path, with_target: Path) -> list[Finding]:
    """The decoded Parquet files' schema and key-value metadata, byte for byte."""
    import pyarrow.parquet as pq

    findings = []
    pairs = zip(data_files(without, _manifest(without), ".parquet"),
                data_files(with_target, _manifest(with_target), ".parquet"), strict=False)
    for one, other in pairs:
        findings += _data_file_compared(pq.ParquetFile(one), pq.ParquetFile(other), one.name)
    for name in published_tables(_manifest(without)):
        if name.endswith(".csv"):  # a text table's schema: its header, byte for byte
            if header_of(without / name) != header_of(with_target / name):
                findings.append(Finding("neighbour-diff", f"{name} header",
                                        "column names differ between neighbours"))
            continue
        schemas = [pq.read_schema(f / name) for f in (without, with_target)]
        if not schemas[0].equals(schemas[1], check_metadata=True):
            findings.append(Finding("neighbour-diff", f"{name} schema",
                                    "column names, types or metadata differ between neighbours"))
    return findings


def _data_file_compared(one: Any, other: Any, name: str) -> list[Finding]:
    """Two neighbours' data files: schema and key-value metadata alike."""
    findings = []
    if not one.schema_arrow.equals(other.schema_arrow, check_metadata=False):
        findings.append(Finding("neighbour-diff", f"{name} schema",
                                "column names or types differ between neighbours"))
    metadata = [dict(f.metadata.metadata or {}) for f in (one, other)]
    for key in sorted(set(metadata[0]) | set(metadata[1])):
        if metadata[0].get(key) != metadata[1].get(key):
            findings.append(Finding("neighbour-diff", f"{name} metadata {key.decode()!r}",
                                    "differs between neighbours"))
    return findings


def _statistics_rederived(path: Path) -> list[Finding]:
    """Each row group's min, max and null count recomputed from its decoded values."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    findings = []
    for group in range(parquet.metadata.num_row_groups):
        table = parquet.read_row_group(group)
        meta = parquet.metadata.row_group(group)
        for i in range(meta.num_columns):
            stats = meta.column(i).statistics
            column = table.column(i)
            if stats is None:
                continue
            if pa.types.is_dictionary(column.type):  # categories are stored as their values
                column = column.cast(column.type.value_type)
            facts = {"null count": (stats.null_count, column.null_count)}
            if stats.has_min_max and len(column) > column.null_count:
                low_high = pc.min_max(column)
                facts["min"] = (stats.min, low_high["min"].as_py())
                facts["max"] = (stats.max, low_high["max"].as_py())
            for what, (stated, derived) in facts.items():
                if stated != derived:
                    findings.append(Finding("re-derivation", f"{path.name} row group {group} "
                                            f"column {table.column_names[i]!r}",
                                            f"statistic {what} is not its values' own"))
    return findings


def value_leaks(folder: Path, value: str) -> list[Finding]:
    """Published bytes that carry ``value`` (data files exempt for a declared public domain)."""
    folder = Path(folder)
    manifest = _manifest(folder)
    public_domain = any("domain" in spec for spec in manifest["columns"].values())
    # a published table's labels enumerate the public domain (as the data's values may)
    data_names = {*(p.name for suffix in (".parquet", ".csv")
                    for p in data_files(folder, manifest, suffix)), *published_tables(manifest)}
    needle = value.encode("utf-8")
    findings = []
    for path in sorted(folder.iterdir()):
        if public_domain and path.name in data_names:
            continue
        if needle in path.read_bytes():
            findings.append(Finding("unique-value", path.name, f"contains {value!r}"))
    for where, texts in decoded_texts(folder, with_data=not public_domain).items():
        if any(value in text for text in texts):
            findings.append(Finding("unique-value", f"{where} (decoded)", f"holds {value!r}"))
    return findings


def decoded_texts(folder: Path, with_data: bool = True) -> dict[str, list[str]]:
    """Every string a reader of the folder can decode: the manifest's strings (JSON-decoded,
    keys included), the report, the Parquet file's key-value metadata and row-group statistics
    and, ``with_data``, its values and the parsed CSV."""

    out: dict[str, list[str]] = {"manifest.json": list(_strings(_manifest(folder))),
                                 "report.md": [(folder / "report.md").read_text("utf-8")]}
    manifest = _manifest(folder)
    # a row group's min and max are its values' own (``re-derivation`` checks it): with a
    # declared public domain they are released values like the data's, exempt as the data is
    for parquet_path in data_files(folder, manifest, ".parquet"):
        out[f"{parquet_path.name} metadata and statistics"] = _metadata_texts(
            parquet_path, statistics=with_data)
    for name in published_tables(_manifest(folder)):
        if name.endswith(".csv"):  # parsed like data.csv: every cell and the header
            if with_data:
                parsed = read_intervals(folder / name)
                out[f"{name} values"] = parsed.to_numpy().ravel().tolist() + list(parsed)
            continue
        out[f"{name} metadata and statistics"] = _metadata_texts(folder / name)
        if with_data:
            out[f"{name} values"] = pd.read_parquet(folder / name).astype(str) \
                .to_numpy().ravel().tolist()
    if with_data:
        for parquet_path, csv_path in zip(data_files(folder, manifest, ".parquet"),
                                          data_files(folder, manifest, ".csv"), strict=True):
            table = pd.read_parquet(parquet_path)
            out[f"{parquet_path.name} values"] = table.astype(str).to_numpy().ravel().tolist()
            parsed = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
            out[f"{csv_path.name} values"] = parsed.to_numpy().ravel().tolist() + list(parsed)
    return out


def _metadata_texts(path: Path, statistics: bool = True) -> list[str]:
    """A Parquet file's key-value metadata and (``statistics``) every row group's min and max,
    as text."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    texts = [v.decode("utf-8", "replace") for v in (parquet.metadata.metadata or {}).values()]
    for group in range(parquet.metadata.num_row_groups if statistics else 0):
        for i in range(parquet.metadata.num_columns):
            stats = parquet.metadata.row_group(group).column(i).statistics
            if stats is not None and stats.has_min_max:
                texts += [str(stats.min), str(stats.max)]
    return texts


def _strings(value: Any):
    """Every string in a decoded JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


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
              # the largest cap a source may have (one release of eps <= 100 per home)
              "columns": columns, "privacy": {"lifetime_epsilon": 100.0,
                                              "lifetime_delta": 1e-2},
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
