"""Information loss of a perturbed node: NCP, EMD and Rate, each in [0, 1] (ALGORITHMS.md §2).

All three are computed from *released cells*: per equivalence class, the true and the released
row count of every (class, informative value) cell, the released rows whose informative value
does not occur in the class (``extra``), and the rows that are noise (``noise``). The suppressed
class ``(*, ..., *)`` is one more class with NCP 1. Parts are kept separately because users plot
them (IPA paper Fig. 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ILParts:
    ncp: float
    emd: float
    rate: float

    @property
    def il(self) -> float:
        return self.ncp + self.emd + self.rate


@dataclass(frozen=True)
class ReleasedCells:
    """A node's perturbed table as counts, the suppressed class last when present.

    ``class_of_cell`` is non-decreasing; ``class_ncp`` holds each class's mean NCP over the
    dimensions (1 for the suppressed class); ``suppressed_class`` marks it; ``class_keys`` holds
    each class's node-level key (-1 for the suppressed class).
    """

    class_of_cell: np.ndarray
    inf_codes: np.ndarray
    true_counts: np.ndarray
    released_counts: np.ndarray
    class_extra: np.ndarray
    class_noise: np.ndarray
    class_ncp: np.ndarray
    suppressed_class: np.ndarray
    class_keys: np.ndarray
    # A release over several lattice nodes (ipa's fallback ladder): the node of each class, as
    # an index into ``nodes``. None: every class belongs to the one chosen node.
    class_node: np.ndarray | None = None
    nodes: tuple[tuple[int, ...], ...] = ()

    @property
    def n_classes(self) -> int:
        return len(self.class_ncp)

    def class_released(self) -> np.ndarray:
        return (
            np.bincount(self.class_of_cell, weights=self.released_counts, minlength=self.n_classes)
            + self.class_extra
        )

    def class_true(self) -> np.ndarray:
        return np.bincount(self.class_of_cell, weights=self.true_counts, minlength=self.n_classes)


def information_loss(cells: ReleasedCells, released: np.ndarray | None = None) -> ILParts:
    """NCP over released rows; EMD and Rate averaged over released classes.

    * NCP: a row's mean per-attribute NCP; rows of the suppressed class score 1.
    * EMD per class: half the L1 distance between the true and the released distribution of the
      informative value; released values absent from the class count fully (``extra``).
    * Rate per class: noise rows over released rows, at most 1.
    A release with no rows loses everything: (1, 1, 1).
    """
    released = cells.class_released() if released is None else released
    total = released.sum()
    if total <= 0:
        return ILParts(1.0, 1.0, 1.0)
    shown = released > 0
    ncp = float(np.dot(released, cells.class_ncp) / total)
    true = cells.class_true()
    cls = cells.class_of_cell
    with np.errstate(divide="ignore", invalid="ignore"):
        p = cells.true_counts / np.where(true[cls] > 0, true[cls], 1)
        q = cells.released_counts / np.where(released[cls] > 0, released[cls], 1)
        l1 = np.bincount(cls, weights=np.abs(p - q), minlength=cells.n_classes)
        extra = cells.class_extra / np.where(released > 0, released, 1)
        emd_class = 0.5 * (l1 + extra)
        rate_class = np.minimum(1.0, cells.class_noise / np.where(released > 0, released, 1))
    emd = float(np.clip(emd_class[shown], 0.0, 1.0).mean())
    rate = float(rate_class[shown].mean())
    return ILParts(min(ncp, 1.0), emd, rate)


def class_ncp(taxonomies: tuple, node: tuple[int, ...], class_codes: np.ndarray) -> np.ndarray:
    """Mean NCP over the dimensions for each class (rows of node-level codes)."""
    if class_codes.shape[0] == 0 or not taxonomies:
        return np.zeros(class_codes.shape[0])
    total = np.zeros(class_codes.shape[0])
    for i, taxonomy in enumerate(taxonomies):
        total += taxonomy.ncp(node[i])[class_codes[:, i]]
    return total / len(taxonomies)
