"""Datasets whose input has to be prepared before a release (issue 56): the release form says
which datasets are ready and how to prepare the others, a release of a dataset whose input is
missing is refused with that sentence before anything else is read, and ``mimic-demo``'s input
can be prepared from the UI (the ``prepare-mimic`` deployment, what ``medrelease
prepare-mimic`` does with its defaults; it takes no parameter, so a form cannot point it at
another folder).
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.states import Completed, Failed, State

from medrelease.data.config import DatasetConfig, find_config
from medrelease.errors import InputValidationError, MedreleaseError

PREPARE_MIMIC_FLOW = "medrelease-prepare-mimic"
PREPARE_MIMIC_DEPLOYMENT = "prepare-mimic"
# dataset -> (the deployment that prepares its input, the command that does the same)
PREPARED_BY = {"mimic-demo": (PREPARE_MIMIC_DEPLOYMENT, "medrelease prepare-mimic"),
               "mimic-relational": (PREPARE_MIMIC_DEPLOYMENT, "medrelease prepare-mimic")}
PATTERN_CHARS = set("*?[")


def input_missing(config: DatasetConfig) -> bool:
    """Whether the config's own extract is absent: no file at its path, or no file matching
    its pattern (a relational dataset: any of its tables' files). A stat or a directory
    listing: nothing of the input is read."""
    if config.relational is not None:
        return not all(path.is_file() for path in config.table_files().values())
    path = config.input_path
    if PATTERN_CHARS & set(path.name):
        return not any(p.is_file() for p in path.parent.glob(path.name))
    return not path.is_file()


def how_to_prepare(config: DatasetConfig) -> str:
    """What a steward does about a missing input, in one clause."""
    if config.name in PREPARED_BY:
        deployment, command = PREPARED_BY[config.name]
        return (f"prepare it first: in the Prefect UI, Deployments → {deployment} → Run, or "
                f"`{command}` on the serving host")
    return ("put the extract there, or name another one in the form's 'Input path' (inside "
            "the dataset's input folders)")


def refuse_missing_input(dataset: str, input_path: str | None) -> None:
    """A request for a dataset's own input that is not there is refused with how to prepare
    it (``InputValidationError``: a refusal, nothing read or spent). A request that names an
    extract, or a dataset that cannot be found, goes on: resolution says what is wrong."""
    if input_path is not None:
        return
    try:
        config = find_config(dataset)
    except MedreleaseError:
        return
    if input_missing(config):
        raise InputValidationError(
            f"the input of dataset {config.name!r} is not there yet ({config.input_path}): "
            f"{how_to_prepare(config)}. Nothing was read or spent.")


def mimic_demo_folder() -> Path:
    """The MIMIC-III demo's CSV folder beside the checkout (``medrelease prepare-mimic``'s
    default, from the project root rather than the working directory)."""
    from medrelease.data.config import project_root

    return project_root().parent / "shared" / "data" / "mimic-iii-demo"


@flow(name=PREPARE_MIMIC_FLOW, log_prints=False,
      description="Write mimic-demo's and mimic-relational's inputs from the MIMIC-III demo "
                  "CSVs (as 'medrelease prepare-mimic')")
def prepare_mimic_flow() -> State:
    """Join the MIMIC-III demo per admission into mimic-demo's input file. Ends 'Prepared'
    (the release form then lists mimic-demo as ready) or 'Refused' with the reason; the log
    names the files, never a value or a count of rows."""
    from medrelease.data.mimic import write_admissions

    target = find_config("mimic-demo").input_path
    try:
        write_admissions(mimic_demo_folder(), target)
    except MedreleaseError as exc:
        get_run_logger().warning("mimic-demo not prepared: %s", exc)
        return Failed(name="Refused", message=f"Nothing written: {exc}"[:2000])
    message = (f"mimic-demo's input written to {target}, mimic-relational's tables to "
               f"{target.parent / 'relational'}: both can be released now")
    get_run_logger().info(message)
    return Completed(name="Prepared", message=message)
