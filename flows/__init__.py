"""Prefect flows: release (and, later, evaluate, audit, watch-inbox)."""
