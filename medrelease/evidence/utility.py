"""The IPA paper's analysis queries, run as SQL in DuckDB on the input and on a release.

Counts and average length of stay per 5-year age group and sex, for one diagnosis and
non-surgical stays (paper tables 9-12). Generalized values are spread as EVALUATION.md says:
an age interval spreads its rows evenly over the age groups it covers, a generalized length of
stay counts at its interval midpoint, and ``*`` spreads over the whole domain (so a suppressed
diagnosis contributes 1/|domain| of a row to the chosen diagnosis). The input goes through the
same SQL, its raw values being one-leaf labels.

These numbers compare the release with the *raw* data: they are for the steward, never for
publication.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from medrelease.data.aggregate import value_counts_by
from medrelease.data.config import DatasetConfig
from medrelease.data.taxonomy import SUPPRESSED, Taxonomy


@dataclass(frozen=True)
class AnalysisQuery:
    """Which columns play the paper's roles; datasets without them skip the queries."""

    age: str = "age"
    sex: str = "sex"
    length_of_stay: str = "length_of_stay"
    surgery: str = "surgery"
    non_surgical: str = "N"
    diagnosis: str = "diagnosis"
    age_group_width: int = 5

    def columns(self) -> list[str]:
        return [self.age, self.sex, self.length_of_stay, self.surgery, self.diagnosis]

    def applies_to(self, config: DatasetConfig) -> bool:
        return all(c in config.dimensions for c in self.columns()[:4]) and \
            self.diagnosis in config.informative


SQL = """
SELECT a.age_group, s.value AS sex,
       SUM(r.n * a.w * s.w * g.w * d.w) AS stays,
       SUM(r.n * a.w * s.w * g.w * d.w * l.mid) / NULLIF(SUM(r.n * a.w * s.w * g.w * d.w), 0)
           AS avg_los
FROM rows_ r
JOIN age_w a ON r.age = a.label
JOIN sex_w s ON r.sex = s.label
JOIN surgery_w g ON r.surgery = g.label
JOIN diagnosis_w d ON r.diagnosis = d.label
JOIN los_mid l ON r.los = l.label
GROUP BY 1, 2
"""


def leaf_values(taxonomy: Taxonomy, label: str) -> np.ndarray:
    """The raw (leaf) values a released label stands for; empty if the label is unknown."""
    return np.asarray(taxonomy.leaves, dtype=object)[taxonomy.leaf_mask(label)]


def _weights(config: DatasetConfig, query: AnalysisQuery, table: pd.DataFrame, diagnosis: str,
             domain_size: int) -> dict[str, pd.DataFrame]:
    """Per label, its weight in each query role; ``table`` holds the labels as text (the
    distinct combinations with their counts)."""
    tax = config.taxonomies
    frames: dict[str, list[tuple]] = {k: [] for k in ("age_w", "sex_w", "surgery_w", "los_mid")}
    for label in table[query.age].astype(str).unique():
        ages = leaf_values(tax[query.age], label).astype(np.int64)
        groups, counts = np.unique(ages // query.age_group_width * query.age_group_width,
                                   return_counts=True)
        frames["age_w"] += [(label, int(g), c / ages.size) for g, c in zip(groups, counts,
                                                                          strict=True)]
    for label in table[query.sex].astype(str).unique():
        values = leaf_values(tax[query.sex], label)
        frames["sex_w"] += [(label, str(v), 1.0 / values.size) for v in values]
    for label in table[query.surgery].astype(str).unique():
        values = leaf_values(tax[query.surgery], label).astype(str)
        if values.size:
            frames["surgery_w"].append((label, "", float((values == query.non_surgical).mean())))
    for label in table[query.length_of_stay].astype(str).unique():
        stays = leaf_values(tax[query.length_of_stay], label).astype(np.float64)
        if stays.size:
            frames["los_mid"].append((label, "", (stays.min() + stays.max()) / 2.0))
    out = {
        "age_w": pd.DataFrame(frames["age_w"], columns=["label", "age_group", "w"]),
        "sex_w": pd.DataFrame(frames["sex_w"], columns=["label", "value", "w"]),
        "surgery_w": pd.DataFrame(frames["surgery_w"], columns=["label", "_", "w"]),
        "los_mid": pd.DataFrame(frames["los_mid"], columns=["label", "_", "mid"]),
    }
    labels = table[query.diagnosis].astype(str).unique()
    out["diagnosis_w"] = pd.DataFrame({
        "label": labels,
        "w": [1.0 if v == diagnosis else (1.0 / domain_size if v == SUPPRESSED else 0.0)
              for v in labels],
    })
    return out


def run_queries(table: pd.DataFrame, config: DatasetConfig, query: AnalysisQuery,
                diagnosis: str, domain_size: int, weights: np.ndarray | None = None
                ) -> pd.DataFrame:
    """Stays and average length of stay per (age group, sex) for ``diagnosis``, in DuckDB
    (``weights``: the rows each row of ``table`` stands for)."""
    import duckdb

    # Only the chosen diagnosis and "*" weigh anything: count those rows alone (on the input
    # a few percent of the rows, so the evaluation does not pay for a million-row grouping).
    wanted = _text_in(table[query.diagnosis], [diagnosis, SUPPRESSED])
    counted = value_counts_by(table.loc[wanted, query.columns()], query.columns(),
                              weights=None if weights is None else weights[wanted])
    weights = _weights(config, query, counted, diagnosis, domain_size)
    grouped = counted.rename(columns={query.age: "age", query.sex: "sex",
                                      query.surgery: "surgery", query.diagnosis: "diagnosis",
                                      query.length_of_stay: "los"})
    with duckdb.connect() as con:
        con.register("rows_", grouped)
        for name, frame in weights.items():
            con.register(name, frame)
        return con.execute(SQL).df()


def _text_in(column: pd.Series, texts: list[str]) -> np.ndarray:
    """Rows whose value, as text, is one of ``texts``, without forming every row's text
    (0.1 s per million rows): categoricals by their categories, strings as they are."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        hit = np.asarray([str(c) in texts for c in column.cat.categories] + [False])
        return hit[column.cat.codes.to_numpy()]  # code -1 (missing) takes the last entry
    if pd.api.types.is_string_dtype(column.dtype) and column.dtype != object:
        return column.isin(texts).to_numpy(dtype=bool)
    return column.astype(str).isin(texts).to_numpy()


def most_frequent(table: pd.DataFrame, column: str, weights: np.ndarray | None = None) -> str:
    """The most frequent value as text; ties go to the smallest text (as ``mode()``)."""
    counted = value_counts_by(table, [column], weights=weights)
    top = counted[counted["n"] == counted["n"].max()]
    return str(top[column].sort_values().iloc[0])


def compare_queries(original: pd.DataFrame, released: pd.DataFrame, config: DatasetConfig,
                    query: AnalysisQuery | None = None, diagnosis: str | None = None,
                    original_weights: np.ndarray | None = None
                    ) -> tuple[pd.DataFrame, dict[str, float | str]]:
    """Side-by-side query results (original vs release) and their mean errors.

    ``diagnosis`` defaults to the input's most frequent one (the comparison is internal);
    ``original_weights``: the rows each row of ``original`` stands for (its distinct cells).
    """
    query = query or AnalysisQuery()
    diagnosis = diagnosis or most_frequent(original, query.diagnosis, original_weights)
    domain = config.informative_domain
    domain_size = len(domain) if domain else int(original[query.diagnosis].nunique())
    both = []
    for name, table, weights in (("original", original, original_weights),
                                 ("released", released, None)):
        result = run_queries(table, config, query, diagnosis, domain_size, weights)
        both.append(result.rename(columns={"stays": f"{name}_stays",
                                           "avg_los": f"{name}_avg_los"}))
    ages = np.arange(int(config.taxonomies[query.age].leaves[0]) // query.age_group_width,
                     int(config.taxonomies[query.age].leaves[-1]) // query.age_group_width + 1
                     ) * query.age_group_width
    sexes = [str(v) for v in config.taxonomies[query.sex].leaves]
    grid = pd.MultiIndex.from_product([ages, sexes], names=["age_group", "sex"]).to_frame(
        index=False)
    side = grid.merge(both[0], how="left", on=["age_group", "sex"]).merge(
        both[1], how="left", on=["age_group", "sex"])
    side[["original_stays", "released_stays"]] = side[
        ["original_stays", "released_stays"]].fillna(0.0)
    side["stays_abs_error"] = (side["released_stays"] - side["original_stays"]).abs()
    side["avg_los_abs_error"] = (side["released_avg_los"] - side["original_avg_los"]).abs()
    present = side["original_stays"] > 0
    summary: dict[str, float | str] = {
        "diagnosis": diagnosis,
        "stays_mean_abs_error": float(side["stays_abs_error"].mean()),
        "stays_mean_rel_error": float((side.loc[present, "stays_abs_error"]
                                       / side.loc[present, "original_stays"]).mean())
        if present.any() else float("nan"),
        "avg_los_mean_abs_error": float(side["avg_los_abs_error"].mean()),
    }
    return side, summary
