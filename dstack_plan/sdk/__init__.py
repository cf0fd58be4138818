"""The Python SDK: submit and follow runs from Python and notebooks, on the same plan/apply
path as the CLI (`dstack_plan.Project` underneath).

    from dstack_plan import submit_task
    run = submit_task(commands=["nvidia-smi"], resources={"gpu": 1})
    run.wait(); print(run.logs())
"""

from dstack_plan.sdk.builders import (
    Config,
    DevEnvironment,
    Fleet,
    Gateway,
    Service,
    SpecError,
    Task,
    Volume,
)
from dstack_plan.sdk.runs import Run
from dstack_plan.sdk.submit import ApplyFailed, aapply, apply, asubmit_task, submit_task

__all__ = [
    "ApplyFailed",
    "Config",
    "DevEnvironment",
    "Fleet",
    "Gateway",
    "Run",
    "Service",
    "SpecError",
    "Task",
    "Volume",
    "aapply",
    "apply",
    "asubmit_task",
    "submit_task",
]
