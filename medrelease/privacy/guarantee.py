"""Privacy guarantees as data, and the accountant that keeps a release inside its budget.

Every mechanism states what it delivers (``Guarantee``) and how it spends its budget
(``BudgetStep`` list). The steps are charged to a ``PrivacyAccountant`` before any noise is
drawn; the manifest, the ledger and the artifacts are all written from these objects, so what
is claimed and what was spent can never drift apart.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from medrelease.errors import BudgetExceededError, MedreleaseError

ADD_REMOVE_ONE_ROW = "add/remove one row"


def row_unit_note(row_noun: str | None = None, unit_noun: str | None = None) -> str:
    """What a reader must not miss under add/remove one row: "one individual" reads as one
    person, and the unit is a row. In the config's own words (``privacy.row_noun`` /
    ``unit_noun``), generic when it names none (a table of households never says 'patient').

    A config whose row and unit are one noun declares that one row is one of them (a cohort
    with one row per patient): the note then says so, in that noun, without the caveat about
    units with several rows (issue 55). The declaration is the steward's, as the nouns are:
    a table where one patient has several rows declares ``privacy.unit`` instead."""
    if row_noun and row_noun != "row" and row_noun == unit_noun:
        return (f"The privacy unit is one row of the extract, and one row is one {unit_noun} "
                f"(the dataset declares one row per {unit_noun}): the guarantee protects one "
                f"{unit_noun}.")
    row = f" (one {row_noun})" if row_noun and row_noun != "row" else ""
    if unit_noun and unit_noun != "row":
        return (f"The privacy unit is one row of the extract{row}, not one {unit_noun}: a "
                f"{unit_noun} with k rows is protected at about k times epsilon.")
    return (f"The privacy unit is one row of the extract{row}, not one person or thing the "
            "rows describe: one described by k rows is protected at about k times epsilon.")
TOLERANCE = 1e-9


@dataclass(frozen=True)
class BudgetStep:
    """One use of the data that costs privacy budget."""

    step: str
    epsilon: float
    delta: float
    mechanism: str
    description: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Guarantee:
    """What a release may be said to guarantee.

    ``proven`` is False when the mechanism's published claim does not hold (``ipa-paper``) or when
    there is no differential-privacy claim at all (syntactic models, pseudonymization); then
    ``epsilon``/``delta`` are the *claimed* values, and ``label`` says so in words.
    """

    mechanism: str
    epsilon: float | None
    delta: float | None
    neighbouring: str
    proven: bool
    label: str
    notes: str = ""
    # The config's words for one row and for whom rows describe (the statement's row note);
    # not part of the record (``as_dict``): the statement carries them.
    row_noun: str | None = None
    unit_noun: str | None = None

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("row_noun", "unit_noun")}

    @classmethod
    def no_dp_claim(cls, mechanism: str, label: str, notes: str) -> Guarantee:
        """Syntactic models and pseudonymization: no epsilon at all, never 'proven'."""
        return cls(mechanism, None, None, ADD_REMOVE_ONE_ROW, False, label, notes)

    def statement(self) -> str:
        """One plain sentence for summaries."""
        if self.epsilon is None:
            return f"{self.label}."
        core = f"(epsilon={self.epsilon:g}, delta={self.delta:g})-differential privacy"
        unit = (f" {row_unit_note(self.row_noun, self.unit_noun)}"
                if self.neighbouring == ADD_REMOVE_ONE_ROW else "")
        if self.proven:
            return f"{core} under {self.neighbouring} ({self.label}).{unit}"
        return f"Claimed {core} under {self.neighbouring} — {self.label}.{unit}"


@dataclass
class PrivacyAccountant:
    """Keeps the spends of one release within its total (sequential composition).

    ``spend`` refuses a step that would push the total past the limit and records nothing then.
    """

    epsilon_limit: float
    delta_limit: float = 0.0
    steps: list[BudgetStep] = field(default_factory=list)

    @property
    def epsilon_spent(self) -> float:
        return math.fsum(s.epsilon for s in self.steps)

    @property
    def delta_spent(self) -> float:
        return math.fsum(s.delta for s in self.steps)

    def spend(self, step: BudgetStep) -> None:
        if step.epsilon < 0 or step.delta < 0:
            raise BudgetExceededError(f"step {step.step!r} has a negative budget")
        eps_after = self.epsilon_spent + step.epsilon
        delta_after = self.delta_spent + step.delta
        if eps_after > self.epsilon_limit * (1 + TOLERANCE) + TOLERANCE:
            raise BudgetExceededError(
                f"step {step.step!r} needs epsilon {step.epsilon:g}; spent {self.epsilon_spent:g} "
                f"of {self.epsilon_limit:g}"
            )
        if delta_after > self.delta_limit * (1 + TOLERANCE) + 1e-15:
            raise BudgetExceededError(
                f"step {step.step!r} needs delta {step.delta:g}; spent {self.delta_spent:g} "
                f"of {self.delta_limit:g}"
            )
        self.steps.append(step)


class StepAccountingError(MedreleaseError):
    """A mechanism drew noise outside its declared budget steps (nothing is published)."""


class StepDraws:
    """The plan's declared budget steps, handed to the mechanism by name as it draws.

    The privacy map drives the noise: a mechanism asks for a step and draws with that step's
    epsilon and delta, never with numbers of its own. Each step is handed out at most once, an
    undeclared one never, and at the end every declared step must have been drawn or passed
    over with a reason (a passed-over step stays charged: its budget was reserved).
    """

    def __init__(self, declared: list[BudgetStep], mechanism: str) -> None:
        self.mechanism = mechanism
        self.declared = {step.step: step for step in declared}
        self.outcome: dict[str, str] = {}

    def take(self, name: str) -> BudgetStep:
        self._claim(name, "drawn")
        return self.declared[name]

    def pass_over(self, name: str, reason: str) -> None:
        self._claim(name, f"not drawn: {reason}")

    def close(self) -> dict[str, str]:
        """Each declared step's outcome; raises if one was never accounted for."""
        missing = [name for name in self.declared if name not in self.outcome]
        if missing:
            raise StepAccountingError(
                f"{self.mechanism}: declared budget step(s) {', '.join(map(repr, missing))} "
                "were neither drawn nor passed over; the release is stopped")
        return dict(self.outcome)

    def _claim(self, name: str, outcome: str) -> None:
        if name not in self.declared:
            raise StepAccountingError(
                f"{self.mechanism} drew noise for {name!r}, a step its plan does not declare "
                f"(declared: {', '.join(map(repr, self.declared))}); the release is stopped")
        if name in self.outcome:
            raise StepAccountingError(
                f"{self.mechanism} asked for budget step {name!r} a second time; each declared "
                "step is drawn once; the release is stopped")
        self.outcome[name] = outcome
