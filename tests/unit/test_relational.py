"""The relational release (issue 58; docs/RELATIONAL.md): validation in counts, the bound on
children, fresh keys and referential integrity by construction, every measured marginal moving
by at most its declared sensitivity when one patient (with all their rows) comes or goes, and
the accounting adding up to the release's rho."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from medrelease.errors import ConfigError, InputValidationError
from medrelease.privacy.zcdp import RhoFilter, rho_for
from medrelease.relational import evaluate as ev
from medrelease.relational import mechanism
from medrelease.relational.flatten import ABSENT, path_table
from medrelease.relational.generate import ModelView, sample_given
from medrelease.relational.hospital import generate_hospital, hospital_schema
from medrelease.relational.mechanism import (
    ChainPrior,
    RelationalParams,
    ScaledAIMRounds,
    release_relational,
)
from medrelease.relational.schema import (
    RelColumn,
    RelSchema,
    RelTable,
    bound_children,
    encode,
    problems,
)
from medrelease.synthetic import aim_rounds, pgm
from medrelease.synthetic.aim_rounds import true_answers

FAST = {"rounds_per_column": 2, "iters": 30, "final_iters": 60}


@pytest.fixture(scope="module")
def hospital() -> dict[str, pd.DataFrame]:
    return generate_hospital(400, seed=5)


@pytest.fixture(scope="module")
def released(hospital):
    schema = hospital_schema()
    return schema, release_relational(schema, hospital, RelationalParams(epsilon=1.0, **FAST),
                                      seed=11, keep_tables=True)


# -- validation ------------------------------------------------------------------------------
def test_problems_name_counts_never_values(hospital):
    """An orphan, a repeated key, a blank key and a value no taxonomy covers: one sentence
    each, with its count, and no value of the extract in any of them."""
    frames = {k: v.copy() for k, v in hospital.items()}
    adm = frames["admissions"]
    adm.loc[0, "subject_id"] = "ZZ-ORPHAN-1"
    adm.loc[1, "subject_id"] = "ZZ-ORPHAN-2"
    adm.loc[3, "hadm_id"] = adm.loc[2, "hadm_id"]
    adm.loc[4, "hadm_id"] = ""
    frames["patients"].loc[5, "age_band"] = "ZZ-AGE"
    found = problems(hospital_schema(), frames)
    text = " ".join(found)
    assert "2 row(s) reference a subject_id that is not in patients (orphans)" in text
    assert "1 row(s) repeat a hadm_id" in text
    assert "1 row(s) have no hadm_id" in text
    assert "patients, column age_band: 1 row(s) hold a value its taxonomy does not cover" in text
    assert "ZZ" not in text and "H2000" not in text
    with pytest.raises(InputValidationError) as caught:
        release_relational(hospital_schema(), frames, RelationalParams(**FAST), seed=1)
    assert "ZZ" not in str(caught.value) and "Nothing was read further or spent" in str(caught.value)


def test_a_schema_without_bounds_or_with_a_broken_reference_is_refused():
    patients = RelTable("patients", (RelColumn.of_values("sex", ["F", "M"]),), key="pid")
    unbounded = RelTable("visits", (RelColumn.of_values("kind", ["a", "b"]),), key="vid",
                         parent="patients", parent_key="pid")
    with pytest.raises(ConfigError, match="needs max_children"):
        RelSchema((patients, unbounded))
    stray = RelTable("visits", (RelColumn.of_values("kind", ["a"]),), parent="nowhere",
                     parent_key="pid", max_children=2)
    with pytest.raises(ConfigError, match="references a table that is not declared"):
        RelSchema((patients, stray))
    with pytest.raises(ConfigError, match="analysis"):
        RelSchema((patients,), analyses=(("patients.age",),))


# -- the bound -------------------------------------------------------------------------------
def test_the_bound_keeps_a_uniform_subset_of_at_most_max_children():
    parent = np.repeat(np.arange(4), [1, 3, 5, 8])
    kept = np.zeros(parent.size)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        keep = bound_children(parent, 3, rng)
        assert (np.bincount(parent[keep], minlength=4) == [1, 3, 3, 3]).all()
        kept += keep
    share = kept / 2000
    assert np.allclose(share[parent == 2], 3 / 5, atol=0.05)
    assert np.allclose(share[parent == 3], 3 / 8, atol=0.05)


# -- the release -----------------------------------------------------------------------------
def test_fresh_keys_integrity_and_the_bound_hold_by_construction(hospital, released):
    schema, release = released
    tables = release.tables
    assert set(tables) == {"patients", "admissions", "diagnoses"}
    assert ev.integrity(schema, tables) == {"duplicate_keys": 0, "missing_keys": 0,
                                            "orphans": 0, "over_max_children": 0}
    for table in schema.tables:
        frame = tables[table.name]
        assert list(frame.columns) == [c for c in (table.key, table.parent_key) if c] + list(
            table.column_names)
        if table.key:  # no input key is ever released
            assert not set(frame[table.key]) & set(hospital[table.name][table.key])
        for column in table.columns:
            assert set(frame[column.name]) <= set(column.taxonomy.leaves)
            assert ABSENT not in set(frame[column.name])
    per_admission = tables["diagnoses"]["hadm_id"].value_counts()
    assert per_admission.max() <= 6
    assert "subject_id" in release.guarantee and "diagnoses" in release.guarantee


def test_the_accounting_adds_up_to_the_release_rho(released):
    _, release = released
    rho = rho_for(1.0, 1e-6)
    assert release.rho == rho
    assert rho * (1 - 1e-6) <= release.rho_used <= rho * (1 + 1e-9)
    assert math.isclose(sum(c.rho for c in release.chains), rho, rel_tol=1e-12)
    for chain in release.chains:  # each model spends its share, charged before each draw
        assert chain.rho_used <= chain.rho * (1 + 1e-9)
        charged = sum(r for _, r in chain.run.state.budget.charges) * chain.scale ** 2
        assert math.isclose(charged, chain.rho_used, rel_tol=1e-9)
    # every measurement's noise against its sensitivity (1 patient): rho = 1 / (2 sigma^2),
    # plus its selection's eps^2 / 8
    listed = sum(m["rho"] for m in release.measurements())
    assert math.isclose(listed, release.rho_used, rel_tol=1e-6)
    for m in release.measurements():
        noise = 1.0 / (2 * m["sigma_patients"] ** 2)
        assert m["rho"] == pytest.approx(noise + m["selection_epsilon"] ** 2 / 8, rel=1e-6)


def _neighbour(frames: dict[str, pd.DataFrame], rng: np.random.Generator
               ) -> dict[str, pd.DataFrame]:
    """``frames`` plus one patient with all their rows, appended at the end of every table (so
    every other patient's bound draws are the same: the coupling of docs/RELATIONAL.md)."""
    admissions = int(rng.integers(0, 9))  # over the bound of 4 at times, none at times
    pid = f"NEW-{rng.integers(1_000_000)}"
    same = rng.random() < 0.5  # all rows alike: the largest move in L2
    patient = pd.DataFrame({"subject_id": [pid], "sex": [rng.choice(["F", "M"])],
                            "age_band": [rng.choice(["18-39", "80+"])],
                            "insurance": ["Medicare"]})
    adm = pd.DataFrame({"hadm_id": [f"{pid}-a{i}" for i in range(admissions)],
                        "subject_id": pid,
                        "admission_type": "EMERGENCY" if same else rng.choice(
                            ["EMERGENCY", "URGENT", "ELECTIVE"], admissions),
                        "los_band": "0-2", "readmitted_30d": "no"})
    counts = rng.integers(0, 11, admissions)  # over the bound of 6 at times
    diag = pd.DataFrame({"row_id": [f"{pid}-d{i}" for i in range(int(counts.sum()))],
                         "hadm_id": np.repeat(adm["hadm_id"].to_numpy(), counts),
                         "icd9": "428" if same else rng.choice(["428", "250", "V45"],
                                                                int(counts.sum())),
                         "priority": "secondary"})
    return {"patients": pd.concat([frames["patients"], patient], ignore_index=True),
            "admissions": pd.concat([frames["admissions"], adm], ignore_index=True),
            "diagnoses": pd.concat([frames["diagnoses"], diag], ignore_index=True)}


def _streams(schema: RelSchema, seed: int) -> dict[str, np.random.Generator]:
    return {t.name: np.random.default_rng([seed, i]) for i, t in enumerate(schema.tables)}


@pytest.mark.slow
@pytest.mark.parametrize("weighting", ["patient", "row"])
def test_every_measured_marginal_moves_by_at_most_its_sensitivity(hospital, released,
                                                                   weighting):
    """Random neighbours (one patient with all their rows: none, a few, more than the
    bounds; alike or not): every marginal a model measured (the 1-way marginals of round 0,
    every selected one at its levels, on the run's merged values) moves by at most L in L2 on
    the scale of the table its noise was calibrated on (sigma_units = L sigma_patients); the
    patient's weight is exactly L in every table. (``row``: the comparison design, rows of
    weight 1 at sensitivity the product of max_children.)"""
    schema, release = released
    if weighting == "row":
        release = release_relational(schema, hospital, RelationalParams(
            epsilon=1.0, weighting="row", **FAST), seed=3)
    small = {k: v.head(v.shape[0]) for k, v in generate_hospital(60, seed=2).items()}
    rng = np.random.default_rng(7)
    normalise = weighting == "patient"
    for trial in range(6):
        other = _neighbour(small, rng)
        before = encode(schema, small, _streams(schema, trial))
        after = encode(schema, other, _streams(schema, trial))
        for chain in release.chains:
            lineage = tuple(schema.table(n) for n in chain.tables)
            t0 = path_table(schema, before, lineage, normalise)
            t1 = path_table(schema, after, lineage, normalise)
            assert t0.scale == chain.scale
            if normalise:  # exactly one patient
                assert t1.weights.sum() - t0.weights.sum() == chain.scale
            run = chain.run
            s0 = run.merged_like_this_run(t0.space())
            s1 = run.merged_like_this_run(t1.space())
            measured = [((c,), (0,)) for c in run.one_way]
            names = list(run.space.names)
            measured += [(tuple(names.index(c) for c in r.columns), tuple(r.levels))
                         for r in run.state.records]
            assert len(measured) >= len(run.one_way) + 1
            for columns, levels in measured:
                m0 = s0.roll_up(s0.fine_marginal(columns), columns, levels)
                m1 = s1.roll_up(s1.fine_marginal(columns), columns, levels)
                move = float(np.sqrt(((m1 - m0) ** 2).sum()))
                assert move <= chain.scale + 1e-6, (chain.tables, columns, move)
                if normalise:
                    assert np.abs(m1 - m0).sum() == pytest.approx(chain.scale)


def test_the_noise_scale_of_every_measurement_matches_its_charge_for_one_patient(
        hospital, monkeypatch):
    """The review of docs/PRIVACY.md, "Relational releases", on the draws themselves. A
    release (declared analyses too) runs with spies on the zCDP filter, the discrete Gaussian
    and the selection, so each draw is read at the sigma^2 the sampler got, paired with the
    charge made just before it. Neighbours of the released extract, each through the bound and
    the patient-normalised table as the engine builds them: a patient added with 9 admissions
    of 10 diagnoses (over both bounds, all alike), the patient with the most admissions removed
    (their rows last in every table: the coupling), a patient with no admission added. Every
    noised marginal (round 0's 1-way, the declared analyses, each round's) moves by Delta in L2
    (table rows); its loss Delta^2 / (2 sigma^2) is at most its charge x L^2 (the patient's
    scale); each selection is drawn at an epsilon that covers its scores' actual move. Summed,
    the charges are the chain's rho_used, and each neighbour's losses stay within the chain's
    share of rho, which the alike patient attains (the bound is tight). Calibrating the rounds
    at rho / (L / 2)^2 instead of rho / L^2 fails here."""
    schema = hospital_schema(declare_effects=True)
    events: list[tuple] = []
    real_charge, real_draw = RhoFilter.charge, aim_rounds.discrete_gaussian
    real_select, real_pick = ScaledAIMRounds._select, mechanism.exponential_mechanism

    def charge(self, rho, what):
        events.append(("charge", id(self), what, real_charge(self, rho, what)))
        return rho

    def draw(rng, sigma_sq, size):
        events.append(("draw", float(sigma_sq), size))
        return real_draw(rng, sigma_sq, size)

    def select(self, plan, indices, scores):
        events.append(("eligible", list(indices)))
        return real_select(self, plan, indices, scores)

    def pick(rng, scores, epsilon, sensitivity, monotone=False):
        events.append(("pick", epsilon, sensitivity))
        return real_pick(rng, scores, epsilon, sensitivity, monotone)

    monkeypatch.setattr(RhoFilter, "charge", charge)
    monkeypatch.setattr(aim_rounds, "discrete_gaussian", draw)
    monkeypatch.setattr(mechanism, "discrete_gaussian", draw)
    monkeypatch.setattr(ScaledAIMRounds, "_select", select)
    monkeypatch.setattr(mechanism, "exponential_mechanism", pick)
    release = release_relational(schema, hospital, RelationalParams(epsilon=1.0, **FAST),
                                 seed=11)
    monkeypatch.undo()
    gaussians: dict[int, list] = {}  # per filter: (charge, sigma^2 drawn with, cells)
    selections: dict[int, list] = {}  # per filter: (charge, epsilon, sensitivity, eligible)
    for i, event in enumerate(events):
        if event[0] in ("draw", "pick"):  # each draw right after its own charge
            assert events[i - 1][0] == "charge"
            _, filter_id, what, rho = events[i - 1]
            assert what.startswith("selection") == (event[0] == "pick"), what
            if event[0] == "draw":
                gaussians.setdefault(filter_id, []).append((rho, event[1], event[2]))
            else:
                assert events[i - 2][0] == "eligible"
                selections.setdefault(filter_id, []).append((rho, *event[1:], events[i - 2][1]))

    def patient(pid: str, admissions: int, diagnoses: int) -> dict[str, pd.DataFrame]:
        adm = [f"{pid}-a{i}" for i in range(admissions)]
        return {"patients": pd.DataFrame({"subject_id": [pid], "sex": ["F"], "age_band": ["80+"],
                                          "insurance": ["Self"]}),
                "admissions": pd.DataFrame({"hadm_id": adm, "subject_id": pid,
                                            "admission_type": "URGENT", "los_band": "14+",
                                            "readmitted_30d": "yes"}),
                "diagnoses": pd.DataFrame({"row_id": [f"{a}-d{j}" for a in adm
                                                      for j in range(diagnoses)],
                                           "hadm_id": np.repeat(adm, diagnoses),
                                           "icd9": "V45", "priority": "primary"})}

    def plus(frames, more):
        return {k: pd.concat([frames[k], more[k]], ignore_index=True) for k in frames}

    adm = hospital["admissions"]
    gone = adm["subject_id"].value_counts().idxmax()
    theirs = {"patients": hospital["patients"]["subject_id"] == gone,
              "admissions": adm["subject_id"] == gone,
              "diagnoses": hospital["diagnoses"]["hadm_id"].isin(
                  adm.loc[adm["subject_id"] == gone, "hadm_id"])}
    assert theirs["admissions"].sum() > 4  # over the bound too
    rest = {k: hospital[k][~theirs[k]] for k in hospital}
    neighbours = {"added, over the bounds, alike": (hospital, plus(hospital,
                                                                   patient("NEW-1", 9, 10))),
                  "removed": (plus(rest, {k: hospital[k][theirs[k]] for k in hospital}), rest),
                  "added, no admission": (hospital, plus(hospital, patient("NEW-2", 0, 0)))}
    for chain in release.chains:
        run, scale = chain.run, chain.scale
        drawn = gaussians.pop(id(run.state.budget))
        picks = selections.pop(id(run.state.budget))
        published = chain.measurements()
        names = list(run.space.names)
        noised = [((c,), (0,), True) for c in run.one_way] + [
            (tuple(names.index(c) for c in r.columns), tuple(r.levels), False)
            for r in run.state.records]  # the order of the draws, and of what is published
        assert len(drawn) == len(published) == len(noised)
        assert len(picks) == sum(not r.analysis for r in run.state.records) >= 1
        charged = sum(rho for rho, *_ in drawn) + sum(rho for rho, *_ in picks)
        assert charged * scale ** 2 == pytest.approx(chain.rho_used, rel=1e-9)
        assert chain.rho_used <= chain.rho * (1 + 1e-9)
        for (rho, sigma_sq, _), m in zip(drawn, published, strict=True):
            assert rho == pytest.approx(1 / (2 * sigma_sq), rel=1e-12)
            assert m["sigma_patients"] * scale == pytest.approx(math.sqrt(sigma_sq), rel=1e-12)
        inherited = len(run.prior.merges) if run.prior else 0
        lineage = tuple(schema.table(n) for n in chain.tables)
        for label, pair in neighbours.items():
            spaces = []  # per side: round 0's space (inherited merges only), the run's
            for frames in pair:
                table = path_table(schema, encode(schema, frames, _streams(schema, 0)), lineage)
                assert table.scale == scale
                first = table.space()
                for merge in run.merges[:inherited]:
                    first.merge(merge.column, merge.keep, merge.groups, merge.weights)
                spaces.append((first, run.merged_like_this_run(table.space())))
            loss = 0.0
            for (rho, sigma_sq, cells), (columns, levels, zero) in zip(drawn, noised,
                                                                         strict=True):
                m0, m1 = (s.roll_up(s.fine_marginal(columns), columns, levels).reshape(-1)
                          for s in (side[0] if zero else side[1] for side in spaces))
                assert m0.size == cells
                delta_sq = float(((m1 - m0) ** 2).sum())
                assert delta_sq / (2 * sigma_sq) <= rho * scale ** 2 * (1 + 1e-9), (
                    label, chain.tables, columns, levels)
                loss += delta_sq / (2 * sigma_sq)
            answers = [true_answers(side[1], run.candidates) for side in spaces]
            for rho, epsilon, sensitivity, eligible in picks:  # scores / L drawn at eps x L
                move = max(run.candidates[i].weight * float(np.abs(answers[1][i] - answers[0][i]
                                                                    ).sum()) for i in eligible)
                actual = epsilon * (move / scale) / sensitivity  # its epsilon for this pair
                assert actual ** 2 / 8 <= rho * scale ** 2 * (1 + 1e-9), (label, chain.tables)
                loss += actual ** 2 / 8
            assert loss <= chain.rho * (1 + 1e-9), (label, chain.tables, loss / chain.rho)
            if label.endswith("alike"):
                assert loss == pytest.approx(chain.rho_used, rel=1e-9)
    assert not gaussians and not selections  # every draw belongs to a chain


def test_a_child_model_inherits_its_parent_chain_marginals_exactly(hospital, released):
    """What ``ChainPrior`` relies on: every marginal of the parent chain's columns in the
    child chain's table is the parent chain's times L_child / L_parent, exactly; the child
    model starts from the parent's measurements so rescaled (and charges nothing for them)."""
    schema = hospital_schema()
    encoded = encode(schema, hospital, _streams(schema, 0))
    parent = path_table(schema, encoded, schema.lineages[0])
    child = path_table(schema, encoded, schema.lineages[1])
    ratio = child.scale // parent.scale
    ps, cs = parent.space(), child.space()
    for pair in [(0, 1), (1, 3), (3, 6), (4, 7), (2,)]:
        cols = tuple(list(cs.names).index(ps.names[i]) for i in pair)
        assert np.array_equal(cs.fine_marginal(cols), ratio * ps.fine_marginal(pair))
    _, release = released
    first, second = release.chains
    inherited = ChainPrior.of(first, second.scale).measurements
    assert len(inherited) == len(first.run.state.measurements)
    for mine, theirs in zip(second.run.state.measurements, first.run.state.measurements,
                            strict=False):
        assert mine.clique == theirs.clique
        assert np.allclose(mine.noisy, theirs.noisy * ratio)
        assert mine.stddev == pytest.approx(theirs.stddev * ratio)
    assert not any("round 0: 1-way marginal of patients" in what
                   for what, _ in second.run.state.budget.charges)


@pytest.mark.slow
def test_children_are_drawn_given_their_parent():
    """With little noise the cross-table effects come through: admissions per patient rise
    with age; heart failure raises readmission (both built into the generator)."""
    frames = generate_hospital(1500, seed=3)
    schema = hospital_schema()
    release = release_relational(schema, frames, RelationalParams(epsilon=50.0, **FAST),
                                 seed=4)
    tables = release.tables
    per = tables["admissions"]["subject_id"].value_counts()
    n = tables["patients"]["subject_id"].map(per).fillna(0)
    means = n.groupby(tables["patients"]["age_band"]).mean()
    assert means["80+"] > means["18-39"] + 0.7
    hf = set(tables["diagnoses"].loc[tables["diagnoses"]["icd9"] == "428", "hadm_id"])
    has = tables["admissions"]["hadm_id"].isin(hf)
    yes = tables["admissions"]["readmitted_30d"] == "yes"
    assert yes[has].mean() > yes[~has].mean() + 0.1
    truth = ev.children_distribution(schema, frames, "admissions")
    assert ev.tvd(truth, ev.children_distribution(schema, tables, "admissions")) < 0.05


def test_drawing_given_evidence_follows_the_model_conditional():
    """``sample_given`` on a model of a - b - c (cliques (a, b), (b, c)) given a: c's draws
    follow the model's P(c | a) = sum_b P(b | a) P(c | b)."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, 20000)
    b = (a + (rng.random(a.size) < 0.3)) % 3
    c = np.where(rng.random(a.size) < 0.8, b, rng.integers(0, 3, a.size))
    domain = pgm.domain(("a", "b", "c"), (3, 3, 3))
    ab = np.bincount(a * 3 + b, minlength=9).astype(float)
    bc = np.bincount(b * 3 + c, minlength=9).astype(float)
    model = pgm.estimate(domain, [pgm.measurement(ab, ("a", "b"), 1.0, None),
                                  pgm.measurement(bc, ("b", "c"), 1.0, None)], 500, a.size)
    view = ModelView(model, {}, {"a": 3, "b": 3, "c": 3})
    given = np.repeat(np.arange(3), 20000)
    drawn = sample_given(view, {"a": given}, ["c"], given.size, rng)["c"]
    joint = model.marginal(("a", "c"))
    expected = joint / joint.sum(axis=1, keepdims=True)
    found = np.array([np.bincount(drawn[given == v], minlength=3) / 20000 for v in range(3)])
    assert np.abs(found - expected).max() < 0.015
    allowed = {"c": np.array([True, True, False])}  # a forbidden value is never drawn
    assert (sample_given(view, {"a": given}, ["c"], given.size, rng, allowed)["c"] != 2).all()
