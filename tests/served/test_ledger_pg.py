"""The PostgreSQL ledger (issue 40): append-only for the service role, cap changes only through
the journaling function, tampering by the owner role detected, restore into a new database.

The rules shared with SQLite run on both back-ends in tests/served/test_ledger.py (``ledger_at``).
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
from typer.testing import CliRunner

from deployments.cli import app
from medrelease.errors import MedreleaseError
from medrelease.privacy.ledger import LedgerIntegrityError
from medrelease.privacy.ledger_backends import open_ledger
from medrelease.privacy.ledger_pg import SCHEMA_VERSION, init_db

from ..flow.test_ledger_journal import _dataset, _release
from .test_ledger import _request

TABLES = ("ledger_events", "spend_reservations", "spend_outcomes", "source_caps",
          "source_policies", "content_claims", "source_inputs", "cap_changes")


@pytest.fixture
def pg_home(tmp_path: Path, monkeypatch, pg_cluster) -> dict:
    """A release setup whose ledger is a fresh database, reached as the service role."""
    database = pg_cluster.fresh_database()
    url = pg_cluster.url(database, "medrelease_service")
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MEDRELEASE_LEDGER_URL", url)
    monkeypatch.delenv("MEDRELEASE_INPUT_ROOTS", raising=False)
    return {"home": tmp_path / "home", "url": url, "owner_url": pg_cluster.url(database),
            "cluster": pg_cluster}


def _as_owner(owner_url: str, *statements: str) -> None:
    """What a database owner (or a DBA with its role) can still do: edit and delete rows."""
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("SET ROLE medrelease_owner")
        conn.execute("SET search_path = medrelease")
        for statement in statements:
            conn.execute(statement)


def _spent_and_published(setup: dict) -> tuple[int, int]:
    spends = len(open_ledger(setup["url"]).spends())
    home = setup["home"]
    published = [p for store in ("releases", "test-releases") if (home / store).exists()
                 for p in (home / store).rglob("*") if p.is_file()]
    return spends, len(published)


def _unwrapped(output: str) -> str:
    return " ".join(output.split())


def test_the_service_role_can_only_read_and_append(pg_home: dict) -> None:
    """UPDATE, DELETE, TRUNCATE and DDL on every ledger table are refused by the database
    itself; a cap changes only through medrelease_set_cap (which journals it)."""
    ledger_at = pg_home["url"]
    ledger = open_ledger(ledger_at)
    spend = ledger.reserve(_request("ds", 1.0, input_key="/d/ds.csv", content=("abc",),
                                    policy="{}"))
    ledger.mark(spend, "released", release_id="r1")
    ledger.set_cap("ds", 5.0, 1e-5, "board approved (minute 12)")  # through the function
    with psycopg.connect(ledger_at, autocommit=True) as conn:
        for table in TABLES:
            for statement in (f"DELETE FROM {table}", f"UPDATE {table} SET seq = seq"
                              if table != "cap_changes" else "UPDATE cap_changes SET reason = ''",
                              f"TRUNCATE {table}", f"DROP TABLE {table}",
                              f"ALTER TABLE {table} ADD COLUMN x int"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # caps: the function only
            conn.execute("INSERT INTO cap_changes VALUES (2, 'ds', 5, 100, 1e-5, 1e-5, "
                         "'more please', 'now')")
        with pytest.raises(psycopg.errors.RaiseException, match="only by medrelease_set_cap"):
            conn.execute("INSERT INTO ledger_events (seq, at, kind, body, prev_hash, hash) "
                         "VALUES (99, 'now', 'cap', '{}', 'x', 'y')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE medrelease.extra (x int)")
        with pytest.raises(psycopg.errors.RaiseException, match="cannot go below"):
            conn.execute("SELECT medrelease_set_cap('ds', 0.5, 1e-5, 'lower than spent')")
    ledger.verify()
    assert [s.status for s in ledger.spends()] == ["released"]
    assert [c.new_epsilon for c in ledger.cap_changes("ds")] == [5.0]
    assert ledger.state("ds").lifetime_epsilon == 5.0


def test_a_service_refuses_a_database_without_the_ledger_schema(pg_cluster) -> None:
    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE empty_ledger_db")
    try:
        with pytest.raises(MedreleaseError, match=r"holds no budget ledger.*ledger init-db"):
            open_ledger(pg_cluster.url("empty_ledger_db"))
        url, applied = init_db(pg_cluster.url("empty_ledger_db"))
        assert applied == list(range(1, SCHEMA_VERSION + 1))  # every migration, in order
        assert url.endswith(f"medrelease_service@127.0.0.1:{pg_cluster.port}/empty_ledger_db")
        again = CliRunner().invoke(app, ["ledger", "init-db", "--admin-url",
                                         pg_cluster.url("empty_ledger_db")])
        assert again.exit_code == 0 and "already up to date" in again.output  # idempotent
        assert f"MEDRELEASE_LEDGER_URL={url}" in _unwrapped(again.output)
        assert open_ledger(url).spends() == []
    finally:
        with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
            conn.execute("DROP DATABASE empty_ledger_db")


@pytest.mark.usefixtures("prefect_harness")
def test_rows_the_owner_deletes_are_detected_before_any_charge(pg_home: dict,
                                                               tmp_path: Path) -> None:
    """A failed spend deleted (outcome, reservation and its journal event) by the owner role:
    the chain breaks; the newest events removed with their rows: the head this host saw is
    gone. Both refuse the next release with nothing spent and nothing published, and 'ledger
    verify' says what differs."""
    config = _dataset(tmp_path / "ds")
    _release(config)
    ledger = open_ledger(pg_home["url"])
    failed = ledger.reserve(_request("paper-example", 1.0, dataset="paper-example", cap=100.0))
    ledger.mark(failed, "failed", note="MemoryError: after the charge")
    ledger.reserve(_request("paper-example", 0.5, dataset="paper-example", cap=100.0))
    ledger.verify()

    _as_owner(pg_home["owner_url"],  # the failed spend, and the middle of the chain
              f"DELETE FROM spend_outcomes WHERE spend_id = '{failed}'",
              f"DELETE FROM spend_reservations WHERE spend_id = '{failed}'")
    before = _spent_and_published(pg_home)
    with pytest.raises(LedgerIntegrityError,
                       match=rf"spend {failed} of source 'paper-example' \(failed, epsilon 1\) "
                             r"is in the journal but missing from the ledger"):
        _release(config)
    assert _spent_and_published(pg_home) == before
    verify = CliRunner().invoke(app, ["ledger", "verify"])
    assert verify.exit_code == 1 and f"spend {failed}" in _unwrapped(verify.output)

    _as_owner(pg_home["owner_url"], "DELETE FROM ledger_events WHERE body LIKE "
                                    f"'%{failed}%'")
    with pytest.raises(LedgerIntegrityError, match=r"ledger_events\) was altered: events "
                                                   r"\d+\.\.\d+ are missing"):
        _release(config)
    assert _spent_and_published(pg_home) == before

    # the newest event and its rows, removed together: the chain is whole again, but this
    # host saw that event (its head file)
    fresh = pg_home["cluster"].fresh_database()
    pg_home["url"] = pg_home["cluster"].url(fresh, "medrelease_service")
    ledger = open_ledger(pg_home["url"])
    kept = ledger.reserve(_request("ds", 1.0))
    newest = ledger.reserve(_request("ds", 2.0))
    _as_owner(pg_home["cluster"].url(fresh),
              "DELETE FROM ledger_events WHERE seq = (SELECT MAX(seq) FROM ledger_events)",
              f"DELETE FROM spend_reservations WHERE spend_id = '{newest}'")
    with pytest.raises(LedgerIntegrityError, match=r"no longer holds event 2 of its journal as "
                                                   r"this host saw it.*Nothing was spent"):
        ledger.reserve(_request("ds", 1.0))
    assert [s.spend_id for s in ledger.spends()] == [kept]


@pytest.mark.usefixtures("prefect_harness")
def test_a_cap_the_owner_edits_is_detected(pg_home: dict, tmp_path: Path) -> None:
    config = _dataset(tmp_path / "ds", lifetime_epsilon=3.0)
    _release(config)
    with pytest.raises(psycopg.errors.CheckViolation):  # beyond the bounds: not even the owner
        _as_owner(pg_home["owner_url"], "UPDATE source_caps SET lifetime_epsilon = 1000")
    _as_owner(pg_home["owner_url"], "UPDATE source_caps SET lifetime_epsilon = 50")
    before = _spent_and_published(pg_home)
    with pytest.raises(LedgerIntegrityError,
                       match=r"source 'paper-example' differs from the journal in "
                             r"lifetime_epsilon \(the ledger's cap is epsilon 50.*its journal "
                             r"says epsilon 3"):
        _release(config)
    assert _spent_and_published(pg_home) == before


@pytest.mark.usefixtures("prefect_harness")
def test_restore_into_a_new_database_from_records_or_a_sqlite_journal(
        pg_home: dict, tmp_path: Path, monkeypatch) -> None:
    """The database lost: a new one made by init-db, 'ledger restore' rebuilds from the
    steward records and manifests; a SQLite ledger moves to PostgreSQL with --from-journal
    (its claims, policy and owner config included)."""
    from medrelease.privacy.ledger import LedgerSourceError

    config = _dataset(tmp_path / "first")
    monkeypatch.delenv("MEDRELEASE_LEDGER_URL")
    _release(config)  # on the SQLite ledger of this home
    journal = pg_home["home"] / "ledger.sqlite.journal.jsonl"
    assert journal.is_file()
    monkeypatch.setenv("MEDRELEASE_LEDGER_URL", pg_home["url"])
    moved = CliRunner().invoke(app, ["ledger", "restore", "--from-journal", str(journal)])
    assert moved.exit_code == 0, moved.output
    assert "restored 1 spend" in _unwrapped(moved.output) and "1 from its journal" in \
        _unwrapped(moved.output)
    ledger = open_ledger(pg_home["url"])
    policy, owner = ledger.source_policy("paper-example")
    assert Path(owner).resolve() == config.resolve() and json.loads(policy)
    copy = _dataset(tmp_path / "copy", name="copy", source="fresh-budget")
    with pytest.raises(LedgerSourceError, match="already charged to source 'paper-example'"):
        _release(copy)
    assert _release(config)["manifest"]["lifetime"]["epsilon_spent"] == pytest.approx(2.0)
    again = CliRunner().invoke(app, ["ledger", "restore"])
    assert again.exit_code != 0 and "already holds" in _unwrapped(again.output)

    fresh = pg_home["cluster"].fresh_database()  # the database lost: a new one, no journal
    monkeypatch.setenv("MEDRELEASE_LEDGER_URL",
                       pg_home["cluster"].url(fresh, "medrelease_service"))
    refused = CliRunner().invoke(app, ["ledger", "verify"])
    assert refused.exit_code == 1 and "does not hold the spends of 2 release(s)" in \
        _unwrapped(refused.output)
    restored = CliRunner().invoke(app, ["ledger", "restore"])
    assert restored.exit_code == 0 and "restored 2 spend" in _unwrapped(restored.output)
    assert CliRunner().invoke(app, ["ledger", "verify"]).exit_code == 0
    assert open_ledger(pg_home["cluster"].url(fresh, "medrelease_service")).state(
        "paper-example").epsilon_spent == pytest.approx(2.0)


def test_runs_carry_the_ledger_url_without_its_password(monkeypatch, pg_cluster) -> None:
    """Tasks are handed the ledger's location, and Prefect stores task parameters: the
    password stays in the variable, and the ledger takes it back from there."""
    from medrelease.privacy.ledger_pg import PostgresLedger
    from medrelease.settings import isolated_home, ledger_location

    url = pg_cluster.url(pg_cluster.fresh_database(), "medrelease_service").replace(
        "medrelease_service@", "medrelease_service:s3cret-pw@")
    monkeypatch.setenv("MEDRELEASE_LEDGER_URL", url)
    location = ledger_location()
    assert "s3cret" not in location and location == url.replace(":s3cret-pw", "")
    ledger = PostgresLedger(location)
    assert ledger.url == url and "s3cret" not in ledger.location
    with isolated_home(pg_cluster.folder):  # the audit's worlds: a SQLite ledger of their own
        assert ledger_location().endswith("ledger.sqlite")
