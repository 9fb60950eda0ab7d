"""The unit tier: the engine alone. ``bash scripts/dev.sh test-fast`` runs it with
``MEDRELEASE_UNIT_TIER=1``, which refuses any import of Prefect, the orchestration layers,
the browser driver or the PostgreSQL drivers: a test that needs one belongs in ``tests/flow``
or ``tests/served`` (docs/ARCHITECTURE.md, "Where a test goes"). The whole suite runs every tier
in one process per worker, so the guard is off there."""

from __future__ import annotations

import os
import sys

NOT_THE_ENGINE = ("prefect", "prefect_dask", "flows", "tasks", "playwright", "psycopg",
                  "asyncpg", "dask", "distributed")


class _NotTheEngine:
    """A meta-path finder that refuses the modules above (an ImportError naming the module)."""

    def find_spec(self, name: str, path=None, target=None):
        if name.split(".")[0] in NOT_THE_ENGINE:
            raise ImportError(f"the unit tier runs the engine alone: {name!r} is imported; "
                              "move the test to tests/flow or tests/served")
        return None


if os.environ.get("MEDRELEASE_UNIT_TIER") == "1":
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in NOT_THE_ENGINE)
    assert not loaded, f"imported before the unit tier's guard: {loaded[:5]}"
    sys.meta_path.insert(0, _NotTheEngine())
