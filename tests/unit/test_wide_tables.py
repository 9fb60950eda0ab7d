"""Wide tables (issue 55): a table whose columns' combined domain no 64-bit key holds is
counted with a code per column, aim reads its marginals from that, and the lattice mechanisms
are refused before anything is read, naming the columns to coarsen or drop. The speed-ups the
wide tables needed keep aim's numbers: the junction-tree sizes of the model's parts are the
whole tree's, the greedy elimination order is unchanged, and a model's marginal across its
independent parts is the product of theirs."""

from __future__ import annotations

import itertools
import random
from math import prod
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import (
    MAX_KEY,
    aggregate_chunks,
    aggregate_frame,
    distinct_cells,
    joint_domain_problem,
    key_space,
    merge_count_tables,
)
from medrelease.data.config import load_config
from medrelease.synthetic.junction_tree import greedy_order, model_size_mb, sizes_with_each
from medrelease.synthetic.space import MarginalSpace

COLUMNS = [f"c{i}" for i in range(8)]


def _folder(tmp_path: Path, values: int = 250) -> Path:
    """Eight dimensions of ``values`` values each and an informative column with a domain."""
    for column in COLUMNS:
        (tmp_path / f"{column}.csv").write_text("".join(f"v{k};g{k % 5};*\n"
                                                        for k in range(values)))
    (tmp_path / "dx.txt").write_text("A\nB\nC\n")
    columns = "\n".join(f"  {c}: {{role: dimension, taxonomy: {c}.csv}}" for c in COLUMNS)
    (tmp_path / "dataset.yaml").write_text(
        f"name: wide\ninput: {{path: t.csv}}\ncolumns:\n{columns}\n"
        "  dx: {role: informative, domain: dx.txt}\nprivacy: {lifetime_epsilon: 10}\n")
    return tmp_path / "dataset.yaml"


def _frame(rows: int = 3000, values: int = 250, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({c: [f"v{k}" for k in rng.integers(0, values, rows)] for c in COLUMNS})
    frame["dx"] = rng.choice(["A", "B", "C"], rows)
    frame.iloc[:50] = frame.iloc[50:100].to_numpy()  # some rows twice: cells of weight 2
    return frame


def test_a_wide_table_counts_with_a_code_per_column_and_the_marginals_are_exact(
        tmp_path: Path) -> None:
    config = load_config(_folder(tmp_path))
    taxonomies = tuple(config.taxonomies[c] for c in COLUMNS)
    assert key_space(taxonomies, 3) >= MAX_KEY  # 250^8 x 3: no packed key
    frame = _frame()
    counts = aggregate_frame(frame, COLUMNS, ["dx"], taxonomies, config.informative_domain)
    assert counts.wide and counts.n_rows == len(frame) and counts.counts.sum() == len(frame)
    assert counts.counts.max() == 2  # the repeated rows are one cell
    space = MarginalSpace(counts)
    for columns in [(0,), (2, 5), (1, 3, 8)]:
        names = [space.names[c] for c in columns]
        fine = space.fine_marginal(columns)
        for key, rows in frame.groupby(names).size().items():
            key = key if isinstance(key, tuple) else (key,)
            index = tuple(space.attributes[c].leaf_labels.index(v)
                          for c, v in zip(columns, key, strict=True))
            assert fine[index] == rows
        assert fine.sum() == len(frame)
    with pytest.raises(Exception, match="too large to stream"):
        counts.radices  # noqa: B018 - a lattice cannot roll up a wide table


def test_every_reading_path_gives_the_same_wide_count_table(tmp_path: Path) -> None:
    """In memory, in chunks, grouped by DuckDB, and merged from two parts: the same cells."""
    from medrelease.data.grouped_input import grouped_count_table

    config = load_config(_folder(tmp_path))
    frame = _frame()
    frame.to_csv(tmp_path / "t.csv", index=False)
    taxonomies = tuple(config.taxonomies[c] for c in COLUMNS)
    whole = aggregate_frame(frame, COLUMNS, ["dx"], taxonomies, config.informative_domain)
    chunked = aggregate_chunks([frame.iloc[i:i + 700] for i in range(0, len(frame), 700)],
                               config)
    grouped = grouped_count_table(config, tmp_path / "t.csv")
    merged = merge_count_tables([
        aggregate_frame(frame.iloc[:1000], COLUMNS, ["dx"], taxonomies,
                        config.informative_domain),
        aggregate_frame(frame.iloc[1000:], COLUMNS, ["dx"], taxonomies,
                        config.informative_domain)])

    def cells(counts) -> set:
        codes = [*counts.dimension_columns(), counts.inf_codes()]
        return {(*key, int(n)) for *key, n in zip(*codes, counts.counts, strict=True)}

    assert grouped is not None and all(t.wide for t in (whole, chunked, grouped, merged))
    assert cells(whole) == cells(chunked) == cells(grouped) == cells(merged)


def test_distinct_cells_groups_any_number_of_columns_exactly() -> None:
    rng = np.random.default_rng(1)
    codes = [rng.integers(0, 3000, 5000) for _ in range(9)]  # 3000^9: renumbered on the way
    codes = [np.concatenate([c, c[:300]]) for c in codes]  # 300 rows twice
    cells, counts = distinct_cells(codes, [3000] * 9, np.ones(5300, dtype=np.int64))
    rows = pd.DataFrame(np.stack(codes, axis=1)).value_counts()
    assert counts.sum() == 5300 and len(counts) == len(rows)
    got = {(*key, n) for *key, n in zip(*cells, counts, strict=True)}
    assert got == {(*key, n) for key, n in rows.items()}


def test_the_lattice_mechanisms_are_refused_naming_the_columns(tmp_path: Path) -> None:
    config = load_config(_folder(tmp_path))
    taxonomies = tuple(config.taxonomies[c] for c in COLUMNS)
    message = joint_domain_problem(COLUMNS, taxonomies, 3, "ipa")
    assert message is not None and "ipa needs" in message and "aim" in message
    named = [c for c in COLUMNS if f"'{c}' (250 values)" in message]
    # the fewest columns whose leaves, removed, let the rest fit
    rest = prod(250 for _ in range(8 - len(named))) * 3
    assert rest < MAX_KEY and rest * 250 >= MAX_KEY
    assert joint_domain_problem(COLUMNS[:3], taxonomies[:3], 3) is None


def test_an_aim_release_of_a_wide_table_runs_in_seconds(tmp_path: Path) -> None:
    from medrelease.release import release

    config = load_config(_folder(tmp_path, values=60))
    frame = _frame(rows=4000, values=60)
    import time

    started = time.perf_counter()
    result = release(frame, config, mechanism="aim", params={"epsilon": 1.0}, seed=3)
    assert time.perf_counter() - started < 60
    assert len(result.table) > 3000 and set(result.table.columns) == {*COLUMNS, "dx"}


# -- aim's speed-ups keep its numbers ----------------------------------------------------------


def _plain_greedy_order(sizes: dict, cliques: list) -> list:
    """mbi's greedy elimination order as the module wrote it before (a set scan per step)."""
    remaining, current, order = list(sizes), set(cliques), []
    while remaining:
        best = min(remaining, key=lambda a, now=frozenset(current): prod(
            sizes[x] for x in set().union(*[cl for cl in now if a in cl])))
        order.append(best)
        remaining.remove(best)
        touching = [cl for cl in current if best in cl]
        current -= set(touching)
        current.add(frozenset(set().union(*touching) - {best}) if touching else frozenset())
        current.discard(frozenset())
    return order


def test_the_incremental_greedy_order_and_the_part_sizes_are_the_whole_trees() -> None:
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 12)
        names = tuple(f"a{i}" for i in range(n))
        shape = tuple(rng.randint(1, 9) for _ in range(n))
        cliques = [tuple(sorted(rng.sample(names, rng.randint(1, min(3, n))), key=names.index))
                   for _ in range(rng.randint(0, 8))]
        cliques += [(a,) for a in names if rng.random() < 0.5]
        sizes = dict(zip(names, shape, strict=True))
        assert greedy_order(sizes, [frozenset(c) for c in cliques]) == \
            _plain_greedy_order(sizes, [frozenset(c) for c in cliques])
        extras = [tuple(sorted(rng.sample(names, rng.randint(1, min(3, n))), key=names.index))
                  for _ in range(4)]
        assert sizes_with_each(names, shape, cliques, extras) == \
            [model_size_mb(names, shape, [*cliques, e]) for e in extras]


def test_a_marginal_across_independent_parts_is_the_product_of_theirs() -> None:
    """Variable elimination over the whole model and the product of the parts' marginals give
    one table (the model has two parts: {a, b} and {c})."""
    from medrelease.synthetic import pgm

    rng = np.random.default_rng(4)
    domain = pgm.domain(("a", "b", "c"), (3, 4, 2))
    measurements = [pgm.measurement(rng.integers(0, 50, 12).astype(float), ("a", "b"), 1.0, None),
                    pgm.measurement(rng.integers(0, 50, 2).astype(float), ("c",), 1.0, None)]
    model = pgm.estimate(domain, measurements, 200, 300.0)
    joint = model.marginal(("c", "a"))
    ab, c = model.marginal(("a", "b")), model.marginal(("c",))
    expected = np.einsum("a,c->ca", ab.sum(axis=1), c) / model.total
    assert np.allclose(joint, expected) and np.isclose(joint.sum(), model.total)
    for clique in itertools.permutations(("a", "b", "c")):
        table = model.marginal(clique)
        assert table.shape == tuple(domain.sizes[x] for x in clique)
        assert np.isclose(table.sum(), model.total)
