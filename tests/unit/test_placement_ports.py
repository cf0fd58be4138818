"""Placement knows ports and busy capacity: replicas never clash on a host, a run no machine
could take is refused with the reason per machine, and one that must wait says for what."""

from __future__ import annotations

from typing import Any

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.config.resources import ResourcesSpec
from dstack_plan.config.runs import RunSpec, ServiceSpec, TaskSpec
from dstack_plan.config.secrets import SecretStore
from dstack_plan.fleets.host_load import busy_jobs
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.runs.jobs import JobContext, JobSlot, build_job, job_demands
from dstack_plan.runs.placing import HostRun, place_on_fleet
from dstack_plan.scheduler.placement import Candidate, HostJob, JobDemand, place

SMALL = {"cpu": 1, "memory": "0.1GB..", "disk": "1GB.."}
MACHINE = MachineResources(cpus=2, memory_gb=4, disk_gb=200)
A100 = GPU(vendor="nvidia", name="NVIDIA Fake A100", memory_mib=81920)
GPU_MACHINE = MachineResources(cpus=2, memory_gb=4, disk_gb=200, gpus=(A100, A100))
HOST = Candidate("local", "local", "vm", MACHINE)
GPU_HOST = Candidate("local", "local", "vm", GPU_MACHINE)
DEPLOYMENT = "abc123"


def resources(**extra: Any) -> ResourcesSpec:
    return ResourcesSpec.model_validate({**SMALL, **extra})


def service(name: str = "web", **fields: Any) -> ServiceSpec:
    data = {"type": "service", "name": name, "port": 8799, "commands": ["serve"]}
    return ServiceSpec.model_validate({**data, "resources": SMALL, **fields})


def task(name: str = "train", **fields: Any) -> TaskSpec:
    data = {"type": "task", "name": name, "commands": ["train"]}
    return TaskSpec.model_validate({**data, "resources": SMALL, **fields})


def run(spec: RunSpec, starts: bool = True) -> HostRun:
    assert spec.name is not None
    return HostRun(f"{spec.type}.{spec.name}", spec.name, spec, starts)  # type: ignore[attr-defined]


def test_process_replicas_on_one_port_can_never_share_a_host() -> None:
    demands = [JobDemand(f"replica {r}", resources(), (8799,)) for r in (0, 1)]
    decision = place(demands, [HOST], distinct=False)
    assert decision.never
    assert decision.reason == "local (vm): replica 1: port 8799 is already used on vm by replica 0"


def test_replicas_without_host_ports_share_a_host() -> None:
    decision = place([JobDemand(f"replica {r}", resources()) for r in (0, 1)], [HOST], False)
    assert [c.host for c in decision.hosts] == ["vm", "vm"]


def test_gpus_no_machine_has_are_a_reason_per_candidate() -> None:
    demand = [JobDemand("job", resources(gpu="H100:80GB:8"))]
    assert place(demand, [HOST], False).reason == "local (vm): needs 8 GPUs H100 80GB, has none"
    decision = place(demand, [GPU_HOST, HOST._replace(fleet="other", host="b")], False)
    assert decision.never and decision.reason == (
        "local (vm): needs 8 GPUs H100 80GB, has none (it has 2 NVIDIA Fake A100); "
        "other (b): needs 8 GPUs H100 80GB, has none"
    )


def test_busy_gpus_and_ports_make_a_run_pending_naming_the_holder() -> None:
    busy_gpus = GPU_HOST._replace(busy=(HostJob("task.other", gpus=2),))
    decision = place([JobDemand("job", resources(gpu=2))], [busy_gpus], False)
    assert (decision.pending, decision.placed) == (True, False)
    assert decision.reason == "waits for 2 GPUs on local, busy with task.other"

    busy_port = HOST._replace(busy=(HostJob("service.other", ports=(8799,)),))
    decision = place([JobDemand("job", resources(), (8799,))], [busy_port], False)
    assert decision.pending
    assert decision.reason == "waits for port 8799 on local (vm), used by service.other"
    # the same host is fine for a job that binds another port
    assert place([JobDemand("job", resources(), (8800,))], [busy_port], False).placed


def test_a_container_service_gets_a_bridge_and_host_ports_chosen_by_docker() -> None:
    ctx = JobContext("web", "d/web", 1, DEPLOYMENT, 1, "127.0.0.1", ("127.0.0.1",))
    secrets = SecretStore(".")
    container = build_job(service(image="busybox"), JobSlot(1, 0), ctx, secrets, environ={})
    assert container.network_mode == "bridge"
    assert [(p.container_port, p.host_port) for p in container.ports] == [(8799, None)]
    assert container.labels["address"] == "service.web"
    process = build_job(service(), JobSlot(0, 0), ctx, secrets, environ={})
    assert process.network_mode == "host"
    # the nodes of a multi-node task reach each other over the host network
    nodes = task(image="busybox", nodes=2, ports=[8080])
    assert build_job(nodes, JobSlot(0, 1), ctx, secrets, environ={}).network_mode == "host"
    assert [d.ports for d in job_demands(nodes)] == [(8080,), (8080,)]
    assert [d.ports for d in job_demands(service(image="busybox", replicas=2))] == [(), ()]
    assert [d.ports for d in job_demands(service(replicas=2))] == [(8799,), (8799,)]


def test_task_groups_bind_their_own_ports() -> None:
    spec = task(
        commands=[],
        groups=[{"nodes": 1, "commands": ["a"], "ports": [7000]}, {"nodes": 1, "commands": ["b"]}],
    )
    assert [(d.label, d.ports) for d in job_demands(spec)] == [("node 0", (7000,)), ("node 1", ())]


def info(job_id: str, run_name: str, **fields: Any) -> JobInfo:
    spec = fields.pop("spec", {})
    return JobInfo.model_validate(
        {
            "id": job_id,
            "run_name": run_name,
            "runtime": "process",
            "status": "running",
            "submitted_at": 1.0,
            "spec": spec,
            **fields,
        }
    )


def test_busy_jobs_hold_gpus_and_the_host_ports_they_bind() -> None:
    ours = {"labels": {"deployment": DEPLOYMENT, "address": "service.web"}, "ports": [8799]}
    bridged = {
        "image": "busybox",
        "network_mode": "bridge",
        "labels": {"deployment": "zzz", "address": "service.api"},
        "ports": [{"container_port": 80}],
    }
    listed = [
        info("a", "web", spec=ours),
        info("b", "api", runtime="docker", spec=bridged, gpus=[0],
             ports=[{"container_port": 80, "host_port": 32768, "host_ip": "127.0.0.1"}]),
        info("c", "old", status="done", spec=ours),
        info("d", "new", runtime="docker", spec={**bridged, "labels": {}}, status="submitted"),
    ]  # fmt: skip
    held = {(b.deployment, b.run_name): b.held for b in busy_jobs(listed, DEPLOYMENT)}
    assert held == {
        (DEPLOYMENT, "web"): HostJob("service.web", 0, (8799,)),
        ("zzz", "api"): HostJob("service.api (another project)", 1, (32768,), gpu_indices=(0,)),
        (None, "new"): HostJob("new (another project)", 0, ()),
    }


def test_a_run_keeps_its_own_port_and_two_new_runs_do_not_count_on_the_same_one() -> None:
    listed = [info("w0", "web", spec={"labels": {"deployment": DEPLOYMENT}, "ports": [8799]})]
    busy = busy_jobs(listed, DEPLOYMENT)
    placed = place_on_fleet(
        [run(service("web"), starts=False), run(service("api", port=9000)),
         run(service("api2", port=9000))],
        [HOST], {HOST.host: busy}, DEPLOYMENT,
    )  # fmt: skip
    assert placed.never == {}
    assert placed.placements["service.web"].placed  # its own job holds the port: no clash
    assert placed.placements["service.api"].placed
    late = placed.placements["service.api2"]
    assert (late.placed, late.pending) == (False, True)
    assert late.note == "pending: waits for port 9000 on local (vm), used by service.api"


def test_runs_that_never_fit_are_collected_with_a_hint_for_process_ports() -> None:
    placed = place_on_fleet(
        [run(service("web", replicas=2)), run(task(resources={**SMALL, "gpu": "H100:80GB:8"})),
         run(task("kept", resources={**SMALL, "gpu": 4}), starts=False)],
        [HOST], {}, DEPLOYMENT,
    )  # fmt: skip
    never = list(placed.never.values())
    assert never[0].startswith(
        "service.web cannot run on any fleet: local (vm): replica 1: port 8799 is already "
        "used on vm by replica 0; a job without an image binds its port on the host itself"
    )
    assert never[1:] == [
        "task.train cannot run on any fleet: local (vm): needs 8 GPUs H100 80GB, has none"
    ]
    # a run the plan keeps as it is is never refused, only noted
    assert placed.placements["task.kept"].note == (
        "cannot be placed: local (vm): needs 4 GPUs, has none"
    )


@pytest.mark.parametrize("replicas", [1, 3])
def test_container_replicas_always_fit_one_host(replicas: int) -> None:
    spec = service(image="busybox", replicas=replicas)
    placed = place_on_fleet([run(spec)], [HOST], {}, DEPLOYMENT)
    assert placed.placements["service.web"].hosts == ("vm",) * replicas
