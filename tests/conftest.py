"""Shared fixtures: the IPA paper's worked example, the bundled NPS sample, small tables."""

from __future__ import annotations

import contextlib
import os
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from medrelease.data.config import DatasetConfig, find_config, load_config

# Before Prefect is imported (none of the modules above imports it): no telemetry, a start-up
# wait that fits a cold machine, and no log shipping to test servers that are gone by the time
# the log worker flushes (it would retry for a minute at exit).
if os.environ.get("MEDRELEASE_UNIT_TIER") == "1":  # the engine alone: Prefect is never imported
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
else:
    from tasks.prefect_defaults import apply_prefect_defaults

    apply_prefect_defaults()
os.environ["PREFECT_LOGGING_TO_API_ENABLED"] = "false"
# The test harness's server records task runs from the client's events in batches of up to 200,
# written at least once a second, instead of one write per event (Prefect's default). One write
# per event raced the next run's INSERT INTO flow_run: SQLite answered "database is locked" at
# once, Prefect 503, and the client slept 2 s before its retry; 9 retries in 20 back-to-back
# runs (34 s), none after (11 s). A test that reads task runs waits for them
# (``recorded_task_runs``). Served servers (``server_env``) batch the same way (README, step 2).
os.environ["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"] = "200"
os.environ["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL"] = "1"
# Nor does it write the events themselves to its database (the event persister, the harness
# server's largest single cost: 0.70 -> 0.50 s of server CPU a release, the corpus file 6 %
# less CPU; docs/results/performance.md). Nothing in the harness's tests reads persisted
# events; the test that no raw value reaches Prefect's database reads them from the server's
# event stream (``test_bad_input_corpus.EventStream``), which stays on. Served servers keep
# the persister: the UI's event feed reads it.
os.environ["PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED"] = "false"


def _one_certificate_bundle() -> str:
    """A CA bundle of one certificate (certifi's first), for the tests' Prefect clients.

    Every Prefect client builds a verifying TLS context when it opens, from certifi's bundle
    of ~140 certificates: 50 ms of CPU, once per flow run (~400 in the suite) and per
    ``get_client``. The test servers are plain HTTP on 127.0.0.1, so no connection ever uses
    it; from a one-certificate file the context takes 1 ms. A developer's own
    ``PREFECT_API_SSL_CERT_FILE`` wins."""
    import re
    import tempfile

    import certifi

    bundle = Path(tempfile.gettempdir()) / "medrelease-tests-one-ca.pem"
    if not bundle.is_file():
        first = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n",
                          Path(certifi.where()).read_text(), re.S)
        partial = bundle.with_name(f"{bundle.name}.{os.getpid()}")
        partial.write_text(first.group(0))
        partial.replace(bundle)  # atomic: two xdist workers may write it at once
    return str(bundle)


os.environ.setdefault("PREFECT_API_SSL_CERT_FILE", _one_certificate_bundle())

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def mbi_module():
    """Private-PGM (``mbi``, dev extra), which aim's numpy estimator and sampler are compared
    with, in 64-bit mode as it must be set before mbi loads (its float32 fits stall)."""
    import warnings

    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    with warnings.catch_warnings():  # mbi warns about the compile cache it was not designed for
        warnings.simplefilter("ignore", UserWarning)
        import mbi
    return mbi

PAPER_TABLE_5 = pd.DataFrame(
    {
        "Age": [17, 16, 13, 24, 29, 25, 67],
        "Gender": ["M", "M", "M", "F", "F", "F", "M"],
        "Zipcode": [28912, 23512, 24231, 31891, 34225, 37756, 80061],
        "Disease": ["Gastritis", "Pneumonia", "Pneumonia", "Anemia", "Anemia", "Diabetes",
                    "Stroke"],
    }
)


def write_paper_dataset(folder: Path) -> Path:
    """Table 5's dataset: age and zipcode as integer taxonomies, gender as an ARX file."""
    (folder / "age.yaml").write_text(
        "domain: {min: 0, max: 99}\nlevels:\n  - {width: 10}\n  - {width: 50}\n"
    )
    (folder / "zipcode.yaml").write_text(
        "domain: {min: 10000, max: 99999}\nlevels:\n  - {width: 10000, anchor: 0}\n"
    )
    (folder / "gender.csv").write_text("M;*\nF;*\n")
    PAPER_TABLE_5.to_csv(folder / "table5.csv", index=False)
    (folder / "dataset.yaml").write_text(
        textwrap.dedent(
            """\
            name: paper-example
            input: {path: table5.csv}
            columns:
              Age: {role: dimension, type: integer, taxonomy: age.yaml}
              Gender: {role: dimension, taxonomy: gender.csv}
              Zipcode: {role: dimension, type: integer, taxonomy: zipcode.yaml}
              Disease: {role: informative}
            privacy: {lifetime_epsilon: 100}
            """
        )
    )
    return folder / "dataset.yaml"


def serve_inbox(monkeypatch, inbox: Path, dataset: str) -> Path:
    """``inbox`` as ``medrelease serve --inbox INBOX --dataset DATASET`` configures it: its
    extracts may be released, as ``dataset`` only."""
    from medrelease.storage.inbox import inbox_settings

    for name, value in inbox_settings(inbox, dataset).items():
        monkeypatch.setenv(name, value)
    return inbox


def _stops_cleanly_on_sigterm(proc, log: Path) -> None:
    """``medrelease serve`` as systemd stops it: quickly, quietly, schedules left active."""
    import signal
    import time

    from prefect.client.orchestration import get_client

    before = len(log.read_text())
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    took = time.monotonic() - started
    with get_client(sync_client=True) as client:
        [scheduled] = [d for d in client.read_deployments() if d.name == "scheduled-nps-sample"]
    text = log.read_text()[before:]  # what the stop itself printed
    assert took < 10 and proc.returncode == 0, f"serve took {took:.1f} s to stop: {text[-2000:]}"
    assert not scheduled.paused and all(s.active for s in scheduled.schedules), \
        "stopping serve paused the scheduled deployment"
    assert "never awaited" not in text and "Traceback" not in text, text[-2000:]


# The served tests in two blocks, each on its own worker with its own server and ``serve``
# (one block of all of them would run longer than the rest of the suite on the other worker):
# the browser tests, and those that call the API directly.
TIERS = ("unit", "flow", "served")
SERVED_BROWSER_FILES = ("test_ui_browser.py", "test_ui_review.py", "test_ui_steward_controls.py",
                        "test_ui_relational.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Tests on the served Prefect server run first, in two blocks (``served-api``,
    ``served-browser``), each on one worker (xdist's loadgroup hands the groups with the most tests
    out first, one per worker); the server and ``medrelease serve`` stop right after a block's
    last test (``pytest_runtest_teardown``), so their polling never slows the tests after them.
    """
    def served_block(item) -> int:
        if "served" not in getattr(item, "fixturenames", ()):
            return 2
        return 1 if item.path.name in SERVED_BROWSER_FILES else 0

    for item in items:  # the tier is the folder: -m unit, -m flow, -m served
        tier = item.path.parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=served_block)  # without xdist: one server, the API block first
    for item in items:  # with pytest-xdist (-n 2 --dist loadgroup): one worker, one server
        block = served_block(item)
        if block < 2:
            item.add_marker(pytest.mark.xdist_group(("served-api", "served-browser")[block]))
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        _name_the_groups(items)


def _name_the_groups(items) -> None:
    """Put each test's ``xdist_group`` names into its node id (``path::test@group``), where
    xdist's scheduler looks for them.

    pytest-xdist 3.8 does this by setting ``item._nodeid``, which pytest 9.2 no longer reads
    (it keeps a structured ``item._id``; pytest-dev/pytest-xdist#1386): every group was
    silently ignored, the served tests ran on both workers with a server each, and the
    module-scoped tables of the grouped modules were built twice. Older pytest (no ``_id``):
    xdist's own hook does it."""
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # pytest before 9.2
        return
    for item in items:
        names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                        for mark in item.iter_markers("xdist_group")})
        if names and hasattr(item, "_id") and "@" not in item.nodeid:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


def pytest_runtest_teardown(item, nextitem) -> None:
    """Stop the served server after the last test of the served block (its clean-stop check
    fails this test's teardown if ``serve`` does not stop cleanly)."""
    uses = "served" in getattr(item, "fixturenames", ())
    next_uses = nextitem is not None and "served" in getattr(nextitem, "fixturenames", ())
    if uses and not next_uses:
        _SERVED.close()


def pytest_sessionfinish(session) -> None:
    _SERVED.close()


@pytest.fixture(autouse=True)
def steward_places(tmp_path_factory, monkeypatch):
    """Tests write configs and extracts under pytest's temporary folder: the steward declares
    it (deployment-level variables, as a real deployment would) so the path rules admit them.
    Tests of those rules remove it again."""
    base = str(tmp_path_factory.getbasetemp())
    monkeypatch.setenv("MEDRELEASE_DATASETS", base)
    monkeypatch.setenv("MEDRELEASE_INPUT_ROOTS", base)
    # a developer's PostgreSQL ledger stays out of the tests (they choose their back-end)
    monkeypatch.delenv("MEDRELEASE_LEDGER_URL", raising=False)


@pytest.fixture
def paper_config(tmp_path: Path) -> DatasetConfig:
    return load_config(write_paper_dataset(tmp_path))


@pytest.fixture(scope="session")
def nps_config() -> DatasetConfig:
    return find_config("nps-sample")


@pytest.fixture(scope="session")
def nps_sample(nps_config: DatasetConfig) -> pd.DataFrame:
    return pd.read_csv(nps_config.input_path)


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API for the whole session (``pytestmark = usefixtures(...)``):
    its database is migrated once, not once per module.

    In-process runs here go without flow-run heartbeats, as the CLI's in-process runs do
    (``without_heartbeats``): Prefect joins the heartbeat thread, which sleeps in whole
    seconds, at the end of every run (0.5 s a run on average, over the suite's ~400 in-process
    runs). Served runs (the ``served`` fixture, ``medrelease serve``) keep them."""
    from prefect.testing.utilities import prefect_test_harness

    from tasks.prefect_defaults import without_heartbeats

    with prefect_test_harness(server_startup_timeout=600), without_heartbeats():
        yield


def wait_until_unchanged(read, settle_s: float = 2.5, wait_s: float = 60) -> None:
    """Wait until ``read()`` has returned the same value for ``settle_s`` (at most ``wait_s``):
    for what the Prefect server writes or sends a little after the run that made it."""
    import time

    deadline = time.monotonic() + wait_s
    seen, since = object(), time.monotonic()
    while time.monotonic() - since < settle_s and time.monotonic() < deadline:
        now = read()
        if now != seen:
            seen, since = now, time.monotonic()
        time.sleep(0.25)


def recorded_task_runs(client, flow_run_id, settle_s: float = 2.5, wait_s: float = 60) -> list:
    """A finished flow run's task runs, once the server has recorded them all: they arrive as
    events, written in batches (at most a second late on the harness, see the top of this
    file), so read until every one is final and the list has not changed for ``settle_s``."""
    import time

    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + wait_s
    seen, since = None, time.monotonic()
    while True:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        now = {(str(r.id), r.state.type if r.state else None) for r in runs}
        if now != seen:
            seen, since = now, time.monotonic()
        settled = runs and all(r.state and r.state.is_final() for r in runs)
        if (settled and time.monotonic() - since >= settle_s) or time.monotonic() > deadline:
            return runs
        time.sleep(0.25)


SERVE_WAIT_S = 180
ARRIVALS = "nps-arrivals"


@pytest.fixture
def corpus_home(tmp_path: Path, monkeypatch) -> Path:
    """A scratch home for one corpus case; extracts only from each dataset's own folder (no
    extra input roots); a locked ledger gives up after 2 s."""
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MEDRELEASE_LEDGER_TIMEOUT_S", "2")
    monkeypatch.delenv("MEDRELEASE_INPUT_ROOTS", raising=False)
    return tmp_path


def sample_spec_in(folder: Path) -> dict:
    """nps-sample's config as a dict for a copy in ``folder``: its taxonomies by absolute path,
    its diagnosis domain copied beside it (a domain file must lie beside its config)."""
    import shutil

    import yaml

    source = ROOT / "datasets" / "nps-sample"
    spec = yaml.safe_load((source / "dataset.yaml").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    for column in spec["columns"].values():
        if "taxonomy" in column:
            column["taxonomy"] = str((source / column["taxonomy"]).resolve())
    shutil.copy(source / "diagnosis_codes.txt", folder)
    return spec


def write_arrivals_dataset(folder: Path) -> Path:
    """The served inbox's dataset: nps-sample's config naming ``ipa``. The sample's default,
    ``aim``, takes over a minute a release in a served run (a fresh process compiles its
    model); these tests are about arrivals, exactly-once and the UI, and the default itself is
    tested where it is resolved (tests/flow/test_registry.py)."""
    import shutil

    import yaml

    source = ROOT / "datasets" / "nps-sample"
    spec = sample_spec_in(folder)
    shutil.copy(source / "nps_sample.csv", folder)
    spec.update(name=ARRIVALS, mechanism={"name": "ipa", "params": {"epsilon": 1.0}})
    (folder / "dataset.yaml").write_text(yaml.safe_dump(spec))
    return folder / "dataset.yaml"


class _ServedOnce:
    """The served server, started on first use and closed after the served block (or at the
    end of the session): a session fixture would live until the worker's last test."""

    def __init__(self) -> None:
        self._stack = None
        self._value = None

    def get(self, tmp_path_factory):
        if self._stack is None:
            stack = contextlib.ExitStack()
            self._value = stack.enter_context(_serving(tmp_path_factory.mktemp("served")))
            self._stack = stack
        return self._value

    def close(self) -> None:
        stack, self._stack, self._value = self._stack, None, None
        if stack is not None:
            stack.close()


_SERVED = _ServedOnce()


@pytest.fixture
def served(tmp_path_factory):
    """A real ``prefect server`` and ``medrelease serve`` (with an inbox), shared by the
    deployment and browser tests: started once for the served block."""
    return _SERVED.get(tmp_path_factory)


@contextlib.contextmanager
def _serving(base: Path):
    """Start the server and ``serve`` in ``base``; on exit check ``serve`` stops cleanly."""
    import secrets
    import signal
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    from deployments.local_server import free_port, running_server, server_env

    auth = f"steward:{secrets.token_urlsafe(18)}"  # only stewards in the UI (README)
    with running_server(base, auth) as api_url:
        env = server_env(base, api_url)
        env.update({"MEDRELEASE_HOME": str(base / "home"), "PREFECT_RUNNER_POLL_FREQUENCY": "1",
                    "PREFECT_API_AUTH_STRING": auth,
                    "PREFECT_LOGGING_LEVEL": "INFO",
                    "MEDRELEASE_PSEUDONYM_KEY": "browser-test-key-0123456789abcdef"})
        inbox = base / "inbox"
        log = (base / "serve.log").open("w")
        medrelease = Path(sys.executable).with_name("medrelease")
        write_arrivals_dataset(base / "home" / "datasets" / ARRIVALS)  # a dataset root
        portal_port = free_port()  # the release portal serve starts beside the deployments
        proc = subprocess.Popen(
            [str(medrelease), "serve", "--inbox", str(inbox), "--dataset", ARRIVALS,
             "--interval", "0.5", "--portal-port", str(portal_port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
        )
        try:
            with temporary_settings(updates={PREFECT_API_URL: api_url,
                                             PREFECT_API_AUTH_STRING: auth}):
                deadline = time.monotonic() + SERVE_WAIT_S
                while True:
                    with get_client(sync_client=True) as client:
                        names = {d.name for d in client.read_deployments()}
                    if {"on-demand", "scheduled-nps-sample", "on-arrival", "watch-inbox"} <= names:
                        break
                    assert proc.poll() is None, (base / "serve.log").read_text()[-3000:]
                    assert time.monotonic() < deadline, "deployments not served in time"
                    time.sleep(1)
                yield SimpleNamespace(api_url=api_url, inbox=inbox, home=base / "home",
                                      log=base / "serve.log", auth=auth,
                                      portal=f"http://127.0.0.1:{portal_port}")
                _stops_cleanly_on_sigterm(proc, base / "serve.log")
        finally:
            with contextlib.suppress(ProcessLookupError):  # gone already after a clean stop
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()


@pytest.fixture(scope="session")
def pg_cluster():
    """A throw-away PostgreSQL cluster for this test process (``deployments/local_postgres``),
    with a template database holding the ledger schema; stopped and removed at the end."""
    from deployments.local_postgres import ensure_installed, running_cluster

    if ensure_installed() is None:
        pytest.skip("no PostgreSQL binaries (/usr/lib/postgresql/*/bin) and apt-get cannot "
                    "install Debian's postgresql package here")
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(params=["sqlite", "postgresql"])
def new_ledger(request, tmp_path: Path, monkeypatch):
    """Makes new, empty ledgers on each back-end: SQLite files, or fresh databases made by
    ``ledger init-db`` reached as its service role (the head file under this test's
    ``MEDRELEASE_HOME``). Returns their locations."""
    import itertools

    numbers = itertools.count()
    if request.param == "sqlite":
        return lambda: str(tmp_path / f"ledger{next(numbers) or ''}.sqlite")
    cluster = request.getfixturevalue("pg_cluster")
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    return lambda: cluster.url(cluster.fresh_database(), "medrelease_service")


@pytest.fixture
def ledger_at(new_ledger) -> str:
    """A new, empty ledger's location, on each back-end (``new_ledger``)."""
    return new_ledger()
