"""Runs on a Slurm fleet: one submission to the cluster; its scheduler places and starts them.

Where runs on other fleets are placed on machines by our scheduler and handed to our agent on
each, a run on a Slurm fleet goes to a partition (the first whose nodes have what one node of
the run asks: `providers/slurm/request.py`) as one Slurm job of all its nodes, and Slurm's
queueing, fair share and accounting decide when and where it starts. Its jobs are recorded
like any run's, their host being the cluster's name, so refresh, watch, `ps`, `logs` and
`stop` reach them through the fleet's `JobsAPI` (`FleetMachines.jobs_api`).

A service's replicas are Slurm jobs of one node each (they are added and removed one by one);
watch's proxy reaches each through the login node, at the address of the node it runs on.

What a Slurm cluster cannot run yet is refused here, at plan time and again at apply: an
`image:` where the backend has no container support, dev environments, local `files:` /
`repos:`, network volumes, node and replica groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.apply.handlers import ApplyContext
from dstack_plan.config.runs import DevEnvironmentSpec, RunSpec, ServiceSpec, TaskSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.errors import ProviderError
from dstack_plan.fleets.machines import FleetMachines
from dstack_plan.fleets.slurm_records import SlurmFleetRecord
from dstack_plan.plan.model import Placement
from dstack_plan.providers.names import SLURM
from dstack_plan.providers.slurm.engine import SlurmEngine
from dstack_plan.providers.slurm.partitions import Partition, describe
from dstack_plan.providers.slurm.request import choose_partition, slurm_request
from dstack_plan.providers.slurm.script import Container, SlurmRequest
from dstack_plan.runs.cluster_runs import cluster_machine, not_yet
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job, slots, stop_seconds
from dstack_plan.runs.submission import Submitted
from dstack_plan.state.model import State

QUEUED_AFTER = 5.0
"""Seconds past now from which Slurm's estimated start means the run waits in its queue."""


def engine_refusal(spec: RunSpec, record: SlurmFleetRecord) -> str | None:
    """Why fleet `record` cannot run `spec` in this version; None when it can."""
    if (
        spec.image
        and record.cluster.containers == "none"
        and not isinstance(spec, DevEnvironmentSpec)
    ):
        return (
            f"image {spec.image!r}: cluster {record.cluster.name} runs no containers "
            "(containers: none in .dstack/backends.yml); drop `image:` to run the commands on "
            "the nodes, or set containers: pyxis or apptainer where the site has them"
        )
    return not_yet(spec, "Slurm", "use the shared filesystem", "use the shared filesystem")


@dataclass(frozen=True)
class EnginePlan:
    """Where a run goes on a Slurm fleet and what it asks for there."""

    partition: Partition
    request: SlurmRequest
    container: Container | None


def plan_run(spec: RunSpec, record: SlurmFleetRecord, comment: str | None = None) -> EnginePlan:
    """The partition and request of `spec` on fleet `record` (the same at plan and at
    apply); ProviderError saying why when it cannot go there."""
    why = engine_refusal(spec, record)
    if why is not None:
        raise ProviderError(SLURM, why)
    assert isinstance(spec, TaskSpec | ServiceSpec)
    # a service's replicas are Slurm jobs of one node each: they come and go one by one
    nodes = spec.node_count() if isinstance(spec, TaskSpec) else 1
    chosen = choose_partition(spec.resources, nodes, record.partitions)
    if isinstance(chosen, str):
        raise ProviderError(
            SLURM, f"no partition of cluster {record.cluster.name} can take it: {chosen}"
        )
    request = slurm_request(
        spec.resources,
        chosen,
        record.cluster,
        nodes=nodes,
        max_duration=None if spec.max_duration in (None, "off") else float(spec.max_duration),
        stop_seconds=stop_seconds(spec),
        comment=comment,
    )
    container = None
    if spec.image:
        container = Container(record.cluster.containers, spec.image, gpus=bool(request.gres))
    return EnginePlan(chosen, request, container)


def placement_note(plan: EnginePlan, record: SlurmFleetRecord) -> str:
    """What the plan shows of a run on a Slurm fleet: the partition and the request."""
    options = " ".join(o for o in plan.request.options() if not o.startswith("--job-name"))
    return f"Slurm {record.cluster.name}, partition {plan.partition.name}: sbatch {options}"


async def plan_placement(
    machines: FleetMachines, fleet: str, spec: RunSpec, state: State, now: float
) -> Placement:
    """Where a run would go on Slurm fleet `fleet`, with Slurm's own estimate of its start
    (`sbatch --test-only`: nothing is queued); placed False with the reason when no
    partition can ever take it."""
    entry = machines.recorded(fleet, state)
    assert entry is not None
    record = SlurmFleetRecord.of(entry)
    try:
        plan = plan_run(spec, record)
    except ProviderError as e:
        partitions = describe(record.partitions)
        return Placement(
            fleet=fleet, provider=SLURM, placed=False, note=f"{e.detail} [{partitions}]"
        )
    note = placement_note(plan, record)
    engine = machines.engine(fleet, state)
    assert isinstance(engine, SlurmEngine)
    estimate = await engine.estimate(plan.request)
    start = estimate.start
    # Slurm's clock has whole seconds: a start within the next few is a start now
    waits = start is not None and start > now + QUEUED_AFTER
    if waits:
        note += f"; Slurm queues it ({estimate.message})"
    return Placement(
        fleet=fleet,
        provider=SLURM,
        hosts=(record.cluster.name,),
        placed=True,
        pending=waits,
        note=note,
        estimated_start=start if waits else None,
    )


async def submit_run(
    machines: FleetMachines,
    fleet: str,
    state: State,
    spec: RunSpec,
    context: JobContext,
    secrets: SecretStore,
    ctx: ApplyContext,
    address: str,
    only: Sequence[JobSlot] | None = None,
) -> list[Submitted]:
    """Submit `spec`'s jobs (`only` those slots when given) to the cluster of Slurm fleet
    `fleet`: a task's nodes as one Slurm job, each replica of a service as its own; what was
    submitted, per slot."""
    entry = machines.recorded(fleet, state)
    assert entry is not None
    record = SlurmFleetRecord.of(entry)
    engine = machines.engine(fleet, state)
    assert isinstance(engine, SlurmEngine)
    plan = plan_run(spec, record, comment=f"{context.deployment}/{context.run_name}")
    machine = cluster_machine(fleet, SLURM, record.cluster.name, record.cluster.hostname)
    wanted = list(only) if only is not None else slots(spec)
    jobs = [build_job(spec, slot, context, secrets, ctx.run_args) for slot in wanted]
    ctx.progress(address, placement_note(plan, record))
    groups = [jobs] if isinstance(spec, TaskSpec) else [[job] for job in jobs]
    infos: list[JobInfo] = []
    for group in groups:
        infos += await engine.submit(plan.request, group, plan.container)
    return [Submitted(info, slot, machine) for info, slot in zip(infos, wanted, strict=True)]
