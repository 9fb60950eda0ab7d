#!/usr/bin/env bash
# One entry point that sets itself up: creates .venv (Python 3.11), installs the pinned set from
# requirements.lock plus this package, then runs what was asked.
#   bash scripts/dev.sh demo     # release the bundled sample through the Prefect flow
#   bash scripts/dev.sh test     # the whole test suite (tests/unit, tests/flow, tests/served)
#   bash scripts/dev.sh test-fast  # the unit tier without its slow statistical audits (< 1 min):
#                                # what a developer runs after every change
#   bash scripts/dev.sh bench    # engine benchmark (prints numbers)
#   bash scripts/dev.sh shell    # just set up; prints how to activate
#   bash scripts/dev.sh pg [-- COMMAND ...]  # a throw-away PostgreSQL with a ledger database:
#                                # prints MEDRELEASE_LEDGER_URL, runs COMMAND with it (or waits
#                                # for Ctrl-C), then stops and removes the cluster
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

setup() {
  local stamp="$VENV/.installed"
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  if [ ! -f "$stamp" ] || [ requirements.lock -nt "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setting up $VENV (pinned dependencies from requirements.lock) ..." >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install --quiet -c requirements.lock -e ".[dev]"
    touch "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
  # Bytecode of this project's modules, written where missing or stale: Python writes it on
  # import unless PYTHONDONTWRITEBYTECODE is set (as in some sandboxes and CI images), and
  # then every command compiled the project from source (0.1 s of each CLI run).
  python -m compileall -q medrelease flows tasks schemas deployments >/dev/null
  export PREFECT_SERVER_ANALYTICS_ENABLED=false
  export PREFECT_HOME="${PREFECT_HOME:-$ROOT/var/prefect}"
  mkdir -p "$PREFECT_HOME"
  export DO_NOT_TRACK=1
  # A new Prefect database is migrated while the ephemeral API starts; on a cold 2-core machine
  # that outlasts Prefect's default wait (20 s), so migrate it here, once, and wait longer.
  export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="${PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS:-600}"
  local migrated="$PREFECT_HOME/.medrelease-migrated-$(python -c "import importlib.metadata as m; print(m.version('prefect'))")"
  if [ -z "${PREFECT_API_URL:-}" ] && [ ! -f "$migrated" ]; then
    echo "preparing the Prefect database in $PREFECT_HOME (once) ..." >&2
    prefect server database upgrade -y >/dev/null
    touch "$migrated"
  fi
}

browser_setup() {
  # The browser tests drive Debian's chromium with Playwright (Playwright's own browser download
  # cannot reach the internet here); install the package once if it is missing.
  [ -x /usr/bin/chromium ] && return 0
  echo "installing Debian's chromium for the browser tests (once) ..." >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get install -y -q chromium >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium >/dev/null; }
}

pg_setup() {
  # The PostgreSQL ledger's tests start throw-away clusters with Debian's postgresql binaries
  # (initdb, pg_ctl); install the package once if they are missing, as for chromium. The
  # package's own cluster is not used (deployments/local_postgres.py starts its own, as the
  # postgres user).
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && return 0
  echo "installing Debian's postgresql for the ledger tests (once) ..." >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1 \
    || { $sudo apt-get update -q >/dev/null \
         && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; }
}

cmd=${1:-demo}
shift || true
setup
case "$cmd" in
  demo)  exec medrelease demo "$@" ;;
  # Two workers (CI has 2 cores); the served tests run as two blocks (API, browser), each on
  # one worker with its own Prefect server (tests/conftest.py).
  test)  browser_setup; pg_setup; exec python -m pytest -q -n "${MEDRELEASE_TEST_WORKERS:-2}" --dist loadgroup "$@" ;;
  # The engine alone: Prefect, the flows and tasks, the browser and PostgreSQL drivers cannot be
  # imported (tests/unit/conftest.py); the slow statistical audits wait for the whole suite.
  test-fast) MEDRELEASE_UNIT_TIER=1 exec python -m pytest -q -n 2 -m "not slow" tests/unit "$@" ;;
  bench) exec python benchmarks/engine_bench.py "$@" ;;
  shell) echo "ready: source .venv/bin/activate" ;;
  pg)    pg_setup; exec python -m deployments.local_postgres "$@" ;;
  *) echo "usage: bash scripts/dev.sh {demo|test|test-fast|bench|shell|pg}" >&2; exit 2 ;;
esac
