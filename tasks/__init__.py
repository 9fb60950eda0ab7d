"""Prefect tasks: thin wrappers over engine calls, one concern each.

No algorithm lives here. Every task opts out of Prefect's result caching: a release must draw
fresh noise on every run, and inputs are large tables that should not be hashed.
"""

from .prefect_defaults import apply_prefect_defaults

apply_prefect_defaults()
