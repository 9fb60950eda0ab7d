"""Any table on the first try (issue 55): whatever ``medrelease init`` drafts, ``check`` passes
and a release with the registry's default mechanism publishes, with no edit.

A seeded generator (``medrelease.data.shapes``) draws tables of every shape the issue lists
— decimals of any magnitude and precision, blanks in integer and decimal columns, negative
numbers, dates written in the common ways, booleans, codes with leading zeros, ids, free text,
very narrow and very wide tables, one-row tables, unicode and odd column names — and each goes
init -> check -> release the way the flow releases it (its counting pass, the default
mechanism, its output checks), at a small epsilon and a test seed. Where init cannot draft a
release (no column besides the informative one is releasable) it must say so and write
nothing. The failures found on the way are kept below as regression tests, each on the
smallest table that showed it; the issue's four tables are reproduced on generated ones.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from medrelease.checkup import Request, check_dataset
from medrelease.data import shapes
from medrelease.data.config import find_config
from medrelease.data.draft import DraftError, draft_dataset, profile_csv, write_draft
from medrelease.data.extract import resolve_extract
from medrelease.refusals import Facts, plan_for_config, refuse
from medrelease.release import Inputs, choose, resolve_mechanism
from medrelease.stages import InProcess

SEEDS = range(200)          # at least 200 tables
CHUNKS = 8                  # test items, so that two workers share them
EPSILON = 0.3               # a small epsilon
SEED = 7                    # a TEST release
SECRET = "ZZSENTINEL"       # a value no message may show


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    """A home per test; its ``datasets/`` is a dataset root (where init writes)."""
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "datasets").mkdir(parents=True)
    return tmp_path / "home"


def drafted(table: shapes.Table, name: str, home: Path, **options) -> Path:
    """``medrelease init`` on the table (its CSV beside the dataset root), no edit: the
    config's path."""
    source = home.parent / "tables"
    source.mkdir(exist_ok=True)
    csv = table.write(source / f"{name}.csv")
    draft = draft_dataset(profile_csv(csv), name, home / "datasets", table.informative,
                          **options)
    write_draft(draft)
    return home / "datasets" / name / "dataset.yaml"


def checked(config_path: Path, **request) -> None:
    """``medrelease check`` finds nothing (the engine's, without Prefect)."""
    report = check_dataset(str(config_path), request=Request(**request))
    assert report.ok, [(f.stage, f.column, f.problem) for f in report.findings]
    assert report.release, "check shows the release it would run"


def published(config_path: Path, mechanism: str | None = None, epsilon: float = EPSILON):
    """The release the flow would make, step by step with the flow's own functions, before
    publishing: the plan (default mechanism), the counting pass (``count_partition``: DuckDB's
    grouped pass or the row-wise one), the count stage's refusals, the stage driver
    (``choose``), the output checks. Returns the chosen
    release (its rows pass the checks the publisher runs)."""
    from medrelease.data.reading import count_partition
    from schemas.output import checked_output

    config = find_config(str(config_path))
    resolved = resolve_mechanism(config, mechanism, epsilon)
    plan = plan_for_config(config, resolved.name, resolved.params, SEED)
    extract = resolve_extract(config, rows_by_count=True)
    try:
        counts = count_partition(config, extract.files[0], unit=plan.unit).counts
    finally:
        extract.discard()
    inputs = Inputs(counts=counts)
    refuse("count", Facts(config, plan, context=inputs.context))
    chosen, _ = choose(inputs, config, plan, InProcess())
    context = inputs.context
    report = checked_output(config, context, chosen, plan.mechanism)
    assert report.success
    return chosen


def _chunk(k: int) -> list[int]:
    return [s for s in SEEDS if s % CHUNKS == k]


# -- the property: every shape, init -> check -> release -------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_drafted_table_checks_clean_and_publishes(home: Path, chunk: int) -> None:
    """200 generated tables (25 a test item), at most 400 rows and 14 columns here (the very
    wide ones, to 40 columns, have tests of their own below: aim's rounds grow with the
    columns): each drafted config passes its own check and releases with the default
    mechanism; a table init cannot draft is refused in words, with nothing written."""
    outcomes = []
    for seed in _chunk(chunk):
        table = shapes.random_table(seed, max_rows=400, max_columns=14)
        name = f"t{seed}"
        try:
            config = drafted(table, name, home)
        except DraftError as exc:
            message = str(exc)
            assert not (home / "datasets" / name).exists(), (table.shape, message)
            assert "no column can be a dimension" in message or \
                "cannot be the informative column" in message, (table.shape, message)
            outcomes.append("refused")
            continue
        checked(config, epsilon=EPSILON)
        chosen = published(config)
        assert len(chosen.rows) >= 1, table.shape
        outcomes.append("released")
    # the generator's narrow tables (one column besides the informative) are the refusals
    assert outcomes.count("refused") <= len(outcomes) // 4, outcomes


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 8])
def test_very_wide_tables_publish(home: Path, seed: int) -> None:
    """Forty columns (seeds 1 and 8: 7 and 120 rows): drafted, checked and released with aim,
    whose lattice (about 10^12 nodes) is never walked nor given a seed per node, and whose
    joint domain no count table key holds. Regression: seed 1 hung in the plan (a seed for
    each of 10^12 nodes) and then in aim's workload closure (6,500 x 6,500 set tests)."""
    table = shapes.random_table(seed, max_rows=120)
    assert len(table.frame.columns) == 40
    config = drafted(table, f"wide{seed}", home)
    started = time.perf_counter()
    checked(config, epsilon=EPSILON)
    assert time.perf_counter() - started < 30
    chosen = published(config)
    assert len(chosen.rows) >= 1


# -- regressions: each failure the generator found, on the smallest table that showed it -----


def _table(columns: dict[str, list], informative: str) -> shapes.Table:
    return shapes.Table(pd.DataFrame(columns, dtype=object), informative, "regression")


def test_yaml_words_as_column_names_read_back_as_themselves(home: Path) -> None:
    """Columns named ``no``, ``null`` and ``on`` (YAML's false, null and true unquoted) were
    written as plain keys and read back as other names: the config had no such columns."""
    rows = 60
    rng = np.random.default_rng(0)
    table = _table({"no": rng.choice(["a", "b"], rows), "null": rng.choice(["x", "y"], rows),
                    "on": rng.choice(["p", "q", "r"], rows),
                    "outcome": rng.choice(["u", "v"], rows)}, "outcome")
    config = drafted(table, "words", home)
    columns = yaml.safe_load(config.read_text())["columns"]
    assert set(columns) == {"no", "null", "on", "outcome"}
    checked(config)


def test_names_that_reduce_to_one_file_stem_get_their_own_files(home: Path) -> None:
    """Two non-Latin column names both reduced to the file stem ``column``: one taxonomy file
    served two columns and check refused the values of the other."""
    rows = 40
    rng = np.random.default_rng(1)
    table = _table({"ключ": rng.choice(["a", "b", "c"], rows),
                    "名前": rng.choice(["x", "y"], rows),
                    "outcome": rng.choice(["u", "v"], rows)}, "outcome")
    config = drafted(table, "stems", home)
    spec = yaml.safe_load(config.read_text())["columns"]
    assert spec["ключ"]["taxonomy"] != spec["名前"]["taxonomy"]
    checked(config)


def test_blanks_in_integer_columns_are_a_category_integers_and_decimals_alike(home: Path) -> None:
    """Issue 55, table 2: an integer column with a blank kept ``type: integer`` and its blanks
    the category ``(blank)``, which the integer check refused while a decimal column's passed;
    one rule now (the category passes both). Also an integer informative column with many
    blanks (its domain holds ``(blank)``)."""
    rows = 300
    rng = np.random.default_rng(2)
    year = rng.integers(1990, 2020, rows).astype(str).astype(object)
    year[[5, 17]] = None
    dose = np.array([f"{v:.1f}" for v in rng.gamma(2, 3, rows)], dtype=object)
    dose[[3, 9]] = None
    flag = rng.integers(0, 2, rows).astype(str).astype(object)
    flag[rng.random(rows) < 0.2] = None
    table = _table({"model_year": year, "dose": dose, "flag": flag,
                    "seat": rng.choice(["front", "rear"], rows)}, "flag")
    config = drafted(table, "blanks", home)
    columns = yaml.safe_load(config.read_text())["columns"]
    assert columns["model_year"]["type"] == "integer"
    assert columns["model_year"]["missing"] == columns["dose"]["missing"] == "(blank)"
    assert columns["flag"]["type"] == "integer" and columns["flag"]["missing"] == "(blank)"
    checked(config)
    published(config)


def test_what_a_release_cannot_hold_is_dropped_with_its_reason(home: Path) -> None:
    """Numbers written with an exponent, dates with a time of day and values with a line
    break passed init as categories and failed check (or were taken for ids): each is now
    dropped, with the reason in the config. All-different whole numbers that do not run one
    after another are a measurement, not an id."""
    rows = 50
    rng = np.random.default_rng(3)
    table = _table({
        "ratio": [f"{v:.2e}" for v in rng.normal(0, 1e5, rows)],
        "seen_at": [f"2021-03-{d:02d} 1{h}:30:00" for d, h in
                    zip(rng.integers(1, 28, rows), rng.integers(0, 9, rows), strict=True)],
        "note": [f"line {k}\nmore" for k in rng.integers(0, 3, rows)],
        "income": rng.permutation(np.arange(rows) * 37 + 1000).astype(str),
        "ward": rng.choice(["a", "b"], rows), "outcome": rng.choice(["u", "v"], rows)},
        "outcome")
    config = drafted(table, "dropped", home)
    text = config.read_text()
    columns = yaml.safe_load(text)["columns"]
    assert [columns[c]["role"] for c in ("ratio", "seen_at", "note")] == ["drop"] * 3
    assert "exponent" in text and "time of day" in text and "control character" in text
    assert columns["income"]["role"] == "dimension"
    checked(config)
    published(config)


def test_an_id_with_blanks_is_never_the_privacy_unit(home: Path) -> None:
    """A code column named ``no`` (an id by its name) whose rows repeat was drafted as the
    privacy unit although two rows had no id; check refused them (every row must name its
    unit). Ids with blanks or NA are no unit now, and --unit naming one is refused."""
    rows = 120
    rng = np.random.default_rng(4)
    ids = np.array([f"P{k}" for k in rng.integers(0, 30, rows)], dtype=object)
    ids[[4, 50]] = None
    ids[7] = "NA"
    table = _table({"no": ids, "stage": rng.choice(["1", "2", "3"], rows),
                    "outcome": rng.choice(["u", "v"], rows)}, "outcome")
    config = drafted(table, "unitless", home)
    assert "unit" not in yaml.safe_load(config.read_text())["privacy"]
    checked(config)
    with pytest.raises(DraftError, match="every row must name its unit"):
        drafted(table, "unit-asked", home, unit="no")
    assert not (home / "datasets" / "unit-asked").exists()


def test_an_informative_column_of_blanks_is_refused_in_words(home: Path) -> None:
    table = _table({"ward": ["a", "b", "a"], "outcome": [None, None, None]}, "outcome")
    with pytest.raises(DraftError, match="no values"):
        drafted(table, "empty", home)


def test_short_codes_get_no_level_that_groups_nothing(home: Path) -> None:
    """Three-character codes (S01 ... S08) had a 'first three characters' level equal to the
    codes and a 'first character' level of one group: two lattice levels that merge nothing
    (the 15-column cohort's lattice: 65,536 nodes, refused for ipa)."""
    rows = 200
    rng = np.random.default_rng(5)
    table = _table({"site": [f"S{k:02d}" for k in rng.integers(1, 9, rows)],
                    "icd": [f"{rng.choice(list('ABC'))}{k:02d}.{d}" for k, d in
                            zip(rng.integers(0, 30, rows), rng.integers(0, 4, rows),
                                strict=True)],
                    "outcome": rng.choice(["u", "v"], rows)}, "outcome")
    config = drafted(table, "codes", home)
    folder = config.parent
    site = [line.split(";") for line in (folder / "site.csv").read_text().splitlines()
            if not line.startswith("#")]
    assert {len(line) for line in site} == {2}  # the code, then '*'
    icd = [line.split(";") for line in (folder / "icd.csv").read_text().splitlines()
           if not line.startswith("#")]
    assert {len(line) for line in icd} == {4}  # the code, three characters, one, '*'
    checked(config)


@pytest.mark.parametrize("fmt", ["%d/%m/%Y", "%m/%d/%Y", "%Y/%m/%d", "%d.%m.%Y", "%Y%m%d",
                                 "%d-%b-%Y", "%Y-%m"])
def test_dates_in_the_common_formats_are_dates(home: Path, fmt: str) -> None:
    """Dates written otherwise than YYYY-MM-DD were categories (or, 20200131, numbers in
    bands): each is now a date taxonomy in the column's own format, day -> month -> year (a
    column of months: month -> year), covering every value."""
    rows = 150
    rng = np.random.default_rng(6)
    days = pd.Timestamp("2019-03-01") + pd.to_timedelta(rng.integers(0, 700, rows), unit="D")
    if fmt == "%m/%d/%Y":  # days after the 12th: no reading as day-first
        days = days[days.day > 12].append(days[days.day <= 12])
    table = _table({"seen": list(days.strftime(fmt)), "outcome": rng.choice(["u", "v"], rows)},
                   "outcome")
    config = drafted(table, "dates", home)
    assert yaml.safe_load(config.read_text())["columns"]["seen"]["role"] == "dimension"
    first = next(line for line in (config.parent / "seen.csv").read_text().splitlines()
                 if not line.startswith("#"))
    assert len(first.split(";")) == (3 if fmt == "%Y-%m" else 4)
    checked(config)
    published(config)


def test_an_aim_plan_on_a_huge_lattice_spawns_no_seed_per_node(home: Path) -> None:
    """The plan spawned one seed per lattice node for every mechanism: for aim, which walks
    none, on a 40-column table (10^12 nodes), the check never returned."""
    rng = np.random.default_rng(7)
    rows = 20
    columns = {f"c{i}": rng.choice([f"v{k}" for k in range(9)], rows) for i in range(24)}
    columns["outcome"] = rng.choice(["u", "v"], rows)
    config_path = drafted(_table(columns, "outcome"), "lattice", home)
    config = find_config(str(config_path))
    started = time.perf_counter()
    plan = plan_for_config(config, "aim", {"epsilon": 1.0}, SEED)
    assert time.perf_counter() - started < 5 and plan.node_seeds == []
    assert math.prod(config.taxonomies[c].height + 1 for c in config.dimensions) > 10**6


# -- the four tables, generated, with no edit ----------------------------------------


def test_ages_below_one_year(home: Path) -> None:
    """Table 1: ages in whole years and some below one (0.1 ... 0.9). The draft's resolution
    follows the data's precision, and every value is covered."""
    table = shapes.ages_below_one(rows=3000)
    config = drafted(table, "tests", home)
    age = yaml.safe_load((config.parent / "age.yaml").read_text())
    assert float(age["resolution"]) <= 0.5
    checked(config)
    published(config)


def test_a_blank_in_an_integer_year(home: Path) -> None:
    """Table 2: one blank in an integer year column, blanks in two integer clinical columns:
    the draft keeps them integer with a (blank) category, check passes, the release too."""
    table = shapes.blank_integer_year(rows=3000)
    config = drafted(table, "crashes", home)
    columns = yaml.safe_load(config.read_text())["columns"]
    assert all(columns[c].get("type") == "integer" and columns[c]["missing"] == "(blank)"
               for c in ("model_year", "speed_limit", "heart_rate"))
    checked(config)
    published(config)


@pytest.mark.slow
def test_a_wide_survey_releases_with_aim_and_ipa_is_refused_by_check_naming_columns(
        home: Path) -> None:
    """Table 3: 20 columns, nine continuous. check said "no problems" and release refused
    ("too large to stream"); now aim (the default) releases it from a count table with a code
    per column, and ipa, which needs the joint table, is refused by check and by the plan
    alike, naming the columns to coarsen or drop."""
    from medrelease.data.aggregate import aggregate
    from medrelease.data.input_schema import validate_input
    from medrelease.errors import PolicyError
    from medrelease.storage.io import read_input

    table = shapes.wide_survey(rows=2000, columns=20, continuous=9)
    config_path = drafted(table, "survey", home)
    checked(config_path)
    started = time.perf_counter()
    chosen = published(config_path)
    assert time.perf_counter() - started < 60
    assert len(chosen.rows) > 1000
    config = find_config(str(config_path))
    assert aggregate(validate_input(read_input(config), config), config).wide
    report = check_dataset(str(config_path), request=Request(mechanism="ipa"))
    problems = " ".join(f.problem for f in report.findings)
    assert not report.ok and ("score_" in problems)
    for mechanism in ("ipa", "histogram"):
        with pytest.raises(PolicyError) as refused:
            plan_for_config(config.model_copy(update={"policy": config.policy.model_copy(
                update={"max_lattice_nodes": 10_000_000})}), mechanism, {"epsilon": 1.0}, None)
        assert "too large to stream" in str(refused.value) and "score_" in str(refused.value)
        assert "aim" in str(refused.value)


@pytest.mark.slow
def test_a_cohort_releases_with_ipa_in_seconds(home: Path) -> None:
    """Table 4: a 15-column cohort (one row per person). Its lattice fits the default limit
    (the short codes add no empty level), ipa releases it, and its guarantee speaks of one
    patient (the steward's nouns: one row per person)."""
    from medrelease.plan import PublicFacts
    from medrelease.release import plan_release

    table = shapes.cohort_table(rows=1500, columns=15)
    config_path = drafted(table, "cohort", home)
    checked(config_path, mechanism="ipa")
    config = find_config(str(config_path))
    assert config.privacy.row_noun == config.privacy.unit_noun == "patient"
    statement = plan_release("ipa", {"epsilon": 1.0}, 1, None,
                             PublicFacts.of(config)).guarantee.statement()
    assert "one row is one patient" in statement and "not one" not in statement
    started = time.perf_counter()
    published(config_path, mechanism="ipa", epsilon=1.0)
    assert time.perf_counter() - started < 60
