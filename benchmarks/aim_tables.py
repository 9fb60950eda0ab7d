"""The tables ``aim``'s benchmarks run on, as count tables: the bundled Adult, the bundled
NPS-like sample (20,000 rows) or an NPS-like table of any size generated with a fixed seed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def load_counts(table: str, rows: int = 20_000):
    """(config, counts) of ``table`` ("adult" or "nps"; ``rows`` other than 20,000 generates
    the NPS-like table at that size, seed 2020, as peers.py and flow_bench.py do)."""
    from medrelease.data.aggregate import aggregate
    from medrelease.data.config import find_config

    config = find_config("nps-sample" if table == "nps" else "adult-ipa")
    if table == "nps" and rows != 20_000:
        from medrelease.data.nps import generate_nps

        raw = generate_nps(rows, seed=2020)
    else:
        from medrelease.data.input_schema import validate_input
        from medrelease.storage.io import read_input

        raw = validate_input(read_input(config), config)
    return config, aggregate(raw, config)


def table_parser(doc: str) -> argparse.ArgumentParser:
    """The benchmarks' common options: which table (``--table``, ``--rows``) at which ``--eps``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--table", choices=["adult", "nps"], default="adult")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--eps", type=float, default=1.0)
    return parser
