"""``intervals.csv`` of a relational release: every measured marginal, in patients, with its
95 % interval, and what the released tables say about the same cells.

A measurement of a model is a marginal of its chain's patient-normalised table (every patient
weighs ``L`` there: docs/RELATIONAL.md §3), plus a discrete Gaussian of sigma ``σ``. Divided by
``L`` a cell counts **patients**, each patient split evenly over their rows of the chain's
tables: a cell of ``patients`` columns only (with the counts ``n_admissions`` ...) is a plain
number of patients; a cell of ``patients.age_band × admissions.admission_type`` counts, per age
band and type, the patients' share of admissions of that type (a patient with two admissions,
one EMERGENCY, counts 1/2 there). The interval is ``noisy / L ± z σ / L`` (rounded outwards to
whole patients): a function of the DP measurements and public parameters, post-processing.
``released`` is the same marginal computed from the released tables alone (their own
patient-normalised tables), so a researcher sees where the synthetic tables sit in it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from medrelease.privacy.interval_table import IntervalTable, joined_cells
from medrelease.privacy.intervals import LEVEL
from medrelease.relational.flatten import PathTable, path_table
from medrelease.relational.schema import RelSchema, encode
from medrelease.synthetic.space import Z_95

STATEMENT = (
    "Every marginal the models measured, in patients, with its 95 % interval (intervals.csv, "
    "what = marginal; each holds on its own). A cell counts patients, each patient split "
    "evenly over their rows of the tables it names: patients-only cells are numbers of "
    "patients; a cell with an admissions column counts the patients' share of admissions "
    "with those values (a patient with two admissions, one of them emergency, counts 1/2 "
    "there). 'released' is the same figure computed from the released tables.")


def relational_intervals(schema: RelSchema, released: Any) -> tuple[Any, dict[str, Any]]:
    """(``intervals.csv``'s rows, the manifest's ``error_bars``) of a ``RelationalRelease``:
    from its chains' measurements and the released tables only."""
    encoded = encode(schema, released.tables, bound=False)
    table = IntervalTable()
    for chain in released.chains:
        lineage = tuple(schema.table(n) for n in chain.tables)
        synthetic = path_table(schema, encoded, lineage)
        _add_chain(table, chain, synthetic)
    bars = {"level": LEVEL, "statement": STATEMENT,
            "about": "every interval is about the input tables after each parent's rows were "
                     "cut to max_children (the guarantee's bound)"}
    bars["intervals"] = table.summary(bars["about"])
    return table.frame(), bars


def _leaf_to_model(run: Any, column: int, size: int) -> np.ndarray:
    """A column's leaf code -> its code in the model's (merged) space."""
    merge = next((m for m in run.merges if m.column == column), None)
    if merge is None:
        return np.arange(size, dtype=np.int64)
    out = np.zeros(size, dtype=np.int64)
    for code, members in enumerate(merge.members):
        out[np.asarray(members, dtype=np.int64)] = code
    return out


def _released_marginal(synthetic: PathTable, run: Any, columns: tuple[int, ...],
                       levels: tuple[int, ...] | None) -> np.ndarray:
    """The released tables' marginal at the measurement's cells (leaves when ``levels`` is
    None), in the chain table's weight units."""
    space = run.space
    flat = np.zeros(synthetic.weights.size, dtype=np.int64)
    shape = []
    for i, c in enumerate(columns):
        codes = synthetic.codes[c]
        if levels is None:
            size = synthetic.attributes[c].size
        else:
            codes = _leaf_to_model(run, c, synthetic.attributes[c].size)[codes]
            attribute = space.attributes[c]
            codes = np.asarray(attribute.level_maps[levels[i]], dtype=np.int64)[codes]
            size = attribute.cardinality(levels[i])
        flat = flat * size + codes
        shape.append(size)
    total = int(np.prod(shape))
    return np.bincount(flat, weights=synthetic.weights, minlength=total)


def _add_chain(table: IntervalTable, chain: Any, synthetic: PathTable) -> None:
    run, scale = chain.run, float(chain.scale)
    names = run.space.names
    state = run.state
    sigma0 = run.one_way_sigma
    for c, noisy in zip(run.one_way, state.one_way_noisy, strict=True):
        labels = run.leaves[c].leaf_labels
        released = _released_marginal(synthetic, run, (c,), None)
        _add(table, (names[c],), [list(labels)], np.asarray(noisy, dtype=np.float64),
             sigma0, released, scale)
    for record, noisy in zip(state.records, state.noisy, strict=True):
        columns = tuple(names.index(n) for n in record.columns)
        labels = [list(run.space.attributes[c].level_labels[lv])
                  for c, lv in zip(columns, record.levels, strict=True)]
        released = _released_marginal(synthetic, run, columns, tuple(record.levels))
        _add(table, record.columns, labels, np.asarray(noisy, dtype=np.float64).reshape(-1),
             record.sigma, released, scale)


def _add(table: IntervalTable, columns: tuple[str, ...], labels: list[list[str]],
         noisy: np.ndarray, sigma: float, released: np.ndarray, scale: float) -> None:
    shape = tuple(len(lab) for lab in labels)
    index = np.unravel_index(np.arange(int(np.prod(shape))), shape)
    cells = joined_cells([np.asarray(lab, dtype=object)[i] for lab, i in zip(labels, index,
                                                                                strict=True)])
    half = Z_95 * sigma / scale
    estimate = noisy / scale
    table.add("marginal", columns, cells, released / scale, estimate - half, estimate + half)
