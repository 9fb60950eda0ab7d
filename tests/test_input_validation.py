"""Bad extracts give a message that names the column, the value and the rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from medrelease.config import DatasetConfig
from medrelease.errors import InputValidationError
from medrelease.io import read_input
from schemas.input import validate_input

HEADER = "patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n"
GOOD = "1,34,F,3,N,11,A001\n2,70,M,12,Y,31,B002\n"


def _load(tmp_path: Path, config: DatasetConfig, text: str | bytes, name: str = "x.csv"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return validate_input(read_input(config, path), config)


def test_good_file_passes(tmp_path, nps_config) -> None:
    frame = _load(tmp_path, nps_config, HEADER + GOOD)
    assert len(frame) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        (HEADER, "no data rows"),
        (HEADER.replace(",", ";") + GOOD.replace(",", ";"), "set input.delimiter: ';'"),
        ("patient_id,age,age,sex,length_of_stay,surgery,region,diagnosis\n",
         "'age' appear more than once"),
        (HEADER.replace(",region", "") + "1,34,F,3,N,A001\n", "missing column.*'region'"),
        (HEADER + "1,thirty,F,3,N,11,A001\n", "column 'age': value 'thirty' is not a whole number"),
        (HEADER + "1,34,F,-2,N,11,A001\n1,34,F,9999,N,11,A001\n",
         "(?s)'-2' is not covered.*'9999' is not covered"),
        (HEADER + GOOD + "3,34,X,3,N,11,A001\n", r"column 'sex': value 'X' is not covered.*row\(s\) 3"),
        (HEADER + "1,34,F,3,N,99,A001\n", "column 'region': value '99'"),
        (HEADER + "1,,F,3,N,11,A001\n2,5,F,3,N,11,\n",
         "(?s)column 'age': 1 missing value.*column 'diagnosis': 1 missing value"),
    ],
)
def test_bad_files(tmp_path, nps_config, text, message) -> None:
    with pytest.raises(InputValidationError, match=message):
        _load(tmp_path, nps_config, text)


def test_wrong_encoding_names_the_setting(tmp_path, nps_config) -> None:
    text = (HEADER + "1,34,F,3,N,11,Ä001\n").encode("latin-1")
    with pytest.raises(InputValidationError, match=r"input\.encoding"):
        _load(tmp_path, nps_config, text)


def test_problems_are_structured(tmp_path, nps_config) -> None:
    with pytest.raises(InputValidationError) as err:
        _load(tmp_path, nps_config, HEADER + "1,130,F,3,N,11,A001\n2,130,F,3,N,11,A001\n")
    problem = err.value.problems[0]
    assert problem["column"] == "age" and problem["value"] == "130"
    assert problem["rows"] == 2 and problem["first_rows"] == [1, 2]
