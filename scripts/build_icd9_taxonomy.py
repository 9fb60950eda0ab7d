"""Write taxonomies/icd9/icd9.csv from the ICD-9 dictionary of the MIMIC-III demo.

    python scripts/build_icd9_taxonomy.py [../shared/data/mimic-iii-demo/D_ICD_DIAGNOSES.csv]
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from medrelease.data.icd9 import taxonomy_lines  # noqa: E402


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        ROOT.parent / "shared/data/mimic-iii-demo/D_ICD_DIAGNOSES.csv"
    with source.open(encoding="utf-8") as handle:
        codes = [row["ICD9_CODE"] for row in csv.DictReader(handle)]
    target = ROOT / "taxonomies/icd9/icd9.csv"
    target.parent.mkdir(parents=True, exist_ok=True)
    lines = taxonomy_lines(codes)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines):,} codes -> {target}")


if __name__ == "__main__":
    main()
