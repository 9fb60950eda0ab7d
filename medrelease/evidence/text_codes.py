"""A column read by its text without forming the text of every row.

The evaluation compares the input with the release value by value *as text* (an integer column
read from CSV and a column of strings alike). ``series.astype(str)`` on a million rows builds a
million Python strings (0.1-0.5 s a column, and the evaluation asked for it about sixty times:
most of its 18 s at 1,361,000 rows). Here each column becomes integer codes plus the text of
each distinct value, formed once per distinct value; every count, match and group-by then runs
on the codes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MISSING = -1  # the code of a missing value (``astype(str)`` keeps it missing)


def text_codes(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes (int64, ``MISSING`` for a missing value) and the distinct texts they index, such
    that ``texts[codes]`` equals ``values.astype(str)`` row for row wherever a value is present.

    Only texts that occur are kept, each once (values ``1`` and ``"1"`` share the text "1");
    their order is unspecified."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        codes = values.cat.codes.to_numpy().astype(np.int64)
        texts = _as_text(values.cat.categories)
    elif _factorized_by_value(values):
        codes, uniques = pd.factorize(values)  # a missing value: -1
        codes = codes.astype(np.int64)
        texts = _as_text(uniques)
    else:  # floats (0.0 and -0.0 are one value, two texts), mixed objects (1, 1.0, True)
        codes, uniques = pd.factorize(values.astype(str))
        codes = np.where(values.isna().to_numpy(), MISSING, codes).astype(np.int64)
        texts = np.asarray(uniques, dtype=object)
    present = codes >= 0
    used = np.bincount(codes[present], minlength=len(texts)) > 0
    merged, distinct = pd.factorize(texts[used])  # equal texts of distinct values: one code
    remap = np.full(len(texts) + 1, MISSING, dtype=np.int64)  # last entry: MISSING stays
    remap[np.flatnonzero(used)] = merged
    return remap[codes], np.asarray(distinct, dtype=object)


def _factorized_by_value(values: pd.Series) -> bool:
    """Whether values equal as values are equal as text: integers, booleans, strings (not
    floats: 0.0 == -0.0; not mixed objects: 1 == 1.0 == True)."""
    if pd.api.types.is_integer_dtype(values.dtype) or pd.api.types.is_bool_dtype(values.dtype):
        return True
    return (pd.api.types.is_object_dtype(values.dtype)
            or pd.api.types.is_string_dtype(values.dtype)) and \
        pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty")


def _as_text(values) -> np.ndarray:
    """Distinct values as ``astype(str)`` writes them (the same conversion, on few values)."""
    return np.asarray(pd.Index(values).astype(str), dtype=object)


def code_of(texts: np.ndarray, wanted: list[str]) -> np.ndarray:
    """Per text in ``wanted``: its code among ``texts``, or ``MISSING`` when no row has it."""
    index = {text: i for i, text in enumerate(texts)}
    return np.asarray([index.get(text, MISSING) for text in wanted], dtype=np.int64)


class CodedColumns:
    """A table's columns as ``text_codes``, each computed once however often it is read."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self.frame = frame
        self._codes: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        if column not in self._codes:
            self._codes[column] = text_codes(self.frame[column])
        return self._codes[column]
