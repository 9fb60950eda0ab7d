"""Imported last by the served runs' fork server (``deployments/served_runs.py``), after the
flows: what the imports made is frozen out of the garbage collector (``gc.freeze``), as the
console command does (``deployments/entry.py``).

A forked run shares the fork server's memory until it writes to it, and a collector pass writes
to every object it walks: a run's first full collection walked the ~180,000 objects of the
imports (140-190 ms) and copied 50 MB of the server's memory into the run; frozen, 0 ms and
2 MB (measured in a fork of a process that imported the served flows)."""

import gc

gc.collect()
gc.freeze()
