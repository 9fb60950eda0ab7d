"""The release task done by the DP synthetic-data tools a user would pick instead (MST, AIM).

For each table (NPS-like, ``--rows`` rows; Adult as ``adult-ipa``) and each eps, every tool
releases a table of the input's size and is measured the same way (EVALUATION.md):

* workload error: mean TVD over every 2-way (dimension x informative) and 3-way (two dimensions
  x informative) marginal on the raw domains, generalized values spread uniformly;
* rows carrying their raw informative value under a non-'*' class, as a share of input rows
  (synthetic and shuffled rows carry no input row: "-");
* the IPA paper's queries (Q1-Q4: stays and mean length of stay per 5-year age group and sex,
  non-surgical, most frequent diagnosis), mean absolute errors, on the NPS-like table;
* wall time (ipa: aggregation + release; peers: fit + generate in their own process).

Tools: ``ipa`` (the sound default, defaults of medrelease/mechanisms/ipa.py), ``ipa-every-value``
(the same with ``pool_every_value``: the '*' pool as a noisy count of every domain value),
``aim`` (ours: medrelease's ``aim`` with its defaults, numpy throughout: nothing to compile),
``aim-ref`` and ``mst-ref`` (the authors'
reference AIM and MST ported to mbi 2.x, ``benchmarks/reference_mbi.py``, ``aim-ref`` engineered
as a user would: one numpy copy of the model per round scores every candidate, compiled
programs kept; same workload, eps and delta), ``aim-ref-literal`` (the reference AIM as first
ported: per-candidate ``model.project``, caches dropped each round), and two references with
no joint information: ``shuffled`` (every column permuted independently) and ``all-star``
(every dimension '*', raw informative values), which are not DP.
``aim``, the references and ``mst-ref`` each run in a process of their own (nothing compiled
in memory, as a served run), interleaved seed by seed; their wall time is the fit and the
sampling (ours: the aggregation too), and each one's time is also given as the median, over
seeds, of its ratio to ``aim-ref``'s time on the same seed in the same benchmark run, with the
machine's 1-minute load average as each run started and the run's peak RSS.

``aim-dpmm`` and ``mst-dpmm`` (dpmm 0.1.9, not in the default list) pin numpy/pandas versions the
product does not use, so they run in their own virtual environment, made on first use
(``var/bench/peers-venv``, needs Python 3.10/3.11).

    python benchmarks/peers.py                                  # eps 0.5 1 2, both tables
    python benchmarks/peers.py --tables nps --eps 1 --tools ipa aim aim-ref shuffled
    python benchmarks/peers.py --write docs/results/peers.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEER_REQUIREMENTS = ["dpmm==0.1.9"]  # newest on PyPI here; pins numpy 1.26.4, pandas 2.1.0
VENV = ROOT / "var" / "bench" / "peers-venv"
WORKER = Path(__file__).resolve().parent / "peers_worker.py"
TOOLS = ["ipa", "ipa-every-value", "aim", "aim-ref", "mst-ref", "shuffled", "all-star"]
DPMM = {"aim-dpmm": "aim", "mst-dpmm": "mst"}
# aim-ref-literal: the reference AIM as first ported (per-candidate model.project, slow)
EXTRA = ["aim-ref-literal"]
OWN_PROCESS = {"aim", "aim-ref", "aim-ref-literal", "mst-ref", *DPMM}
DEFAULT_TOOLS = TOOLS
TOOLS = [*TOOLS, *EXTRA, *DPMM]
SYNTHETIC = {"shuffled", *OWN_PROCESS}
REFERENCE = Path(__file__).resolve().parent / "reference_mbi.py"
REFERENCES = {"aim-ref", "aim-ref-literal", "mst-ref"}
RATIO_TO = "aim-ref"  # own-process tools' time as a ratio to it, seed by seed, same run


@dataclass
class Table:
    name: str
    config: object
    raw: pd.DataFrame        # the released columns only, as read
    counts: object           # CountTable
    domain: dict[str, list[str]]
    dataset: str = ""
    rows: int = 0


@dataclass
class Outcome:
    tvd2: list[float] = field(default_factory=list)
    tvd3: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)
    stays: list[float] = field(default_factory=list)
    los: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)   # 1-minute load average as a run started
    peak_gb: list[float] = field(default_factory=list)
    status: str = "ok"


# -- the peers' environment ---------------------------------------------------------------

def peer_python() -> Path:
    """The peers' interpreter; the venv is made (and its requirements installed) once."""
    python = VENV / "bin" / "python"
    stamp = VENV / "requirements.txt"
    if python.exists() and stamp.exists() and stamp.read_text() == "\n".join(PEER_REQUIREMENTS):
        return python
    base = _base_python()
    print(f"making the peers' environment in {VENV} ({' '.join(PEER_REQUIREMENTS)}) ...",
          flush=True)
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([str(base), "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    *PEER_REQUIREMENTS], check=True)
    stamp.write_text("\n".join(PEER_REQUIREMENTS))
    return python


def _base_python() -> Path:
    if sys.version_info[:2] in {(3, 10), (3, 11)}:
        return Path(sys.executable)
    for name in ("python3.11", "python3.10"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise SystemExit("dpmm needs Python 3.10 or 3.11; none found on PATH")


# -- tables -------------------------------------------------------------------------------

def load_table(name: str, rows: int) -> Table:
    from medrelease.data.aggregate import aggregate
    from medrelease.data.config import find_config

    if name == "nps":
        from medrelease.data.nps import generate_nps

        config = find_config("nps-sample")
        raw = generate_nps(rows, seed=2020)
    else:
        from medrelease.data.input_schema import validate_input
        from medrelease.storage.io import read_input

        config = find_config("adult-ipa")
        raw = validate_input(read_input(config), config)
    counts = aggregate(raw, config)
    columns = list(counts.dimensions) + list(counts.informative.columns)
    table_name = "nps-sample" if name == "nps" else "adult-ipa"
    domain = public_domains(config)
    return Table(name, config, raw[columns].astype(str), counts, domain, table_name, rows)


def public_domains(config) -> dict[str, list[str]]:
    """Each released column's public values in the released order: taxonomy leaves, then the
    informative column's declared domain (the codes every tool's output is read back with)."""
    from medrelease.data.aggregate import aggregate
    from medrelease.data.input_schema import validate_input
    from medrelease.storage.io import read_input
    from medrelease.synthetic.space import MarginalSpace

    counts = aggregate(validate_input(read_input(config), config).head(1), config)
    return {a.name: [str(v) for v in a.leaf_labels] for a in MarginalSpace(counts).attributes}


# -- the tools ----------------------------------------------------------------------------

def release_ipa(table: Table, epsilon: float, seed: int, every_value: bool) -> pd.DataFrame:
    from medrelease.data.aggregate import aggregate
    from medrelease.plan import PublicFacts
    from medrelease.release import release_from_counts

    counts = aggregate(table.raw, table.config)  # timed with the release, as a user would run it
    params = {"epsilon": epsilon, "pool_every_value": every_value}
    result = release_from_counts(counts, "ipa", params, seed=seed, workers=2,
                                 facts=PublicFacts.of(table.config))
    return result.table


def release_peer(tool: str, table: Table, epsilon: float, delta: float, seed: int,
                 timeout: float, work: Path) -> pd.DataFrame | None:
    data, domain, out = work / "input.csv", work / "domain.json", work / f"{tool}.csv"
    if not data.exists():
        table.raw.to_csv(data, index=False)
        domain.write_text(json.dumps(table.domain))
    job = {"tool": tool, "data": str(data), "domain": str(domain), "out": str(out),
           "epsilon": epsilon, "delta": delta, "seed": seed}
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        subprocess.run([str(peer_python()), str(WORKER), json.dumps(job)], check=True,
                       timeout=timeout, capture_output=True, text=True, env=env)
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as error:
        raise SystemExit(f"{tool} failed:\n{error.stderr[-3000:]}") from error
    return pd.read_csv(out, dtype=str, keep_default_na=False)


def release_own_process(tool: str, table: Table, epsilon: float, delta: float, seed: int,
                        timeout: float, work: Path,
                        workload_degree: int) -> tuple[pd.DataFrame | None, float]:
    """``aim`` (ours) or a reference on mbi in a fresh process: (released rows, seconds); both
    fit every marginal of 2 up to ``workload_degree`` columns."""
    out = work / f"{tool}-{seed}.npz"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if tool == "aim":
        job = {"dataset": table.dataset, "rows": table.rows, "epsilon": epsilon, "delta": delta,
               "seed": seed, "out": str(out), "workload_degree": workload_degree}
        command = [sys.executable, "-m", "benchmarks.aim_worker", json.dumps(job)]
    else:
        job_file = _reference_job(tool, table, epsilon, delta, seed, work, out,
                                  workload_degree)
        command = [sys.executable, str(REFERENCE), str(job_file)]
    try:
        done = subprocess.run(command, check=True, timeout=timeout, capture_output=True,
                              text=True, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, timeout
    except subprocess.CalledProcessError as error:
        print(f"{tool} failed (seed {seed}):\n{error.stderr[-2000:]}", flush=True)
        return None, float("nan")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    codes = np.load(out)
    frame = pd.DataFrame({c: np.asarray(table.domain[c], dtype=object)[codes[c]]
                          for c in table.domain})
    LAST_PEAK_GB[0] = report.get("peak_gb", float("nan"))
    return frame, report["seconds"]


LAST_PEAK_GB = [float("nan")]


def _reference_job(tool: str, table: Table, epsilon: float, delta: float, seed: int,
                   work: Path, out: Path, workload_degree: int) -> Path:
    """The input as leaf codes per column (the same domains ``aim`` uses) and the workload
    ``aim`` fits without a declared one (``default_workload``)."""
    from medrelease.synthetic.release import default_workload

    data = work / "codes.npz"
    if not data.exists():
        np.savez(data, **{c: pd.Categorical(table.raw[c], categories=v).codes.astype(np.int64)
                          for c, v in table.domain.items()})
    columns = list(table.domain)
    workload = [list(c) for c, _ in default_workload(columns, workload_degree)]
    job = {"tool": tool, "codes": str(data), "sizes": {c: len(v) for c, v in table.domain.items()},
           "workload": workload, "epsilon": epsilon, "delta": delta, "seed": seed,
           "out": str(out)}
    path = work / f"{tool}-{seed}.json"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def shuffled(table: Table, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({c: rng.permutation(table.raw[c].to_numpy()) for c in table.raw})


def all_star(table: Table) -> pd.DataFrame:
    out = table.raw.copy()
    for column in table.counts.dimensions:
        out[column] = "*"
    return out


# -- measuring ----------------------------------------------------------------------------

def measure(table: Table, tool: str, released: pd.DataFrame, outcome: Outcome) -> None:
    from medrelease.evidence.utility import AnalysisQuery, compare_queries
    from medrelease.evidence.workload import rows_kept_share, workload_error

    error = workload_error(table.counts, released)
    outcome.tvd2.append(error.mean_two_way)
    outcome.tvd3.append(error.mean_three_way)
    if tool not in SYNTHETIC:
        outcome.kept.append(rows_kept_share(released, table.counts.dimensions,
                                            table.counts.n_rows))
    if AnalysisQuery().applies_to(table.config):
        _, summary = compare_queries(table.raw, released, table.config)
        outcome.stays.append(float(summary["stays_mean_abs_error"]))
        outcome.los.append(float(summary["avg_los_mean_abs_error"]))


def runs_of(tool: str, args) -> int:
    if tool == "all-star":
        return 1
    return (args.ref_runs if tool in REFERENCES else args.peer_runs if tool in OWN_PROCESS
            else args.runs)


def run_once(tool: str, table: Table, epsilon: float, args, work: Path, run: int,
             outcome: Outcome) -> None:
    """One run (seed 1000 + run) of ``tool``, measured into ``outcome``."""
    from medrelease.mechanisms.ipa import default_delta

    if outcome.status != "ok":
        return
    seed = 1000 + run
    outcome.load.append(os.getloadavg()[0])
    started = time.perf_counter()
    seconds = None
    if tool.startswith("ipa"):
        released = release_ipa(table, epsilon, seed, every_value=tool == "ipa-every-value")
    elif tool in DPMM:
        released = release_peer(DPMM[tool], table, epsilon, default_delta(None), seed,
                                args.peer_timeout, work)
    elif tool in OWN_PROCESS:
        released, seconds = release_own_process(tool, table, epsilon, default_delta(None),
                                                seed, args.peer_timeout, work,
                                                args.workload_degree)
        outcome.peak_gb.append(LAST_PEAK_GB[0])
    elif tool == "shuffled":
        released = shuffled(table, seed)
    else:
        released = all_star(table)
    if released is None:
        outcome.status = (f"timed out after {args.peer_timeout:.0f} s" if seconds
                          else "failed")
        return
    outcome.seconds.append(seconds if seconds is not None else time.perf_counter() - started)
    measure(table, tool, released, outcome)


def run_tools(tools: list[str], table: Table, epsilon: float, args,
              work: Path) -> dict[str, Outcome]:
    """Every tool's runs; the own-process tools (aim and the references) interleaved seed by
    seed, so that a busy moment of a shared machine hits each of them alike and the ratio of
    their times, seed by seed, is fair."""
    outcomes = {tool: Outcome() for tool in tools}
    own = [t for t in tools if t in OWN_PROCESS]
    for tool in tools:
        if tool not in own:
            for run in range(runs_of(tool, args)):
                run_once(tool, table, epsilon, args, work, run, outcomes[tool])
    for run in range(max([runs_of(t, args) for t in own], default=0)):
        for tool in own:
            if run < runs_of(tool, args):
                run_once(tool, table, epsilon, args, work, run, outcomes[tool])
    return outcomes


def _mean(values: list[float], digits: int = 3) -> str:
    return f"{np.mean(values):.{digits}f}" if values else "-"


def row_of(table: Table, epsilon: float, tool: str, outcome: Outcome,
           reference: Outcome | None = None) -> str:
    eps = "-" if tool in {"shuffled", "all-star"} else f"{epsilon:g}"
    if outcome.status != "ok":
        return f"| {table.name} | {eps} | {tool} | {outcome.status} | | | | | | | | | |"
    ratio = "-"
    if reference is not None and tool in OWN_PROCESS and reference.seconds:
        pairs = list(zip(outcome.seconds, reference.seconds, strict=False))
        if pairs:
            ratio = f"{np.median([a / b for a, b in pairs]):.2f}"
    peak = f"{np.nanmax(outcome.peak_gb):.2f}" if outcome.peak_gb else "-"
    return (f"| {table.name} | {eps} | {tool} | {_mean(outcome.tvd2)} | {_mean(outcome.tvd3)} | "
            f"{_mean(outcome.kept)} | {_mean(outcome.stays, 1)} | {_mean(outcome.los, 1)} | "
            f"{_mean(outcome.seconds, 1)} | {ratio} | {peak} | {_mean(outcome.load, 1)} | "
            f"{len(outcome.tvd2)} |")


HEADER = ("| table | eps | tool | TVD 2-way | TVD 3-way | rows kept (raw value, non-* class) | "
          "Q1-Q2 stays MAE | Q3-Q4 mean LOS MAE | wall s | time / aim-ref (median of seeds) | "
          "peak GB | load (1-min) | runs |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", default=["nps", "adult"], choices=["nps", "adult"])
    parser.add_argument("--rows", type=int, default=20_000,
                        help="NPS-like rows (20,000 with seed 2020 is the bundled sample)")
    parser.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--tools", nargs="+", default=DEFAULT_TOOLS, choices=TOOLS)
    parser.add_argument("--runs", type=int, default=3, help="runs of ipa and shuffled (mean)")
    parser.add_argument("--peer-runs", type=int, default=5,
                        help="runs (seeds) of aim, aim-ref, mst-ref and the dpmm tools (mean)")
    parser.add_argument("--ref-runs", type=int, default=5,
                        help="runs (seeds) of aim-ref, aim-ref-literal and mst-ref (mean); "
                             "aim-ref-literal takes about 13 minutes a run on Adult here")
    parser.add_argument("--peer-timeout", type=float, default=1800.0,
                        help="seconds before a peer run is given up (reported as such)")
    parser.add_argument("--workload-degree", type=int, default=None,
                        help="aim's and the references' workload: every marginal of 2 up to "
                             "this many columns (default: aim's default workload_degree)")
    parser.add_argument("--write", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    from medrelease.mechanisms.aim import AIMParams

    if args.workload_degree is None:
        args.workload_degree = AIMParams.model_fields["workload_degree"].default

    lines = [HEADER]
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory(prefix="medrelease-peers-") as tmp:
        for name in args.tables:
            table = load_table(name, args.rows)
            work = Path(tmp) / name
            work.mkdir()
            for epsilon in args.eps:
                # references spend nothing: one row per table
                tools = [t for t in args.tools
                         if t not in {"shuffled", "all-star"} or epsilon == args.eps[0]]
                outcomes = run_tools(tools, table, epsilon, args, work)
                for tool in tools:
                    line = row_of(table, epsilon, tool, outcomes[tool], outcomes.get(RATIO_TO))
                    lines.append(line)
                    print(line, flush=True)
    if args.write:
        command = "python benchmarks/peers.py " + " ".join(sys.argv[1:])
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(
            f"<!-- {command} ; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
            f"{os.cpu_count()} cores -->\n" + "\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
