"""dstack-plan: Terraform-style plan/apply for AI compute, speaking dstack's YAML.

The Python API: `Project` (load, plan, apply, destroy a directory of configurations) and the
SDK (`submit_task`, the builders `Task`, `Service`, `Fleet`, ..., run handles), imported on
first use so that the CLI starts without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "ApplyFailed",
    "Config",
    "DevEnvironment",
    "Fleet",
    "Gateway",
    "Project",
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
_SDK = frozenset(__all__) - {"Project"}

if TYPE_CHECKING:
    from dstack_plan.project import Project
    from dstack_plan.sdk import (
        ApplyFailed,
        Config,
        DevEnvironment,
        Fleet,
        Gateway,
        Run,
        Service,
        SpecError,
        Task,
        Volume,
        aapply,
        apply,
        asubmit_task,
        submit_task,
    )


def __getattr__(name: str) -> Any:
    if name == "Project":
        from dstack_plan.project import Project

        return Project
    if name in _SDK:
        from dstack_plan import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'dstack_plan' has no attribute {name!r}")
