"""The ICD-9 item taxonomy and the MIMIC-III demo joined per admission."""

from __future__ import annotations

import pandas as pd
import pytest

from medrelease.data.icd9 import category, chapter, taxonomy_lines
from medrelease.data.mimic import admissions_table
from medrelease.data.taxonomy import load_taxonomy

from ..conftest import ROOT, SHARED


def test_code_structure() -> None:
    assert (category("99591"), chapter("99591")) == ("995", "800-999 injury and poisoning")
    assert (category("V1323"), chapter("V1323")) == ("V13", "V01-V91 supplementary factors")
    assert (category("E8795"), chapter("E8795")) == ("E879", "E000-E999 external causes")
    assert chapter("0389") == "001-139 infectious and parasitic"
    assert taxonomy_lines(["4019"]) == [
        "401;401;390-459 circulatory system;*", "4019;401;390-459 circulatory system;*"]
    with pytest.raises(ValueError):
        chapter("ABC")


def test_shipped_taxonomy_covers_every_demo_diagnosis() -> None:
    taxonomy = load_taxonomy(ROOT / "taxonomies/icd9/icd9.csv", "icd9")
    assert taxonomy.height == 3 and taxonomy.cardinality(2) == 19
    table = admissions_table(SHARED / "data/mimic-iii-demo")
    assert len(table) == 129 and table["hadm_id"].is_unique
    items = pd.Series([c for codes in table["icd9_codes"] for c in codes.split("|") if c])
    assert len(items) == 1761
    taxonomy.encode(items)  # raises if any code is not covered
    assert set(table["died_in_hospital"]) == {"no", "yes"}
    assert not (table == "").any().any()
