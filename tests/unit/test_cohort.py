"""One exported fleet's tenants as the owner's watch sees them, and what it reclaims: jobs
told apart by their deployment key, waiting runs served oldest first, a run that would only
borrow served nothing; and the importer's door (`share_gate`): borrowing refused while
another project under its guarantee waits."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from dstack_plan.agent.api_models import JobInfo
from dstack_plan.apply.deployment import deployment_key
from dstack_plan.config.quotas import ProjectQuota
from dstack_plan.providers.base import GPU, MachineResources
from dstack_plan.runs.cohort import UNKNOWN, cohort, reclaims
from dstack_plan.runs.queueing import NoCapacity
from dstack_plan.runs.share_gate import check_share
from dstack_plan.sharing.imports import Imports
from dstack_plan.state.exports import Export, Importer
from dstack_plan.state.local import LocalBackend
from dstack_plan.state.model import ResourceState, State

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
ONE_GPU = MachineResources(
    cpus=8,
    memory_gb=64,
    disk_gb=100,
    gpus=(GPU(index=0, name="A100", memory_mib=81920, vendor="nvidia"),),
)


def _job(job: str, state: State, started: float, status: str = "running") -> JobInfo:
    return JobInfo.model_validate(
        {
            "id": job, "run_name": job, "runtime": "process", "status": status,
            "submitted_at": started, "started_at": started, "gpus": [0],
            "spec": {"labels": {"deployment": deployment_key(state.lineage),
                                "address": f"task.{job}"}},
        }
    )  # fmt: skip


def _pending(name: str, fleet: str, gpus: int, at: int) -> ResourceState:
    spec = {"type": "task", "name": name, "commands": ["x"], "resources": {"gpu": gpus}}
    when = datetime.fromtimestamp(T0.timestamp() + at, tz=timezone.utc)
    return ResourceState(
        kind="task", name=name, provider="ssh", spec=spec, status="pending",
        attributes={"fleet": fleet, "jobs": []}, created_at=when, updated_at=when,
    )  # fmt: skip


def test_a_tenant_under_its_guarantee_gets_the_newest_borrowed_job() -> None:
    owner, ml = State.empty(), State.empty()
    owner = owner.with_resource(_pending("train", "gpu", 1, 10))
    hosts = {"h1": ONE_GPU, "h2": ONE_GPU}
    listings = {"h1": [_job("old", ml, 100.0)], "h2": [_job("new", ml, 200.0)]}
    limits = {"platform": ProjectQuota(guarantee="50%"), "ml": ProjectQuota(guarantee=1)}
    tenants = {"platform": (owner, "gpu"), "ml": (ml, "platform/gpu")}
    c = cohort("gpu", hosts, listings, tenants, limits)
    assert c.used() == {"ml": 2.0} and c.capacity == 2
    decided = reclaims(c)
    [(victim, run)] = decided.preempt
    assert (victim.job, victim.tenant, run.address) == ("new", "ml", "task.train")
    assert decided.waiting == {"platform": 1.0}


def test_nothing_is_reclaimed_for_a_run_that_would_borrow_or_from_unknown_jobs() -> None:
    owner, ml, stranger = State.empty(), State.empty(), State.empty()
    owner = owner.with_resource(_pending("big", "gpu", 2, 10))  # its guarantee is 1
    hosts = {"h1": ONE_GPU, "h2": ONE_GPU}
    listings = {"h1": [_job("theirs", stranger, 100.0)], "h2": [_job("mine", ml, 200.0)]}
    limits = {"platform": ProjectQuota(guarantee=1), "ml": ProjectQuota(guarantee=0)}
    c = cohort("gpu", hosts, listings, {"platform": (owner, "gpu"), "ml": (ml, "x/gpu")}, limits)
    assert {h.tenant for h in c.held} == {UNKNOWN, "ml"}
    assert reclaims(c).preempt == ()
    small = owner.with_resource(_pending("small", "gpu", 1, 20))
    c = cohort("gpu", hosts, listings, {"platform": (small, "gpu"), "ml": (ml, "x/gpu")}, limits)
    [(victim, _)] = reclaims(c).preempt
    assert victim.job == "mine"  # never the job of a project outside the cohort


def _two_gpu_fleet() -> ResourceState:
    """The state entry of SSH fleet `gpu`: hosts h1 and h2, one GPU each."""
    return ResourceState.model_validate(
        {"kind": "fleet", "name": "gpu", "provider": "ssh", "status": "active",
         "spec": {"type": "fleet", "name": "gpu", "ssh_config": {"user": "u", "hosts": []}},
         "attributes": {"hosts": [
             {"name": h, "hostname": h, "instance_id": f"ssh:{h}",
              "resources": ONE_GPU.model_dump(mode="json")} for h in ("h1", "h2")]},
         "created_at": T0, "updated_at": T0}
    )  # fmt: skip


def test_an_importer_may_not_borrow_while_another_project_under_its_guarantee_waits(
    tmp_path: Path,
) -> None:
    fleet = _two_gpu_fleet()
    ml_dir = tmp_path / "ml"
    (ml_dir / ".dstack").mkdir(parents=True)
    (ml_dir / ".dstack" / "projects.yml").write_text(
        f"projects:\n  platform:\n    state: {tmp_path}/owner.json\n"
    )
    export = Export(name="e", fleets=("gpu",), importers=(Importer(project="ml", state="/x"),))
    policy = {"projects": {"ml": {"guarantee": 1}, "platform": {"guarantee": 1}}}
    owner = State.empty().with_resource(fleet)
    owner = owner.model_copy(update={"exports": {"e": export}, "policy": policy})
    backend = LocalBackend(tmp_path / "owner.json")
    backend.write(owner, backend.read().version)
    imports = Imports(ml_dir, "ml")
    check_share(imports, "platform/gpu", "task.a", 2, State.empty(), 0.0)  # borrows 1: idle
    waits = {**policy, "waiting": {"gpu": {"platform": 1}}}
    backend.write(owner.model_copy(update={"policy": waits}), backend.read().version)
    imports.forget()
    check_share(imports, "platform/gpu", "task.a", 1, State.empty(), 0.0)  # its guarantee
    with pytest.raises(NoCapacity, match="platform is 1 GPUs under its guarantee and waits"):
        check_share(imports, "platform/gpu", "task.a", 2, State.empty(), 0.0)


def test_the_owner_borrowing_its_own_exported_fleet_waits_for_an_importer_under_guarantee(
    tmp_path: Path,
) -> None:
    """The owner is one of its fleet's projects: beyond its guarantee it borrows, and is held
    back while an importer under its guarantee waits (as its watch published)."""
    fleet = _two_gpu_fleet()
    export = Export(name="e", fleets=("gpu",), importers=(Importer(project="ml", state="/x"),))
    policy = {
        "projects": {"ml": {"guarantee": 1}, "platform": {"guarantee": 1}},
        "waiting": {"gpu": {"ml": 1}},
    }
    owner = State.empty().with_resource(fleet)
    owner = owner.model_copy(update={"exports": {"e": export}, "policy": policy})
    imports = Imports(tmp_path, "platform")
    check_share(imports, "gpu", "task.a", 1, owner, 0.0)  # within its guarantee
    with pytest.raises(NoCapacity, match="ml is 1 GPUs under its guarantee and waits"):
        check_share(imports, "gpu", "task.a", 2, owner, 0.0)
    unshared = owner.model_copy(update={"exports": {}})
    check_share(imports, "gpu", "task.a", 2, unshared, 0.0)  # a fleet nobody shares
