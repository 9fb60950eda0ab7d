"""The ``medrelease`` console command's entry point: what a fresh command process does before
the CLI (``deployments.cli``) is imported.

* No garbage-collector passes over what the imports create. Python, pandas, Prefect and the
  flows make about a million objects that live as long as the process; the collector walked
  them 550 times (4 full passes) in a CLI release, 0.2 s of it (issue 27). The collector is
  off while they are imported, they are then frozen (``gc.freeze``: kept out of every later
  pass), and it is on again for the command's own work.
* No ``hypothesis``: a test tool installed beside the product for the suite, which pandera
  imports when present to offer data-synthesis strategies the product never uses (0.1 s of a
  release's first input check). A module set to None in ``sys.modules`` makes its import fail,
  and pandera runs without the strategies.

Only the console command does this; tests import ``deployments.cli`` and keep both.
"""

from __future__ import annotations

import gc
import sys

FLOW_COMMANDS = ("release", "demo")  # they import the flows: imported here, frozen with the rest
HELP = "--help"  # no flow runs: Prefect stays unimported (issue 37: help in a second, not 12 s)


def runs_a_flow(argv: list[str]) -> bool:
    """Whether this command line runs a flow: a flow command, not asked for its help."""
    return bool(argv[:1]) and argv[0] in FLOW_COMMANDS and HELP not in argv[1:]


def main() -> None:  # pragma: no cover - console entry point
    gc.disable()
    sys.modules.setdefault("hypothesis", None)  # type: ignore[arg-type]
    try:
        from deployments import cli

        if runs_a_flow(sys.argv[1:]):
            import flows.release  # noqa: F401
    finally:
        gc.freeze()
        gc.enable()
    cli.main()
