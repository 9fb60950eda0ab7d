"""``medrelease init`` drafts a config a release accepts as it is; ``medrelease check`` lists
every problem of a dataset in one run, without Prefect and without spending."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from deployments import cli
from deployments.cli import app
from medrelease.data.config import READ_FROM_DATA_MARK, find_config
from medrelease.errors import ConfigError
from medrelease.privacy.ledger import Ledger

from ..conftest import ROOT, SHARED

WIDE = {"COLUMNS": "240"}
SECRET = "SECRETVALUE"  # a value no console line may show


def generated_visits(path: Path, rows: int = 3000, seed: int = 7) -> pd.DataFrame:
    """A table as a steward has one: a patient id repeated per patient, a decimal, ICD-like
    codes, dates, free text, a flat category, and blanks in the informative column."""
    rng = np.random.default_rng(seed)
    words = ["pain", "fever", "cough", "follow", "up", "chest", "acute", "mild", "severe"]
    frame = pd.DataFrame({
        "patient_id": [f"P{p:05d}" for p in rng.integers(1, rows // 3, rows)],
        "age": rng.integers(18, 91, rows),
        "bmi": np.round(rng.normal(27, 4, rows), 1),
        "icd_code": [f"{rng.choice(list('ABJK'))}{rng.integers(0, 30):02d}.{rng.integers(0, 4)}"
                     for _ in range(rows)],
        "admitted": (pd.Timestamp("2016-01-01")
                     + pd.to_timedelta(rng.integers(0, 900, rows), unit="D")).strftime("%Y-%m-%d"),
        "notes": [" ".join(rng.choice(words, 5)) + f" {i}" for i in range(rows)],
        "sex": rng.choice(["F", "M"], rows),
        "outcome": rng.choice(["home", "transfer", "rehab"], rows).astype(object),
    })
    frame.loc[rng.choice(rows, rows // 100, replace=False), "outcome"] = None
    frame.to_csv(path, index=False)
    return frame


@pytest.fixture(autouse=True)
def wide_console(monkeypatch) -> None:
    """The CLI's console takes its width when first imported (80 in a worker without a
    terminal): tables here are read whole, so give it room (``COLUMNS`` alone comes too late)."""
    monkeypatch.setattr(cli.console, "width", 240)


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _init(csv: Path, name: str, root: Path, *extra: str):
    return CliRunner().invoke(app, ["init", str(csv), "--name", name, "--root", str(root),
                                    *extra], env=WIDE)


def test_init_drafts_every_kind_of_column(tmp_path: Path, home: Path) -> None:
    frame = generated_visits(tmp_path / "visits.csv")
    root = home / "datasets"
    result = _init(tmp_path / "visits.csv", "visits", root, "--informative", "outcome")
    assert result.exit_code == 0, result.output
    folder = root / "visits"
    spec = yaml.safe_load((folder / "dataset.yaml").read_text())
    roles = {name: column["role"] for name, column in spec["columns"].items()}
    assert roles == {"patient_id": "identifier", "age": "dimension", "bmi": "dimension",
                     "icd_code": "dimension", "admitted": "dimension", "notes": "drop",
                     "sex": "dimension", "outcome": "informative"}
    assert spec["privacy"]["unit"] == "patient_id" and spec["privacy"]["unit_noun"] == "patient"
    assert spec["privacy"]["row_noun"] == "row"
    assert spec["missing"] == "drop_rows"  # 1 % blank informative values: a readable rule
    # review before publishing: offered, commented out (a first release does not stop)
    assert "review" not in spec and "\n# review: required\n" in (folder / "dataset.yaml").read_text()
    age = yaml.safe_load((folder / "age.yaml").read_text())
    # issue 53: bands start and end where the data does (the file says it was read from it)
    assert age["domain"] == {"min": frame["age"].min(), "max": frame["age"].max()}
    assert [level["width"] for level in age["levels"]] == [5, 10, 20]
    bmi = yaml.safe_load((folder / "bmi.yaml").read_text())
    assert bmi["domain"] == {"min": frame["bmi"].min(), "max": frame["bmi"].max()}
    codes = [line for line in (folder / "icd_code.csv").read_text().splitlines()
             if not line.startswith("#")]  # (issue 53: a leading read-from-the-data mark)
    assert codes[0].split(";")[1:] == \
        [sorted(frame["icd_code"])[0][:3], sorted(frame["icd_code"])[0][:1], "*"]
    assert (folder / "admitted.csv").read_text().splitlines()[0] == "2015-01-01;2015-01;2015;*"
    domain = (folder / "outcome_domain.txt").read_text().splitlines()
    assert domain[0].startswith(READ_FROM_DATA_MARK) and "home" in domain
    config = find_config("visits")
    assert config.domain_read_from_data == "outcome"
    assert "review" in result.output and "read from the data" in result.output


def test_init_never_overwrites_and_refuses_an_unparseable_file(tmp_path: Path,
                                                                home: Path) -> None:
    generated_visits(tmp_path / "visits.csv", rows=200)
    root = home / "datasets"
    assert _init(tmp_path / "visits.csv", "visits", root, "--informative", "sex").exit_code == 0
    before = (root / "visits" / "dataset.yaml").read_text()
    again = _init(tmp_path / "visits.csv", "visits", root, "--informative", "outcome")
    assert again.exit_code == 1 and "never overwrites" in again.output
    assert (root / "visits" / "dataset.yaml").read_text() == before
    broken = tmp_path / "broken.csv"
    broken.write_text(f"a,b,c\n1,2,3\n4,5,6\n7,8,{SECRET},9\n1,2,3\n")
    refused = _init(broken, "broken", root, "--informative", "a")
    assert refused.exit_code == 1
    assert "line 4" in refused.output and "column 4" in refused.output, refused.output
    assert SECRET not in refused.output and not (root / "broken").exists()


def test_init_without_an_informative_column_lists_the_candidates(tmp_path: Path,
                                                                  home: Path) -> None:
    generated_visits(tmp_path / "visits.csv", rows=200)
    result = _init(tmp_path / "visits.csv", "visits", home / "datasets")
    assert result.exit_code == 1 and "--informative" in result.output
    assert "outcome" in result.output and not (home / "datasets" / "visits").exists()


@pytest.mark.usefixtures("prefect_harness")
def test_init_then_release_publishes_first_try(tmp_path: Path, home: Path) -> None:
    from flows.release import ReleaseRequest, release_flow

    generated_visits(tmp_path / "visits.csv")
    drafted = _init(tmp_path / "visits.csv", "visits", home / "datasets", "--informative",
                    "outcome")
    assert drafted.exit_code == 0, drafted.output
    checked = CliRunner().invoke(app, ["check", "visits"], env=WIDE)
    assert checked.exit_code == 0 and "no problems" in checked.output, checked.output
    result = release_flow(ReleaseRequest(dataset="visits", mechanism="ipa", epsilon=1.0,
                                         evaluate=False))
    manifest = json.loads((Path(result["path"]) / "manifest.json").read_text())
    statement = manifest["guarantee"]["statement"]
    assert "the set of values of 'outcome' was taken from the data" in statement
    assert "add/remove one patient" in statement
    assert [s.status for s in Ledger(home / "ledger.sqlite").spends()] == ["released"]


def test_a_reviewed_domain_drops_the_words(tmp_path: Path, home: Path) -> None:
    from medrelease.plan import PublicFacts
    from medrelease.release import plan_release

    generated_visits(tmp_path / "visits.csv", rows=300)
    assert _init(tmp_path / "visits.csv", "visits", home / "datasets", "--informative",
                 "outcome").exit_code == 0
    path = home / "datasets" / "visits" / "dataset.yaml"
    path.write_text(path.read_text().replace('domain: "outcome_domain.txt"',
                                             'domain: "outcome_domain.txt", domain_reviewed: '
                                             'true'))
    config = find_config("visits")
    assert config.domain_read_from_data is None
    plan = plan_release("ipa", {"epsilon": 1.0}, 1, None, PublicFacts.of(config))
    # (issue 53: the dimensions' drafted taxonomies keep their own caveat until reviewed)
    assert "the set of values of 'outcome'" not in plan.guarantee.statement()


def five_problem_dataset(folder: Path) -> None:
    """A config and extract with five different problems: a broken taxonomy file, a number
    that is not whole, a value its taxonomy lacks, a blank where blanks are refused, and an
    informative value outside the declared domain."""
    folder.mkdir(parents=True)
    (folder / "age.yaml").write_text("domain: {min: 0, max: 99}\nlevels:\n  - {width: 10}\n")
    (folder / "sex.csv").write_text("F;*\nM;*\n")
    (folder / "ward.csv").write_text("north;*\nsouth;*\n")
    (folder / "region.csv").write_text("east;all\nwest;all\n")  # no '*' at the top
    (folder / "diagnosis.txt").write_text("A01\nB02\nC03\n")
    (folder / "dataset.yaml").write_text(textwrap.dedent("""\
        name: five-problems
        input: {path: extract.csv}
        columns:
          age:       {role: dimension, type: integer, taxonomy: age.yaml}
          sex:       {role: dimension, taxonomy: sex.csv}
          ward:      {role: dimension, taxonomy: ward.csv}
          region:    {role: dimension, taxonomy: region.csv}
          diagnosis: {role: informative, domain: diagnosis.txt}
        privacy: {lifetime_epsilon: 10}
        """))
    rows = [["34", "F", "north", "east", "A01"]] * 30
    rows[3] = ["3.5x", "F", "north", "east", "A01"]          # line 5: not a whole number
    rows[7] = ["40", SECRET, "north", "east", "A01"]          # line 9: not in sex.csv
    rows[11] = ["41", "M", "", "west", "A01"]                 # line 13: a refused blank
    rows[20] = ["42", "M", "south", "west", SECRET + "D"]    # line 22: outside the domain
    pd.DataFrame(rows, columns=["age", "sex", "ward", "region", "diagnosis"]).to_csv(
        folder / "extract.csv", index=False)


def test_check_lists_five_problems_in_one_run(tmp_path: Path, home: Path) -> None:
    five_problem_dataset(home / "datasets" / "five-problems")
    result = CliRunner().invoke(app, ["check", "five-problems"], env=WIDE)
    assert result.exit_code == 1
    out = result.output
    assert "5 problem(s)" in out, out
    for column, line in (("region", None), ("age", "file line 5"), ("sex", "file line 9"),
                         ("ward", "file line 13"), ("diagnosis", "file line 22")):
        assert column in out and (line is None or line in out), (column, out)
    assert "taxonomy" in out and "not whole numbers" in out and "missing value" in out
    assert "not in its declared domain" in out and "not covered by its taxonomy" in out
    assert SECRET not in out
    logs = list((home / "steward" / "logs").glob("validation-five-problems-*.txt"))
    assert len(logs) == 1 and SECRET in logs[0].read_text()  # the steward's own log has them
    assert not (home / "ledger.sqlite").exists()  # nothing spent, no ledger touched


def test_check_shows_the_release_it_would_run(home: Path) -> None:
    result = CliRunner().invoke(app, ["check", "nps-sample"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "no problems" in result.output and "aim" in result.output
    assert "workload marginals" in result.output and "nothing spent" in result.output
    snapshots = home / "steward" / "snapshots"  # the copies it read are raw data: gone
    assert not snapshots.exists() or not any(snapshots.iterdir())


def test_check_holds_the_plan_to_the_flows_work_limits(home: Path) -> None:
    """``check`` plans exactly as the flow does (``plan_for_config``): a DiffGen cut whose noise
    would pass ``max_noise_rows`` is a problem here too, not only once the release runs."""
    result = CliRunner().invoke(app, ["check", "adult", "--mechanism", "diffgen",
                                      "--epsilon", "0.01"], env=WIDE)
    assert result.exit_code == 1, result.output
    assert "max_noise_rows" in " ".join(result.output.split()), result.output
    assert not (home / "ledger.sqlite").exists()


def test_init_and_check_never_import_prefect(tmp_path: Path, home: Path) -> None:
    generated_visits(tmp_path / "visits.csv", rows=300)
    script = textwrap.dedent(f"""\
        import sys
        from deployments.cli import app
        for argv in (["init", {str(tmp_path / 'visits.csv')!r}, "--name", "visits", "--root",
                      {str(home / 'datasets')!r}, "--informative", "outcome"],
                     ["check", "visits"]):
            try:
                app(argv)
            except SystemExit as exc:
                assert not exc.code, exc.code
        print("PREFECT" if any(m.split(".")[0] == "prefect" for m in sys.modules) else "NONE")
        """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("NONE"), done.stdout[-2000:]


def mixed_spellings(path: Path, rows: int = 1500, seed: int = 5) -> None:
    """A table with no id (no unit, no nouns) whose informative column writes numbers both
    as 3 and as 3.0."""
    rng = np.random.default_rng(seed)
    score = rng.integers(0, 7, rows).astype(str)
    spelled = np.where(rng.random(rows) < 0.4, [f"{v}.0" for v in score], score)
    pd.DataFrame({"age": rng.integers(18, 91, rows), "sex": rng.choice(["F", "M"], rows),
                  "ward": rng.choice(["north", "south", "east"], rows),
                  "score": spelled}).to_csv(path, index=False)


def test_init_writes_numbers_one_way_and_the_engine_reads_them_so(tmp_path: Path,
                                                                   home: Path) -> None:
    from medrelease.data.aggregate import prepare_table
    from medrelease.data.input_schema import validate_input
    from medrelease.storage.io import read_input

    mixed_spellings(tmp_path / "scores.csv")
    assert _init(tmp_path / "scores.csv", "scores", home / "datasets", "--informative",
                 "score").exit_code == 0
    folder = home / "datasets" / "scores"
    spec = yaml.safe_load((folder / "dataset.yaml").read_text())
    assert spec["columns"]["score"]["type"] == "integer"
    values = (folder / "score_domain.txt").read_text().splitlines()
    assert [v for v in values if not v.startswith("#")] == [str(v) for v in range(7)]
    config = find_config("scores")
    frame = validate_input(read_input(config), config)  # the row-wise path
    assert set(frame["score"]) == {str(v) for v in range(7)}
    assert set(prepare_table(read_input(config), config)["score"]) == {str(v) for v in range(7)}
    # a hand-written domain listing both spellings of one number is refused, by name
    (folder / "score_domain.txt").write_text("0\n1\n2\n3\n3.0\n4\n5\n6\n")
    with pytest.raises(ConfigError, match=r"3 and 3\.0 are one"):
        find_config("scores").informative_domain  # noqa: B018


@pytest.mark.usefixtures("prefect_harness")
def test_mixed_spellings_publish_one_value_and_a_nounless_guarantee_says_row(
        tmp_path: Path, home: Path) -> None:
    """init -> release with 3 and 3.0 in the informative column publishes one value (the
    grouped DuckDB path); a config that names no nouns says 'one row', never 'admission'."""
    from flows.release import ReleaseRequest, release_flow

    mixed_spellings(tmp_path / "scores.csv")
    assert _init(tmp_path / "scores.csv", "scores", home / "datasets", "--informative",
                 "score").exit_code == 0
    path = home / "datasets" / "scores" / "dataset.yaml"
    text = "\n".join(line for line in path.read_text().splitlines()
                     if "_noun:" not in line) + "\n"
    path.write_text(text)
    assert "noun" not in yaml.safe_load(text)["privacy"]
    result = release_flow(ReleaseRequest(dataset="scores", mechanism="ipa", epsilon=1.0,
                                         evaluate=False))
    folder = Path(result["path"])
    released = pd.read_csv(folder / "data.csv", dtype=str)
    assert set(released["score"].dropna()) <= {str(v) for v in range(7)}
    assert "3" in set(released["score"])
    statement = json.loads((folder / "manifest.json").read_text())["guarantee"]["statement"]
    assert "one row of the extract, not one person or thing" in statement
    assert "admission" not in statement and "patient" not in statement


def test_the_row_note_speaks_the_configs_words(tmp_path: Path) -> None:
    from medrelease.plan import PublicFacts
    from medrelease.release import plan_release

    from ..conftest import write_paper_dataset

    nounless = plan_release("ipa", {"epsilon": 1.0}, 1, None,
                            PublicFacts.of(find_config(write_paper_dataset(tmp_path))))
    statement = nounless.guarantee.statement()
    assert "one row of the extract, not one person or thing" in statement
    assert "admission" not in statement and "patient" not in statement
    assert "row_noun" not in nounless.guarantee.as_dict()  # the record's fields are unchanged
    nps = plan_release("ipa", {"epsilon": 1.0}, 1, None, PublicFacts.of(find_config("nps-sample")))
    assert "(one admission), not one patient" in nps.guarantee.statement()


@pytest.mark.skipif(not (SHARED / "data" / "adult" / "adult.csv").is_file(),
                    reason="needs ../shared/data/adult")
def test_init_on_adult_drafts_a_config_check_passes(home: Path) -> None:
    """The real table of the benchmark (benchmarks/init_vs_handwritten.py): drafted with no
    edit, checked clean (docs/results/init.md has its release figures)."""
    root = home / "datasets"
    drafted = _init(SHARED / "data" / "adult" / "adult.csv", "adult-init", root,
                    "--informative", "occupation")
    assert drafted.exit_code == 0, drafted.output
    spec = yaml.safe_load((root / "adult-init" / "dataset.yaml").read_text())
    assert spec["columns"]["age"]["type"] == "integer" and "unit" not in spec["privacy"]
    checked = CliRunner().invoke(app, ["check", "adult-init"], env=WIDE)
    assert checked.exit_code == 0 and "no problems" in checked.output, checked.output
