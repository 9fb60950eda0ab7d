"""Start a real ``prefect server`` on a loopback port (tests, benchmarks), and stop it afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

STARTUP_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The server records task runs from the runs' events in batches (up to 200, at least once a
# second) instead of one write per event, Prefect's default. On SQLite one write per event races
# a form's "create flow run" (a read, then a write, in one transaction): SQLite answers "database
# is locked" at once and Prefect 503, which the UI shows as "Oops. Something went wrong" on
# Submit. Measured on the test harness: 9 such retries in 20 back-to-back runs, none after; a
# CI run's browser walk met six 503s in a row on one Submit while two releases ran. README,
# step 2, gives a steward's server the same settings.
SQLITE_FRIENDLY_SERVER = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}


def server_env(home: Path, api_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # One UI for the whole walk-through: Prefect's default (Vue) UI at every path, "/"
        # included; with V2 enabled "/" lands on V2 and deep links on the other (issue 27).
        "PREFECT_SERVER_UI_V2_ENABLED": "false",
        **SQLITE_FRIENDLY_SERVER,
    })
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


def drain_prefect_workers() -> None:
    """Flush this process's event and log workers while their server is still up.

    Otherwise a later Prefect test harness blocks at teardown trying to deliver them.
    """
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        with contextlib.suppress(RuntimeError):
            result = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    run_coro_as_sync(drain())


@contextlib.contextmanager
def running_server(home: Path, auth_string: str | None = None,
                   database_url: str | None = None) -> Iterator[str]:
    """Yield the API URL of a fresh server (own SQLite database under ``home``, or the
    PostgreSQL database ``database_url``, ``postgresql+asyncpg://...``); with ``auth_string``
    ("user:password") the server refuses every API call without it (Prefect's basic
    authentication; its health check stays open)."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = (home / "server.log").open("w")
    prefect = Path(sys.executable).with_name("prefect")
    env = server_env(home)
    if auth_string:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth_string
    if database_url:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    # `prefect server start --port` does not tell the UI where its API is: without this the UI
    # calls 127.0.0.1:4200 and shows "Can't connect to Server API".
    env["PREFECT_UI_API_URL"] = api_url
    # With SQLite, a write that races another can fail at once with "database is locked"
    # (Prefect answers 503; its UI shows "Oops. Something went wrong"). Log them in server.log.
    env["PREFECT_API_LOG_RETRYABLE_ERRORS"] = "true"
    proc = subprocess.Popen(
        [str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited early; see {home / 'server.log'}")
            try:
                with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"prefect server not healthy after {STARTUP_TIMEOUT_S} s")
            time.sleep(0.5)
        yield api_url
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: api_url,
                                         PREFECT_API_AUTH_STRING: auth_string}):
            drain_prefect_workers()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


@contextlib.contextmanager
def running_serve(home: Path, api_url: str, args: tuple[str, ...] = (),
                  env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """``medrelease serve`` against ``api_url`` (benchmarks), its log in ``home/serve.log``,
    with ``MEDRELEASE_HOME`` under ``home``; stopped with SIGTERM afterwards."""
    full_env = {**server_env(home, api_url), "MEDRELEASE_HOME": str(home / "home"), **(env or {})}
    log = (home / "serve.log").open("w")
    serve = subprocess.Popen([str(Path(sys.executable).with_name("medrelease")), "serve", *args],
                             env=full_env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    try:
        yield serve
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=30)
        log.close()
