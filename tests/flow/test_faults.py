"""Faults: a killed run leaves no visible release and a counted reservation; a rerun works.
Security: destinations cannot leave the store; logs and artifacts carry no raw input rows."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from flows.release import ReleaseRequest
from medrelease.privacy.ledger import Ledger
from medrelease.storage.store import ReleaseStore

from ..conftest import ROOT

KILLERS = {
    "after budget charge": "import tasks.lattice as m; m.score_node_piece = die",
    "during fan-out": textwrap.dedent("""
        import medrelease.release as loop  # tasks of 16 nodes: the scoring packs them by rate
        loop.PROBE_NODES, loop.SCORING_TASK_SECONDS = 16, 0.0
        import tasks.lattice as m
        real = m.score_node_piece
        calls = []
        def half(*a, **k):
            calls.append(1)
            if len(calls) == 3:
                die()
            return real(*a, **k)
        m.score_node_piece = half"""),
    "during publish": "import medrelease.storage.store as m; m._fsync_dir = lambda p: die()",
}


def _run_child(home: Path, patch: str) -> subprocess.CompletedProcess:
    """Run an ipa release of the sample (the killers patch its lattice scoring) in a child
    process (own session); kill whatever it left running.

    The child talks to the session's Prefect API (``prefect_harness``) instead of starting an
    ephemeral one of its own (15-20 s each on 2 cores). Output goes to a file, not a pipe: a
    child's server, if any, would otherwise hold the pipe open after the child was killed.
    """
    from prefect.settings import PREFECT_API_URL

    script = textwrap.dedent("""
        import os, signal
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        {patch}
        from flows.release import ReleaseRequest, release_flow
        release_flow(ReleaseRequest(seed=1, batch_size=16, mechanism="ipa"))
    """).format(patch=textwrap.indent(patch, "").strip())
    env = {"MEDRELEASE_HOME": str(home), "PREFECT_HOME": str(home / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PATH": "/usr/bin:/bin",
           "PREFECT_LOGGING_TO_API_ENABLED": "false", "PREFECT_API_URL": PREFECT_API_URL.value()}
    log = home / f"child-{len(list(home.glob('child-*.log')))}.log"
    home.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT,
                                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = proc.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the orphaned ephemeral server, if any
    text = log.read_text()
    return subprocess.CompletedProcess(proc.args, returncode, text, text)


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("stage", sorted(KILLERS))
def test_kill_leaves_no_release_and_a_counted_reservation(tmp_path: Path, stage: str) -> None:
    killed = _run_child(tmp_path, KILLERS[stage])
    assert killed.returncode == -9, killed.stderr[-2000:]
    store = ReleaseStore(tmp_path / "test-releases", test=True)  # seed 1: a TEST release
    assert store.releases() == []  # a partial folder, if any, is hidden
    [spend] = Ledger(tmp_path / "ledger.sqlite").spends()
    assert spend.status == "reserved" and spend.epsilon == 1.0  # still counted
    rerun = _run_child(tmp_path, "pass")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    [release] = store.releases()
    assert not list(release.parent.glob(".partial-*"))  # leftovers swept by the rerun
    spends = Ledger(tmp_path / "ledger.sqlite").spends()
    assert [s.status for s in spends] == ["reserved", "released"]
    assert Ledger(tmp_path / "ledger.sqlite").state("nps-sample", 10, 1e-4).epsilon_spent == 2.0


@pytest.mark.parametrize("destination", ["../escape", "/tmp/abs", "a/../../b", ".hidden"])
def test_destination_escaping_the_store_is_refused_before_the_run(destination: str) -> None:
    with pytest.raises(ValidationError, match="destination"):
        ReleaseRequest(destination=destination)


@pytest.mark.usefixtures("prefect_harness")
def test_logs_and_artifacts_carry_no_raw_rows(tmp_path: Path) -> None:
    """Run the sample's release (ipa: real rows) in a child process and scan everything it
    logged and recorded."""
    result = _run_child(tmp_path, "pass")
    assert result.returncode == 0, result.stderr[-2000:]
    sample = pd.read_csv(ROOT / "datasets/nps-sample/nps_sample.csv")
    log_text = result.stdout
    [release] = ReleaseStore(tmp_path / "test-releases", test=True).releases()
    assert not (tmp_path / "releases").exists()  # never in the publishable store
    manifest_text = (release / "manifest.json").read_text() + (release / "report.md").read_text()
    for row in sample.head(500).itertuples(index=False):
        values = [str(v) for v in row[1:]]
        for sep in (",", " ", "\t", "|"):
            needle = sep.join(values)
            assert needle not in log_text and needle not in manifest_text
    manifest = json.loads((release / "manifest.json").read_text())
    assert "information_loss" not in manifest and "input_rows" not in manifest
