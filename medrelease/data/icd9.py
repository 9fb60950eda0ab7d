"""ICD-9-CM diagnosis codes as an item taxonomy: code -> 3-digit category -> chapter -> *.

Built from the code structure alone (no data): numeric codes belong to the category of their
first three digits, ``V`` codes to ``V`` + two digits, ``E`` codes to ``E`` + three digits, and
categories to the ICD-9-CM chapter ranges below. Used for set-valued predictors (the set of
diagnosis codes of an admission).
"""

from __future__ import annotations

from collections.abc import Iterable

CHAPTERS: list[tuple[int, int, str]] = [
    (1, 139, "001-139 infectious and parasitic"),
    (140, 239, "140-239 neoplasms"),
    (240, 279, "240-279 endocrine, nutritional, metabolic, immunity"),
    (280, 289, "280-289 blood and blood-forming organs"),
    (290, 319, "290-319 mental disorders"),
    (320, 389, "320-389 nervous system and sense organs"),
    (390, 459, "390-459 circulatory system"),
    (460, 519, "460-519 respiratory system"),
    (520, 579, "520-579 digestive system"),
    (580, 629, "580-629 genitourinary system"),
    (630, 679, "630-679 pregnancy, childbirth, puerperium"),
    (680, 709, "680-709 skin and subcutaneous tissue"),
    (710, 739, "710-739 musculoskeletal and connective tissue"),
    (740, 759, "740-759 congenital anomalies"),
    (760, 779, "760-779 perinatal conditions"),
    (780, 799, "780-799 symptoms, signs, ill-defined conditions"),
    (800, 999, "800-999 injury and poisoning"),
]
V_CHAPTER = "V01-V91 supplementary factors"
E_CHAPTER = "E000-E999 external causes"


def category(code: str) -> str:
    code = code.strip().upper()
    if not code:
        raise ValueError("empty ICD-9 code")
    if code[0] == "E":
        return code[:4]
    return code[:3]


def chapter(code: str) -> str:
    code = code.strip().upper()
    if code.startswith("V"):
        return V_CHAPTER
    if code.startswith("E"):
        return E_CHAPTER
    number = int(code[:3])
    for low, high, name in CHAPTERS:
        if low <= number <= high:
            return name
    raise ValueError(f"{code!r} is not an ICD-9-CM diagnosis code")


def taxonomy_lines(codes: Iterable[str]) -> list[str]:
    """ARX lines ``code;category;chapter;*`` for every code and every code's shorter prefixes.

    Prefixes (categories and subcategories) are leaves too, because records use them when a
    diagnosis is not coded to full precision.
    """
    leaves: set[str] = set()
    for code in codes:
        code = code.strip().upper()
        if not code:
            continue
        shortest = 4 if code[0] == "E" else 3
        for length in range(shortest, len(code) + 1):
            leaves.add(code[:length])
    return [f"{c};{category(c)};{chapter(c)};*" for c in sorted(leaves)]
