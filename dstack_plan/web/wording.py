"""How runs and jobs are worded for people, the same in `dstack ps` and the web UI's pages:
ages, a job's status in dstack's words, the GPUs a run or job holds. Pure; nothing heavy is
imported, so the CLI may use it at any time."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dstack_plan.inspect.runs import JobView, RunView


def format_age(seconds: float) -> str:
    """`now`, `45s`, `12m`, `3h`, `5d` (the largest whole unit)."""
    if seconds < 1:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def job_status_text(job: JobView) -> str:
    """dstack's job wording: `exited (N)` for a failure with an exit code, `stopped`..."""
    if job.status == "failed" and job.exit_code is not None:
        return f"exited ({job.exit_code})"
    if job.status == "terminated":
        return "stopped"
    return job.status


def run_gpus(view: RunView) -> str:
    """What the run asks (`A100:2`); for a one-job run on a shared GPU, which one and how it
    is shared: `25% of GPU 0 (MPS)`, `25% of GPU 0 (time-sliced: no limits)`."""
    if len(view.jobs) == 1 and view.jobs[0].gpus and view.jobs[0].gpu_share is not None:
        job = view.jobs[0]
        return f"{_share(job)} of GPU {job.gpus[0]} ({_sharing(job)})"
    return view.gpus or "-"


def job_gpus(job: JobView) -> str:
    """Which of its host's GPUs the job holds, named so that no one reads an index as a
    count: `GPU 0`, `GPUs 0,1`; a shared GPU with the job's share and how it is shared:
    `GPU 0 (25%, MPS)`, `GPU 0 (25%, time-sliced: no limits)`; `-` for none."""
    if not job.gpus:
        return "-"
    shown = ("GPU " if len(job.gpus) == 1 else "GPUs ") + ",".join(str(g) for g in job.gpus)
    if job.gpu_share is None:
        return shown
    return f"{shown} ({_share(job)}, {_sharing(job)})"


def _share(job: JobView) -> str:
    from dstack_plan.scheduler.occupancy import percent  # noqa: PLC0415 - only for shared GPUs

    return percent(job.gpu_share or 0)


def _sharing(job: JobView) -> str:
    """Said plainly: with MPS the share's limits hold; time-slicing enforces none."""
    return "MPS" if job.gpu_sharing == "mps" else "time-sliced: no limits"
