"""A throw-away PostgreSQL cluster (tests, benchmarks, ``bash scripts/dev.sh pg``): ``initdb``
+ ``pg_ctl`` in a temporary folder, on a free loopback port, stopped (and removed) at the end.

One cluster per test process (each pytest-xdist worker starts its own: no port or folder is
shared). ``initdb`` refuses root, so where the tests run as root the cluster runs as the
``postgres`` system user (Debian's package creates it) through ``runuser``. Every test gets a
fresh database copied from a template on which ``medrelease ledger init-db`` ran once.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TEMPLATE = "ledger_template"
ADMIN = "postgres"


def pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def ensure_installed() -> Path | None:
    """The bin folder, installing Debian's ``postgresql`` package if it is missing and apt can
    (as root); None when neither is possible."""
    found = pg_bin()
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    install = ["apt-get", "install", "-y", "-q", "postgresql"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        subprocess.run(install, env=env, capture_output=True)
    return pg_bin()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Cluster:
    """A running throw-away cluster; ``url(db, user)`` names a database on it."""

    bin: Path
    folder: Path
    port: int
    _databases: Iterator[int] = field(default_factory=itertools.count)

    def url(self, database: str = "postgres", user: str = ADMIN) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def fresh_database(self) -> str:
        """A new database with the ledger schema (copied from the template): its name."""
        import psycopg

        name = f"ledger_{os.getpid()}_{next(self._databases)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE {TEMPLATE}')
        return name


def _as_cluster_user(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


@contextlib.contextmanager
def running_cluster(with_template: bool = True) -> Iterator[Cluster]:
    """Start a cluster (fsync off: it holds test data only), yield it, stop and remove it."""
    bin_dir = ensure_installed()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed and apt-get cannot install it")
    folder = Path(tempfile.mkdtemp(prefix="medrelease-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    data = folder / "data"
    subprocess.run(_as_cluster_user([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust",
                                     "-U", ADMIN, "--no-sync", "-E", "UTF8"]),
                   check=True, capture_output=True)
    for attempt in range(5):
        port = free_port()
        started = subprocess.run(_as_cluster_user([
            str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w",
            "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off", "start"]),
            capture_output=True)
        if started.returncode == 0:
            break
        if attempt == 4:
            raise RuntimeError(f"pg_ctl start failed: {(folder / 'log').read_text()[-2000:]}")
    cluster = Cluster(bin_dir, folder, port)
    try:
        if with_template:
            _make_template(cluster)
        yield cluster
    finally:
        subprocess.run(_as_cluster_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m",
                                         "immediate", "-w", "stop"]), capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def _make_template(cluster: Cluster) -> None:
    import psycopg

    from medrelease.privacy.ledger_pg import init_db

    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    init_db(cluster.url(TEMPLATE))


def main(argv: list[str]) -> int:
    """``bash scripts/dev.sh pg [-- COMMAND ...]``: a throw-away cluster with a ledger database
    made by ``medrelease ledger init-db``; prints its URLs, then runs COMMAND with
    ``MEDRELEASE_LEDGER_URL`` set (or waits for Ctrl-C), and stops the cluster."""
    import signal

    import psycopg

    from medrelease.privacy.ledger_pg import init_db

    command = argv[argv.index("--") + 1:] if "--" in argv else []
    with running_cluster(with_template=False) as cluster:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE medrelease")
        service_url, _ = init_db(cluster.url("medrelease"))
        print(f"PostgreSQL {cluster.bin.parent.name} running in {cluster.folder} (stopped and "
              f"removed when this ends)\n  admin (owner's DBA): {cluster.url('medrelease')}\n"
              f"  MEDRELEASE_LEDGER_URL={service_url}\n"
              f"  PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://postgres@127.0.0.1:"
              f"{cluster.port}/postgres", flush=True)
        if command:
            env = {**os.environ, "MEDRELEASE_LEDGER_URL": service_url}
            return subprocess.run(command, env=env).returncode
        print("Ctrl-C stops it.", flush=True)
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped cleanly either way
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
