"""What an apply did, resource by resource, and the Terraform-like summary line."""

from __future__ import annotations

import traceback
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from dstack_plan.apply.events import Step, plural
from dstack_plan.errors import DstackPlanError, ProviderError
from dstack_plan.plan.model import Action


class ResultStatus(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    """Not attempted because a resource it depends on (or, for a destroy, a dependent) failed."""
    NOT_STARTED = "not-started"
    """Not attempted because the apply was interrupted."""
    ABORTED = "aborted"
    """In progress when a second interrupt abandoned it."""


class ResourceResult(BaseModel):
    """The outcome for one planned change."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str
    action: Action
    status: ResultStatus
    message: str | None = None
    """The error (failed), the reason (skipped, not started, aborted), or a note."""
    internal: bool = False
    """The error is a bug (not a DstackPlanError); `message` is then `TypeName: message`."""
    steps: tuple[Step, ...] = ()
    """Provider operations that completed, in order (a failed replace may have a `delete`)."""
    duration: float = 0.0
    """Seconds from the first to the last operation, measured with the apply's clock."""
    traceback: str | None = Field(default=None, exclude=True, repr=False)
    """For internal errors only, for `--debug`; never part of the message or the JSON."""

    @property
    def counted(self) -> bool:
        """False for a no-op that had nothing to do, which summaries leave out."""
        return self.action is not Action.NOOP or bool(self.steps) or self.status in _BAD


_BAD = (ResultStatus.FAILED, ResultStatus.ABORTED)


class ApplyReport(BaseModel):
    """Every planned change's result, in plan order, plus how the run ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    destroy: bool = False
    results: tuple[ResourceResult, ...] = ()
    interrupted: bool = False
    """A first interrupt arrived: nothing new was started after it."""
    aborted: bool = False
    """A second interrupt arrived: operations in progress were abandoned."""

    def _with(self, *statuses: ResultStatus) -> list[ResourceResult]:
        return [r for r in self.results if r.status in statuses and r.counted]

    @property
    def succeeded(self) -> list[ResourceResult]:
        """Changes that completed (no-ops with nothing to do left out)."""
        return self._with(ResultStatus.SUCCEEDED)

    @property
    def failed(self) -> list[ResourceResult]:
        return self._with(ResultStatus.FAILED)

    @property
    def skipped(self) -> list[ResourceResult]:
        return self._with(ResultStatus.SKIPPED)

    @property
    def not_started(self) -> list[ResourceResult]:
        return self._with(ResultStatus.NOT_STARTED)

    @property
    def abandoned(self) -> list[ResourceResult]:
        """Changes in progress when the second interrupt came (status `aborted`)."""
        return self._with(ResultStatus.ABORTED)

    @property
    def ok(self) -> bool:
        """True when every change succeeded; False on any failure, skip or interruption."""
        return all(r.status is ResultStatus.SUCCEEDED for r in self.results if r.counted)

    def counts(self) -> tuple[int, int, int]:
        """(added, changed, destroyed) by completed operations: a replace is +1 and -1."""
        steps = [s for r in self.results for s in dict.fromkeys(r.steps)]
        return steps.count("create"), steps.count("update"), steps.count("delete")

    def result(self, address: str) -> ResourceResult | None:
        """The result for `address`, or None if it was not in the plan."""
        for r in self.results:
            if r.address == address:
                return r
        return None

    def summary(self) -> str:
        """`Apply complete! Resources: 1 added, 0 changed, 0 destroyed.` or an honest failure.

        Failures read `Apply failed: 1 added, 0 changed, 0 destroyed, 1 failed, 2 skipped.`,
        with `N not started` and `N aborted` appended when there are any; an interrupted run
        without failures says `Apply interrupted: ...`. Destroys say `Destroy` and only count
        what was destroyed.
        """
        added, changed, destroyed = self.counts()
        verb = "Destroy" if self.destroy else "Apply"
        parts = (
            [f"{destroyed} destroyed"]
            if self.destroy
            else [f"{added} added", f"{changed} changed", f"{destroyed} destroyed"]
        )
        if self.ok:
            return f"{verb} complete! Resources: {', '.join(parts)}."
        failed = len(self.failed)
        parts += [f"{failed} failed", f"{len(self.skipped)} skipped"]
        if self.not_started:
            parts.append(f"{len(self.not_started)} not started")
        if self.abandoned:
            parts.append(f"{len(self.abandoned)} aborted")
        outcome = "interrupted" if failed == 0 and (self.interrupted or self.aborted) else "failed"
        return f"{verb} {outcome}: {', '.join(parts)}."

    def abort_warning(self) -> str | None:
        """The warning to print after a second interrupt, naming what was abandoned."""
        if not self.aborted:
            return None
        names = ", ".join(r.address for r in self.abandoned) or "none"
        return (
            f"Two interrupts received: abandoned {plural(len(self.abandoned), 'operation')} "
            f"in progress ({names}). They may have left resources behind; those are recorded "
            "in state as tainted, so the next plan replaces or cleans them up."
        )


def describe_error(error: BaseException, address: str = "") -> tuple[str, bool, str | None]:
    """(message, internal, traceback) for the failed change of `address`.

    A DstackPlanError is the user's to fix and its message stands as is (less the address,
    which the report prints before it); anything else is a bug, shown as
    `TypeName: message`, with the traceback kept aside for `--debug`.
    """
    if isinstance(error, ProviderError) and error.resource and error.resource == address:
        return f"{error.provider}: {error.detail}", False, None
    if isinstance(error, DstackPlanError):
        return str(error) or type(error).__name__, False, None
    text = str(error)
    message = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return message, True, "".join(traceback.format_exception(error))
