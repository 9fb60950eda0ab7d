"""A relational dataset: one parent table (one row per patient: its key is the privacy unit)
and child tables that reference it, one or more levels deep (patients -> admissions ->
diagnoses, the MIMIC shape).

Every released column is one the engine already understands: a taxonomy
(``medrelease.data.taxonomy``: an ARX CSV or YAML rules) or a list of values (a flat taxonomy).
Each child table carries a public ``max_children``: every parent's children are cut to at most
that many, chosen at random, before anything is counted (``bound``), as ``max_rows_per_unit``
cuts a patient's rows in a single table. All of it is public, declared, never read from data.

``problems`` validates the tables against the schema and the references between them (missing
columns, missing or duplicate keys, orphans, values no taxonomy covers) in one sentence each,
with counts and never a value: the sentences are meant for logs and forms that others read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from medrelease.data.binning import SUPPRESSED
from medrelease.data.taxonomy import Taxonomy, from_leaf_paths, load_taxonomy
from medrelease.errors import ConfigError, InputValidationError, MedreleaseError

# The weights of the patient-normalised tables (``flatten.py``) are L / (k_1 ... k_d) with
# L = prod lcm(1..max_children) over the child tables of a path: exact integers. A larger L
# only scales every count and every sigma; this cap keeps counts far inside float64's exact
# integers (2^53) for tables of up to 2^21 patients.
MAX_SCALE = 2 ** 32


@dataclass(frozen=True)
class RelColumn:
    """A released column: its taxonomy (a list of values is a flat taxonomy), and optionally the
    category a missing value becomes (as ``ColumnSpec.missing``; without it a missing value is
    a problem)."""

    name: str
    taxonomy: Taxonomy
    missing: str | None = None

    @classmethod
    def of_values(cls, name: str, values: Sequence[str], missing: str | None = None) -> RelColumn:
        """A categorical column over a public list of values (each one leaf under '*')."""
        values = [str(v) for v in values]
        if not values or len(set(values)) != len(values):
            raise ConfigError(f"column {name!r}: a list of distinct values is needed")
        return cls(name, from_leaf_paths(name, "categorical", values, [[SUPPRESSED]] * len(values)),
                   missing)

    @classmethod
    def of_taxonomy(cls, name: str, path: str | Path, missing: str | None = None) -> RelColumn:
        """A column whose values are the leaves of a taxonomy file (ARX CSV or YAML rules)."""
        return cls(name, load_taxonomy(Path(path), name), missing)


@dataclass(frozen=True)
class RelTable:
    """One table: its name (the released file's stem), its own key column (needed when another
    table references it), the column that references its parent's key, the public bound on
    children per parent row, and its released columns."""

    name: str
    columns: tuple[RelColumn, ...]
    key: str | None = None
    parent: str | None = None
    parent_key: str | None = None
    max_children: int | None = None

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


@dataclass(frozen=True)
class RelSchema:
    """The tables, the root (the patients) first; the references form a tree."""

    tables: tuple[RelTable, ...]
    unit_noun: str = "patient"
    # the tables researchers need, as "<table>.<column>" names (a count: "<table>.n_<child>"),
    # columns of one table and its ancestors: measured first, as aim's declared analyses
    analyses: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        problems = structure_problems(self)
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def root(self) -> RelTable:
        return self.tables[0]

    def table(self, name: str) -> RelTable:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def children(self, name: str) -> tuple[RelTable, ...]:
        return tuple(t for t in self.tables if t.parent == name)

    def ancestors(self, name: str) -> tuple[RelTable, ...]:
        """From the root down to the table's parent."""
        out: list[RelTable] = []
        table = self.table(name)
        while table.parent is not None:
            table = self.table(table.parent)
            out.append(table)
        return tuple(reversed(out))

    @cached_property
    def paths(self) -> tuple[tuple[RelTable, ...], ...]:
        """Every root-to-leaf chain of tables (the patient-normalised tables are built on
        these): the MIMIC shape has one, patients -> admissions -> diagnoses."""
        leaves = [t for t in self.tables if not self.children(t.name)]
        return tuple((*self.ancestors(t.name), t) for t in leaves) if len(self.tables) > 1 \
            else ((self.root,),)

    @cached_property
    def lineages(self) -> tuple[tuple[RelTable, ...], ...]:
        """The chain from the root down to every child table (the root alone when it has no
        child): one model per child table is fitted on these."""
        if len(self.tables) == 1:
            return ((self.root,),)
        return tuple((*self.ancestors(t.name), t) for t in self.tables[1:])

    def scale(self, path: Sequence[RelTable]) -> int:
        """L of a path: the product of lcm(1..max_children) over its child tables, so that
        L / (k_1 ... k_d) is a whole number for every count a bounded row can have."""
        out = 1
        for table in path[1:]:
            out *= math.lcm(*range(1, int(table.max_children or 1) + 1))
        return out


def structure_problems(schema: RelSchema) -> list[str]:
    """What is wrong with the declaration itself (before any data): one sentence each."""
    out: list[str] = []
    names = [t.name for t in schema.tables]
    if not schema.tables:
        return ["a relational dataset needs at least its parent table"]
    if len(set(names)) != len(names):
        out.append("two tables have the same name; each table needs its own (its file's stem)")
    root = schema.tables[0]
    if root.parent is not None:
        out.append(f"the first table ({root.name}) is the parent table and references none")
    if root.key is None:
        out.append(f"the parent table {root.name} needs its key column (the privacy unit)")
    for table in schema.tables:
        cols = table.column_names
        if len(set(cols)) != len(cols):
            out.append(f"table {table.name} names a column twice")
        counts = {f"n_{t.name}" for t in schema.tables if t.parent == table.name}
        clash = sorted(set(cols) & counts)
        if clash:
            out.append(f"table {table.name}: column(s) {', '.join(clash)} are named like the "
                       "count of a child table the release measures; rename them")
        ids = [c for c in (table.key, table.parent_key) if c]
        if len(set(ids)) != len(ids):
            out.append(f"table {table.name}: its key and the column that references "
                       f"{table.parent} must be two columns")
        if table.parent_key and table.parent_key in cols:
            out.append(f"table {table.name}: the column that references {table.parent} is "
                       "never released as a column")
        if not cols:
            out.append(f"table {table.name} releases no column")
        if table is root:
            continue
        if table.parent not in names or table.parent == table.name:
            out.append(f"table {table.name} references a table that is not declared before it")
            continue
        if names.index(table.parent) > names.index(table.name):
            out.append(f"table {table.name} is declared before its parent {table.parent}")
        parent = schema.table(table.parent)
        if parent.key is None:
            out.append(f"table {parent.name} is referenced by {table.name} but declares no key")
        if not table.parent_key:
            out.append(f"table {table.name} needs the column that references {table.parent}")
        if not (isinstance(table.max_children, int) and 1 <= table.max_children <= 1000):
            out.append(f"table {table.name} needs max_children, a public whole number 1-1000 "
                       "(each parent's rows are cut to at most that many)")
        if table.key is not None and table.key in cols:
            out.append(f"table {table.name}: its key is never released as a column")
    by_name = {t.name: t for t in schema.tables}
    for analysis in schema.analyses:
        known = []
        for name in analysis:
            table, _, column = name.partition(".")
            t = by_name.get(table)
            children = {f"n_{c.name}" for c in schema.tables if c.parent == table}
            known.append(t is not None and (column in t.column_names or column in children))
        if not (analysis and all(known)) or len(set(analysis)) != len(analysis):
            out.append(f"an analysis ({len(analysis)} column(s)) names a column no table has, "
                       "or one twice (write <table>.<column>, a count <table>.n_<child>)")
            continue
        tables = [by_name[n.split(".", 1)[0]] for n in analysis]
        deepest = max(tables, key=lambda t: len(_lineage(by_name, t)))
        if not {t.name for t in tables} <= {t.name for t in _lineage(by_name, deepest)}:
            out.append("an analysis takes columns from tables that are not on one chain from "
                       "the parent table down")
    if not out:
        for path in _chains(schema):
            scale = 1
            for table in path[1:]:
                scale *= math.lcm(*range(1, int(table.max_children or 1) + 1))
            if scale > MAX_SCALE:
                out.append(f"the chain {' -> '.join(t.name for t in path)} has max_children "
                           "too large together (the product of lcm(1..max_children) exceeds "
                           "2^32); lower one of them")
    return out


def _lineage(by_name: dict[str, RelTable], table: RelTable) -> list[RelTable]:
    chain = [table]
    while chain[0].parent is not None and chain[0].parent in by_name and len(chain) <= 50:
        chain.insert(0, by_name[chain[0].parent])
    return chain


def _chains(schema: RelSchema) -> list[list[RelTable]]:
    by_name = {t.name: t for t in schema.tables}
    out = []
    for table in schema.tables:
        if any(t.parent == table.name for t in schema.tables):
            continue
        chain = [table]
        while chain[0].parent is not None and chain[0].parent in by_name and len(chain) <= 50:
            chain.insert(0, by_name[chain[0].parent])
        out.append(chain)
    return out


def _key_text(series: pd.Series) -> pd.Series:
    """Keys compared as text (``12`` in one file and ``12.0`` nowhere: extracts are read as
    text), blanks as missing."""
    text = series.astype("string").str.strip()
    return text.mask(text == "")


def problems(schema: RelSchema, frames: Mapping[str, pd.DataFrame]) -> list[str]:
    """Every problem of the tables and their references, one sentence each, counts only.

    Checked: each declared table is given; its key and reference columns exist, are never
    blank, keys are distinct; every reference names an existing parent row (an orphan is a
    problem, never silently dropped); every released column exists and each value is covered
    by its taxonomy (blank: a problem unless the column declares its ``missing`` category)."""
    out: list[str] = []
    keys: dict[str, pd.Series] = {}
    for table in schema.tables:
        frame = frames.get(table.name)
        if frame is None:
            out.append(f"table {table.name} was not given")
            continue
        needed = [c for c in (table.key, table.parent_key) if c] + list(table.column_names)
        absent = [c for c in needed if c not in frame.columns]
        if absent:
            out.append(f"table {table.name} lacks {len(absent)} declared column(s): "
                       f"{', '.join(absent)}")
            continue
        if table.key:
            key = _key_text(frame[table.key])
            blank = int(key.isna().sum())
            if blank:
                out.append(f"table {table.name}: {blank} row(s) have no {table.key}")
            duplicated = int(key.dropna().duplicated().sum())
            if duplicated:
                out.append(f"table {table.name}: {duplicated} row(s) repeat a {table.key} "
                           "another row has (keys must be distinct)")
            keys[table.name] = key
        if table.parent_key:
            ref = _key_text(frame[table.parent_key])
            blank = int(ref.isna().sum())
            if blank:
                out.append(f"table {table.name}: {blank} row(s) have no {table.parent_key} "
                           f"(every row must belong to a row of {table.parent})")
            parent_keys = keys.get(table.parent or "")
            if parent_keys is not None:
                orphans = int((ref.notna() & ~ref.isin(set(parent_keys.dropna()))).sum())
                if orphans:
                    out.append(f"table {table.name}: {orphans} row(s) reference a "
                               f"{table.parent_key} that is not in {table.parent} (orphans)")
        for column in table.columns:
            out.extend(_value_problems(table.name, column, frame[column.name]))
    return out


def _value_problems(table: str, column: RelColumn, values: pd.Series) -> list[str]:
    text = values.astype("string").str.strip()
    blank = text.isna() | (text == "")
    out = []
    if blank.any() and column.missing is None:
        out.append(f"table {table}, column {column.name}: {int(blank.sum())} row(s) have no "
                   "value (declare the category a missing value becomes, or fix the extract)")
    filled = text.mask(blank, column.missing) if column.missing is not None else text[~blank]
    try:
        column.taxonomy.encode(filled)
    except MedreleaseError as exc:
        count = _uncovered_count(exc)
        out.append(f"table {table}, column {column.name}: {count} row(s) hold a value its "
                   "taxonomy does not cover")
    return out


def _uncovered_count(exc: MedreleaseError) -> str:
    """How many rows were not covered, from the encoder's own count (its message names no
    value; its problems list, which does, stays with the steward and is not read here)."""
    if isinstance(exc, InputValidationError) and exc.problems:
        rows = exc.problems[0].get("rows")
        if isinstance(rows, int):
            return str(rows)
    return "some"


def check(schema: RelSchema, frames: Mapping[str, pd.DataFrame]) -> None:
    """Raise ``InputValidationError`` naming every problem (counts only), or return."""
    found = problems(schema, frames)
    if found:
        raise InputValidationError(f"{len(found)} problem(s) in the relational extract: "
                                   + "; ".join(found) + ". Nothing was read further or spent.")


@dataclass(frozen=True)
class EncodedTable:
    """A table after the bound, as integer codes: its row ids (0..n-1), each row's parent
    row id (-1 for the root), the leaf code of every released column."""

    name: str
    parent_row: np.ndarray
    codes: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        return int(self.parent_row.size)


def encode(schema: RelSchema, frames: Mapping[str, pd.DataFrame],
           streams: Mapping[str, np.random.Generator] | None = None,
           bound: bool = True) -> dict[str, EncodedTable]:
    """Validate (``check``), cut every parent's children to ``max_children`` at random
    (``bound_children``), and encode the kept rows as leaf codes; keys become row numbers.

    The bound runs per table with that table's own stream (``streams[name]``): the choices
    for one parent's children use only that table's draws, in the rows' order, so adding a
    patient's rows at the end of every table leaves every other patient's choices as they were
    (the coupling the privacy argument reads, docs/RELATIONAL.md). Without streams: fresh
    generators from OS entropy."""
    check(schema, frames)
    streams = streams or {t.name: np.random.default_rng() for t in schema.tables}
    out: dict[str, EncodedTable] = {}
    row_of_key: dict[str, pd.Series] = {}
    for table in schema.tables:
        frame = frames[table.name]
        if table.parent is None:
            keep = np.ones(len(frame), dtype=bool)
            parent_row = np.full(len(frame), -1, dtype=np.int64)
        else:
            ref = _key_text(frame[table.parent_key]).map(row_of_key[table.parent])
            alive = ref.notna().to_numpy()  # a parent dropped by the bound drops its rows
            parent_row = ref.fillna(-1).to_numpy(dtype=np.int64)
            keep = alive.copy()
            if bound:
                keep &= bound_children(parent_row, int(table.max_children or 1),
                                       streams[table.name], alive)
            parent_row = parent_row[keep]
        kept = frame.iloc[np.flatnonzero(keep)]
        if table.key:
            row_of_key[table.name] = pd.Series(np.arange(int(keep.sum()), dtype=np.int64),
                                               index=_key_text(kept[table.key]).to_numpy())
        codes = {}
        for column in table.columns:
            text = kept[column.name].astype("string").str.strip()
            if column.missing is not None:
                text = text.mask(text.isna() | (text == ""), column.missing)
            codes[column.name] = column.taxonomy.encode(text.reset_index(drop=True)).astype(np.int64)
        out[table.name] = EncodedTable(table.name, parent_row.astype(np.int64), codes)
    return out


def bound_children(parent_row: np.ndarray, max_children: int, rng: np.random.Generator,
                   alive: np.ndarray | None = None) -> np.ndarray:
    """Which rows stay when every parent keeps a uniformly random ``max_children`` of its
    rows: each row draws a uniform key (one draw per row, in row order, from this table's
    stream), and a parent keeps its rows of the smallest keys. The subset is uniform and
    depends on the parent's own rows only (values never enter)."""
    n = parent_row.size
    draws = rng.random(n)
    alive = np.ones(n, dtype=bool) if alive is None else alive
    order = np.lexsort((draws, parent_row))
    sorted_parent = parent_row[order]
    starts = np.flatnonzero(np.r_[True, sorted_parent[1:] != sorted_parent[:-1]]) if n else \
        np.zeros(0, dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    if n:
        lengths = np.diff(np.r_[starts, n])
        rank[order] = np.arange(n) - np.repeat(starts, lengths)
    return alive & (rank < max_children)


def children_counts(tables: Mapping[str, EncodedTable], schema: RelSchema, parent: str,
                    child: str) -> np.ndarray:
    """How many rows of ``child`` each row of ``parent`` has (after the bound)."""
    assert schema.table(child).parent == parent
    return np.bincount(tables[child].parent_row, minlength=tables[parent].rows).astype(np.int64)
