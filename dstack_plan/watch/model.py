"""What one tick of `dstack watch` saw and did: the input of its metrics, events and logs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSeen(_Frozen):
    """A job of a run in state, as its agent reported it this tick."""

    address: str
    """The run's address (`task.train`)."""
    job_id: str
    host: str
    status: str
    """The agent's job status (`running`, `done`, `failed`, ...); `unknown` when its host did
    not answer."""


class HostSeen(_Frozen):
    """A machine whose agent watch asked this tick."""

    fleet: str
    host: str
    reachable: bool
    error: str | None = None
    metrics_text: str | None = None
    """The agent's Prometheus exposition (`/metrics`), when it answered."""
    jobs: int | None = None
    """Jobs not finished on the host, of every project, as that exposition counts them (None
    when it did not answer): busy or idle (`fleets/host_status.py`)."""


class TickReport(_Frozen):
    """One reconcile tick."""

    started_at: float
    """Epoch seconds (the watch's clock)."""
    duration_s: float
    leader: bool
    """Whether this process held the lease and so could act."""
    runs: dict[str, str] = {}
    """Run address -> its status after the tick (`running`, `pending`, `failed`, ...)."""
    jobs: tuple[JobSeen, ...] = ()
    hosts: tuple[HostSeen, ...] = ()
    fleets: dict[str, dict[str, int]] = {}
    """Fleet name -> instance status -> count (`{"onprem": {"busy": 1, "idle": 1,
    "unreachable": 1}}`), each host's status by `fleets.host_status.host_status`."""
    queue_depth: int = 0
    """Runs waiting to be placed (pending)."""
    retries: int = 0
    """Jobs or runs resubmitted by this tick."""
    bandwidth: tuple[tuple[str, str, str, float], ...] = ()
    """(fleet, src, dst, bytes per second) of every link `dstack fleet probe` measured, as
    state records them."""
