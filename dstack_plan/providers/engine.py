"""What a cluster whose own scheduler runs the jobs offers the rest of the code.

Slurm (`providers/slurm/`) and Kubernetes (`providers/kubernetes/`) are engine backends: where
other providers give us machines on which our agent runs jobs, an engine takes the jobs
themselves. Each serves the job half of the agent's interface (`agent/jobs_api.py`), so what
reads and ends jobs works on it unchanged; what places and submits runs on it is its own
(`runs/slurm_runs.py`, `runs/kubernetes_runs.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from dstack_plan.state.model import ResourceState

if TYPE_CHECKING:
    from dstack_plan.agent.jobs_api import JobsAPI
    from dstack_plan.providers.ssh.forward import Forward


class ClusterEngine(Protocol):
    """One cluster's jobs, reached as its backend config says (no I/O until asked)."""

    @property
    def name(self) -> str:
        """How messages name the cluster (its `name` in `.dstack/backends.yml`)."""
        ...

    def jobs(self) -> JobsAPI:
        """The cluster's jobs behind the job half of the agent's interface."""
        ...

    async def forward(self, address: str, port: int, local_port: int = 0) -> Forward:
        """`address`:`port` (where a service's replica listens, as its published port says)
        on this machine's 127.0.0.1 (`local_port`, 0: any free one)."""
        ...

    async def close(self) -> None:
        """Let go of connections and clients."""
        ...


EngineOf = Callable[[ResourceState], ClusterEngine]
"""The project's kept engine of an engine fleet in state (`FleetMachines.engine_of`)."""
