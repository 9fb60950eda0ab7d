"""The commands that run no flow never import Prefect (issue 37): importing it costs seconds, and
its exit handling starts the ephemeral API server (10 s) before the process may end.

Each command runs in a fresh process through the console entry point (``deployments.entry``),
as a steward types it; the CLI's last step (``_exit_now``) is wrapped to report which modules
were imported before the process exits. Wall times are printed by ``benchmarks/cli_timing.py``;
a timed test would fail on a loaded machine for reasons that are not the code's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.entry import runs_a_flow

from .conftest import ROOT

# The entry point as the console command runs it, with a report of what was imported at its
# exit: registered first, the report runs after every other exit handler (the CLI runs them
# after draining Prefect's workers, which is what would start the ephemeral API server).
PROBE = """\
import atexit, json, sys

def report():
    loaded = sorted({name.split(".")[0] for name in sys.modules} & {"prefect", "flows", "tasks"})
    server = any(name.startswith("prefect.server") for name in sys.modules)
    print("\\nMODULES " + json.dumps({"loaded": loaded, "server": server}), flush=True)

atexit.register(report)
from deployments.entry import main
sys.argv[0] = "medrelease"
main()
"""


def run_command(argv: list[str], env: dict[str, str], cwd: Path
                ) -> tuple[subprocess.CompletedProcess, dict]:
    """``medrelease ARGV`` in a fresh process, and what it had imported when it exited."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)
    reported = [line for line in done.stdout.splitlines() if line.startswith("MODULES ")]
    assert reported, done.stdout[-2000:] + done.stderr[-2000:]
    return done, json.loads(reported[-1].removeprefix("MODULES "))


NO_FLOW_COMMANDS = [
    ["--help"],
    ["release", "--help"],
    ["demo", "--help"],
    ["mechanisms"],
    ["ledger"],
    ["ledger", "--help"],
    ["ledger", "verify"],
    ["ledger", "restore"],
    ["ledger", "init"],
    ["ledger", "set-cap", "--help"],
    ["check", "nps-sample"],
    ["init", "--help"],
]


@pytest.mark.parametrize("argv", NO_FLOW_COMMANDS, ids=" ".join)
def test_a_command_that_runs_no_flow_never_imports_prefect(argv: list[str],
                                                           tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(tmp_path / "home"),
           "COLUMNS": "160"}
    done, imported = run_command(argv, env, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert imported == {"loaded": [], "server": False}


def test_a_refused_release_starts_no_prefect_server(tmp_path: Path) -> None:
    """Refused before its flow runs (a malformed parameter): the flows were imported for the
    run, but nothing was sent to Prefect, so its API server is not started to drain it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(tmp_path / "home"),
           "COLUMNS": "160"}
    done, imported = run_command(["release", "nps-sample", "-p", "no-equals-sign"], env,
                                 tmp_path)
    assert done.returncode == 1 and "--param needs name=value" in done.stdout
    assert imported == {"loaded": ["flows", "prefect", "tasks"], "server": False}


def test_init_then_check_never_import_prefect_through_the_entry_point(tmp_path: Path) -> None:
    """``init`` writes a config (the CSV generated here), ``check`` reads it back."""
    csv = tmp_path / "visits.csv"
    csv.write_text("patient_id,age,sex,outcome\n"
                   + "".join(f"P{i % 40:03d},{20 + i % 60},{'FM'[i % 2]},{'ab'[i % 3 == 0]}\n"
                             for i in range(200)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(tmp_path / "home"),
           "MEDRELEASE_DATASETS": str(tmp_path / "datasets"), "COLUMNS": "160"}
    for argv in (["init", str(csv), "--name", "visits", "--root", str(tmp_path / "datasets"),
                  "--informative", "outcome"], ["check", "visits"]):
        done, imported = run_command(argv, env, tmp_path)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert imported == {"loaded": [], "server": False}, argv


def test_only_a_flow_command_preloads_the_flows() -> None:
    assert runs_a_flow(["release", "nps-sample"]) and runs_a_flow(["demo"])
    assert not runs_a_flow(["release", "--help"]) and not runs_a_flow(["demo", "--help"])
    assert not runs_a_flow([]) and not runs_a_flow(["--help"]) and not runs_a_flow(["ledger"])
