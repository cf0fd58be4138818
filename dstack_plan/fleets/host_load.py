"""What the jobs on a host hold now (GPUs, host ports), as the scheduler sees them.

Built from an agent's job listing; pure. Each job is tagged with the run it belongs to, so the
placement of a run can leave out its own jobs (a replacement stops them first, a no-op keeps
them) and messages name the run that holds what another one waits for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.gpu_share import WHOLE
from dstack_plan.scheduler.placement import HostJob


class BusyJob(NamedTuple):
    """A job that holds part of its host, and whose run it is."""

    deployment: str | None
    """The deployment key of the state it belongs to (None: not submitted by a project)."""
    run_name: str
    held: HostJob
    ends_at: float | None = None
    """When its `max_duration` ends it, by the host's clock (None: it has none)."""


def busy_jobs(infos: Iterable[JobInfo], deployment: str) -> list[BusyJob]:
    """The unfinished jobs among `infos`, with what each holds: its GPUs (and its share of
    them), and the ports it binds on the host (those on the host network, and those Docker
    published for it)."""
    busy = []
    for info in infos:
        if info.finished:
            continue
        spec = info.spec if isinstance(info.spec, dict) else {}
        labels = spec.get("labels") or {}
        owner = str(labels.get("address") or info.run_name)
        theirs = labels.get("deployment")
        if theirs != deployment:
            owner += " (another project)"
        share = info.gpu_share if info.gpu_share is not None else WHOLE
        held = HostJob(owner, len(info.gpus), _host_ports(info, spec), share, tuple(info.gpus))
        limit = spec.get("max_duration")
        start = info.started_at or info.submitted_at
        ends = start + float(limit) if isinstance(limit, int | float) and limit > 0 else None
        busy.append(BusyJob(None if theirs is None else str(theirs), info.run_name, held, ends))
    return busy


def _host_ports(info: JobInfo, spec: dict[str, object]) -> tuple[int, ...]:
    known = tuple(p.host_port for p in info.ports if p.host_port is not None)
    if known:
        return known
    if spec.get("network_mode", "host") != "host" and spec.get("image"):
        return ()  # a container not started yet: Docker picks its host ports then
    declared = spec.get("ports")
    if not isinstance(declared, list):
        return ()
    ports = []
    for port in declared:
        number = port.get("container_port") if isinstance(port, dict) else port
        if isinstance(number, int):
            ports.append(number)
    return tuple(ports)
