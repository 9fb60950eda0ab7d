"""The budget ledger: spends add up, overspending is refused, races cannot overspend."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import pytest

from medrelease.errors import BudgetExceededError
from medrelease.ledger import Ledger


def _reserve(path: str, start, results) -> None:
    ledger = Ledger(path)
    start.wait()
    try:
        ledger.reserve("ds", 6.0, 0.0, "ipa", lifetime_epsilon=10.0, lifetime_delta=1e-5)
        results.put("ok")
    except BudgetExceededError as exc:
        results.put(f"refused: {exc}")


def test_spends_add_up_and_statuses_all_count(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    first = ledger.reserve("ds", 1.0, 1e-7, "ipa", 3.0, 1e-5, flow_run_id="run-1")
    second = ledger.reserve("ds", 1.5, 0.0, "ipa-paper", 3.0, 1e-5)
    ledger.mark(first, "released", release_id="r1")
    ledger.mark(second, "failed", note="crashed")
    state = ledger.state("ds", 3.0, 1e-5)
    assert state.epsilon_spent == pytest.approx(2.5)
    assert state.delta_spent == pytest.approx(1e-7)
    assert [s.status for s in ledger.spends("ds")] == ["released", "failed"]
    assert ledger.spends("other") == []


def test_over_budget_is_refused_with_spent_requested_total(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.reserve("ds", 2.5, 0.0, "ipa", 3.0, 1e-5)
    with pytest.raises(BudgetExceededError) as err:
        ledger.reserve("ds", 1.0, 0.0, "ipa", 3.0, 1e-5)
    assert "spent 2.5" in str(err.value) and "requested 1" in str(err.value)
    assert "total 3" in str(err.value)
    assert len(ledger.spends("ds")) == 1  # nothing written when refused
    with pytest.raises(BudgetExceededError, match="delta"):
        ledger.reserve("ds", 0.1, 1e-4, "ipa", 3.0, 1e-5)
    ledger.reserve("ds", 0.5, 0.0, "ipa", 3.0, 1e-5)  # exactly the rest is fine


def test_two_processes_racing_never_overspend(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.sqlite")
    Ledger(path)
    context = mp.get_context("spawn")
    for _ in range(3):
        start, results = context.Event(), context.Queue()
        procs = [context.Process(target=_reserve, args=(path, start, results)) for _ in range(2)]
        for p in procs:
            p.start()
        start.set()
        outcomes = sorted(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        spent = Ledger(path).state("ds", 10.0, 1e-5).epsilon_spent
        assert spent <= 10.0
        Path(path).unlink()
        for suffix in ("-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)
        Ledger(path)
        assert outcomes[0] == "ok" and outcomes[1].startswith("refused"), outcomes


def _reserve_then_die(path: str) -> None:
    Ledger(path).reserve("ds", 4.0, 0.0, "ipa", 10.0, 1e-5)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_crashed_runs_reservation_stays_counted(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.sqlite")
    proc = mp.get_context("spawn").Process(target=_reserve_then_die, args=(path,))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    ledger = Ledger(path)
    assert [s.status for s in ledger.spends("ds")] == ["reserved"]
    assert ledger.state("ds", 10.0, 1e-5).epsilon_spent == 4.0
    with pytest.raises(BudgetExceededError):
        ledger.reserve("ds", 7.0, 0.0, "ipa", 10.0, 1e-5)
