"""check = release (issue 55): every refusal a release makes before its charge, ``medrelease
check`` reports, from the same code.

Two halves. The bad-input corpus (``test_bad_input_corpus.CASES``) is the catalogue of what
the release flow refuses, each case with the message the flow gives; here ``check_dataset``
runs on each case's dataset with the same request, and one of its findings must carry the
same message. And an inventory of the flow's pre-charge steps: every ``raise`` in them (read
from the source) must belong to a function the inventory names, so a refusal added to one of
those steps, or a new pre-charge step, fails this test until ``check`` runs it too.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

import pytest

from medrelease.checkup import Finding, Request, check_dataset
from medrelease.privacy.ledger import Ledger

from .test_bad_input_corpus import CASES, Case, _dataset, _published_files, _request

pytestmark = pytest.mark.usefixtures("prefect_harness")  # (some cases' setups release first)

# Refused by the form (the request's own fields, before the flow starts a step): check has
# its own options, checked by its parser.
FORM = {c.name for c in CASES if c.error == "ValidationError"}
# Refused at the charge itself, atomically (another run may spend or lock in between): a
# check beforehand could only glance at them.
AT_THE_CHARGE = {
    "ledger locked by another process": "the lock is the charge's; check never waits on it",
    "same extract through a second YAML with its own source and --input":
        "a content claim is tested inside the charge's transaction",
    "byte-identical copy of a charged extract under a new source":
        "a content claim is tested inside the charge's transaction",
}
# Found by the release only: check says what it can see instead (its release panel).
RELEASE_ONLY = {
    "pseudonymize without a key is refused before the charge":
        "the key's Prefect Secret block is looked for by Prefect, which check never starts",
}
PRE_CHARGE = [c for c in CASES if c.name not in FORM and c.name not in AT_THE_CHARGE
              and c.name not in RELEASE_ONLY]


def _said(finding: Finding) -> str:
    """A finding as the release's message says it (column, problem, lines)."""
    column = f"column {finding.column!r}: " if finding.column else ""
    rows = f"{finding.rows} " if finding.rows is not None else ""
    lines = f", first at {finding.first_lines}" if finding.first_lines else ""
    return f"{column}{rows}{finding.problem}{lines}"


def _check_case(base: Path, case: Case) -> list[Finding]:
    _dataset(base, case)
    extract = base / "extract.csv"
    if isinstance(case.extract, bytes):
        extract.write_bytes(case.extract)
    elif case.extract is not None:
        extract.write_text(case.extract)
    if case.setup:
        case.setup(base)
    release = _request(base, case)
    home = base / "home"
    ledger = home / "ledger.sqlite"
    before = (len(Ledger(ledger).spends()) if ledger.is_file() else 0,
              len(_published_files(home)))
    report = check_dataset(release.dataset, request=Request(
        input_path=release.input_path, mechanism=release.mechanism, epsilon=release.epsilon,
        params=dict(release.parameters), seed=release.seed, destination=release.destination,
        void_confirmed=release.void_lifetime_guarantee))
    after = (len(Ledger(ledger).spends()) if ledger.is_file() else 0,
             len(_published_files(home)))
    assert after == before, f"{case.name}: check changed the ledger or the stores"
    return report.findings


@pytest.mark.parametrize("case", PRE_CHARGE, ids=[c.name for c in PRE_CHARGE])
def test_check_reports_what_the_release_refuses(corpus_home: Path, case: Case) -> None:
    findings = _check_case(corpus_home, case)
    said = [_said(f) for f in findings]
    assert any(re.search(case.message, s, re.S) for s in said), (case.name, case.message, said)


def test_check_says_what_it_cannot_see_of_a_missing_key(corpus_home: Path, monkeypatch) -> None:
    """The one pre-charge refusal check cannot make: a pseudonymization key in a Prefect
    Secret block. Its panel says the environment's key is missing and what the release does."""
    monkeypatch.delenv("MEDRELEASE_PSEUDONYM_KEY", raising=False)
    [case] = [c for c in CASES if c.name in RELEASE_ONLY]
    base = corpus_home
    _dataset(base, case)
    (base / "extract.csv").write_text(case.extract)
    release = _request(base, case)
    report = check_dataset(release.dataset, request=Request(
        mechanism=release.mechanism, params=dict(release.parameters),
        void_confirmed=release.void_lifetime_guarantee))
    key = dict(report.release).get("key", "")
    assert "not set" in key and "Secret block" in key, report.release


def test_the_corpus_covers_the_pre_charge_refusals_it_walks() -> None:
    assert len(PRE_CHARGE) >= 60 and set(AT_THE_CHARGE) <= {c.name for c in CASES}


# -- the inventory of the flow's pre-charge steps -----------------------------------------------

# Each call the flow makes before its charge (``_release_resolved``), the functions that do
# its refusing, and the stage of ``check`` that calls the same functions. A call missing here
# fails ``test_every_pre_charge_call_of_the_flow_is_in_the_inventory``: add its check. The
# rules on facts are declared by stage in ``medrelease/refusals.py``: the flow's tasks and
# ``check`` name the same stages (``test_the_flow_and_check_run_every_stage_of_refusals``).
SHARED = {
    "resolve_request": ({"refuse", "ledger_facts", "resolve_mechanism", "resolve_extract"},
                        "_planned"),  # (and plan.fn: plan_for_config, below)
    "read_extract": ({"load_and_validate_input", "validate_and_aggregate",
                      "merge_partitions"}, "_rows_checked"),
    "load_and_validate_input": ({"refuse_several_files", "validate_input",
                                 "check_drop_limit"}, "_rows_checked"),
    "validate_and_aggregate": ({"refuse_several_files", "count_partition"}, "_input_checked"),
    "check_before_charge": ({"refuse"}, "_counted"),
}
# What each check stage calls for them (the same functions, or the engine's ones the task
# wraps: ``plan`` is ``plan_for_config``, ``count_partition`` counts with the encoding,
# joint-domain and drop-limit rules ``aggregate`` applies).
CHECKS = {
    "_planned": {"plan_for_config", "refusals", "ledger_facts", "resolve_mechanism"},
    "_input_checked": {"refuse_several_files", "resolve_extract"},
    "_rows_checked": {"validate_input", "check_drop_limit", "aggregate"},
    "_stores_checked": {"refusals"},
    "_counted": {"refusals"},
}
EXEMPT = {
    "connect": "a Dask runner that cannot start is the deployment's, not the dataset's",
    "released_before": "no refusal: an unchanged extract is skipped, with nothing spent",
}
NOT_A_STEP = {"quote", "ticking", "read_step", "fan_out_runner", "runner_kind", "enter_context",
              "ExitStack",
              "counted", "close", "len", "skipped", "int", "get", "str"}


def _calls(function) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return {node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)}


def _stages(function, runner: str) -> set[str]:
    """The stages ``function`` runs through ``runner`` (``refuse`` or ``refusals``): the
    string its calls name first."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == runner and node.args
            and isinstance(node.args[0], ast.Constant)}


def test_every_pre_charge_call_of_the_flow_is_in_the_inventory() -> None:
    """The calls ``_release_resolved`` makes before its ``charge_budget``."""
    from flows import release as flow

    tree = ast.parse(textwrap.dedent(inspect.getsource(flow._release_resolved)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute | ast.Name)]
    name = lambda n: n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id  # noqa: E731
    last_charge = max(n.lineno for n in calls if name(n) == "charge_budget")
    before = {name(n) for n in calls if n.lineno < last_charge} - {"charge_budget"}
    unknown = before - set(SHARED) - set(EXEMPT) - NOT_A_STEP
    assert unknown == set(), f"pre-charge steps check does not run: {unknown}"


@pytest.mark.parametrize("step", sorted(SHARED))
def test_check_runs_the_functions_each_pre_charge_step_refuses_with(step: str) -> None:
    from medrelease import checkup
    from medrelease.data import reading
    from tasks import budget, inputs, request

    where = {"resolve_request": request.resolve_request.fn,
             "read_extract": inputs.read_extract,
             "load_and_validate_input": reading.read_validated,
             "validate_and_aggregate": reading.counted_partitions,
             "check_before_charge": budget.check_before_charge.fn}[step]
    functions, stage = SHARED[step]
    assert functions <= _calls(where), (step, functions - _calls(where))
    assert CHECKS[stage] <= _calls(getattr(checkup, stage)), stage
    # the engine function a task wraps is the one check calls
    assert "plan_for_config" in _calls(budget.plan.fn)
    assert "plan.fn(" in inspect.getsource(request.resolve_request.fn)
    assert {"validate_input", "aggregate_chunks"} <= _calls(reading._count_file)
    # the input tasks run the engine's reading (``medrelease/data/reading.py``)
    assert "read_validated" in _calls(inputs.load_and_validate_input.fn)
    assert "counted_partitions" in _calls(inputs.validate_and_aggregate.fn)


def test_the_flow_and_check_run_every_stage_of_refusals() -> None:
    """Every stage ``medrelease/refusals.py`` declares is run by the flow (its plan, resolve
    and pre-charge tasks) and by ``check``, stage for stage."""
    from medrelease import checkup, refusals
    from tasks import budget, request

    flow = (_stages(refusals.plan_for_config, "refuse") | _stages(request.resolve_request.fn,
            "refuse") | _stages(budget.check_before_charge.fn, "refuse"))
    check = (_stages(refusals.plan_for_config, "refuse") | _stages(checkup._planned, "refusals")
             | _stages(checkup._counted, "refusals") | _stages(checkup._stores_checked,
                                                               "refusals"))
    assert flow == check == set(refusals.STAGES), (flow, check, set(refusals.STAGES))
    assert "plan_for_config" in _calls(checkup._planned)


def test_each_mechanisms_pre_charge_hooks_come_through_functions_check_calls() -> None:
    """check_work, parse_params (plan_release), fixed_node (fixed_index), expected_noise_rows:
    every mechanism's own refusals before the charge come through a rule of a stage, or the
    plan, that check runs."""
    from medrelease import refusals, release

    assert "check_work" in _calls(refusals.work_over_limits)
    assert {"parse_params", "_check_budget_numbers"} <= _calls(release.plan_release)
    assert "fixed_node" in _calls(release.fixed_index)
    assert "fixed_index" in _calls(refusals.fixed_node_outside)
    assert "expected_noise_rows" in _calls(refusals.noise_rows_over_limit)
    assert "check_fits" in _calls(refusals.mechanism_misfit)
    assert "plan_release" in _calls(refusals.plan_for_config)
