"""Placement's running tally of what holds each host (`scheduler/ledger.py`, issue 36).

- A ledger answers as the list of its jobs does (`occupancy.gpu_free`, the first job binding a
  port, the mix of GPU demands), whatever jobs were added, removed and added back.
- Placing many runs on a fleet decides as placing them one by one on the hosts' listed jobs
  did (the rule before the ledger, kept here as the reference), and reads each host's jobs
  once, not once per run: placing N runs among N jobs was N² steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dstack_plan.config.runs import RunSpec, ServiceSpec, TaskSpec
from dstack_plan.fleets.host_load import BusyJob
from dstack_plan.plan.model import Placement
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.runs.jobs import job_demands
from dstack_plan.runs.placing import FleetPlacements, HostRun, place_on_fleet
from dstack_plan.scheduler.ledger import HostLedger
from dstack_plan.scheduler.occupancy import gpu_free
from dstack_plan.scheduler.packing import Shape
from dstack_plan.scheduler.placement import Candidate, HostJob, held_by, place

SMALL = {"cpu": 1, "memory": "0.1GB..", "disk": "1GB.."}
A100 = GPU(vendor="nvidia", name="NVIDIA Fake A100", memory_mib=81920)
ME = "abc123"

held_jobs = st.builds(
    HostJob,
    owner=st.sampled_from(["task.a", "task.b", "service.c (another project)"]),
    gpus=st.integers(0, 2),
    ports=st.lists(st.sampled_from([80, 8000, 9000]), max_size=2, unique=True).map(tuple),
    gpu_share=st.sampled_from([1000, 1000, 500, 250]),
    gpu_indices=st.lists(st.integers(0, 3), max_size=2, unique=True).map(tuple),
).map(lambda j: j._replace(gpu_indices=j.gpu_indices[: j.gpus]))


@settings(max_examples=200, deadline=None)
@given(
    jobs=st.lists(held_jobs, max_size=12),
    steps=st.lists(st.tuples(st.integers(0, 11), st.booleans()), max_size=20),
    count=st.integers(0, 4),
)
def test_a_ledger_answers_as_the_list_of_its_jobs(
    jobs: list[HostJob], steps: list[tuple[int, bool]], count: int
) -> None:
    ledger = HostLedger()
    held: dict[int, HostJob] = {}
    for job in jobs:
        held[ledger.add(job)] = job
    out: dict[int, HostJob] = {}
    for index, back in steps:  # take jobs out, put some back with their keys, add new ones
        if back and out:
            key = sorted(out)[index % len(out)]
            held[key] = out.pop(key)
            ledger.add(held[key], key)
        elif held:
            key = sorted(held)[index % len(held)]
            ledger.remove(key, held[key])
            out[key] = held.pop(key)
        if not back and jobs:
            added = jobs[index % len(jobs)]._replace(owner="task.new", gpu_indices=())
            held[ledger.add(added)] = added
    in_order = [held[k] for k in sorted(held)]
    assert ledger.gpu_free(count) == gpu_free(count, in_order)
    for port in (80, 8000, 9000, 1):
        first = next((j.owner for j in in_order if port in j.ports), None)
        assert ledger.port_owner(port) == first
    assert dict(ledger.shapes()) == dict(
        Counter(Shape(gpus=j.gpus, gpu_milli=j.gpu_share) for j in in_order)
    )
    assert ledger.gpu_holders() == [j for j in in_order if j.gpus]


@lru_cache
def spec(kind: str, name: str, gpus: int, port: int | None, replicas: int) -> RunSpec:
    resources = {**SMALL, "gpu": gpus} if gpus else SMALL
    if kind == "service":
        data = {"type": "service", "name": name, "port": port or 8000, "replicas": replicas}
        return ServiceSpec.model_validate({**data, "commands": ["x"], "resources": resources})
    ports = {"ports": [port]} if port else {}
    data = {"type": "task", "name": name, "nodes": replicas, **ports}
    return TaskSpec.model_validate({**data, "commands": ["x"], "resources": resources})


@lru_cache
def machine(gpus: int) -> MachineResources:
    return MachineResources(cpus=4, memory_gb=16, disk_gb=100, gpus=(A100,) * gpus)


NAMES = ["r0", "r1", "r2", "r3"]
busy_jobs = st.builds(
    BusyJob,
    deployment=st.sampled_from([ME, ME, "other", None]),
    run_name=st.sampled_from(NAMES),
    held=held_jobs,
)
runs = st.lists(
    st.builds(
        lambda kind, name, gpus, port, replicas, starts, priority: HostRun(
            f"{kind}.{name}",
            name,
            spec(kind, name, gpus, port, replicas).model_copy(update={"priority": priority}),
            starts,
        ),
        kind=st.sampled_from(["task", "service"]),
        name=st.sampled_from(NAMES),
        gpus=st.integers(0, 2),
        port=st.sampled_from([None, 8000, 9000]),
        replicas=st.integers(1, 2),
        starts=st.booleans(),
        priority=st.integers(0, 2),
    ),
    max_size=8,
    unique_by=lambda r: r.address,
)


def reference(
    runs: Sequence[HostRun],
    hosts: Sequence[Candidate],
    busy: Mapping[str, Sequence[BusyJob]],
    deployment: str | None,
) -> FleetPlacements:
    """Placement as it was made before the ledger: every run sees every listed job of every
    host but its own and those of the runs started before it, and the jobs placed so far."""
    from dstack_plan.runs.placing import _placement, _process_port_clash

    placements: dict[str, Placement] = {}
    never: dict[str, str] = {}
    planned: dict[str, list[HostJob]] = {h.host: [] for h in hosts}
    started: set[str] = set()
    order = sorted(runs, key=lambda r: (r.starts, -r.spec.priority if r.starts else 0))
    for run in order:
        mine = {run.name} | started
        candidates = [
            host._replace(
                busy=(
                    *(
                        b.held
                        for b in busy.get(host.host, ())
                        if not (b.deployment == deployment and b.run_name in mine)
                    ),
                    *planned[host.host],
                )
            )
            for host in hosts
        ]
        demands = job_demands(run.spec, run.replicas)
        distinct = isinstance(run.spec, TaskSpec) and run.spec.node_count() > 1
        decision = place(demands, candidates, distinct)
        placements[run.address] = _placement(hosts, decision)
        if not run.starts:
            continue
        if decision.never:
            hint = "; " if _process_port_clash(run, decision) else ""
            never[run.address] = f"{run.address} cannot run on any fleet: {decision.reason}{hint}"
        elif decision.placed:
            started.add(run.name)
            for demand, chosen in zip(demands, decision.hosts, strict=True):
                planned[chosen.host].append(held_by(demand, run.address, chosen.resources.gpus))
    return FleetPlacements(placements, never)


@settings(max_examples=150, deadline=None)
@given(
    gpus=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    listed=st.lists(st.tuples(st.integers(0, 2), busy_jobs), max_size=10),
    planned=runs,
    deployment=st.sampled_from([ME, None]),
)
def test_placing_many_runs_decides_as_placing_them_on_the_listed_jobs(
    gpus: list[int],
    listed: list[tuple[int, BusyJob]],
    planned: list[HostRun],
    deployment: str | None,
) -> None:
    hosts = [Candidate("f", "ssh", f"h{i}", machine(n)) for i, n in enumerate(gpus)]
    busy: dict[str, list[BusyJob]] = {h.host: [] for h in hosts}
    for index, job in listed:
        host = hosts[index % len(hosts)]
        indices = tuple(i for i in job.held.gpu_indices if i < len(host.resources.gpus))
        busy[host.host].append(job._replace(held=job.held._replace(gpu_indices=indices)))
    found = place_on_fleet(planned, hosts, busy, deployment)
    expected = reference(planned, hosts, busy, deployment)
    assert found.placements == expected.placements
    hintless = {a: n.split("; a job without an image")[0] for a, n in found.never.items()}
    assert hintless == {a: n.removesuffix("; ") for a, n in expected.never.items()}


class Listed(Sequence[BusyJob]):
    """A host's listed jobs, counting how often they are read through."""

    def __init__(self, jobs: list[BusyJob]) -> None:
        self.jobs = jobs
        self.reads = 0

    def __iter__(self) -> Iterator[BusyJob]:
        self.reads += 1
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, index: Any) -> Any:
        return self.jobs[index]


def test_placing_n_runs_reads_each_host_s_jobs_once() -> None:
    n = 300
    hosts = [Candidate("f", "ssh", f"h{i}", machine(2)) for i in range(3)]
    job = HostJob("task.x", 0, (), 1000, ())
    busy = {
        h.host: Listed([BusyJob(ME, f"r{i}", job._replace(owner=f"task.r{i}")) for i in range(n)])
        for h in hosts
    }
    planned = [
        HostRun(f"task.r{i}", f"r{i}", spec("task", f"r{i}", 0, None, 1), i % 2 == 0)
        for i in range(n)
    ]
    planned += [
        HostRun(f"task.n{i}", f"n{i}", spec("task", f"n{i}", 0, None, 1), True) for i in range(n)
    ]
    placed = place_on_fleet(planned, hosts, busy, ME)
    assert all(p.placed for p in placed.placements.values())
    assert [listed.reads for listed in busy.values()] == [1, 1, 1]
