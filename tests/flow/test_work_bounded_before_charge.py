"""Issue 36, "work after the charge" (cases 1-4), and cases 12, 21, 22: every mechanism's work
is bounded from public facts before the budget is charged; a refusal names the parameter to
change and spends nothing (ledger, published files and steward records unchanged).

The reproductions use small tables and small policy ceilings: the failure mode (work beyond a
public bound, found only after the charge) is the same as the issue's gigabyte runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from medrelease.data.aggregate import aggregate
from medrelease.data.config import config_from_dict, load_config
from medrelease.data.taxonomy import load_taxonomy
from medrelease.errors import ParameterError
from medrelease.mechanisms import get_mechanism
from medrelease.plan import PublicFacts
from medrelease.privacy.randomness import MIN_NOISE_EPSILON, generator_for
from medrelease.release import plan_release, release
from medrelease.synthetic.release import aim_rounds, synthetic_release

from ..conftest import SHARED
from .test_aim import write_small_dataset
from .test_bad_input_corpus import (
    HEADER,
    ROW,
    SENTINELS,
    Case,
    _rows,
    _write,
    run_case,
)

ROOT = Path(__file__).resolve().parents[2]

# The corpus's dataset (the NPS sample's columns) with 'surgery' as DiffGen's class column.
SURGERY_IS_THE_CLASS = {"columns": {"surgery": {"role": "class", "values": ["N", "Y"],
                                                "taxonomy": None}}}
CODES = {"columns": {"diagnosis": {"domain": "codes.txt"}}}
WRITE_CODES = _write(Path(), "codes.txt", "A001\nB002\nC003\n")
PAPER_ALLOWED = {"policy": {"mechanisms": ["ipa", "ipa-paper"], "allow_unproven": True,
                            "max_noise_rows": 50_000}}



def _adult_sample(base: Path) -> None:
    """The bundled ``adult`` config (default policy) over its first 60 rows: the issue's
    reproductions, without their gigabytes (the refusal comes before any row is read)."""
    spec = yaml.safe_load((ROOT / "datasets/adult/dataset.yaml").read_text())
    spec["name"] = "corpus"
    spec["input"]["path"] = "extract.csv"
    spec["privacy"].pop("source")
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((ROOT / "datasets/adult" / column["taxonomy"]).resolve())
    (base / "dataset.yaml").write_text(yaml.safe_dump(spec))
    lines = (SHARED / "data/adult/adult.csv").read_text().splitlines()[:61]
    (base / "extract.csv").write_text("\n".join(lines) + "\n")


CASES = [
    # 1. DiffGen's leaf cells (leaves x classes) and its noise rows, bounded before the charge.
    Case("diffgen on adult: 200 specializations could draw 1.03e9 leaf cells", "PolicyError",
         r"200 specializations could cut its predictors into 514,304,000 leaf partitions, "
         r"1,028,608,000 cells.*max_leaf_cells.*'specializations'.*Nothing was read or spent",
         None, setup=_adult_sample,
         request={"mechanism": {"mechanism": "diffgen", "epsilon": 2.0,
                                "specializations": 200}}),
    Case("diffgen on adult at eps 5e-5: the leaf cells' noise alone is millions of rows",
         "PolicyError", r"diffgen at epsilon 5e-05.*expected to add [\d,]+ noise rows.*"
         r"max_noise_rows.*'specializations'.*Nothing was read or spent", None,
         setup=_adult_sample,
         request={"mechanism": {"mechanism": "diffgen", "epsilon": 5e-5,
                                "specializations": 10}}),
    Case("diffgen: a small max_leaf_cells is the steward's to set", "PolicyError",
         r"200 specializations could cut.*over the limit of 10,000 \(policy: max_leaf_cells",
         _rows(60), config={**SURGERY_IS_THE_CLASS, "policy": {"max_leaf_cells": 10_000}},
         request={"mechanism": {"mechanism": "diffgen", "epsilon": 2.0,
                                "specializations": 200}}),
    # 3. aim: a round's epsilon below the samplers' floor, known before the charge.
    Case("aim at eps 1e-6: a round's selection epsilon below 2^-20", "ParameterError",
         r"aim at epsilon 1e-06.*selection could get epsilon 3\.\d+e-07, below the samplers' "
         r"floor.*'rounds_per_column'.*Nothing was read or spent", _rows(60), config=CODES,
         setup=WRITE_CODES, request={"mechanism": {"mechanism": "aim", "epsilon": 1e-6}}),
    # 4. ipa-paper: the counterfeit rows every class may gain, covered by max_noise_rows.
    Case("ipa-paper at eps 1e-4: counterfeit rows beyond max_noise_rows", "PolicyError",
         r"ipa-paper at epsilon 0\.0001.*expected to add [\d,]+ noise rows.*counterfeit rows.*"
         r"max_noise_rows.*Nothing was spent", _rows(300), config=PAPER_ALLOWED,
         request={"mechanism": {"mechanism": "ipa-paper", "epsilon": 1e-4},
                  "void_lifetime_guarantee": True}),
    # 12. A mechanism's delta (or epsilon) outside the product's bounds on a lifetime cap.
    Case("ipa with delta 0.5", "ParameterError",
         r"ipa: delta 0\.5 is above 0\.01.*use a smaller delta\. Nothing was read or spent",
         HEADER + ROW * 30, config={"privacy": {"lifetime_delta": 0.009}},
         request={"mechanism": {"mechanism": "ipa", "epsilon": 1.0, "delta": 0.5}}),
]


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_work_beyond_a_public_bound_is_refused_before_the_charge(corpus_home: Path,
                                                                 case: Case) -> None:
    """``run_case`` checks that no spend, published file or steward record appeared."""
    error = run_case(corpus_home, case)
    assert type(error).__name__ == case.error, f"{case.name}: {type(error).__name__}: {error}"
    assert re.search(case.message, str(error), re.S), f"{case.name}: {error}"
    for sentinel in SENTINELS:
        assert sentinel not in str(error)


# -- 1. DiffGen: the public bound holds for every run ---------------------------------------

def test_the_leaf_partition_bound_covers_every_cut_diffgen_reaches(tmp_path: Path) -> None:
    """The bound (taxonomies only) is at least the leaf partitions of real runs, at several
    numbers of specializations, on data whose best cut is as fine as it can be."""
    (tmp_path / "region.csv").write_text("".join(f"r{i};g{i // 4};*\n" for i in range(16)))
    (tmp_path / "sex.csv").write_text("F;*\nM;*\n")
    (tmp_path / "age.yaml").write_text("domain: {min: 0, max: 31}\nlevels:\n  - {width: 8}\n")
    config = config_from_dict({
        "name": "cuts", "input": {"path": "x.csv"},
        "columns": {"age": {"role": "dimension", "type": "integer", "taxonomy": "age.yaml"},
                    "sex": {"role": "dimension", "taxonomy": "sex.csv"},
                    "region": {"role": "dimension", "taxonomy": "region.csv"},
                    "outcome": {"role": "class", "values": ["no", "yes"]}},
        "privacy": {"lifetime_epsilon": 100.0}}, tmp_path)
    rng = np.random.default_rng(1)
    n = 4000
    frame = pd.DataFrame({"age": rng.integers(0, 32, n), "sex": rng.choice(["F", "M"], n),
                          "region": rng.choice([f"r{i}" for i in range(16)], n)})
    frame["outcome"] = np.where((frame["age"] % 3 == 0) ^ (frame["region"] > "r5"), "yes", "no")
    from medrelease.mechanisms.diffgen import leaf_partitions_bound

    taxonomies = [config.taxonomies[c] for c in config.dimensions]
    for h in (1, 3, 6, 12, 40):
        result = release(frame, config, mechanism="diffgen",
                         params={"epsilon": 50.0, "specializations": h}, seed=h)
        reached = result.details["leaf_partitions"]
        assert reached <= leaf_partitions_bound(taxonomies, h), h
    assert leaf_partitions_bound(taxonomies, 0) == 1
    # every predictor at its leaves: the bound never exceeds the full product
    assert leaf_partitions_bound(taxonomies, 500) == 32 * 2 * 16


def test_a_set_valued_split_past_the_cell_ceiling_is_not_made(tmp_path: Path) -> None:
    """Set-valued columns grow by noisy tests, so their cut cannot be bounded before the run:
    a split whose kept children would take the cells past the ceiling keeps none of them
    (records stay in their parent, post-processing of the test), and no cell beyond the
    ceiling is drawn. With room, the same run splits."""
    (tmp_path / "items.csv").write_text("a1;A;*\na2;A;*\nb1;B;*\nb2;B;*\n")
    (tmp_path / "sex.csv").write_text("F;*\nM;*\n")

    def config(max_leaf_cells: int):
        return config_from_dict({
            "name": "items", "input": {"path": "x.csv"},
            "columns": {"sex": {"role": "dimension", "taxonomy": "sex.csv"},
                        "codes": {"role": "set_valued", "separator": "|",
                                  "taxonomy": "items.csv"},
                        "outcome": {"role": "class", "values": ["no", "yes"]}},
            "privacy": {"lifetime_epsilon": 100.0},
            "policy": {"max_leaf_cells": max_leaf_cells}}, tmp_path)

    rng = np.random.default_rng(0)
    n = 3000
    choice = rng.integers(0, 3, n)
    frame = pd.DataFrame({"sex": rng.choice(["F", "M"], n),
                          "codes": np.where(choice == 0, "a1", np.where(choice == 1, "b2",
                                                                        "a2|b1")),
                          "outcome": np.where(choice == 1, "no", "yes")})
    params = {"epsilon": 20.0, "specializations": 3}
    roomy = release(frame, config(10_000), mechanism="diffgen", params=params, seed=3)
    assert roomy.details["set_specializations"][0]["children_kept"] > 0
    # sex x {empty, {*}} x 2 classes = 8 cells: the starting cut fits, no split does
    tight = release(frame, config(8), mechanism="diffgen", params=params, seed=3)
    steps = tight.details["set_specializations"]
    assert all(s["children_kept"] == 0 and "ceiling" in s["not_made"] for s in steps)
    assert tight.details["cells"] <= 8
    assert len(tight.table) == pytest.approx(n, rel=0.05)  # no record is lost


# -- 2 and 21. aim: a public ceiling on the rows sampled; the check centred on the noisy total -

@pytest.mark.usefixtures("prefect_harness")
def test_aim_at_a_tiny_epsilon_samples_at_most_its_public_ceiling(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """At eps 1e-4 the noisy total's sigma is about 10^5 rows on a table of 400: the total is
    clipped to ``max_synthetic_rows`` (post-processing), the manifest says so, and the output
    check passes on the clipped total."""
    from flows.release import ReleaseRequest, release_flow

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    path = write_small_dataset(tmp_path)
    result = release_flow(ReleaseRequest(
        dataset=str(path), mechanism="aim", epsilon=1e-4, seed=2, evaluate=False,
        parameters={"rounds_per_column": 1, "iters": 20, "final_iters": 20,
                    "max_synthetic_rows": 2_000}))
    manifest = result["manifest"]
    assert manifest["parameters"]["max_synthetic_rows"] == 2_000
    details = manifest["mechanism_details"]
    assert details["synthetic_rows_ceiling"] == 2_000 and details["noisy_total_clipped"]
    assert 1_900 <= manifest["released_rows"] <= 2_000
    released = pd.read_csv(Path(result["path"]) / "TEST-data.csv")
    assert len(released) == manifest["released_rows"]


def test_aims_output_check_is_centred_on_the_noisy_total_not_the_input_rows(tmp_path) -> None:
    """Case 21: the plausible-rows check reads the noisy total (a DP output) and its sigma,
    never ``counts.n_rows``: whether a release passes cannot depend on the input's size."""
    config = load_config(write_small_dataset(tmp_path))
    counts = aggregate(pd.read_csv(tmp_path / "t.csv"), config)
    plan = plan_release("aim", {"epsilon": 0.3, "rounds_per_column": 1, "iters": 20,
                                "final_iters": 20}, 0, seed=5, facts=PublicFacts.of(config))
    run = aim_rounds(counts, config, plan)
    run.run()
    chosen = synthetic_release(run, counts, plan)
    spread = int(12 * run.state.total_sigma) + 1
    centre = round(run.state.total)
    assert centre != counts.n_rows  # (the noisy total, at sigma ~ 30 rows)
    assert chosen.row_bounds == (max(1, centre - spread), centre + spread)


# -- 3. aim: the per-round epsilon floor, computed up front, is a true lower bound -----------

@pytest.mark.parametrize(("epsilon", "rounds_per_column"), [(0.05, 1), (0.05, 4), (0.2, 2),
                                                            (1.0, 3)])
def test_the_smallest_round_epsilon_bounds_every_rounds_selection(tmp_path, epsilon,
                                                                  rounds_per_column) -> None:
    config = load_config(write_small_dataset(tmp_path))
    counts = aggregate(pd.read_csv(tmp_path / "t.csv"), config)
    plan = plan_release("aim", {"epsilon": epsilon, "rounds_per_column": rounds_per_column,
                                "iters": 10, "final_iters": 10}, 0, seed=7,
                        facts=PublicFacts.of(config))
    run = aim_rounds(counts, config, plan)
    run.run()
    floor = get_mechanism("aim").smallest_round_epsilon(plan.params, len(run.space.names))
    used = [r.selection_epsilon for r in run.state.records]
    assert used and min(used) >= floor * (1 - 1e-12)


def test_aims_round_epsilon_floor_refuses_at_plan_time_without_reading_data(tmp_path) -> None:
    config = load_config(write_small_dataset(tmp_path))
    aim = get_mechanism("aim")
    params = plan_release("aim", {"epsilon": 1e-6}, 0, seed=1,
                          facts=PublicFacts.of(config)).params
    assert aim.smallest_round_epsilon(params, 3) < MIN_NOISE_EPSILON
    with pytest.raises(ParameterError, match="rounds_per_column"):
        aim.check_work(config, params)
    fine = plan_release("aim", {"epsilon": 1e-3}, 0, seed=1, facts=PublicFacts.of(config))
    aim.check_work(config, fine.params)  # no refusal


# -- 12. the product's bounds on epsilon and delta, for every mechanism --------------------

@pytest.mark.parametrize(("mechanism", "params", "what"), [
    ("ipa", {"epsilon": 1.0, "delta": 0.5}, "delta 0.5"),
    ("ipa", {"epsilon": 150.0}, "epsilon 150"),
    ("histogram", {"epsilon": 101.0}, "epsilon 101"),
    ("diffgen", {"epsilon": 500.0}, "epsilon 500"),
    ("aim", {"epsilon": 200.0}, "epsilon 200"),
])
def test_a_release_outside_the_caps_bounds_is_refused_when_planned(mechanism, params,
                                                                   what) -> None:
    from medrelease.privacy.ledger import MAX_CAP_DELTA, MAX_CAP_EPSILON

    with pytest.raises(ParameterError, match=rf"{what} is above "
                                             rf"({MAX_CAP_EPSILON:g}|{MAX_CAP_DELTA:g})"):
        plan_release(mechanism, params, 4, seed=1)
    plan_release("ipa", {"epsilon": 100.0, "delta": 1e-2}, 4, seed=1)  # the bounds themselves


# -- 22. the unit bound's stream is none of the noise streams ------------------------------

def test_a_seeded_unit_bound_draws_from_its_own_stream() -> None:
    facts = PublicFacts(unit_rows=2, unit_column="patient_id",
                        unit_relation="add/remove one patient")
    probe = plan_release("histogram", {"epsilon": 1.0}, 0, seed=11, facts=facts)
    full = plan_release("histogram", {"epsilon": 1.0}, 8, seed=11, facts=facts)
    unit = generator_for(probe.unit.seed).integers(0, 2**62, 8)
    assert np.array_equal(unit, generator_for(full.unit.seed).integers(0, 2**62, 8))
    streams = [*full.node_seeds, full.selection_seed, full.release_seed, full.shuffle_seed]
    for stream in streams:
        assert not np.array_equal(unit, generator_for(stream).integers(0, 2**62, 8))


def test_the_cut_growth_of_a_taxonomy_is_its_largest_gains(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("".join(f"x{i};{'ab'[i // 5]};*\n" for i in range(10)))
    taxonomy = load_taxonomy(tmp_path / "t.csv", "t")
    from medrelease.mechanisms.diffgen import cut_growth

    assert cut_growth(taxonomy, 4) == [1, 5, 9, 10, 10]  # two groups of 5, root of 2
