"""The budget ledger: spends add up, overspending is refused, races cannot overspend."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import pytest

from medrelease.errors import BudgetExceededError, MedreleaseError
from medrelease.privacy.ledger import Ledger, LedgerSourceError, SpendRequest
from medrelease.privacy.ledger_backends import open_ledger


def _request(source: str, epsilon: float, delta: float = 0.0, mechanism: str = "ipa",
             cap: float = 10.0, cap_delta: float = 1e-5, **extra) -> SpendRequest:
    return SpendRequest(source=source, dataset=extra.pop("dataset", source),
                        mechanism=mechanism, epsilon=epsilon, delta=delta,
                        lifetime_epsilon=cap, lifetime_delta=cap_delta, **extra)


def _reserve(location: str, start, results) -> None:
    ledger = open_ledger(location)
    start.wait()
    try:
        ledger.reserve(_request("ds", 6.0))
        results.put("ok")
    except BudgetExceededError as exc:
        results.put(f"refused: {exc}")


def test_spends_add_up_and_statuses_all_count(ledger_at: str) -> None:
    ledger = open_ledger(ledger_at)
    first = ledger.reserve(_request("ds", 1.0, 1e-7, cap=3.0, flow_run_id="run-1"))
    second = ledger.reserve(_request("ds", 1.5, mechanism="ipa-paper", cap=3.0))
    ledger.mark(first, "released", release_id="r1")
    ledger.mark(second, "failed", note="crashed")
    state = ledger.state("ds", 3.0, 1e-5)
    assert state.epsilon_spent == pytest.approx(2.5)
    assert state.delta_spent == pytest.approx(1e-7)
    assert [s.status for s in ledger.spends("ds")] == ["released", "failed"]
    assert ledger.spends("other") == []


def test_over_budget_is_refused_with_spent_requested_total(ledger_at: str) -> None:
    ledger = open_ledger(ledger_at)
    ledger.reserve(_request("ds", 2.5, cap=3.0))
    with pytest.raises(BudgetExceededError) as err:
        ledger.reserve(_request("ds", 1.0, cap=3.0))
    assert "spent 2.5" in str(err.value) and "requested 1" in str(err.value)
    assert "total 3" in str(err.value)
    assert len(ledger.spends("ds")) == 1  # nothing written when refused
    with pytest.raises(BudgetExceededError, match="delta"):
        ledger.reserve(_request("ds", 0.1, 1e-4, cap=3.0))
    ledger.reserve(_request("ds", 0.5, cap=3.0))  # exactly the rest is fine


def test_two_processes_racing_never_overspend(new_ledger) -> None:
    context = mp.get_context("spawn")
    for _ in range(3):
        location = new_ledger()  # a new ledger each round (a new file, or a new database)
        open_ledger(location)
        start, results = context.Event(), context.Queue()
        procs = [context.Process(target=_reserve, args=(location, start, results))
                 for _ in range(2)]
        for p in procs:
            p.start()
        start.set()
        outcomes = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        spent = open_ledger(location).state("ds", 10.0, 1e-5).epsilon_spent
        assert spent <= 10.0
        assert outcomes[0] == "ok" and outcomes[1].startswith("refused"), outcomes


def _reserve_then_die(location: str) -> None:
    open_ledger(location).reserve(_request("ds", 4.0))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_crashed_runs_reservation_stays_counted(ledger_at: str) -> None:
    proc = mp.get_context("spawn").Process(target=_reserve_then_die, args=(ledger_at,))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    ledger = open_ledger(ledger_at)
    assert [s.status for s in ledger.spends("ds")] == ["reserved"]
    assert ledger.state("ds", 10.0, 1e-5).epsilon_spent == 4.0
    with pytest.raises(BudgetExceededError):
        ledger.reserve(_request("ds", 7.0))


def test_configs_over_one_extract_share_one_source(ledger_at: str) -> None:
    ledger = open_ledger(ledger_at)
    ledger.reserve(_request("census", 1.0, cap=1.5, dataset="adult", input_key="/d/adult.csv"))
    with pytest.raises(BudgetExceededError, match="census"):  # same source, other config
        ledger.reserve(_request("census", 1.0, cap=1.5, dataset="adult-ipa",
                                input_key="/d/adult.csv"))
    with pytest.raises(LedgerSourceError, match=r"privacy: \{source: census\}"):
        ledger.reserve(_request("adult-ipa", 1.0, dataset="adult-ipa", input_key="/d/adult.csv"))
    assert [s.dataset for s in ledger.spends()] == ["adult"]  # refusals wrote nothing


def test_cap_is_fixed_at_the_first_spend_and_changed_only_with_a_reason(ledger_at: str) -> None:
    ledger = open_ledger(ledger_at)
    ledger.reserve(_request("ds", 1.0, cap=1.0))
    with pytest.raises(BudgetExceededError, match="total 1"):  # the YAML now says 5: ignored
        ledger.reserve(_request("ds", 1.0, cap=5.0))
    state = ledger.state("ds", 5.0, 1e-5)
    assert state.lifetime_epsilon == 1.0 and "ledger's cap applies" in state.cap_note
    with pytest.raises(MedreleaseError, match="reason"):
        ledger.set_cap("ds", 5.0, 1e-5, "  ")
    with pytest.raises(MedreleaseError, match="cannot go below"):
        ledger.set_cap("ds", 0.5, 1e-5, "tighter, per the board")
    ledger.set_cap("ds", 5.0, 1e-5, "board approved 2026-11 (minute 12)")
    ledger.reserve(_request("ds", 1.0, cap=1.0))
    [change] = ledger.cap_changes("ds")
    assert change[1:3] == (1.0, 5.0) and "board approved" in change[5]


def test_a_non_dp_spend_voids_the_lifetime_guarantee(ledger_at: str) -> None:
    ledger = open_ledger(ledger_at)
    ledger.reserve(_request("ds", 1.0))
    assert not ledger.state("ds").void and "together are (1, 0)-DP" in ledger.state(
        "ds").statement()
    refused = ledger.reserve(_request("ds", 0.0, mechanism="kanon", dp=False))
    ledger.mark(refused, "failed", note="no key")
    assert not ledger.state("ds").void  # a run that published nothing voids nothing
    kanon = ledger.reserve(_request("ds", 0.0, mechanism="kanon", dp=False))
    ledger.mark(kanon, "released", release_id="k1")
    ledger.reserve(_request("ds", 1.0, test=True))
    state = ledger.state("ds")
    assert state.void and "kanon" in state.void_reason and "VOID" in state.statement()
    assert state.epsilon_spent == 2.0 and state.test_epsilon_spent == 1.0
    assert [s.test for s in ledger.spends("ds")] == [False, False, False, True]


def test_an_old_ledger_is_refused_then_migrated_in_place(tmp_path: Path, monkeypatch) -> None:
    """A ledger of the first schema (no source, no journal): refused at open with the command,
    then ``medrelease ledger migrate`` brings it to this version, its budget as it was."""
    import sqlite3

    from typer.testing import CliRunner

    from deployments.cli import app
    from medrelease.privacy.ledger import LedgerIntegrityError

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path))
    path = tmp_path / "ledger.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript("""
            CREATE TABLE spends (spend_id TEXT PRIMARY KEY, dataset TEXT NOT NULL,
              mechanism TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL,
              lifetime_epsilon REAL NOT NULL, lifetime_delta REAL NOT NULL, flow_run_id TEXT,
              status TEXT NOT NULL, release_id TEXT, note TEXT, created_at TEXT NOT NULL,
              updated_at TEXT NOT NULL);
            INSERT INTO spends VALUES ('a', 'nps', 'ipa', 2.0, 0.0, 4.0, 1e-5, NULL,
              'released', 'r1', NULL, '2026-01-01', '2026-01-01');""")
    with pytest.raises(LedgerIntegrityError, match="ledger migrate"):
        Ledger(path)
    migrated = CliRunner().invoke(app, ["ledger", "migrate"])
    assert migrated.exit_code == 0, migrated.output
    assert "added the column(s)" in migrated.output and "1 spend(s)" in migrated.output
    again = CliRunner().invoke(app, ["ledger", "migrate"])
    assert again.exit_code == 0 and "nothing changed" in again.output
    ledger = Ledger(path)
    [spend] = ledger.spends("nps")
    assert spend.source == "nps" and not spend.test and spend.dp
    assert ledger.state("nps").lifetime_epsilon == 4.0
    with pytest.raises(BudgetExceededError):
        ledger.reserve(_request("nps", 2.5, cap=100.0))


def _unwrapped(output: str) -> str:
    """CLI output with the console's line wrapping undone (its width is the terminal's)."""
    return " ".join(output.split())


@pytest.mark.usefixtures("prefect_harness")
def test_a_lost_ledger_is_refused_then_restored_from_the_records(tmp_path: Path,
                                                                  monkeypatch) -> None:
    """Deleting the ledger used to start a new empty one: the budget restarted from zero."""
    from typer.testing import CliRunner

    from deployments.cli import app
    from flows.release import ReleaseRequest, release_flow
    from medrelease.privacy.ledger import LedgerIntegrityError

    from ..conftest import write_paper_dataset

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    (tmp_path / "ds").mkdir()
    config = str(write_paper_dataset(tmp_path / "ds"))
    release_flow(ReleaseRequest(dataset=config, evaluate=False))
    ledger = tmp_path / "home" / "ledger.sqlite"
    ledger.unlink()
    with pytest.raises(LedgerIntegrityError, match=r"is missing the spends of 1 release.*ledger restore"):
        release_flow(ReleaseRequest(dataset=config, evaluate=False))
    assert not ledger.exists()

    refused = CliRunner().invoke(app, ["ledger", "init"])
    assert refused.exit_code != 0 and "ledger restore" in _unwrapped(refused.output)
    restored = CliRunner().invoke(app, ["ledger", "restore"])
    assert restored.exit_code == 0 and "restored 1 spend" in _unwrapped(restored.output)
    assert Ledger(ledger).state("paper-example").epsilon_spent == pytest.approx(1.0)
    again = CliRunner().invoke(app, ["ledger", "restore"])
    assert again.exit_code != 0 and "already holds spends" in _unwrapped(again.output)

    release_flow(ReleaseRequest(dataset=config, evaluate=False))
    assert Ledger(ledger).state("paper-example").epsilon_spent == pytest.approx(2.0)


def test_ledger_init_makes_a_new_ledger_only_where_nothing_is_on_record(tmp_path: Path,
                                                                        monkeypatch) -> None:
    from typer.testing import CliRunner

    from deployments.cli import app

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    made = CliRunner().invoke(app, ["ledger", "init"])
    assert made.exit_code == 0 and (tmp_path / "home" / "ledger.sqlite").is_file()


def test_a_run_that_published_cannot_spend_again(ledger_at: str) -> None:
    """Prefect's Retry on a finished release re-runs it under the same run id: refused before
    any row is written, whether the run published or failed after its charge (issue 25: a
    retry of a run whose publish failed was charged a second time)."""
    from medrelease.errors import PolicyError

    ledger = open_ledger(ledger_at)
    failed = ledger.reserve(_request("ds", 1.0, flow_run_id="run-7"))
    ledger.mark(failed, "failed", note="crashed")
    with pytest.raises(PolicyError, match=r"already charged .*'failed'.*Nothing was spent"):
        ledger.reserve(_request("ds", 1.0, flow_run_id="run-7"))
    published = ledger.reserve(_request("ds", 1.0, flow_run_id="run-6"))
    ledger.mark(published, "released", release_id="r6")
    with pytest.raises(PolicyError, match=r"already published release r6.*Nothing was spent"):
        ledger.reserve(_request("ds", 1.0, flow_run_id="run-6"))
    assert ledger.state("ds", 10.0, 1e-5).epsilon_spent == pytest.approx(2.0)
    ledger.reserve(_request("ds", 1.0, flow_run_id="run-8"))  # a new run releases again


def test_the_budget_artifact_shows_nothing_left_where_the_guarantee_is_void(ledger_at: str) -> None:
    """Issue 27: "7.5 left" stood beside "Lifetime guarantee VOID"; the note pointed at a
    guarantee "above" that the artifact does not show."""
    from tasks.report import budget_markdown

    ledger = open_ledger(ledger_at)
    ledger.reserve(_request("ds", 1.0))
    assert "| left |" in budget_markdown(ledger.state("ds"), ledger.spends("ds"))
    kanon = ledger.reserve(_request("ds", 0.0, mechanism="kanon", dp=False))
    ledger.mark(kanon, "released", release_id="k1")
    text = budget_markdown(ledger.state("ds"), ledger.spends("ds"))
    assert "| left |" not in text and "room under the cap (guarantee VOID)" in text
    assert "above" not in text and "in its manifest, still holds" in text


def test_another_hosts_release_is_waited_for_and_a_lost_one_still_refused(monkeypatch) -> None:
    """Two hosts, one ledger, one shared release store, a steward folder each: host A's
    manifest is out before its spend takes its release id, and its record is on host A (the
    two-hosts test was refused so, on a slow machine). Host B's check reads the ledger again
    while only published releases are missing: A's finalized spend is then found. A manifest
    still missing after the last read, or a spend on record that is missing, is refused at
    once or then, as before."""
    from medrelease.privacy import ledger as module
    from medrelease.privacy.ledger import LedgerIntegrityError, refuse_releases_not_in_settled

    monkeypatch.setattr(module, "MANIFEST_SETTLE_S", 0.01)
    reads: list[int] = []

    def finalized_on_the_second_read() -> tuple[set[str], set[str]]:
        reads.append(1)
        return {"SA"}, ({"RA"} if len(reads) >= 2 else set())

    refuse_releases_not_in_settled("L", "does not hold", finalized_on_the_second_read, [],
                                   [{"release_id": "RA"}])
    assert len(reads) == 2
    with pytest.raises(LedgerIntegrityError, match=r"\(RB"):  # never finalized: refused
        refuse_releases_not_in_settled("L", "does not hold", lambda: ({"SA"}, set()), [],
                                       [{"release_id": "RB"}])
    reads.clear()
    with pytest.raises(LedgerIntegrityError, match=r"\(R1"):  # a lost spend: no second read
        refuse_releases_not_in_settled(
            "L", "does not hold", lambda: reads.append(1) or (set(), set()),
            [{"release_id": "R1", "ledger_spend_id": "S1"}], [{"release_id": "R2"}])
    assert len(reads) == 1


def test_a_release_published_while_the_ledger_is_checked_is_not_taken_for_a_lost_spend() -> None:
    """Another run's release, between its publishing and its finalized spend: its manifest is
    out, the ledger holds its spend without its release id yet. The check before a charge
    reads it then (two hosts racing for a PostgreSQL ledger's last budget hit exactly this):
    its steward record's spend accounts for it. A spend the ledger lacks is still refused."""
    from medrelease.privacy.ledger import LedgerIntegrityError, refuse_releases_not_in

    records = [{"release_id": "R1", "ledger_spend_id": "S1"}]
    manifests = [{"release_id": "R1"}]
    refuse_releases_not_in("the ledger", "does not hold", {"S1"}, set(), records, manifests)
    with pytest.raises(LedgerIntegrityError, match=r"the spends of 1 release\(s\) on record \(R1"):
        refuse_releases_not_in("the ledger", "does not hold", set(), set(), records, manifests)
    with pytest.raises(LedgerIntegrityError, match=r"\(R2"):  # a manifest with no record
        refuse_releases_not_in("the ledger", "does not hold", {"S1"}, set(), records,
                               [*manifests, {"release_id": "R2"}])
