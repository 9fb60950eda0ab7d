"""Classification utility of a release (DiffGen's and seed 004's measure).

BA: a decision tree (entropy criterion, the C4.5 stand-in) trained on raw training records.
LA: the majority class of the training records (no predictors).
CA: the same tree trained on the *release* of the training records, tested on the held-out
records generalized to the release's cut. All three use the same held-out records.
``model_scores`` adds a random forest and the geometric mean of per-class recall (seed 004);
``information_gain`` the class information each attribute carries (seed 004 Table 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Accuracies:
    baseline: float      # BA
    lower_bound: float   # LA
    release: float       # CA

    def as_dict(self) -> dict[str, float]:
        return {"BA": self.baseline, "LA": self.lower_bound, "CA": self.release}


def split(frame: pd.DataFrame, test_share: float = 0.3, seed: int = 0):
    order = np.random.default_rng(seed).permutation(len(frame))
    cut = int(len(frame) * (1 - test_share))
    return frame.iloc[order[:cut]].reset_index(drop=True), frame.iloc[order[cut:]].reset_index(
        drop=True)


def features(frame: pd.DataFrame, set_valued: dict[str, str] | None = None) -> pd.DataFrame:
    """One-hot predictors (as text); a set-valued column becomes one indicator per item or node."""
    set_valued = set_valued or {}
    plain = [c for c in frame.columns if c not in set_valued]
    parts = [pd.get_dummies(frame[plain].astype(str), dtype=np.uint8)]
    for column, separator in set_valued.items():
        items = frame[column].fillna("").astype(str).str.get_dummies(sep=separator)
        parts.append(items.add_prefix(f"{column}:").astype(np.uint8))
    return pd.concat(parts, axis=1)


def tree_accuracy(train_x: pd.DataFrame, train_y: pd.Series, test_x: pd.DataFrame,
                  test_y: pd.Series, seed: int = 0,
                  set_valued: dict[str, str] | None = None) -> float:
    """Indicator features, entropy decision tree, accuracy on the test records."""
    from sklearn.tree import DecisionTreeClassifier

    both = features(pd.concat([train_x, test_x]), set_valued).fillna(0)
    model = DecisionTreeClassifier(criterion="entropy", min_samples_leaf=5, random_state=seed)
    model.fit(both.iloc[: len(train_x)], train_y.astype(str))
    return float((model.predict(both.iloc[len(train_x):]) == test_y.astype(str).to_numpy()).mean())


def accuracies(
    train: pd.DataFrame, test: pd.DataFrame, predictors: list[str], label: str,
    released: pd.DataFrame, generalize_test: Callable[[pd.DataFrame], pd.DataFrame],
    set_valued: dict[str, str] | None = None,
) -> Accuracies:
    """BA, LA and CA; ``set_valued`` maps item-set columns to their separator."""
    majority = train[label].astype(str).mode().iloc[0]
    lower = float((test[label].astype(str) == majority).mean())
    base = tree_accuracy(train[predictors], train[label], test[predictors], test[label],
                         set_valued=set_valued)
    cand = tree_accuracy(released[predictors], released[label],
                         generalize_test(test)[predictors], test[label], set_valued=set_valued)
    return Accuracies(base, lower, cand)


def _model(kind: str, seed: int):
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.tree import DecisionTreeClassifier

    if kind == "tree":
        return DecisionTreeClassifier(criterion="entropy", min_samples_leaf=5, random_state=seed)
    return RandomForestClassifier(n_estimators=100, min_samples_leaf=2, random_state=seed,
                                  n_jobs=1)


def model_scores(train_x: pd.DataFrame, train_y: pd.Series, test_x: pd.DataFrame,
                 test_y: pd.Series, kind: str = "tree", seed: int = 0,
                 set_valued: dict[str, str] | None = None) -> dict[str, float]:
    """Accuracy and geometric mean of per-class recall of a tree or forest on the test records."""
    both = features(pd.concat([train_x, test_x]), set_valued).fillna(0)
    model = _model(kind, seed).fit(both.iloc[: len(train_x)], train_y.astype(str))
    predicted = model.predict(both.iloc[len(train_x):])
    truth = test_y.astype(str).to_numpy()
    recalls = [float((predicted[truth == c] == c).mean()) for c in np.unique(truth)]
    return {"accuracy": float((predicted == truth).mean()),
            "gmean_recall": float(np.prod(recalls) ** (1.0 / len(recalls))) if recalls else 0.0}


def information_gain(frame: pd.DataFrame, label: str, attributes: list[str]) -> dict[str, float]:
    """IG(class; attribute) = H(class) - H(class | attribute), in bits, per attribute."""
    def entropy(counts: np.ndarray) -> float:
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log2(p)).sum())

    y = frame[label].astype(str)
    base = entropy(y.value_counts().to_numpy())
    gains = {}
    for column in attributes:
        table = pd.crosstab(frame[column].astype(str), y).to_numpy().astype(float)
        weights = table.sum(axis=1) / table.sum()
        gains[column] = base - float(sum(w * entropy(row) for w, row in zip(weights, table,
                                                                            strict=True)))
    return gains


def diffgen_heldout(train: pd.DataFrame, test: pd.DataFrame, config, params: dict,
                    seed: int | None = None):
    """DiffGen released from ``train``; BA / LA / CA on ``test`` generalized to its cut.

    Set-valued columns are predictors too (one indicator per item or node). Returns the
    accuracies and the release.
    """
    from medrelease.mechanisms import get_mechanism
    from medrelease.release import release

    released = release(train, config, mechanism="diffgen", params=params, seed=seed)
    impl = get_mechanism("diffgen")
    separators = {c: config.columns[c].separator or "" for c in config.set_valued}
    scores = accuracies(train, test, config.dimensions + config.set_valued,
                        config.class_columns[0], released.table,
                        lambda t: impl.generalize(t, config, released.details), separators)
    return scores, released
