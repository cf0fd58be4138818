"""The HTTP API's own models: what no `--json` output already has a model for."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dstack_plan.plan.model import Plan


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ApiError(_Frozen):
    """Every error answer (4xx, 5xx)."""

    error: str


class ApiIndex(_Frozen):
    """`/api/`: what this server is and where its endpoints are."""

    read_only: bool = True
    recording_history: bool
    """Whether metrics history is kept (`dstack watch --ui`; not `dstack ui`)."""
    endpoints: tuple[str, ...]


class PlanView(_Frozen):
    """The plan of the project's configuration against its state, computed on request."""

    computed_at: float
    """Epoch seconds."""
    plan: Plan
    """As `dstack plan -out FILE` saves it (its `plan`); `dstack plan --json` is the
    Terraform-shaped rendering of the same."""


class MetricsSample(_Frozen):
    """What one tick of `dstack watch` saw, reduced to what charts over time need."""

    time: float
    """Epoch seconds the tick started (the watch's clock)."""
    duration_s: float
    leader: bool
    queue_depth: int
    """Runs waiting to be placed."""
    retries: int
    runs: dict[str, int] = {}
    """Run status -> runs."""
    jobs: dict[str, int] = {}
    """Job status (as agents report it) -> jobs."""
    gpu_utilization: dict[str, float] = {}
    """Host -> mean utilisation of its GPUs in percent (hosts that reported GPUs)."""
    gpu_memory_used_bytes: dict[str, float] = {}
    """Host -> GPU memory in use, all its GPUs together."""
    hosts_unreachable: int = 0


class MetricsHistory(_Frozen):
    """The samples kept, oldest first."""

    recording: bool
    """False under `dstack ui` (no watch runs in this process: no samples)."""
    max_samples: int
    max_age_s: float
    samples: tuple[MetricsSample, ...] = ()


class LogLine(_Frozen):
    """One line of a job's output."""

    ts: float | None
    """When the agent stored it (epoch seconds, to about a second); None from an old agent."""
    text: str


class JobLogs(_Frozen):
    """A job's retained output (`/api/runs/{run}/logs` without `follow`)."""

    address: str
    job_id: str
    host: str
    status: str
    lines: tuple[LogLine, ...] = ()
    attempt: int | None = None
    """Which submission of the run the job is of (1: the first; `runs/attempts.py`)."""


class LogEnd(_Frozen):
    """The last server-sent event of a followed log: the job ended."""

    job_id: str
    status: str
    exit_code: int | None = None
