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
from tests.flow.test_aim import write_small_dataset

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
    first = re.match(r"Round 0 of about (\d+): measured the 3 columns' one-way marginals",
                     said[0])
    assert first and 1 <= int(first.group(1)) <= 6, said[0]  # round 0 spent 3 rounds' worth
    rounds = [ROUND.match(line) for line in said[1:]]
    assert all(rounds), said
    numbers = [int(m.group(1)) for m in rounds]
    assert numbers == list(range(1, len(said)))
    # issue 55: "of about n" is the run's own projection (the rho left at the current cost),
    # never above the plan's 6, never below the rounds made, and exact at the last round
    about = [int(m.group(2)) for m in rounds]
    assert all(k <= n <= 6 for k, n in zip(numbers, about, strict=True)), about
    assert about[-1] == numbers[-1] == run.selection_rounds
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


# -- issue 55: no silent minutes -------------------------------------------------------------


def test_a_step_without_a_count_says_it_is_still_going(monkeypatch):
    """``ticking``: a step with nothing to count (one pass over a file, aim's round 0) reports
    when it starts and then every TICK_SECONDS with the time it has taken."""
    import time

    seen: list[progress.StepProgress] = []

    class Keep:
        level = 0

        def handle(self, record):
            seen.append(getattr(record, progress.PROGRESS_KEY))

    monkeypatch.setattr(progress._logger, "handle", Keep().handle)
    monkeypatch.setattr(progress, "TICK_SECONDS", 0.05)
    with progress.ticking("reading and counting the extract", "1 file(s)",
                          estimate=lambda elapsed: 7.0):
        time.sleep(0.4)
    assert seen[0].step == "reading and counting the extract" and seen[0].detail == "1 file(s)"
    assert len(seen) >= 4, seen  # said again while it ran
    assert all("s so far, about 7 s left" in s.detail for s in seen[1:])


def test_without_a_terminal_a_long_step_is_printed_again_every_five_seconds(monkeypatch):
    """The CLI prints a line per step when there is no terminal; a step still going (the same
    words) is printed again after LINE_EVERY_S, so a long scoring is never one line and then
    minutes of nothing (issue 55: 267 s)."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    from deployments import cli

    clock = FakeClock()
    monkeypatch.setattr(cli.time, "perf_counter", clock)
    out = io.StringIO()
    bar = Progress(console=Console(file=out, force_terminal=False, width=200))
    handler = cli._ProgressHandler(bar, bar.add_task("x", total=None, detail=""), "k", "p")
    for second in range(0, 21):
        clock.now = 100.0 + second
        handler._show_step(progress.StepProgress("scoring lattice nodes", second * 100, 10_000,
                                                 f"{second * 100:,}/10,000 nodes"))
    printed = [line for line in out.getvalue().splitlines() if "scoring" in line]
    assert len(printed) == 5, printed  # at 0, 5, 10, 15 and 20 s: not one, not 21


def test_scoring_tasks_are_packed_to_the_measured_rate():
    """After the first wave, batches are joined in order into tasks of at least ``nodes``
    nodes (a task costs ~0.15 s of Prefect's bookkeeping: 288 tasks of 64 took 53 s where 16
    took 4; issue 55), keeping every node once and in order."""
    from medrelease.stages import after as _after
    from medrelease.stages import packed as _packed

    batches = [[(i, j) for j in range(k)] for i, k in enumerate([64, 10, 64, 64, 3, 64])]
    tasks = _packed(batches, 100)
    assert [n for task in tasks for n in task] == [n for batch in batches for n in batch]
    assert all(len(task) >= 100 for task in tasks[:-1]) and len(tasks) == 2
    assert _packed(batches, 1) == batches
    # the first wave's tasks, then what is left of the batches after them
    assert _after(batches, len(tasks[0])) == batches[3:] and _after(batches, 269) == []


def test_an_artifact_larger_than_one_prefect_event_is_cut_to_fit(monkeypatch):
    """Prefect's server refuses an event over 1.5 MB, and an artifact's creation event
    carries its data: an 18,432-node table was "Refusing to publish event of size 4608619".
    A table keeps its first rows that fit, and says so in its description."""
    import json

    from tasks import artifacts

    made = {}
    monkeypatch.setattr(artifacts, "create_table_artifact",
                        lambda table, key=None, description=None: made.update(
                            table=table, description=description))
    rows = [{"node": f"age {i % 5} · sex {i % 2} · zip {i % 7}", "il": 0.5, "P(chosen)": 1e-4}
            for i in range(18_432)]
    artifacts.table_artifact(rows, key="k", description="every node")
    size = len(json.dumps(made["table"]).encode())
    assert size <= artifacts.EVENT_BUDGET and 0 < len(made["table"]) < len(rows)
    assert f"of {len(rows):,} rows" in made["description"]
    artifacts.table_artifact(rows[:10], key="k", description="ten")
    assert len(made["table"]) == 10 and made["description"] == "ten"
