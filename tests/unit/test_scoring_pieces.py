"""The lattice's scoring loop gives every worker a piece in each wave (``score_lattice``):
a small lattice of dear nodes (256 nodes of 1.2 million rows, 19 ms each) went as one piece to
one worker, and the other core idled for half the scoring (docs/results/performance.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from medrelease import release


class Recording:
    """An executor that scores nothing and remembers each wave's piece sizes."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.waves: list[list[int]] = []

    def map(self, fn, pieces, **shared):
        self.waves.append([len(p) for p in pieces])
        return iter([[None] * len(p) for p in pieces])

    def call(self, fn, **arguments):
        raise AssertionError("the scoring loop calls no step")


@pytest.mark.parametrize(("nodes", "workers", "first", "later"), [
    (256, 2, [64, 64], [64, 64]),         # small: each wave split over both workers
    (18_432, 2, [256, 256], None),        # large: pieces of 256, then of the measured rate
    (256, 1, [128], [128]),
])
def test_each_wave_gives_every_worker_a_piece(monkeypatch, nodes, workers, first, later):
    batches = [[(i, j) for j in range(64)] for i in range(nodes // 64)]
    monkeypatch.setattr(release, "node_batches", lambda context, size, plan: batches)
    pieces = Recording(workers)
    summaries = release.score_lattice(SimpleNamespace(), SimpleNamespace(mechanism="ipa"),
                                      pieces, 64)
    assert len(summaries) == nodes
    assert pieces.waves[0] == first
    if later is not None:
        assert pieces.waves[1] == later
    assert len(pieces.waves[1]) >= workers  # the rest, too, on every worker
