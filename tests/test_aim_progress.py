"""What a steward sees while ``aim`` runs: a sentence per round in the run's log (round k of
about n, rho used, elapsed, then an estimate of the time left), and the progress bar's estimate
of the time left (``flows/progress.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from flows import progress
from medrelease.data.aggregate import aggregate
from medrelease.data.config import load_config
from medrelease.release import plan_release
from medrelease.synthetic.release import aim_rounds
from tests.test_aim import write_small_dataset

ROUND = re.compile(r"^Round (\d+) of about (\d+): measured [\w ]+ \(taxonomy levels [\d, ]+; "
                   r"[\d,]+ cells\) with noise sigma [\d.]+; (\d+)% of the rounds' rho used "
                   r"\([\d.e-]+ of [\d.e-]+\) after (\d+\.\d) s\.(.*)$")


def test_every_round_is_a_sentence_with_rho_elapsed_and_then_the_time_left(tmp_path: Path):
    config = load_config(write_small_dataset(tmp_path))
    counts = aggregate(pd.read_csv(tmp_path / "t.csv"), config)
    plan = plan_release("aim", {"epsilon": 1.0, "rounds_per_column": 2, "iters": 20,
                                "final_iters": 20}, 0, seed=3)
    said: list[str] = []
    run = aim_rounds(counts, config, plan, said.append)
    run.run()
    assert said[0].startswith("Round 0 of about 6: measured the 3 columns' one-way marginals")
    rounds = [ROUND.match(line) for line in said[1:]]
    assert all(rounds), said
    numbers = [int(m.group(1)) for m in rounds]
    assert numbers == list(range(1, len(said))) and {m.group(2) for m in rounds} == {"6"}
    shares = [int(m.group(3)) for m in rounds]
    assert shares == sorted(shares) and shares[-1] == 100
    elapsed = [float(m.group(4)) for m in rounds]
    assert elapsed == sorted(elapsed)
    endings = [m.group(5) for m in rounds]
    # no estimate from round 1 alone; one from round 2 on; the last round says it is the last
    assert "left" not in endings[0]
    assert all(re.search(r"About \d+ s of rounds left\.$", e) for e in endings[1:-1])
    assert endings[-1].endswith("This was the last round; sampling the rows next.")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_progress_bar_estimates_the_time_left_after_the_first_rounds(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(progress.time, "perf_counter", clock)
    seen: list[progress.StepProgress] = []

    class Keep:
        level = 0

        def handle(self, record):
            seen.append(getattr(record, progress.PROGRESS_KEY))

    monkeypatch.setattr(progress._logger, "handle", Keep().handle)
    for k, share in enumerate([0.05, 0.15, 0.25, 0.5, 1.0]):
        clock.now = 100.0 + 10 * k
        progress.report_progress(f"aim round {k} of about 8", share, 1.0,
                                 f"rho used {share:.0%}")
    assert [s.remaining for s in seen[:2]] == [None, None]  # too few rounds to go on
    # 20 s for 25 % of the budget: about 60 s left; at half after 30 s: 30 s left
    assert seen[2].remaining == pytest.approx(20 * 0.75 / 0.25)
    assert seen[3].remaining == pytest.approx(30.0)
    assert seen[3].detail_with_estimate == "rho used 50%, about 30 s left"
    assert seen[3].detail == "rho used 50%"  # the one-line-per-step output is unchanged
    assert seen[4].detail_with_estimate == "rho used 100%"  # finished: no estimate
    # a new run of the step (its share falls back) starts its own clock
    clock.now = 500.0
    progress.report_progress("aim round 0 of about 8", 0.05, 1.0, "rho used 5%")
    assert seen[-1].elapsed == 0.0 and seen[-1].remaining is None
