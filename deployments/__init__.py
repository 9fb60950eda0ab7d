"""Deployments: scheduled, on-demand and on-arrival releases, and a local server helper."""
