"""A flow that says which process imported its module and which one runs it (for
``test_served_run_start``): a served run forked from the preloaded process finds its module
imported by that process, not by itself. (The flow's function travels to the run by value,
with the globals it names as they were where it was pickled: it looks the module up.)"""

from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import time

from prefect import flow

IMPORTED_BY = os.getpid()


@flow(name="served-run-probe")
def probe(out: str, hold_s: float = 0.0) -> None:
    seen = {"imported_by": importlib.import_module(__name__).IMPORTED_BY,
            "run_by": os.getpid(), "parent": os.getppid(),
            "release_flow_loaded": "flows.release" in sys.modules,
            "frozen_objects": gc.get_freeze_count()}
    with open(f"{out}.started", "w", encoding="utf-8") as file:
        json.dump(seen, file)
    time.sleep(hold_s)
    with open(out, "w", encoding="utf-8") as file:
        json.dump(seen, file)
