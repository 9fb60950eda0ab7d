"""The exact samplers' speed, before and after, on the same minutes: a markdown table.

    git archive e8f79df | tar -x -C var/before          # the tree to compare with
    python benchmarks/sampler_speed.py --before var/before --rounds 3
    python benchmarks/sampler_speed.py --before var/before --rounds 2 --pytest

Each round runs every measurement in each tree in turn (fresh processes, ``PYTHONPATH`` = the
tree), so the machine's drift (30 % hour to hour here) hits both trees alike:

* ``design``: one step-audit design as the profile ran it,
  ``run_design(replace(D["ipa cells: new cell"], runs=1000), "sound", seed=11)`` (4,000
  ``discrete_laplace`` calls of 5-57 entries), wall seconds and its hit counts;
* ``samplers``: CPU microseconds per draw of ``discrete_laplace`` at 5, 57 and 10,000 entries
  and of the discrete Gaussian at 20 (best of 5), and a digest of seeded draws of every
  sampler and of the generator's next draw: equal digests mean the same stream;
* ``--pytest``: the wall time of ``pytest -q -n 0 -p no:cacheprovider
  tests/unit/test_step_audit.py`` run in the tree (its own tests).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DESIGN = """
import json, time
from dataclasses import replace
from medrelease.evidence.step_audit import designs, run_design
D = {d.name: d for d in designs()}
started = time.perf_counter()
result = run_design(replace(D["ipa cells: new cell"], runs=1000), "sound", seed=11)
print(json.dumps({"seconds": time.perf_counter() - started,
                  "hits": f"{result.hits_a} / {result.hits_b}"}))
"""

SAMPLERS = """
import hashlib, json, time
from fractions import Fraction
import numpy as np
from medrelease.privacy import zcdp
from medrelease.privacy.randomness import bernoulli_exp, discrete_laplace, exponential_mechanism

def per_draw(call, reps, n):
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(reps):
            call()
        best = min(best, (time.process_time() - started) / reps / n * 1e6)
    return best

rng = np.random.default_rng(1)
out = {f"dlap n={n}": per_draw(lambda: discrete_laplace(rng, 0.1, n), reps, n)
       for n, reps in [(5, 1000), (57, 200), (10_000, 3)]}
out["dgauss n=20"] = per_draw(lambda: zcdp.discrete_gaussian(rng, Fraction(625), 20), 60, 20)
digest = hashlib.sha256()
for seed in range(20):
    g = np.random.default_rng(seed)
    for eps in (0.1, 1.0, 1 / 3, 50.0):
        for n in (0, 1, 5, 57, 1000):
            digest.update(discrete_laplace(g, eps, n).tobytes())
    digest.update(zcdp.discrete_gaussian(g, Fraction(160001, 16), 300).tobytes())
    digest.update(bytes([bernoulli_exp(g, Fraction(seed * 7, 5)) for _ in range(50)]))
    digest.update(str([exponential_mechanism(g, np.arange(300.0), 0.5, 1.0)
                       for _ in range(50)]).encode())
    digest.update(str(int(g.integers(0, 2**62))).encode())
out["stream digest"] = digest.hexdigest()[:16]
print(json.dumps(out))
"""


def _run(tree: Path, code: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"a measurement failed in {tree}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pytest(tree: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                           "no:cacheprovider", "tests/unit/test_step_audit.py"], cwd=tree, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"tests/unit/test_step_audit.py failed in {tree}:\n{done.stdout[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True,
                        help="the tree to compare with (e.g. git archive of the base commit)")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pytest", action="store_true",
                        help="also time tests/unit/test_step_audit.py in each tree")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    print("| round | tree | design s (hits) | dlap n=5 | dlap n=57 | dlap n=10,000 | "
          "dgauss n=20 (us/draw CPU) | stream digest |" + (" test_step_audit.py s |"
                                                         if args.pytest else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.pytest else ""))
    for round_ in range(1, args.rounds + 1):
        for label, tree in trees.items():
            design, samplers = _run(tree, DESIGN), _run(tree, SAMPLERS)
            row = (f"| {round_} | {label} | {design['seconds']:.2f} ({design['hits']}) | "
                   f"{samplers['dlap n=5']:.1f} | {samplers['dlap n=57']:.1f} | "
                   f"{samplers['dlap n=10000']:.2f} | {samplers['dgauss n=20']:.1f} | "
                   f"{samplers['stream digest']} |")
            if args.pytest:
                row += f" {_pytest(tree):.1f} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
