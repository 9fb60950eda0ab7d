"""The bad-input corpus through the release flow: careless files, hostile files, wrong requests.

Every error case asserts a clear message (which column, which problem, how many rows, which
file lines — never a value), no ledger spend, no published byte and no steward record. The
released cases assert what comes out. A last test scans Prefect's database after the corpus:
no raw value and no file content may be there.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

from deployments.local_server import drain_prefect_workers
from flows.release import ReleaseRequest, release_flow
from medrelease.privacy.ledger import Ledger

from ..conftest import ROOT, wait_until_unchanged

pytestmark = pytest.mark.usefixtures("prefect_harness")

HEADER = "patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n"
ROW = "1,34,F,3,N,11,A001\n"
SECRET = "TOPSECRET_DB_PASSWORD=hunter2-sentinel"
SENTINELS = [SECRET, "thirty-sentinel", "XSENTINEL", "ZZSENTINEL9", "7777777", "SENTINEL-DX"]


@dataclass
class Case:
    """One corpus entry: how to break things, and the error that must come out."""

    name: str
    error: str                        # exception class name
    message: str                      # regex the message must match
    extract: str | bytes | None = None
    config: dict[str, Any] = field(default_factory=dict)   # merged into the YAML
    request: dict[str, Any] = field(default_factory=dict)  # ReleaseRequest fields
    setup: Callable[[Path], None] | None = None            # extra preparation in the folder
    locked: bool = False                                   # another process holds the ledger


def _rows(n: int, seed: int = 0, **fixed) -> str:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "patient_id": np.arange(n), "age": rng.integers(1, 101, n),
        "sex": rng.choice(["F", "M"], n), "length_of_stay": rng.integers(1, 401, n),
        "surgery": rng.choice(["Y", "N"], n), "region": rng.choice([11, 21, 22, 31, 39], n),
        "diagnosis": rng.choice(["A001", "B002", "C003"], n)})
    for column, values in fixed.items():
        frame[column] = values
    return frame.to_csv(index=False)


def _write(folder: Path, name: str, text: str) -> Callable[[Path], None]:
    def setup(base: Path) -> None:
        (base / name).write_text(text)
    return setup


def _taxonomy(name: str, text: str, column: str, key: str = "taxonomy"):
    """A case whose column points at a broken taxonomy written into the dataset's folder."""
    return {"config": {"columns": {column: {key: name}}}, "setup": _write(Path(), name, text)}


def _prior_release_then(action: Callable[[Path], None]) -> Callable[[Path], None]:
    def setup(base: Path) -> None:
        _prior_release(base)
        action(base)
    return setup


def _empty_ledger(base: Path) -> None:
    with sqlite3.connect(base / "home" / "ledger.sqlite") as conn:
        conn.execute("DELETE FROM spends")


def _delete_ledger(base: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        (base / "home" / f"ledger.sqlite{suffix}").unlink(missing_ok=True)


def _lock_ledger(base: Path) -> sqlite3.Connection:
    """Another process holding the ledger: an exclusive transaction on its own connection."""
    Ledger(base / "home" / "ledger.sqlite")
    conn = sqlite3.connect(base / "home" / "ledger.sqlite", isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    return conn


def _file_in_the_way(base: Path) -> None:
    (base / "home" / "test-releases").mkdir(parents=True)  # seeded requests: the test store
    (base / "home" / "test-releases" / "monthly").write_text("a file, not a folder")


def _symlink_out(base: Path) -> None:
    (base / "home" / "test-releases").mkdir(parents=True)
    (base / "outside").mkdir()
    os.symlink(base / "outside", base / "home" / "test-releases" / "elsewhere")


def _link_to_secret(base: Path) -> None:
    secret = base.parent / f"{base.name}-secret.txt"  # outside the dataset's input folder
    secret.write_text(SECRET + "\n1,2,3\n")
    os.symlink(secret, base / "link.csv")


def _prior_release(base: Path) -> None:
    release_flow(ReleaseRequest(dataset=str(base / "dataset.yaml"), evaluate=False))


# -- issue 25: the budget follows the data; the ledger is the system of record -----------------

def _second_yaml(base: Path, patch: dict[str, Any], folder: str = "other") -> Path:
    """Another steward's (or a careless copy's) YAML in its own folder, over the same data."""
    spec = yaml.safe_load((base / "dataset.yaml").read_text())
    spec["name"] = "second"
    spec["input"]["path"] = "own.csv"
    _merge(spec, patch)
    (base / folder).mkdir(exist_ok=True)
    path = base / folder / "dataset.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _second_source_over_the_first_folder(base: Path) -> None:
    _prior_release(base)
    _second_yaml(base, {"privacy": {"source": "fresh-budget"},
                        "input": {"folders": [str(base)]}})


def _byte_identical_copy_elsewhere(base: Path) -> None:
    _prior_release(base)
    _second_yaml(base, {"privacy": {"source": "fresh-budget"}})
    shutil.copyfile(base / "extract.csv", base / "other" / "own.csv")


def _permissive_yaml_of_the_same_source(base: Path) -> None:
    _prior_release(base)
    _second_yaml(base, {"privacy": {"source": "corpus"},
                        "policy": {"mechanisms": ["kanon", "ipa"], "allow_unproven": True,
                                   "min_k": 2}})
    shutil.copyfile(base / "extract.csv", base / "other" / "own.csv")


def _ledger_and_records_deleted(base: Path) -> None:
    _delete_ledger(base)
    shutil.rmtree(base / "home" / "steward")


def _cap_lowered_then_sources_dropped(base: Path) -> None:
    Ledger(base / "home" / "ledger.sqlite").set_cap("corpus", 5.0, 1e-4, "lowered by the board")
    with sqlite3.connect(base / "home" / "ledger.sqlite") as conn:
        conn.execute("DROP TABLE sources")


def _identical_partitions(base: Path) -> None:
    text = _rows(100)
    (base / "visits-1.csv").write_text(text)
    (base / "visits-1 (copy).csv").write_text(text)


def _chain_taxonomy(values: list[str], levels: int) -> str:
    """A categorical taxonomy of ``levels`` levels (each value its own chain up to '*')."""
    return "".join(";".join([v, *(f"{v}~{k}" for k in range(1, levels - 1)), "*"]) + "\n"
                   for v in values)


def _ten_levels_everywhere(base: Path) -> None:
    widths = "\n".join(f"  - width: {2 ** k}" for k in range(1, 9))
    for column, high in (("age", 100), ("length_of_stay", 400)):
        (base / f"{column}.yaml").write_text(
            f"domain: {{min: 1, max: {high}}}\nlevels:\n{widths}\n")
    for column, values in (("sex", ["F", "M"]), ("surgery", ["Y", "N"]),
                           ("region", ["11", "21", "22", "31", "39"])):
        (base / f"{column}.csv").write_text(_chain_taxonomy(values, 10))


TEN_LEVELS = {"columns": {c: {"taxonomy": f"{c}.{'yaml' if c in ('age', 'length_of_stay') else 'csv'}"}
                          for c in ("age", "sex", "length_of_stay", "surgery", "region")}}


def _six_wide_taxonomies(base: Path) -> None:
    """Six more dimensions of 200 values each: with the others, a joint domain of about 10^14
    combinations, more than one count table's key holds (issue 55: check said no problems and
    the release refused "too large to stream")."""
    for i in range(6):
        (base / f"w{i}.csv").write_text("".join(f"v{k};*\n" for k in range(200)))


SIX_WIDE = {"columns": {f"w{i}": {"role": "dimension", "taxonomy": f"w{i}.csv"}
                        for i in range(6)}}


ALIAS_BOMB = ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
              "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, "
              "*c, *c]\n")

CASES = [
    # -- the file itself --------------------------------------------------------------------
    Case("empty file", "InputValidationError", "empty", ""),
    Case("header only", "InputValidationError", "no data rows", HEADER),
    Case("wrong delimiter", "InputValidationError", "set input.delimiter: ';'",
         HEADER.replace(",", ";") + ROW.replace(",", ";")),
    Case("wrong encoding", "InputValidationError", r"input\.encoding",
         (HEADER + "1,34,F,3,N,11,Ä001\n").encode("latin-1")),
    Case("binary garbage", "InputValidationError", r"input\.encoding|parse",
         bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8))),
    Case("duplicated column", "InputValidationError", "repeats 1 column name.*'age'",
         "patient_id,age,age,sex,length_of_stay,surgery,region,diagnosis\n1,34,34," + ROW[5:]),
    Case("missing column", "InputValidationError", "missing declared column.*'region'|lacks",
         HEADER.replace(",region", "") + "1,34,F,3,N,A001\n"),
    Case("200 kB header field", "InputValidationError", "longer than",
         "x" * 200_000 + "," + HEADER),
    Case("a secret as the header", "InputValidationError", "single column",
         SECRET + "\n1\n"),
    Case("ragged row", "InputValidationError", "Expected 7 fields",
         HEADER + ROW + "2,34,F,3,N,11,A001,extra\n"),
    Case("parquet declared, CSV given", "InputValidationError", "as Parquet", HEADER + ROW,
         config={"input": {"format": "parquet"}}),
    Case("NUL byte in a value", "InputValidationError", "'diagnosis'.*control characters",
         HEADER + "1,34,F,3,N,11,A0\x0001\n"),
    Case("escape character", "InputValidationError", "'sex'.*control characters",
         HEADER + "1,34,F\x1b[31m,3,N,11,A001\n"),
    # -- values ------------------------------------------------------------------------------
    Case("age as words", "InputValidationError", "'age'.*whole numbers.*file line 2",
         HEADER + "1,thirty-sentinel,F,3,N,11,A001\n"),
    Case("age 1e1", "InputValidationError", "'age'.*whole numbers", HEADER + "1,1e1,F,3,N,11,A001\n"),
    Case("age 41.99999999999999999", "InputValidationError", "'age'.*whole numbers",
         HEADER + "1,41.99999999999999999,F,3,N,11,A001\n"),
    Case("fractional age, integer taxonomy", "InputValidationError", "'age'.*whole numbers",
         HEADER + "1,0.8,F,3,N,11,A001\n"),
    Case("negative stay", "InputValidationError", "'length_of_stay'.*not covered.*line 3",
         HEADER + ROW + "2,34,F,-2,N,11,A001\n"),
    Case("stay 9999", "InputValidationError", "'length_of_stay'.*not covered",
         HEADER + "1,34,F,9999,N,11,A001\n"),
    Case("region outside its taxonomy", "InputValidationError", "'region'.*not covered",
         HEADER + "1,34,F,3,N,7777777,A001\n"),
    Case("sex outside its taxonomy", "InputValidationError", "'sex'.*not covered.*line 4",
         HEADER + ROW + ROW + "3,34,XSENTINEL,3,N,11,A001\n"),
    Case("missing sex (reject)", "InputValidationError", "'sex': 1 missing value",
         HEADER + "1,34,,3,N,11,A001\n"),
    Case("missing diagnosis (reject)", "InputValidationError", "'diagnosis': 1 missing",
         HEADER + "1,34,F,3,N,11,\n"),
    Case("drop_rows over its limit", "InputValidationError", "drop 5 of 10 rows",
         _rows(10, sex=["F", None] * 5), config={"missing": "drop_rows"}),
    Case("drop_rows of every row", "InputValidationError", "every one of the 3 rows",
         _rows(3, sex=[None] * 3), config={"missing": "drop_rows"}),
    Case("diagnosis outside the declared domain", "InputValidationError",
         "'diagnosis'.*declared domain", HEADER + "1,34,F,3,N,11,ZZSENTINEL9\n",
         config={"columns": {"diagnosis": {"domain": "codes.txt"}}},
         setup=_write(Path(), "codes.txt", "A001\nB002\nC003\n")),
    Case("a row without its patient (privacy unit declared)", "InputValidationError",
         "'patient_id': 1 missing value", HEADER + ROW + ",34,F,3,N,11,A001\n",
         config={"columns": {"patient_id": {"role": "identifier"}},
                 "privacy": {"unit": "patient_id", "max_rows_per_unit": 2}}),
    # -- the dataset config --------------------------------------------------------------------
    Case("privacy unit is not an identifier column", "ConfigError",
         "privacy.unit 'sex' must name a column with role 'identifier'", HEADER + ROW,
         config={"privacy": {"unit": "sex", "max_rows_per_unit": 2}}),
    Case("malformed YAML", "ConfigError", r"not valid YAML \(line", HEADER + ROW,
         setup=_write(Path(), "dataset.yaml", "name: x\ncolumns: [a, b\n")),
    Case("YAML alias bomb", "ConfigError", "more than 20 YAML aliases", HEADER + ROW,
         setup=lambda base: (base / "dataset.yaml").write_text(
             (base / "dataset.yaml").read_text() + ALIAS_BOMB)),
    Case("config over 256 kB", "ConfigError", "larger than 256 kB", HEADER + ROW,
         setup=lambda base: (base / "dataset.yaml").write_text(
             (base / "dataset.yaml").read_text() + "# " + "x" * 300_000 + "\n")),
    Case("taxonomy outside the dataset's folders", "ConfigError",
         "taxonomy file must lie in the dataset config's own folder", HEADER + ROW,
         config={"columns": {"sex": {"taxonomy": "../outside/sex.csv"}}},
         setup=lambda base: ((base.parent / "outside").mkdir(exist_ok=True),
                             (base.parent / "outside" / "sex.csv").write_text("F;*\nM;*\n"))),
    Case("domain is /etc/passwd", "ConfigError", "domain file must lie", HEADER + ROW,
         config={"columns": {"diagnosis": {"domain": "/etc/passwd"}}}),
    Case("taxonomy: duplicate leaf", "TaxonomyError", "appears twice", HEADER + ROW,
         **_taxonomy("sex.csv", "F;*\nF;*\n", "sex")),
    Case("taxonomy: cycle", "TaxonomyError", "two parents|cycle", HEADER + ROW,
         **_taxonomy("sex.csv", "F;M;*\nM;F;*\n", "sex")),
    Case("taxonomy: no '*'", "TaxonomyError", "must be '\\*'", HEADER + ROW,
         **_taxonomy("sex.csv", "F;all\nM;all\n", "sex")),
    Case("taxonomy: ragged lines", "TaxonomyError", "different numbers of levels", HEADER + ROW,
         **_taxonomy("sex.csv", "F;x;*\nM;*\n", "sex")),
    Case("taxonomy: two parents", "TaxonomyError", "two parents", HEADER + ROW,
         **_taxonomy("region.csv", "11;a;x;*\n21;a;y;*\n22;b;y;*\n31;c;y;*\n39;c;y;*\n",
                     "region")),
    Case("taxonomy: empty", "TaxonomyError", "empty", HEADER + ROW,
         **_taxonomy("sex.csv", "\n", "sex")),
    Case("numeric taxonomy: bad width", "TaxonomyError", "width", HEADER + ROW,
         **_taxonomy("age.yaml", "domain: {min: 1, max: 100}\nlevels:\n  - {width: -3}\n", "age")),
    Case("missing category not in the taxonomy", "ConfigError", "is not a leaf", HEADER + ROW,
         config={"columns": {"sex": {"missing": "unknown"}}}),
    Case("unknown encoding", "ConfigError", "unknown text encoding", HEADER + ROW,
         config={"input": {"encoding": "utf-99"}}),
    Case("dataset name not a slug", "ConfigError", "lower-case", HEADER + ROW,
         config={"name": "Bad Name!"}),
    Case("unknown dataset name", "ConfigError", "no dataset named", HEADER + ROW,
         request={"dataset": "no-such-dataset"}),
    Case("dataset YAML outside the dataset roots", "ConfigError", "dataset root|inside",
         HEADER + ROW, request={"dataset": "/etc/hosts.yaml"}),
    # -- where the extract comes from ---------------------------------------------------------
    Case("input path outside the input folders", "ConfigError", "not in an input folder",
         HEADER + ROW, request={"input_path": "/etc/passwd"}),
    Case("input path: a symlink to a secret", "ConfigError", "not in an input folder",
         HEADER + ROW, request={"input_path": "LINK"}, setup=_link_to_secret,
         config={"input": {"folders": ["."]}}),
    Case("input path relative", "ConfigError", "must be absolute", HEADER + ROW,
         request={"input_path": "extract.csv"}),
    # -- budgets and the policy -------------------------------------------------------------
    Case("epsilon 0", "ParameterError", "epsilon must be a positive", HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "epsilon": 0.0}}),
    Case("epsilon negative", "ParameterError", "epsilon must be a positive", HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "epsilon": -1.0}}),
    Case("epsilon NaN", "ParameterError", "epsilon must be a positive", HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "epsilon": float("nan")}}),
    Case("epsilon 1e-300", "ParameterError", r"below 9\.5", HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "epsilon": 1e-300}}),
    Case("epsilon 1e9", "ParameterError", "above 100, the product.s bound", HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "epsilon": 1e9}}),
    Case("epsilon above the policy's cap", "PolicyError", "above the per-release cap 2",
         HEADER + ROW, request={"mechanism": {"mechanism": "ipa", "epsilon": 3.0}}),
    Case("kanon under the default policy", "PolicyError", "'kanon' is not allowed",
         HEADER + ROW, request={"mechanism": {"mechanism": "kanon", "k": 10}}),
    Case("pseudonymize under the default policy", "PolicyError", "not allowed", HEADER + ROW,
         request={"mechanism": {"mechanism": "pseudonymize"}}),
    Case("ipa-paper listed but unproven not allowed", "PolicyError", "allow_unproven",
         HEADER + ROW, config={"policy": {"mechanisms": ["ipa", "ipa-paper"]}},
         request={"mechanism": {"mechanism": "ipa-paper", "epsilon": 1.0}}),
    Case("histogram without a public domain", "PolicyError", "no proven DP guarantee",
         HEADER + ROW, request={"mechanism": {"mechanism": "histogram", "epsilon": 1.0}}),
    Case("kanon k=2 below the policy's minimum", "PolicyError", "below the minimum k = 10",
         HEADER + ROW, config={"policy": {"mechanisms": ["kanon"], "allow_unproven": True}},
         request={"mechanism": {"mechanism": "kanon", "k": 2}}),
    Case("ipa shares not adding up", "ParameterError", "must add up", HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "epsilon": 1.0, "eps_candidates": 0.5,
                                "eps_cells": 0.5, "eps_ladder": 0.1, "eps_suppression": 0.5}}),
    Case("ipa t = 1", "ValidationError", "at least 2", HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "suppression_threshold": 1}}),
    Case("ipa delta 0", "ValidationError", "strictly between", HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "delta": 0.0}}),
    Case("unknown parameter", "ValidationError", "ipa does not take epsilonn; it takes: delta",
         HEADER + ROW,
         request={"mechanism": {"mechanism": "ipa", "epsilonn": 1.0}}),
    Case("unknown mechanism", "ValidationError", "unknown mechanism 'magic'; available: aim, diffgen",
         HEADER + ROW, request={"mechanism": {"mechanism": "magic"}}),
    Case("histogram node over the cell limit", "ParameterError", "cell limit", HEADER + ROW,
         config={"columns": {"diagnosis": {"domain": "codes.txt"}}},
         setup=_write(Path(), "codes.txt", "A001\nB002\n"),
         request={"mechanism": {"mechanism": "histogram", "epsilon": 1.0, "cell_limit": 10,
                                "node": {"age": 0, "sex": 0, "length_of_stay": 0,
                                         "surgery": 0, "region": 0}}}),
    Case("lifetime budget exceeded", "BudgetExceededError", "exceed the lifetime",
         HEADER + ROW, config={"privacy": {"lifetime_epsilon": 0.5}}),
    # -- where the release goes ----------------------------------------------------------------
    Case("destination escaping the store", "ValidationError", "not allowed|relative path",
         HEADER + ROW, request={"destination": "../escape"}),
    Case("destination 7 levels deep", "ValidationError", "folder levels", HEADER + ROW,
         request={"destination": "a/b/c/d/e/f/g"}),
    Case("destination through a file", "StoreError", "cannot be created|is a file",
         HEADER + ROW, request={"destination": "monthly"}, setup=_file_in_the_way),
    Case("destination leading out through a symlink", "StoreError", "outside the store",
         HEADER + ROW, request={"destination": "elsewhere"}, setup=_symlink_out),
    Case("destination inside an existing release", "StoreError", "is a published release",
         _rows(200), request={"destination": "INSIDE", "seed": None}, setup=_prior_release),
    # -- the ledger ------------------------------------------------------------------------
    Case("ledger emptied while releases exist", "LedgerIntegrityError",
         "does not hold the spends of 1 release",
         _rows(200), setup=_prior_release_then(_empty_ledger)),
    Case("ledger file deleted while releases exist", "LedgerIntegrityError",
         "is missing the spends of 1",
         _rows(200), setup=_prior_release_then(_delete_ledger)),
    Case("ledger locked by another process", "LedgerLockedError", "stayed locked", HEADER + ROW,
         locked=True),
    # -- mechanism and data shape -------------------------------------------------------------
    Case("diffgen without a class column", "ParameterError", "exactly one column with role",
         _rows(50), config={"policy": {"mechanisms": ["diffgen"]}},
         request={"mechanism": {"mechanism": "diffgen", "epsilon": 1.0}}),
    # -- issue 25: budget identity, hostile users, work bounded before the charge ------------
    Case("same extract through a second YAML with its own source and --input",
         "LedgerSourceError", "already charged to source 'corpus'.*Nothing was spent",
         _rows(200), setup=_second_source_over_the_first_folder,
         request={"dataset": "OTHER", "input_path": "FIRST", "seed": None}),
    Case("byte-identical copy of a charged extract under a new source", "LedgerSourceError",
         "already charged to source 'corpus'", _rows(200), setup=_byte_identical_copy_elsewhere,
         request={"dataset": "OTHER", "seed": None}),
    Case("a permissive YAML of the same source cannot loosen its policy", "PolicyError",
         "not allowed by the policy of source .corpus.*first released", _rows(200),
         setup=_permissive_yaml_of_the_same_source,
         request={"dataset": "OTHER", "seed": None,
                  "mechanism": {"mechanism": "kanon", "k": 2}}),
    Case("ledger and steward records deleted while releases are published",
         "LedgerIntegrityError", "is missing the spends of 1 release.*ledger restore",
         _rows(200), setup=_prior_release_then(_ledger_and_records_deleted)),
    Case("sources table dropped after a lowered cap", "LedgerIntegrityError",
         "journal says epsilon 5.*lowered by the board", _rows(200),
         setup=_prior_release_then(_cap_lowered_then_sources_dropped)),
    Case("pseudonymize without a key is refused before the charge", "ParameterError",
         "needs a key.*Nothing was spent", _rows(50),
         config={"policy": {"mechanisms": ["pseudonymize"], "allow_unproven": True}},
         # the void confirmation given (its own refusal comes first: test_void_confirmation)
         request={"mechanism": {"mechanism": "pseudonymize"}, "seed": None,
                  "void_lifetime_guarantee": True}),
    Case("two byte-identical partitions of one extract", "InputValidationError",
         r"visits-1 \(copy\)\.csv and visits-1\.csv have identical content|"
         r"visits-1\.csv and visits-1 \(copy\)\.csv have identical content",
         None, config={"input": {"path": "visits-*.csv"}}, setup=_identical_partitions),
    Case("histogram at eps 1e-4 adds hundreds of millions of noise rows", "PolicyError",
         r"expected to add [\d,]+ noise rows.*max_noise_rows.*Nothing was spent", _rows(200),
         config={"columns": {"diagnosis": {"domain": "codes.txt"}}},
         setup=_write(Path(), "codes.txt", "A001\nB002\nC003\n"),
         request={"mechanism": {"mechanism": "histogram", "epsilon": 1e-4}}),
    Case("dimensions whose combined domain no count table holds (ipa)", "PolicyError",
         r"too large to stream.*coarsen.*'w\d' \(200 values\).*aim.*Nothing was read or spent",
         _rows(50, **{f"w{i}": [f"v{k % 200}" for k in range(50)] for i in range(6)}),
         config=SIX_WIDE, setup=_six_wide_taxonomies),
    Case("a lattice of 10^5 nodes (5 dimensions x 10 levels)", "PolicyError",
         "lattice has 100,000 nodes.*max_lattice_nodes.*Nothing was read or spent", _rows(50),
         config=TEN_LEVELS, setup=_ten_levels_everywhere),
    Case("a decimal taxonomy of 5 million bins and a 1,000-cut level", "TaxonomyError",
         "5,000,000 leaves, over the limit of 200,000.*max_taxonomy_leaves",
         _rows(50), **_taxonomy("fine.yaml", "domain: {min: 0, max: 499.9999}\nresolution: "
                                "0.0001\nlevels:\n  - cuts: ["
                                + ", ".join(str(k / 2) for k in range(1, 1001)) + "]\n", "age")),
    # -- issue 36: a new source's first cap (from its YAML) has set-cap's bounds ---------------
    Case("lifetime_epsilon 1e300 for a new source", "ConfigError",
         r"lifetime_epsilon 1e\+300.*new source 'corpus'.*0 < epsilon <= 100.*Nothing was "
         "read or spent", HEADER + ROW, config={"privacy": {"lifetime_epsilon": 1e300}}),
    Case("lifetime_delta 0.9 for a new source", "ConfigError",
         r"lifetime_delta 0\.9 .*0 <= delta <= 0\.01.*Nothing was read or spent", HEADER + ROW,
         config={"privacy": {"lifetime_delta": 0.9}}),
]


def _dataset(base: Path, case: Case) -> Path:
    """The NPS sample's config with the default policy and ipa, in its own folder, plus the
    case's edits."""
    spec = yaml.safe_load((ROOT / "datasets/nps-sample/dataset.yaml").read_text())
    spec["name"] = "corpus"
    spec.pop("policy")
    spec.pop("schedule")
    spec["columns"]["diagnosis"] = {"role": "informative"}
    spec["mechanism"] = {"name": "ipa", "params": {"epsilon": 1.0}}  # (no domain: aim cannot run)
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((ROOT / "datasets/nps-sample" / column["taxonomy"]).resolve())
    spec["input"]["path"] = "extract.csv"
    _merge(spec, case.config)
    path = base / "dataset.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _merge(target: dict, patch: dict) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _request(base: Path, case: Case) -> ReleaseRequest:
    fields = {"dataset": str(base / "dataset.yaml"), "seed": 1, "evaluate": False,
              "batch_size": 64, **case.request}
    if fields.get("input_path") == "LINK":
        fields["input_path"] = str(base / "link.csv")
    if fields.get("input_path") == "FIRST":
        fields["input_path"] = str(base / "extract.csv")
    if fields.get("dataset") == "OTHER":
        fields["dataset"] = str(base / "other" / "dataset.yaml")
    if fields.get("destination") == "INSIDE":
        [inside] = [p for p in (base / "home" / "releases" / "corpus").iterdir()]
        fields["destination"] = f"corpus/{inside.name}"
    return ReleaseRequest(**fields)


def _published_files(home: Path) -> list[Path]:
    return [p for store in ("releases", "test-releases") if (home / store).exists()
            for p in (home / store).rglob("*") if p.is_file()]


def _records(home: Path) -> list[Path]:
    return list((home / "steward").rglob("record.json")) if (home / "steward").exists() else []


def run_case(base: Path, case: Case) -> BaseException:
    """Run a case; return its exception after checking nothing was spent or published."""
    _dataset(base, case)
    extract = base / "extract.csv"
    if isinstance(case.extract, bytes):
        extract.write_bytes(case.extract)
    elif case.extract is not None:
        extract.write_text(case.extract)
    if case.setup:
        case.setup(base)
    home = base / "home"
    ledger = home / "ledger.sqlite"
    before = (len(Ledger(ledger).spends()) if ledger.is_file() else 0,
              len(_published_files(home)), len(_records(home)))
    lock = _lock_ledger(base) if case.locked else None
    try:
        with pytest.raises(Exception) as err:
            release_flow(_request(base, case))
    finally:
        if lock is not None:
            lock.close()
    after = (len(Ledger(ledger).spends()) if ledger.is_file() else 0,
             len(_published_files(home)), len(_records(home)))
    assert after == before, f"{case.name}: spends/published/records {before} -> {after}"
    return err.value


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_case(corpus_home: Path, case: Case) -> None:
    import re

    error = run_case(corpus_home, case)
    assert type(error).__name__ == case.error, f"{case.name}: {type(error).__name__}: {error}"
    assert re.search(case.message, str(error), re.S), f"{case.name}: {error}"
    for sentinel in SENTINELS:
        assert sentinel not in str(error), f"{case.name} quotes a value: {error}"


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 60


@pytest.mark.parametrize(("n_rows", "n_diagnoses"), [(3000, 1), (3000, 100_000), (40, 30),
                                                     (1, 1)])
def test_degenerate_tables_release_correctly(corpus_home: Path, n_rows: int,
                                             n_diagnoses: int) -> None:
    """One diagnosis, a diagnosis per row, only tiny classes, one row: a valid (maybe empty)
    release; the sound mechanism never shows a cell under its threshold."""
    case = Case("degenerate", "", "", None)
    _dataset(corpus_home, case)
    rng = np.random.default_rng(n_diagnoses)
    codes = np.array([f"D{i:06d}" for i in range(n_diagnoses)])
    (corpus_home / "extract.csv").write_text(_rows(n_rows, diagnosis=rng.choice(codes, n_rows)))
    result = release_flow(ReleaseRequest(dataset=str(corpus_home / "dataset.yaml"), seed=1,
                                         evaluate=False))
    assert result["manifest"]["checks"]["passed"] and result["record"]["input_rows"] == n_rows
    released = pd.read_parquet(Path(result["path"]) / "TEST-data.parquet")
    if len(released):  # every released (class, diagnosis) cell meets the threshold
        assert released.astype(str).value_counts().min() >= 2
    if n_diagnoses == 100_000:  # every diagnosis is unique: none may be published
        assert len(released) == 0 or released["diagnosis"].nunique() < 5


def test_real_world_columns_configure_cleanly(corpus_home: Path) -> None:
    """Fractional ages, ages above the taxonomy (top-coded), a category for missing payers, and
    drop_rows under its limit with the count reported."""
    base = corpus_home
    (base / "age.yaml").write_text(
        "domain: {min: 0, max: 100}\nresolution: 0.1\ntop_code: 100\n"
        "levels:\n  - {width: 10}\n  - {width: 50}\n")
    (base / "payer.csv").write_text("public;insured;*\nprivate;insured;*\nunknown;unknown;*\n")
    case = Case("real world", "", "", None, config={
        "missing": "drop_rows", "drop_limit": 0.2,
        "columns": {"age": {"type": "decimal", "taxonomy": "age.yaml"},
                    "payer": {"role": "dimension", "taxonomy": "payer.csv", "missing": "unknown"}}})
    _dataset(base, case)
    rng = np.random.default_rng(3)
    n = 4000
    ages = rng.choice(["0.8", "34.5", "119", "138", "67.25", "12"], n).astype(object)
    payer = rng.choice(["public", "private", None], n, p=[0.4, 0.3, 0.3])
    sex = np.where(rng.random(n) < 0.05, None, rng.choice(["F", "M"], n))
    (base / "extract.csv").write_text(_rows(n, age=ages, sex=sex))
    frame = pd.read_csv(base / "extract.csv", dtype=str, keep_default_na=False, na_values=[""])
    frame["payer"] = payer
    frame.to_csv(base / "extract.csv", index=False)
    result = release_flow(ReleaseRequest(dataset=str(base / "dataset.yaml"), seed=2,
                                         evaluate=False))
    record = result["record"]
    dropped = int(pd.isna(sex).sum())
    assert record["dropped_rows"] == dropped and record["input_rows"] == n - dropped
    released = pd.read_parquet(Path(result["path"]) / "TEST-data.parquet")
    assert set(released["payer"].astype(str)) <= {"public", "private", "unknown", "insured", "*"}
    assert set(released["age"].astype(str)) <= {
        "*", "[0-50)", "[50-100)", "[100+]", "[0-10)", "[10-20)", "[30-40)", "[60-70)",
        "[0.8-0.9)", "[34.5-34.6)", "[67.2-67.3)", "[12-12.1)"}


def test_no_raw_value_or_file_content_reaches_prefects_database(corpus_home: Path,
                                                                 monkeypatch) -> None:
    """Run the corpus's hostile cases with logging to the API on, then read every table."""
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import (
        PREFECT_API_DATABASE_CONNECTION_URL,
        PREFECT_API_URL,
        PREFECT_LOGGING_TO_API_ENABLED,
        temporary_settings,
    )

    chosen = [c for c in CASES if any(s in str(c.extract) for s in SENTINELS)]
    assert len(chosen) >= 5
    url = PREFECT_API_DATABASE_CONNECTION_URL.value()
    database = Path(url.split("///", 1)[1])
    runs_before = _flow_run_ids(database)  # (earlier tests' states may still be recorded)
    with temporary_settings(updates={PREFECT_LOGGING_TO_API_ENABLED: True}), \
            EventStream(PREFECT_API_URL.value()) as events:
        for i, case in enumerate(chosen):
            base = corpus_home / f"case-{i}"
            base.mkdir()
            monkeypatch.setenv("MEDRELEASE_HOME", str(base / "home"))
            run_case(base, case)
        APILogWorker.drain_all()
        drain_prefect_workers()
        events.settle()
    _task_run_states_settled(database)  # recorded from events, a batch a second (conftest)
    # the events, as the server sent them out: its database would hold them, but the harness's
    # server does not write them (conftest: its event persister is off). Every state these
    # runs reached has its event in what was read (its id is the state's): none was missed.
    states = _state_ids(database, _flow_run_ids(database) - runs_before)
    assert len(states) >= 3 * len(chosen) and states <= events.ids(), len(states - events.ids())
    found_in_events = [("event", s) for text in events.texts for s in SENTINELS if s in text]
    assert found_in_events == [], found_in_events
    copy = corpus_home / "prefect-copy.db"
    shutil.copy(database, copy)
    for suffix in ("-wal",):
        if Path(str(database) + suffix).exists():
            shutil.copy(str(database) + suffix, str(copy) + suffix)
    found = []
    with sqlite3.connect(copy) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                text = " ".join(str(v) for v in row if v is not None)
                found += [(table, s) for s in SENTINELS if s in text]
    assert found == [], found
    assert any("validation" in p.name for p in (corpus_home / "case-0" / "home" / "steward" /
                                                "logs").iterdir())


class EventStream:
    """Every event the Prefect server at ``api_url`` sends out while open, as JSON text: read
    from its event stream (``/events/out``, what the UI's event feed and automations read) on
    a thread of its own. Open once a probe event has come back through it (the server
    subscribes only after reading the filter the client sends); a stream that failed or closed
    while open fails the test at exit."""

    def __init__(self, api_url: str) -> None:
        self.texts: list[str] = []
        self._api_url = api_url
        self._connected = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread = threading.Thread(target=self._run, name="event-stream", daemon=True)
        self._failure: BaseException | None = None

    def __enter__(self) -> EventStream:
        from prefect.events import emit_event

        self._thread.start()
        connected = self._connected.wait(60)
        assert connected and self._failure is None, f"no event stream: {self._failure!r}"
        probe = f"medrelease.test.stream-probe.{uuid.uuid4().hex}"
        emit_event(event="medrelease.test.stream-probe", resource={"prefect.resource.id": probe})
        drain_prefect_workers()
        deadline = time.monotonic() + 60
        while not any(probe in text for text in self.texts):
            assert time.monotonic() < deadline and self._failure is None, (
                f"the event stream never delivered its probe event: {self._failure!r}")
            time.sleep(0.1)
        return self

    def __exit__(self, *exc) -> None:
        failure, listening = self._failure, self._thread.is_alive()
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=30)
        if exc[0] is None:
            assert listening and failure is None, f"the event stream ended early: {failure!r}"

    def settle(self) -> None:
        """Wait until no event has arrived for a while (the client's events are sent by a
        worker of their own, after the run that made them)."""
        wait_until_unchanged(lambda: len(self.texts))

    def ids(self) -> set[str]:
        """The events' ids (a state change's event has its state's id)."""
        return {json.loads(text)["id"] for text in self.texts}

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._task = self._loop.create_task(self._listen())
            self._loop.run_until_complete(self._task)
            self._failure = RuntimeError("the server closed the event stream")
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # reported by __enter__ or __exit__
            self._failure = exc
        finally:
            self._connected.set()
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    async def _listen(self) -> None:
        from prefect.events.clients import PrefectEventSubscriber

        async with PrefectEventSubscriber(api_url=self._api_url) as subscriber:
            self._connected.set()
            async for event in subscriber:
                self.texts.append(event.model_dump_json())


def _flow_run_ids(database: Path) -> set[str]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM flow_run")}


def _state_ids(database: Path, flow_runs: set[str]) -> set[str]:
    """Ids of every state of ``flow_runs`` and of their task runs in a Prefect database."""
    marks = ", ".join("?" * len(flow_runs))
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            f"SELECT id FROM flow_run_state WHERE flow_run_id IN ({marks}) UNION ALL "
            "SELECT s.id FROM task_run_state s JOIN task_run t ON s.task_run_id = t.id "
            f"WHERE t.flow_run_id IN ({marks})", [*flow_runs, *flow_runs]).fetchall()
    return {str(uuid.UUID(str(r[0]))) for r in rows}


def _task_run_states_settled(database: Path) -> None:
    """Wait until the server has written the task-run states still on their way (its recorder
    writes them in batches): their count has not changed for a while."""
    def count() -> int:
        with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM task_run_state").fetchone()[0]

    wait_until_unchanged(count, wait_s=30)
