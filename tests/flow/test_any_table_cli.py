"""Any table on the first try, through the real CLI (issue 55): init, check and release as a
steward types them, on generated tables (the engine's property over 200 tables is
``tests/unit/test_any_table.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from medrelease.data import shapes

from ..unit import test_any_table as engine_property

SECRET = engine_property.SECRET
home = engine_property.home  # the fixture: a MEDRELEASE_HOME per test

# -- through the real CLI: a handful ---------------------------------------------------------


@pytest.mark.usefixtures("prefect_harness")
def test_init_check_release_through_the_cli(home: Path, monkeypatch) -> None:
    """init, check and release as a steward types them, on the wide survey (aim, a count table
    with a code per column, through DuckDB's grouped pass) and on the cohort with ipa (its
    scoring reported as it goes): both published, no value of the table in any output."""
    from typer.testing import CliRunner

    from deployments import cli
    from deployments.cli import app

    monkeypatch.setattr(cli.console, "width", 200)
    runner = CliRunner()
    survey = shapes.wide_survey(rows=1500, columns=20, continuous=9)
    cohort = shapes.cohort_table(rows=1200, columns=11)
    cohort.frame.loc[3, "grade_5"] = SECRET
    for name, table, extra in (("survey", survey, []), ("cohort", cohort, ["--mechanism",
                                                                            "ipa"])):
        csv = table.write(home.parent / f"{name}.csv")
        out = runner.invoke(app, ["init", str(csv), "--name", name, "--root",
                                  str(home / "datasets"), "--informative", table.informative])
        assert out.exit_code == 0, out.output
        out = runner.invoke(app, ["check", name, *extra])
        assert out.exit_code == 0 and "no problems" in out.output, out.output
        out = runner.invoke(app, ["release", name, "--seed", "1", *extra])
        assert out.exit_code == 0, out.output
        assert "released" in out.output and SECRET not in out.output
        assert "Refusing to publish event" not in out.output
        # evaluated from the run's count table (a wide one; decimals in bins): the evidence
        # report is written (its line is there only when the evaluation succeeded)
        assert "evidence" in out.output, out.output
