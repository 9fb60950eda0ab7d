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

from ..conftest import ROOT

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
    ["portal", "--help"],
]


@pytest.mark.slow
@pytest.mark.parametrize("argv", NO_FLOW_COMMANDS, ids=" ".join)
def test_a_command_that_runs_no_flow_never_imports_prefect(argv: list[str],
                                                           tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(tmp_path / "home"),
           "COLUMNS": "160"}
    done, imported = run_command(argv, env, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert imported == {"loaded": [], "server": False}


@pytest.mark.slow
def test_a_refused_release_starts_no_prefect_server(tmp_path: Path) -> None:
    """Refused before its flow runs (a malformed parameter): the flows were imported for the
    run, but nothing was sent to Prefect, so its API server is not started to drain it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(tmp_path / "home"),
           "COLUMNS": "160"}
    done, imported = run_command(["release", "nps-sample", "-p", "no-equals-sign"], env,
                                 tmp_path)
    assert done.returncode == 1 and "--param needs name=value" in done.stdout
    assert imported == {"loaded": ["flows", "prefect", "tasks"], "server": False}


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_portal_command_serves_behind_the_secret_without_prefect(tmp_path: Path) -> None:
    """``medrelease portal`` as a steward starts it: it answers 401 without the Prefect
    server's secret and 200 with it, stops on Ctrl-C, and never imported Prefect."""
    import base64
    import signal
    import time
    import urllib.error
    import urllib.request

    from deployments.local_server import free_port

    port, secret = free_port(), "steward:cli-portal-secret"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(tmp_path / "home"),
           "COLUMNS": "160", "PREFECT_API_AUTH_STRING": secret}
    env.pop("PREFECT_SERVER_API_AUTH_STRING", None)
    proc = subprocess.Popen([sys.executable, "-c", PROBE, "portal", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=tmp_path)
    url = f"http://127.0.0.1:{port}/releases"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url, timeout=5)
                raise AssertionError("the portal answered without the secret")
            except urllib.error.HTTPError as exc:
                assert exc.code == 401 and exc.headers["WWW-Authenticate"].startswith("Basic")
                break
            except urllib.error.URLError:
                assert proc.poll() is None and time.monotonic() < deadline, "portal not up"
                time.sleep(0.2)
        token = base64.b64encode(secret.encode()).decode()
        with urllib.request.urlopen(urllib.request.Request(
                url, headers={"Authorization": f"Basic {token}"}), timeout=5) as answer:
            assert answer.status == 200 and b"No release yet" in answer.read()
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert f"release portal on http://127.0.0.1:{port}" in out, out[-2000:]
    reported = [line for line in out.splitlines() if line.startswith("MODULES ")]
    assert json.loads(reported[-1].removeprefix("MODULES ")) == {"loaded": [], "server": False}


def test_the_portal_refuses_a_public_address_without_a_secret(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PREFECT_API_AUTH_STRING", "PREFECT_SERVER_API_AUTH_STRING")}
    env.update({"PYTHONPATH": str(ROOT), "MEDRELEASE_HOME": str(tmp_path / "home"),
                "COLUMNS": "200"})
    done, imported = run_command(["portal", "--host", "0.0.0.0", "--port", "1"], env, tmp_path)
    assert done.returncode == 1 and "portal refused" in done.stdout
    assert "no secret for host 0.0.0.0" in done.stdout
    assert imported == {"loaded": [], "server": False}
