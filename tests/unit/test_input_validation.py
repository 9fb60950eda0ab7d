"""Bad extracts give a message that names the column, the problem, counts and file lines —
never a value from the file (those go to the steward-only log)."""

from __future__ import annotations

from pathlib import Path

import pytest

from medrelease.data.config import DatasetConfig
from medrelease.data.input_schema import validate_input
from medrelease.errors import InputValidationError
from medrelease.storage.io import counting_positions, read_input

HEADER = "patient_id,age,sex,length_of_stay,surgery,region,diagnosis\n"
GOOD = "1,34,F,3,N,11,A001\n2,70,M,12,Y,31,B002\n"


def _load(tmp_path: Path, config: DatasetConfig, text: str | bytes, name: str = "x.csv"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with counting_positions(config, path):  # as the flow's input task does
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
         "repeats 1 column name.*'age'"),
        (HEADER.replace(",region", "") + "1,34,F,3,N,A001\n", "missing declared column.*'region'"),
        (HEADER + "1,thirty,F,3,N,11,A001\n",
         "column 'age': 1 distinct value.* not whole numbers.*file line 2"),
        (HEADER + "1,34,F,-2,N,11,A001\n1,34,F,9999,N,11,A001\n",
         "column 'length_of_stay': 2 distinct value.*not covered.*file lines 2, 3"),
        (HEADER + GOOD + "3,34,X,3,N,11,A001\n", "column 'sex': 1 distinct.*not covered.*line 4"),
        (HEADER + "1,34,F,3,N,99,A001\n", "column 'region': 1 distinct value"),
        (HEADER + "1,,F,3,N,11,A001\n2,5,F,3,N,11,\n",
         "(?s)column 'age': 1 missing value.*column 'diagnosis': 1 missing value"),
        (HEADER + "1,1e1,F,3,N,11,A001\n", "column 'age'.*not whole numbers"),
        (HEADER + "1,34,F,3,N,11,A0\x0001\n", "column 'diagnosis'.*control characters"),
    ],
)
def test_bad_files(tmp_path, nps_config, text, message) -> None:
    with pytest.raises(InputValidationError, match=message) as err:
        _load(tmp_path, nps_config, text)
    for value in ("thirty", "9999", "'X'", "'99'", "1e1", "A0"):
        assert value not in str(err.value)


def test_wrong_encoding_names_the_setting(tmp_path, nps_config) -> None:
    text = (HEADER + "1,34,F,3,N,11,Ä001\n").encode("latin-1")
    with pytest.raises(InputValidationError, match=r"input\.encoding"):
        _load(tmp_path, nps_config, text)


def test_problems_are_structured(tmp_path, nps_config) -> None:
    with pytest.raises(InputValidationError) as err:
        _load(tmp_path, nps_config, HEADER + "1,130,F,3,N,11,A001\n2,130,F,3,N,11,A001\n")
    problem = err.value.problems[0]
    assert problem["column"] == "age" and problem["values"] == ["130"]
    assert problem["rows"] == 2 and problem["first_positions"] == [2, 3]  # file lines
