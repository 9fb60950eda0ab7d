"""The authors' reference MST and AIM (private-pgm ``mechanisms/mst.py`` and ``aim.py``), ported to
``mbi`` 2.x as faithfully as the new API allows, for ``benchmarks/peers.py``; and the same AIM
engineered as a user would in an afternoon (``aim-ref``, the fair reference for speed).

Two ports of AIM, the same algorithm, numbers and random draws (same seed, same selections
up to floating point):

* ``aim-ref`` (engineered): one conversion of the model's potentials to numpy per round feeds
  every candidate's score (a candidate inside a fitted clique is a sum of its marginal, any
  other by variable elimination in numpy), mbi's jitted mirror descent keeps its compiled
  programs across rounds (one per model structure; no cache drops: peak RSS stays ~1-2 GB,
  measured with ``/usr/bin/time -v`` in docs/results/peers.md).
* ``aim-ref-literal`` (the port as first written): each candidate scored with
  ``model.project`` (as upstream), which jit-compiles a variable elimination per candidate and
  model structure; jax's caches dropped each round, or LLVM runs out of memory on Adult.

The literal port: AIM scores each candidate with ``model.project`` (as upstream does),
re-fits with 1,000 mirror-descent iterations every round, anneals and spends the rest in a last
round exactly as upstream; MST measures every 1-way marginal, compresses rare values, selects a
spanning tree by the exponential mechanism and measures it. Noise is numpy's continuous
Gaussian, as upstream (a benchmark, not a release). What changed for mbi 2.x: ``estimation.
mirror_descent(...)`` became ``estimation.MirrorDescent().estimate(...)`` with ``warm_start``,
MST's compressed-domain query is a ``WeightedQuery`` (hashable), ``Dataset`` takes a dict.

Run one job in its own process (``python benchmarks/reference_mbi.py JOB.json``), so jax's
compile cache is cold for every tool, as it is for a user.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np


def _mbi():
    import jax

    jax.config.update("jax_enable_x64", True)
    import mbi

    return mbi


def cdp_rho(epsilon: float, delta: float) -> float:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from medrelease.privacy.zcdp import rho_for

    return rho_for(epsilon, delta)


def exponential_mechanism(rng, qualities: np.ndarray, epsilon: float, sensitivity: float) -> int:
    scores = 0.5 * epsilon / sensitivity * qualities
    probs = np.exp(scores - scores.max())
    return int(rng.choice(qualities.size, p=probs / probs.sum()))


# -- AIM ------------------------------------------------------------------------------------

def downward_closure(cliques):
    out = set()
    for cl in cliques:
        for k in range(1, len(cl) + 1):
            out.update(itertools.combinations(cl, k))
    return sorted(out, key=len)


def compile_workload(workload):
    return {cl: sum(w * len(set(cl) & set(wcl)) for wcl, w in workload)
            for cl in downward_closure([w for w, _ in workload])}


def filter_candidates(mbi, candidates, model, size_limit):
    free = downward_closure(model.cliques)
    return {cl: w for cl, w in candidates.items()
            if mbi.junction_tree.hypothetical_model_size(model.domain, [*model.cliques, cl])
            <= size_limit or cl in free}


def aim(data, workload, epsilon, delta, rng, max_model_size=80, max_iters=1000,
        engineered=True):
    import jax

    mbi = _mbi()
    rho = cdp_rho(epsilon, delta)
    estimator = mbi.estimation.MirrorDescent()
    rounds = 16 * len(data.domain)
    candidates = compile_workload(workload)
    answers = {cl: data.project(cl).datavector() for cl in candidates}
    oneway = [cl for cl in candidates if len(cl) == 1]
    sigma = np.sqrt(rounds / (2 * 0.9 * rho))
    eps = np.sqrt(8 * 0.1 * rho / rounds)
    measurements = []
    rho_used = len(oneway) * 0.5 / sigma ** 2
    for cl in oneway:
        x = answers[cl]
        measurements.append(mbi.LinearMeasurement(x + rng.normal(0, sigma, x.size), cl, sigma))
    model = estimator.estimate(data.domain, measurements, iters=max_iters)
    terminate = False
    while not terminate:
        # jax keeps every compiled program (each candidate's projection, each round's fit); on
        # Adult that ran LLVM out of memory after 6.5 minutes (a segfault). Dropping them each
        # round changes no number: the next round's model has a new structure anyway.
        if not engineered:
            jax.clear_caches()
        if rho - rho_used < 2 * (0.5 / sigma ** 2 + 1.0 / 8 * eps ** 2):
            remaining = rho - rho_used
            sigma = np.sqrt(1 / (2 * 0.9 * remaining))
            eps = np.sqrt(8 * 0.1 * remaining)
            terminate = True
        rho_used += 1.0 / 8 * eps ** 2 + 0.5 / sigma ** 2
        size_limit = max_model_size * rho_used / rho
        small = filter_candidates(mbi, candidates, model, size_limit)
        keys = list(small)
        marginal = _model_marginals(model, engineered)
        errors = np.array([small[cl] * (np.linalg.norm(answers[cl] - marginal(cl), 1)
                                        - np.sqrt(2 / np.pi) * sigma * data.domain.size(cl))
                           for cl in keys])
        cl = keys[exponential_mechanism(rng, errors, eps, max(small.values()))]
        print(f"aim-ref: measuring {cl}, sigma {sigma:.1f}, rho used {rho_used:.4g} of {rho:.4g}",
              file=sys.stderr, flush=True)
        x = answers[cl]
        measurements.append(mbi.LinearMeasurement(x + rng.normal(0, sigma, x.size), cl, sigma))
        z = model.project(cl).datavector()
        model = estimator.estimate(data.domain, measurements, iters=max_iters, warm_start=model)
        w = model.project(cl).datavector()
        if np.linalg.norm(w - z, 1) <= sigma * np.sqrt(2 / np.pi) * x.size:
            sigma /= 2
            eps *= 2
    return model


def _model_marginals(model, engineered):
    """A candidate's model marginal as a flat vector: from one numpy copy of the model's
    potentials (engineered), or ``model.project`` per candidate (upstream)."""
    if not engineered:
        return lambda cl: np.asarray(model.project(cl).datavector())
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from medrelease.synthetic import pgm

    def tables(vector) -> dict:
        return {tuple(f.domain.attributes): np.asarray(f.values, dtype=np.float64)
                for f in vector.tables.values()}

    dom = model.domain
    copy = pgm.Model(pgm.domain(tuple(dom.attributes), tuple(dom.shape)),
                     tuple(tuple(c) for c in model.cliques), tables(model.potentials),
                     tables(model.marginals), float(model.total))
    return lambda cl: copy.marginal(tuple(cl)).reshape(-1)


# -- MST ------------------------------------------------------------------------------------

def mst(data, epsilon, delta, rng):
    mbi = _mbi()
    rho = cdp_rho(epsilon, delta)
    sigma = np.sqrt(3 / (2 * rho))
    estimator = mbi.estimation.MirrorDescent()
    log1 = _measure(mbi, data, [(c,) for c in data.domain.attributes], sigma, rng)
    data2, log1, supports = _compress(mbi, data, log1)
    cliques = _select(mbi, estimator, data2, rho / 3.0, log1, rng)
    log2 = _measure(mbi, data2, cliques, sigma, rng)
    model = estimator.estimate(data2.domain, log1 + log2, iters=10000)
    return model, supports


def _measure(mbi, data, cliques, sigma, rng):
    out = []
    for cl in cliques:
        x = data.project(cl).datavector()
        out.append(mbi.LinearMeasurement(x + rng.normal(0, sigma, x.size), cl, sigma))
    return out


def _compress(mbi, data, measurements):
    supports, out = {}, []
    for m in measurements:
        col = m.clique[0]
        y = np.asarray(m.noisy_measurement)
        sup = y >= 3 * m.stddev
        supports[col] = sup
        if sup.all():
            out.append(m)
            continue
        y2 = np.append(y[sup], y[~sup].sum())
        weights = np.ones(y2.size)
        weights[-1] = 1.0 / np.sqrt(y.size - y2.size + 1.0)
        y2[-1] /= np.sqrt(y.size - y2.size + 1.0)
        out.append(mbi.LinearMeasurement(y2, m.clique, m.stddev,
                                         query=mbi.WeightedQuery(weights)))
    data2 = {}
    shape = []
    for col in data.domain.attributes:
        sup = supports[col]
        size = int(sup.sum())
        mapping = np.full(sup.size, size)
        mapping[sup] = np.arange(size)
        data2[col] = mapping[data.data[col]]
        shape.append(size + (1 if size < sup.size else 0))
    domain = mbi.Domain(data.domain.attributes, shape)
    return mbi.Dataset(data2, domain), out, supports


def _select(mbi, estimator, data, rho, log, rng):
    import networkx as nx
    from scipy.cluster.hierarchy import DisjointSet

    est = estimator.estimate(data.domain, log, iters=2500)
    attrs = data.domain.attributes
    candidates = list(itertools.combinations(attrs, 2))
    weights = {e: np.linalg.norm(data.project(e).datavector() - est.project(e).datavector(), 1)
               for e in candidates}
    tree = nx.Graph()
    tree.add_nodes_from(attrs)
    ds = DisjointSet(attrs)
    r = len(list(nx.connected_components(tree)))
    eps = np.sqrt(8 * rho / (r - 1))
    for _ in range(r - 1):
        candidates = [e for e in candidates if not ds.connected(*e)]
        e = candidates[exponential_mechanism(rng, np.array([weights[e] for e in candidates]),
                                             eps, 1.0)]
        tree.add_edge(*e)
        ds.merge(*e)
    return list(tree.edges)


def _undo_compression(codes, supports, rng):
    out = {}
    for col, sup in supports.items():
        idx, extra = np.flatnonzero(sup), np.flatnonzero(~sup)
        values = np.asarray(codes[col])
        mapped = np.empty(values.size, dtype=np.int64)
        rare = values == idx.size
        mapped[~rare] = idx[values[~rare]]
        if rare.any():
            mapped[rare] = rng.choice(extra, int(rare.sum()))
        out[col] = mapped
    return out


# -- one job --------------------------------------------------------------------------------

def main() -> None:
    """Job: {"tool", "codes" (npz of leaf codes per column), "sizes", "workload", "epsilon",
    "delta", "seed", "out"}; writes the synthetic codes (npz) and prints the seconds."""
    job = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    mbi = _mbi()
    loaded = np.load(job["codes"])
    columns = list(job["sizes"])
    data = mbi.Dataset({c: loaded[c] for c in columns},
                       mbi.Domain(columns, [job["sizes"][c] for c in columns]))
    rng = np.random.default_rng(job["seed"])
    np.random.seed(job["seed"])
    started = time.perf_counter()
    if job["tool"] in ("aim-ref", "aim-ref-literal"):
        workload = [(tuple(w), 1.0) for w in job["workload"]]
        model = aim(data, workload, job["epsilon"], job["delta"], rng,
                    engineered=job["tool"] == "aim-ref")
        synth = model.synthetic_data().data
    else:
        model, supports = mst(data, job["epsilon"], job["delta"], rng)
        synth = _undo_compression(model.synthetic_data().data, supports, rng)
    seconds = time.perf_counter() - started
    np.savez(job["out"], **{c: np.asarray(synth[c]) for c in columns})
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KB -> GB (Linux)
    print(json.dumps({"seconds": seconds, "peak_gb": peak}))


if __name__ == "__main__":
    main()
