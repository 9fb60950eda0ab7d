"""The public manifest's JSON Schema, ``manifest.schema.json`` beside this file: what a
researcher's tools can validate a release's ``manifest.json`` against. Written from the
engine's model (``medrelease.storage.manifest_model.PublicManifest``, which the publisher and
the publication audit validate with): ``python -m schemas.manifest``."""

from __future__ import annotations

import json
from pathlib import Path

from medrelease.storage.manifest_model import PublicManifest

SCHEMA_PATH = Path(__file__).with_name("manifest.schema.json")


def write_json_schema() -> None:
    SCHEMA_PATH.write_text(json.dumps(PublicManifest.model_json_schema(), indent=2) + "\n")


if __name__ == "__main__":
    write_json_schema()
