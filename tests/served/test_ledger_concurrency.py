"""Releases racing for one source's last budget (issue 40).

Three processes (as workers on several hosts would be) make four releases each of one source
whose lifetime cap admits five: exactly five are published, the seven others are refused at
the charge with nothing spent, and the ledger's sum stays within the cap. At the ledger level
(reserve, then mark released) on both back-ends; as whole Prefect releases (each process its
own Prefect client) on PostgreSQL, the multi-host back-end — on SQLite that costs another
minute and adds nothing the ledger-level race does not show.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest

from medrelease.privacy.ledger_backends import open_ledger

from .test_ledger import _request

# each release spends epsilon 1; the module stays light to import: the spawned processes do
PROCESSES, RELEASES_EACH, CAP = 3, 4, 5.0


def _charge_several(location: str, start, results) -> None:
    from medrelease.errors import BudgetExceededError

    ledger = open_ledger(location)
    start.wait()
    for number in range(RELEASES_EACH):
        try:
            spend = ledger.reserve(_request("ds", 1.0, cap=CAP))
        except BudgetExceededError as exc:
            results.put(("refused", str(exc)))
            continue
        ledger.mark(spend, "released", release_id=f"r-{os.getpid()}-{number}")
        results.put(("published", spend))


def _race(target, what, timeout: float) -> list:
    """PROCESSES processes (spawned: nothing shared) run ``target(what, start, results)`` from
    one start signal; every outcome they report."""
    context = mp.get_context("spawn")
    start, results = context.Event(), context.Queue()
    procs = [context.Process(target=target, args=(what, start, results))
             for _ in range(PROCESSES)]
    for proc in procs:
        proc.start()
    start.set()
    outcomes = [results.get(timeout=timeout) for _ in range(PROCESSES * RELEASES_EACH)]
    for proc in procs:
        proc.join(timeout=60)
    return outcomes


def test_charges_racing_for_the_last_budget_admit_exactly_what_the_cap_admits(
        ledger_at: str) -> None:
    open_ledger(ledger_at)
    outcomes = _race(_charge_several, ledger_at, timeout=120)
    published = [o for o in outcomes if o[0] == "published"]
    refused = [o for o in outcomes if o[0] == "refused"]
    assert len(published) == 5 and len(refused) == 7, outcomes
    assert all("would exceed the lifetime privacy budget" in o[1] for o in refused)
    ledger = open_ledger(ledger_at)
    assert sorted(s.spend_id for s in ledger.spends()) == sorted(o[1] for o in published)
    assert ledger.state("ds").epsilon_spent <= CAP + 1e-9
    ledger.verify()


def _release_several(config: str, start, results) -> None:
    """One 'host': its releases one after the other, each reported (published or refused)."""
    from flows.release import ReleaseRequest, release_flow
    from medrelease.errors import BudgetExceededError

    start.wait()
    for _ in range(RELEASES_EACH):
        try:
            result = release_flow(ReleaseRequest(dataset=config, evaluate=False))
            results.put(("published", result["release_id"], str(result["path"])))
        except BudgetExceededError as exc:
            results.put(("refused", str(exc), ""))
        except Exception as exc:  # reported, and failed on below
            results.put(("error", f"{type(exc).__name__}: {exc}", ""))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_releases_racing_for_the_last_budget_publish_exactly_what_the_cap_admits(
        pg_cluster, tmp_path: Path, monkeypatch) -> None:
    from prefect.settings import PREFECT_API_URL

    from ..flow.test_ledger_journal import _dataset

    ledger_at = pg_cluster.url(pg_cluster.fresh_database(), "medrelease_service")
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MEDRELEASE_LEDGER_URL", ledger_at)
    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())  # the children's API
    monkeypatch.delenv("MEDRELEASE_INPUT_ROOTS", raising=False)
    config = str(_dataset(tmp_path / "ds", lifetime_epsilon=CAP))
    from medrelease.settings import ledger_location

    location = ledger_location()
    assert location == ledger_at

    outcomes = _race(_release_several, config, timeout=600)

    assert not [o for o in outcomes if o[0] == "error"], outcomes
    published = [o for o in outcomes if o[0] == "published"]
    refused = [o for o in outcomes if o[0] == "refused"]
    assert len(published) == 5 and len(refused) == 7, outcomes
    assert all("would exceed the lifetime privacy budget" in o[1] for o in refused)
    assert len({o[1] for o in published}) == 5  # release ids unique
    ledger = open_ledger(location)
    spends = ledger.spends("paper-example")
    assert len(spends) == 5 and all(s.status == "released" for s in spends)  # none for refusals
    assert {s.release_id for s in spends} == {o[1] for o in published}
    spent = ledger.state("paper-example").epsilon_spent
    assert spent == pytest.approx(5.0) and spent <= CAP + 1e-9
    folders = [p for p in (tmp_path / "home" / "releases").rglob("manifest.json")]
    assert len(folders) == 5
