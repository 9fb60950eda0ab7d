"""Prefect flows: release, evaluate, audit, publication audit, arrival, watch-inbox.

Importing this package sets Prefect defaults that fit a cold 2-core machine before Prefect is
imported (an explicit environment always wins): a new Prefect database is migrated while the
ephemeral API starts, which takes longer than Prefect's default wait there.
"""

from tasks.prefect_defaults import apply_prefect_defaults

apply_prefect_defaults()
