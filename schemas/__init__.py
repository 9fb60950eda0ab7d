"""Schemas: pandera input models, the Great Expectations output suite, the manifest model."""
