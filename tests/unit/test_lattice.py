"""Aggregation and roll-ups agree with a plain pandas group-by on every node."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from medrelease.data.aggregate import aggregate, group_sum
from medrelease.errors import InputValidationError
from medrelease.mechanisms.base import ReleaseContext
from medrelease.release import node_batches


def _naive_cells(table: pd.DataFrame, config, node) -> pd.Series:
    """Count rows per (generalized labels, informative) the slow, obvious way."""
    labelled = {}
    for column, level in zip(config.dimensions, node, strict=True):
        tax = config.taxonomies[column]
        leaf = tax.encode(table[column])
        labelled[column] = tax.labels(level)[tax.level_codes[level][leaf]]
    for column in config.informative:
        labelled[column] = table[column].to_numpy()
    frame = pd.DataFrame(labelled)
    return frame.value_counts().sort_index()


def _engine_cells(context: ReleaseContext, config, table_obj) -> pd.Series:
    lattice = context.lattice
    codes = lattice.class_codes_from_keys(table_obj.class_keys)
    labelled = {}
    for i, column in enumerate(config.dimensions):
        labelled[column] = lattice.taxonomies[i].labels(table_obj.node[i])[codes[:, i]]
    for column in config.informative:
        labelled[column] = context.counts.informative[column].to_numpy()[table_obj.inf_codes]
    frame = pd.DataFrame(labelled)
    frame["count"] = table_obj.counts
    return frame.set_index(list(frame.columns[:-1]))["count"].sort_index()


def test_nps_lattice_has_256_nodes_and_counts_add_up(nps_config, nps_sample) -> None:
    counts = aggregate(nps_sample, nps_config)
    assert counts.counts.sum() == len(nps_sample)
    assert np.all(np.diff(counts.cell_keys) > 0)
    context = ReleaseContext.from_counts(counts)
    assert len(context.lattice) == 256
    order = context.lattice.dfs_order()
    assert sorted(order) == sorted(context.lattice.nodes)
    seen = set()
    for node in order:  # every node comes after the node it is rolled up from
        source = context.lattice.source_of(node)
        assert source is None or source in seen
        seen.add(node)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 7, 256])
def test_rollups_match_naive_group_by(nps_config, nps_sample, batch_size) -> None:
    sample = nps_sample.sample(3000, random_state=1)
    context = ReleaseContext.from_counts(aggregate(sample, nps_config))
    checked = 0
    rng = np.random.default_rng(batch_size)
    for batch in node_batches(context, batch_size):
        for table in context.lattice.iter_tables(batch):
            assert table.counts.sum() == len(sample)
            if rng.random() < 0.15 or sum(table.node) in (0, 12):
                expected = _naive_cells(sample, nps_config, table.node)
                got = _engine_cells(context, nps_config, table)
                pd.testing.assert_series_equal(
                    got, expected.rename("count"), check_names=False, check_index_type=False
                )
                checked += 1
    assert checked >= 10


def test_group_sum_strategies_agree() -> None:
    rng = np.random.default_rng(3)
    for high in (50, 10**7, 2**40):
        keys = rng.integers(0, high, 5000)
        weights = rng.integers(1, 1000, 5000)
        got_keys, got_sums = group_sum(keys, weights)
        expected = pd.Series(weights).groupby(keys).sum()
        assert got_keys.tolist() == expected.index.tolist()
        assert got_sums.tolist() == expected.tolist()
    huge = np.array([2**61, 5, 2**61, 5], dtype=np.int64)  # packed value would overflow
    keys, sums = group_sum(huge, np.array([2**40, 1, 1, 2]))
    assert keys.tolist() == [5, 2**61] and sums.tolist() == [3, 2**40 + 1]


def test_missing_columns_nulls_and_empty_tables(nps_config, nps_sample) -> None:
    with pytest.raises(InputValidationError, match=r"lacks column.*'region'"):
        aggregate(nps_sample.drop(columns=["region"]), nps_config)
    with pytest.raises(InputValidationError, match="no rows"):
        aggregate(nps_sample.iloc[:0], nps_config)
    broken = nps_sample.head(20).copy()
    broken.loc[[3, 11], "age"] = np.nan
    with pytest.raises(InputValidationError, match=r"(?s)column 'age': 2 missing.*data rows 4, 12"):
        aggregate(broken, nps_config)
    dropping = nps_config.model_copy(update={"missing": "drop_rows", "drop_limit": 0.2})
    assert aggregate(broken, dropping).n_rows == 18


@pytest.mark.parametrize("batch_size", [1, 5, 16, 32, 64, 256])
def test_batches_cover_every_node_once_and_roll_up_mostly_by_steps(nps_config, nps_sample,
                                                                     batch_size: int) -> None:
    """Batches partition the lattice, none above the size, and a node is rolled up from the
    finest cells (about 30 step-ups' work) only where its source is in another batch: one per
    connected piece of the roll-up tree, not one per place a depth-first slice cuts it."""
    context = ReleaseContext.from_counts(aggregate(nps_sample, nps_config))
    lattice = context.lattice
    batches = node_batches(context, batch_size)
    nodes = [n for b in batches for n in b]
    assert sorted(nodes) == sorted(lattice.nodes) and len(nodes) == len(set(nodes))
    assert max(len(b) for b in batches) <= batch_size
    from_finest = 0
    for batch in batches:
        seen: set = set()
        for node in batch:
            from_finest += lattice.source_of(node) not in seen and node != lattice.nodes[0]
            seen.add(node)
    # depth-first slices of 32 roll 22 nodes up from the finest cells; the pieces 7
    assert from_finest <= {1: 255, 5: 63, 16: 16, 32: 7, 64: 3, 256: 0}[batch_size]
    assert len(batches) <= 2 * -(-len(lattice.nodes) // batch_size)  # pieces packed together
