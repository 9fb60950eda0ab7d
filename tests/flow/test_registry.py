"""The registry is the single list: a mechanism registered from a test shows up in the form
schema, the CLI and a flow run without touching another file; and every trigger resolves the
mechanism the same way (request -> dataset YAML -> the registry's rule for the dataset: aim
with a declared informative domain, else ipa -> the mechanism's defaults)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from deployments.cli import app
from flows.release import ReleaseRequest, release_flow
from medrelease.data.config import find_config
from medrelease.errors import ParameterError
from medrelease.mechanisms import Capabilities, label, register, unregister
from medrelease.mechanisms.histogram import Histogram
from medrelease.release import release, resolve_mechanism

from ..conftest import PAPER_TABLE_5, serve_inbox, write_paper_dataset

MIMIC = Path(__file__).resolve().parents[3] / "shared" / "data" / "mimic-iii-demo"


class ToyHistogram(Histogram):
    """A mechanism declared here and nowhere else: the histogram under another name."""

    name: ClassVar[str] = "toy-histogram"
    capabilities: ClassVar[Capabilities] = Capabilities(summary="toy for the registry test")


@pytest.fixture
def toy():
    register(ToyHistogram())
    try:
        yield "toy-histogram"
    finally:
        unregister("toy-histogram")


def test_a_registered_mechanism_appears_in_the_form_and_the_cli(toy: str) -> None:
    schema = ReleaseRequest.model_json_schema()
    assert label(toy) in schema["properties"]["mechanism"]["enum"]
    assert "toy-histogram: node, cell_limit" in schema["properties"]["parameters"]["description"]
    listed = CliRunner().invoke(app, ["mechanisms"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "toy-histogram" in listed.output
    request = ReleaseRequest(mechanism=label(toy), epsilon=0.5, parameters={"cell_limit": 9000})
    assert request.mechanism == toy
    with pytest.raises(ValueError, match="toy-histogram does not take k; it takes: auto_cells"):
        ReleaseRequest(mechanism=toy, parameters={"k": 3})


def test_the_form_and_the_readme_say_what_each_mechanism_gives_a_researcher() -> None:
    from medrelease.mechanisms import MECHANISMS, capabilities

    described = ReleaseRequest.model_json_schema()["properties"]["mechanism"]["description"]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    for name in MECHANISMS:
        gives = capabilities(name).gives
        assert gives, f"{name} declares no 'gives' line"
        assert f"**{name}**: {gives}" in described
        assert f"- `{name}`: {gives}." in readme, f"README has no line for {name}"


@pytest.mark.usefixtures("prefect_harness")
def test_a_registered_mechanism_releases_through_the_flow(toy: str, tmp_path: Path,
                                                           monkeypatch) -> None:
    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    config = write_paper_dataset(tmp_path)
    config.write_text(config.read_text() + textwrap.dedent("""\
        policy: {mechanisms: [toy-histogram], allow_unproven: true}
        """))
    result = release_flow(ReleaseRequest(dataset=str(config), mechanism=toy, epsilon=0.5,
                                         seed=3, evaluate=False,
                                         void_lifetime_guarantee=True))  # unproven: confirmed
    manifest = result["manifest"]
    assert manifest["mechanism"] == toy and manifest["epsilon_spent"] == pytest.approx(0.5)
    assert manifest["checks"]["passed"]


def test_resolution_request_then_yaml_then_defaults() -> None:
    mimic = find_config("mimic-demo")
    own = resolve_mechanism(mimic)
    assert (own.name, own.params["specializations"], own.source) == ("diffgen", 5,
                                                                      "dataset config")
    overridden = resolve_mechanism(mimic, epsilon=0.5, params={"score": "infogain"})
    assert overridden.params == {"epsilon": 0.5, "specializations": 5, "score": "infogain"}
    other = resolve_mechanism(find_config("nps-sample"), "kanon", None, {"k": 12})
    assert other.params == {"k": 12} and other.source == "request"  # no ipa params carried
    with pytest.raises(ParameterError, match="kanon takes no epsilon"):
        resolve_mechanism(find_config("nps-sample"), "kanon", 1.0)


def _without_mechanism(config, **update):
    """``config`` as a YAML that names no mechanism (plus ``update``)."""
    from medrelease.data.config import config_from_dict

    raw = config.model_dump(exclude={"base_dir", "config_file", "mechanism"}) | update
    return config_from_dict(raw, config.base_dir)


def test_a_dataset_naming_no_mechanism_gets_aim_with_a_declared_domain_else_ipa(
        paper_config) -> None:
    """No default publishes silent bias: ipa drops rare informative values without saying so,
    so aim is the default wherever it can run (a declared informative domain)."""
    from medrelease.mechanisms import DEFAULT_RULE, capabilities, default_mechanism, labels

    sample = find_config("nps-sample")
    own = resolve_mechanism(sample)  # the bundled sample names aim in its YAML
    assert (own.name, own.params, own.source) == ("aim", {"epsilon": 1.0}, "dataset config")
    assert default_mechanism(sample) == "aim"
    unnamed = _without_mechanism(sample)
    assert unnamed.mechanism.name is None and unnamed.informative_domain
    assert resolve_mechanism(unnamed).name == "aim"
    no_domain = paper_config  # no mechanism, no domain (Disease: {role: informative})
    assert no_domain.mechanism.name is None and no_domain.informative_domain is None
    assert default_mechanism(no_domain) == resolve_mechanism(no_domain).name == "ipa"
    assert release(PAPER_TABLE_5, no_domain, seed=1).mechanism == "ipa"  # (the driver too)
    columns = {**{c: s.model_dump(exclude_none=True) for c, s in sample.columns.items()},
               "diagnosis": {"role": "informative"}}
    assert default_mechanism(_without_mechanism(sample, columns=columns)) == "ipa"
    # a domain, but a policy without aim: the default is one the policy lets run
    no_aim = _without_mechanism(sample, policy={"mechanisms": ["ipa", "histogram"]})
    assert default_mechanism(no_aim) == "ipa"
    # the params of a YAML that names no mechanism go to the default
    params = _without_mechanism(sample, mechanism={"params": {"epsilon": 0.5}})
    assert resolve_mechanism(params).params == {"epsilon": 0.5}
    # nothing calls one mechanism "the default": the form derives it per dataset
    assert not any("default" in text for text in labels())
    assert "default" not in capabilities("ipa").summary
    described = ReleaseRequest.model_json_schema()["properties"]["mechanism"]["description"]
    assert DEFAULT_RULE in described and "nps-sample: aim" in described
    assert "adult: diffgen" in described


@pytest.mark.skipif(not MIMIC.is_dir(), reason="MIMIC-III demo not beside the checkout")
@pytest.mark.usefixtures("prefect_harness")
def test_a_mimic_arrival_is_released_with_the_yaml_diffgen_parameters(tmp_path: Path,
                                                                       monkeypatch) -> None:
    from flows.arrival import arrival_release_flow
    from medrelease.data.mimic import write_admissions
    from medrelease.storage.inbox import InboxWatcher

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    serve_inbox(monkeypatch, inbox, "mimic-demo")
    write_admissions(MIMIC, inbox / "admissions.csv")
    (inbox / "admissions.csv.done").write_text("")
    [arrival] = InboxWatcher(inbox, stable_polls=1).poll()
    result = arrival_release_flow("mimic-demo", str(arrival.path), arrival.sha256)
    manifest = json.loads((Path(result["path"]) / "manifest.json").read_text())
    assert manifest["mechanism"] == "diffgen"
    assert manifest["parameters"]["specializations"] == 5  # from datasets/mimic-demo's YAML
    assert manifest["parameters"]["score"] == "max" and manifest["epsilon_spent"] == 1.0


@pytest.mark.usefixtures("prefect_harness")
def test_an_unchanged_extract_is_not_released_again_when_asked_to_skip(tmp_path: Path,
                                                                       monkeypatch) -> None:
    from medrelease.privacy.ledger import Ledger

    monkeypatch.setenv("MEDRELEASE_HOME", str(tmp_path / "home"))
    config = str(write_paper_dataset(tmp_path))
    first = release_flow(ReleaseRequest(dataset=config, skip_unchanged=True, evaluate=False))
    assert first["release_id"]
    spends = len(Ledger(tmp_path / "home" / "ledger.sqlite").spends())
    state = release_flow(ReleaseRequest(dataset=config, skip_unchanged=True, evaluate=False),
                         return_state=True)
    assert (state.name, state.type.value) == ("No new data", "COMPLETED")
    assert first["release_id"] in state.message and "nothing spent" in state.message
    assert len(Ledger(tmp_path / "home" / "ledger.sqlite").spends()) == spends
    forced = release_flow(ReleaseRequest(dataset=config, evaluate=False))  # the steward forces
    assert forced["release_id"] != first["release_id"]


def test_the_form_says_beside_an_option_which_bundled_datasets_it_cannot_release() -> None:
    """Issue 27: diffgen was offered for datasets without a class column, then refused."""
    described = ReleaseRequest.model_json_schema()["properties"]["mechanism"]["description"]
    diffgen = next(line for line in described.splitlines() if line.startswith("- **diffgen**"))
    assert "not for adult-ipa, nps-sample: no class column with declared values" in diffgen
    ipa = next(line for line in described.splitlines() if line.startswith("- **ipa**"))
    assert "nps-sample" not in ipa
