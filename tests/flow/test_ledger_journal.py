"""Issue 36, "The ledger as system of record" (cases 8-13 and the lifetime-budget mixing note).

The journal beside the ledger is the system of record: every reservation (with its whole
request), outcome and cap change is appended there before it commits. A ledger that differs
from it — a table dropped, a cap edited, a failed spend deleted, the journal removed — is
refused before any charge; ``ledger restore`` replays it (claims, inputs, policy, owner config
included). Each refusal here is checked for "nothing spent, nothing published".
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from deployments.cli import app
from flows.release import ReleaseRequest, release_flow
from medrelease.errors import ConfigError, PolicyError
from medrelease.privacy.ledger import Ledger, LedgerIntegrityError, LedgerSourceError

from ..conftest import write_paper_dataset
from ..served.test_ledger import _request

KANON_ALLOWED = {"mechanisms": ["ipa", "kanon"], "allow_unproven": True, "min_k": 2}


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MEDRELEASE_INPUT_ROOTS", raising=False)
    return tmp_path / "home"


def _unwrapped(output: str) -> str:
    return " ".join(output.split())


def _dataset(folder: Path, name: str = "paper-example", **privacy_and_policy) -> Path:
    """The paper's Table 5 dataset in its own folder (same bytes in every folder), renamed,
    with ``source``/``policy``/unit edits."""
    folder.mkdir(parents=True)
    path = write_paper_dataset(folder)
    spec = yaml.safe_load(path.read_text())
    spec["name"] = name
    if "policy" in privacy_and_policy:
        spec["policy"] = privacy_and_policy.pop("policy")
    spec["privacy"].update(privacy_and_policy)
    path.write_text(yaml.safe_dump(spec))
    return path


def _release(config: Path, **fields) -> dict:
    return release_flow(ReleaseRequest(dataset=str(config), evaluate=False, **fields))


def _spent_and_published(home: Path) -> tuple[int, int]:
    ledger = home / "ledger.sqlite"
    spends = len(Ledger(ledger).spends()) if ledger.is_file() else 0
    published = [p for store in ("releases", "test-releases") if (home / store).exists()
                 for p in (home / store).rglob("*") if p.is_file()]
    return spends, len(published)


def _sql(home: Path, statement: str) -> None:
    with sqlite3.connect(home / "ledger.sqlite") as conn:
        conn.execute(statement)


def _move_ledger_aside(home: Path, journal_too: bool = False) -> None:
    for suffix in ("", "-wal", "-shm"):
        path = home / f"ledger.sqlite{suffix}"
        if path.exists():
            path.rename(home / f"aside-ledger.sqlite{suffix}")
    if journal_too:
        for journal in home.glob("ledger.sqlite.*jsonl"):
            journal.unlink()


# -- 8: restore rebuilds content claims, inputs, the policy and its owner --------------------

@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("lost", ["ledger", "ledger and journal"])
def test_restore_rebuilds_content_claims_inputs_policy_and_owner(home: Path, tmp_path: Path,
                                                                 lost: str) -> None:
    """Before: restore rebuilt spends only; a byte-identical copy under another source and a
    looser YAML of the same source (kanon k=2) were both released after it."""
    config = _dataset(tmp_path / "first")
    _release(config)
    _move_ledger_aside(home, journal_too=lost == "ledger and journal")
    restored = CliRunner().invoke(app, ["ledger", "restore"])
    assert restored.exit_code == 0, restored.output
    assert "restored 1 spend" in _unwrapped(restored.output)
    policy, owner = Ledger(home / "ledger.sqlite").source_policy("paper-example")
    assert Path(owner).resolve() == config.resolve()
    assert json.loads(policy)["allow_unproven"] is False
    before = _spent_and_published(home)

    copy = _dataset(tmp_path / "copy", name="copy", source="fresh-budget")
    with pytest.raises(LedgerSourceError, match="already charged to source 'paper-example'"):
        _release(copy)
    loose = _dataset(tmp_path / "loose", name="loose", source="paper-example",
                     policy=KANON_ALLOWED)
    with pytest.raises(PolicyError, match=r"policy of source 'paper-example'.*first released"):
        _release(loose, mechanism={"mechanism": "kanon", "k": 2},
                 void_lifetime_guarantee=True)
    assert _spent_and_published(home) == before


# -- 9 and 13: a void lifetime is said by the release that voids it, and never lost --------

@pytest.mark.usefixtures("prefect_harness")
def test_a_kanon_release_says_itself_that_the_lifetime_is_void(home: Path,
                                                               tmp_path: Path) -> None:
    """Before: the kanon release's own manifest said "void": false and "(0, 0)-DP together";
    only later manifests said VOID."""
    config = _dataset(tmp_path / "ds", policy=KANON_ALLOWED)
    result = _release(config, mechanism={"mechanism": "kanon", "k": 2},
                 void_lifetime_guarantee=True)
    lifetime = result["manifest"]["lifetime"]
    assert lifetime["void"] is True and "kanon" in lifetime["void_reason"]
    assert lifetime["statement"].startswith("Lifetime guarantee VOID")
    report = (Path(result["path"]) / "report.md").read_text()
    section = report.split("## Lifetime of the source", 1)[1].split("##", 1)[0]
    assert "Lifetime guarantee VOID" in section and "-DP (" not in section


@pytest.mark.usefixtures("prefect_harness")
def test_a_dropped_sources_table_is_detected_and_the_void_survives_restore(
        home: Path, tmp_path: Path) -> None:
    """Before: DROP TABLE sources after a kanon release was silently rebuilt, and the next
    manifest said "(1, 2e-06)-DP", no longer VOID."""
    config = _dataset(tmp_path / "ds", policy=KANON_ALLOWED)
    _release(config, mechanism={"mechanism": "kanon", "k": 2},
                 void_lifetime_guarantee=True)
    _sql(home, "DROP TABLE sources")
    before = _spent_and_published(home)
    with pytest.raises(LedgerIntegrityError,
                       match=r"source 'paper-example' is in the journal but missing from the "
                             r"ledger.*is VOID \(a kanon release.*nothing was spent"):
        _release(config)
    assert _spent_and_published(home) == before
    verify = CliRunner().invoke(app, ["ledger", "verify"])
    assert verify.exit_code == 1 and "LedgerIntegrityError" in verify.output
    assert "source 'paper-example' is in the journal but missing" in _unwrapped(verify.output)

    _move_ledger_aside(home)
    assert CliRunner().invoke(app, ["ledger", "restore"]).exit_code == 0
    assert CliRunner().invoke(app, ["ledger", "verify"]).exit_code == 0
    lifetime = _release(config)["manifest"]["lifetime"]
    assert lifetime["void"] is True and "VOID" in lifetime["statement"]


# -- 10: caps edited outside set-cap, with or without the journal ----------------------------

@pytest.mark.usefixtures("prefect_harness")
def test_a_cap_edited_in_sqlite_is_detected(home: Path, tmp_path: Path) -> None:
    """Before: a source whose cap was never changed with set-cap had no journal entry, so an
    edited cap went unnoticed ("epsilon 3 of 1000")."""
    config = _dataset(tmp_path / "ds", lifetime_epsilon=3.0)
    _release(config)
    _sql(home, "UPDATE sources SET lifetime_epsilon = 1000 WHERE source = 'paper-example'")
    before = _spent_and_published(home)
    with pytest.raises(LedgerIntegrityError,
                       match=r"source 'paper-example' differs from the journal in "
                             r"lifetime_epsilon \(the ledger's cap is epsilon 1000.*its journal "
                             r"says epsilon 3, .*fixed at its first spend"):
        _release(config)
    assert _spent_and_published(home) == before


@pytest.mark.usefixtures("prefect_harness")
def test_a_journal_deleted_then_a_cap_edited_is_detected(home: Path, tmp_path: Path) -> None:
    config = _dataset(tmp_path / "ds")
    _release(config)
    Ledger(home / "ledger.sqlite").set_cap("paper-example", 3.0, 1e-5, "lowered by the board")
    assert Ledger(home / "ledger.sqlite").journal_path.is_file()
    for journal in home.glob("ledger.sqlite.*jsonl"):
        journal.unlink()
    _sql(home, "UPDATE sources SET lifetime_epsilon = 100 WHERE source = 'paper-example'")
    before = _spent_and_published(home)
    with pytest.raises(LedgerIntegrityError, match=r"its journal .*journal\.jsonl, the system of "
                                                   r"record, is missing.*Nothing was spent"):
        _release(config)
    assert _spent_and_published(home) == before


# -- 11: every spend journaled (reservation and outcome); a deleted failed spend detected ----

@pytest.mark.usefixtures("prefect_harness")
def test_deleting_failed_spends_is_detected(home: Path, tmp_path: Path) -> None:
    """Before: DELETE FROM spends WHERE status='failed' went unnoticed (a failed run leaves no
    steward record, and only caps were journaled)."""
    config = _dataset(tmp_path / "ds")
    _release(config)
    ledger = Ledger(home / "ledger.sqlite")
    failed = ledger.reserve(_request("paper-example", 1.0, dataset="paper-example", cap=100.0))
    ledger.mark(failed, "failed", note="MemoryError: after the charge")
    events = [json.loads(line) for line in ledger.journal_path.read_text().splitlines()]
    assert [(e["event"], e.get("status")) for e in events if e.get("spend_id") == failed] == [
        ("reserve", None), ("outcome", "failed")]
    _sql(home, "DELETE FROM spends WHERE status = 'failed'")
    before = _spent_and_published(home)
    with pytest.raises(LedgerIntegrityError,
                       match=rf"spend {failed} of source 'paper-example' \(failed, epsilon 1\) "
                             r"is in the journal but missing from the ledger"):
        _release(config)
    assert _spent_and_published(home) == before


def test_an_outcome_the_journal_cannot_take_is_not_made(tmp_path: Path) -> None:
    """The journal line is written before the ledger commits: when it cannot be written, the
    change is not made either (a reservation is refused earlier: its check finds no journal)."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    kept = ledger.reserve(_request("ds", 1.0))
    ledger.journal_path.rename(tmp_path / "journal-aside")
    ledger.journal_path.mkdir()  # the journal cannot be appended to
    with pytest.raises(IsADirectoryError):
        ledger.mark(kept, "released", release_id="r1")
    with pytest.raises(LedgerIntegrityError, match=r"journal.*is missing"):
        ledger.reserve(_request("ds", 1.0))
    ledger.journal_path.rmdir()
    (tmp_path / "journal-aside").rename(ledger.journal_path)
    assert [(s.spend_id, s.status) for s in ledger.spends()] == [(kept, "reserved")]
    ledger.verify()


def test_an_older_ledger_is_refused_until_migrated_then_checked(tmp_path: Path) -> None:
    """A ledger written before the journal held spends, and lacked the columns added since: it
    is refused at open with the command that migrates it; ``ledger migrate`` adds the columns
    and journals its rows as one snapshot, and it is checked from then on."""
    from medrelease.privacy.ledger_migrate import migrate_sqlite

    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    ledger.reserve(_request("ds", 2.0))
    ledger.journal_path.unlink()
    ledger.heads.path.unlink()  # (an older version kept no head)
    with sqlite3.connect(path) as conn:  # as an older version left it
        conn.execute("PRAGMA user_version = 0")
        conn.execute("ALTER TABLE spends DROP COLUMN privacy_unit")
    with pytest.raises(LedgerIntegrityError, match=r"older version of medrelease \(its tables "
                                                   r"lack spends\.privacy_unit; it holds spends "
                                                   r"but was written before the journal\)"
                                                   r".*'medrelease ledger migrate'"):
        Ledger(path)
    done = migrate_sqlite(path)
    assert len(done) == 2 and "privacy_unit" in done[0] and "1 spend(s)" in done[1]
    assert migrate_sqlite(path) == []  # nothing is migrated twice
    Ledger(path).verify()
    [adopted] = [json.loads(line) for line in ledger.journal_path.read_text().splitlines()]
    assert adopted["event"] == "adopt" and len(adopted["tables"]["spends"]) == 1
    assert adopted["chain"]["seq"] == 1
    _sql(tmp_path, "UPDATE spends SET epsilon = 0")
    with pytest.raises(LedgerIntegrityError, match="differs from the journal in epsilon"):
        Ledger(path).reserve(_request("ds", 1.0))


# -- 12 (the YAML half): a new source's first cap is held to set-cap's bounds ----------------

def test_a_new_sources_first_cap_is_held_to_the_set_cap_bounds(tmp_path: Path) -> None:
    """The ledger's own check (the flow refuses earlier, before reading: the corpus cases)."""
    ledger = Ledger(tmp_path / "ledger.sqlite")
    with pytest.raises(ConfigError, match=r"lifetime epsilon 1e\+300.*0 < epsilon <= 100"):
        ledger.reserve(_request("new", 1.0, cap=1e300))
    with pytest.raises(ConfigError, match=r"delta 0\.9 .*0 <= delta <= 0\.01.*Nothing was spent"):
        ledger.reserve(_request("new", 1.0, cap_delta=0.9))
    assert ledger.spends() == [] and ledger.sources() == []
    assert not ledger.journal_path.exists()
    ledger.reserve(_request("new", 1.0, cap=10.0))
    ledger.reserve(_request("new", 1.0, cap=1e300))  # a known source: the ledger's cap applies
    assert ledger.state("new").lifetime_epsilon == 10.0


# -- the lifetime-budget mixing note ---------------------------------------------------------

@pytest.mark.usefixtures("prefect_harness")
def test_mixed_privacy_units_are_said_in_every_later_manifest(home: Path,
                                                              tmp_path: Path) -> None:
    """Before: "(2, ...)-DP" with no caveat after a row-level and a patient-level release of
    one source."""
    rows = _dataset(tmp_path / "rows", name="rows", source="ward")
    table = (tmp_path / "rows" / "table5.csv")
    text = table.read_text().splitlines()
    with_ids = "\n".join([text[0] + ",pid"] + [f"{line},p{i // 2}"
                                                for i, line in enumerate(text[1:])]) + "\n"
    table.write_text(with_ids)
    spec = yaml.safe_load(rows.read_text())
    spec["columns"]["pid"] = {"role": "identifier"}
    rows.write_text(yaml.safe_dump(spec))
    patients = tmp_path / "patients"
    shutil.copytree(tmp_path / "rows", patients)
    spec.update(name="patients")
    spec["privacy"].update(unit="pid", max_rows_per_unit=2)
    (patients / "dataset.yaml").write_text(yaml.safe_dump(spec))

    first = _release(rows)["manifest"]["lifetime"]
    assert not first["mixed_units"] and "together are (1, " in first["statement"]
    second = _release(patients / "dataset.yaml")["manifest"]
    assert "add/remove one patient" in second["guarantee"]["neighbouring"]
    for lifetime in (second["lifetime"], _release(rows)["manifest"]["lifetime"]):
        assert lifetime["mixed_units"] is True
        statement = lifetime["statement"]
        assert "MIXED PRIVACY UNITS" in statement and "-DP" not in statement
        assert "under add/remove one row: epsilon" in statement
        assert "under add/remove one patient (all rows with one pid" in statement
        assert [u["neighbouring"][:21] for u in lifetime["privacy_units"]] == [
            "add/remove one row", "add/remove one patien"]
