"""Cloud fleets through the Python API, where the CLI cannot reach: capacity errors injected
into EC2 (moto server) with a botocore `before-send` hook, a create cut short, a machine that
vanishes by itself, offers that no rule allows. The booted machines are the namespace SSH
hosts, as in tests/e2e/test_cloud_fleet.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from dstack_plan.errors import PlanError
from dstack_plan.fleets.cloud_records import CloudFleetRecord
from dstack_plan.plan.model import Action
from dstack_plan.plan.planner import PlanOptions
from dstack_plan.project import Project
from dstack_plan.providers.aws.provider import AWSProvider
from tests.e2e.test_cloud_fleet import FLEET, cloud, ec2, tagged  # noqa: F401 - fixtures
from tests.e2e.test_ssh_fleet import remote  # noqa: F401 - fixture
from tests.e2e.test_watch_pending import tick
from tests.infra.moto_server import REGION
from tests.infra.ssh_hosts import SSHTestHosts
from tests.integration.test_aws_provider import _fail_types

pytestmark = pytest.mark.ssh

JOB = """\
type: task
name: job
fleets: [burst]
commands: ["sleep 600"]
stop_duration: 1s
retry: {on_events: [interruption], duration: 1h}
"""


@pytest.fixture
def env(cloud: Path, cli_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Path:  # noqa: F811
    """This process's environment as the CLI's (endpoint, credentials, agent dirs)."""
    for key, value in cli_env.items():
        if key.startswith(("AWS_", "DSTACK_PLAN_")) or key == "HOME":
            monkeypatch.setenv(key, value)
    return cloud


async def _plan_and_apply(project: Project, hook: Any = None) -> tuple[Any, Any, list[str]]:
    said: list[str] = []
    project._progress = lambda address, message: said.append(message)
    plan, _ = await project.plan(PlanOptions())
    if hook is not None:
        hook(project.clouds.provider("aws", plan.lineage, creating=True))
    async with project.locked("apply"):
        report = await project.apply(plan)
    return plan, report, said


async def _destroy(project: Project) -> tuple[Any, Any]:
    """Plan and apply the destroy of everything `project`'s state holds, then close it;
    (the plan, its report)."""
    try:
        plan, _ = await project.plan(PlanOptions(destroy=True))
        async with project.locked("apply"):
            report = await project.apply(plan)
        return plan, report
    finally:
        await project.close()


def test_no_capacity_for_the_planned_offer_falls_through_to_the_next(
    env: Path,
    ec2: Any,  # noqa: F811
    ssh_hosts: SSHTestHosts,
) -> None:
    # nodes: 0 first, so the state exists and the plan knows the lineage the tags will carry
    (env / "fleet.dstack.yml").write_text(FLEET.format(nodes=0))

    async def scenario() -> None:
        project = Project(env)
        try:
            _, empty, said = await _plan_and_apply(project)
            assert empty.ok and said == []  # no machine, nothing created
            await project.close()
            (env / "fleet.dstack.yml").write_text(FLEET.format(nodes=1))
            project = Project(env)
            failed: set[str] = set()

            def no_capacity(provider: AWSProvider) -> None:
                failed.add(first.instance_type)
                _fail_types(provider, failed)

            planned, _ = await project.plan(PlanOptions())
            placement = planned.changes[0].placement
            assert placement is not None and placement.offer is not None
            first = placement.offer
            _, report, said = await _plan_and_apply(project, no_capacity)
            assert report.ok, [(r.address, r.message) for r in report.failed]
            assert (
                f"no capacity: {first.instance_type} {REGION} spot: InsufficientInstanceCapacity"
                in said
            )
            entry = project.backend.read().state.resources["fleet.burst"]
            (made,) = CloudFleetRecord.of(entry).instances
            assert (made.instance_type, made.spot) != (first.instance_type, first.spot)
            assert made.hostname == ssh_hosts["h2"].address
        finally:
            await _destroy(project)

    asyncio.run(scenario())
    assert tagged(ec2, env) == {}


def test_a_create_cut_short_leaves_its_machines_for_the_next_apply_or_destroy(
    env: Path,
    ec2: Any,  # noqa: F811
    ssh_hosts: SSHTestHosts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Booting never finishes (nothing answers SSH on the instance's address): the create
    fails with the instance recorded, and destroy terminates what the tags name."""
    (env / "fleet.dstack.yml").write_text(FLEET.format(nodes=1))
    monkeypatch.setenv("DSTACK_PLAN_CLOUD_BOOT_TIMEOUT", "2")
    ssh_hosts.stop("h2")  # the address moto gives the instance
    try:

        async def scenario() -> None:
            project = Project(env)
            try:
                _, report, _ = await _plan_and_apply(project)
            finally:
                await project.close()
            assert not report.ok
            (result,) = report.failed
            assert "not reachable over SSH" in (result.message or "")
            entry = Project(env).backend.read().state.resources["fleet.burst"]
            assert entry.tainted and len(CloudFleetRecord.of(entry).instances) == 1
            assert len(tagged(ec2, env)) == 1

            plan, destroyed = await _destroy(Project(env))
            assert [c.action for c in plan.changes] == [Action.DELETE]
            assert destroyed.ok

        asyncio.run(scenario())
    finally:
        ssh_hosts.start("h2")
    assert tagged(ec2, env) == {}


def test_a_fleet_no_offer_allows_is_refused_by_the_plan_with_the_reasons(env: Path) -> None:
    fleet = FLEET.format(nodes=2).replace("spot_policy: auto", "spot_policy: spot")
    (env / "fleet.dstack.yml").write_text(fleet + "max_price: 0.001\n")
    project = Project(env)
    with pytest.raises(PlanError) as caught:
        asyncio.run(project.plan(PlanOptions()))
    message = str(caught.value)
    assert message.startswith("fleet.burst: cannot create 2 machines on aws: no offer matches:")
    assert "are above max_price $0.001/h" in message


def test_a_machine_gone_by_itself_is_drift_the_next_apply_replaces(
    env: Path,
    ec2: Any,  # noqa: F811
    ssh_hosts: SSHTestHosts,
) -> None:
    """A spot machine taken back (here: terminated behind dstack-plan's back) leaves the
    fleet short: the plan says so and updates it, apply creates a machine again."""
    (env / "fleet.dstack.yml").write_text(FLEET.format(nodes=1))

    async def scenario() -> None:
        project = Project(env)
        try:
            _, report, _ = await _plan_and_apply(project)
            assert report.ok, [(r.address, r.message) for r in report.failed]
            (lost,) = CloudFleetRecord.of(
                project.backend.read().state.resources["fleet.burst"]
            ).instances
            ec2.terminate_instances(InstanceIds=[lost.id])

            plan, refresh = await project.plan(PlanOptions())
            (change,) = plan.changes
            assert change.action is Action.UPDATE
            assert change.reason == f"drift: 0 of 1 machine left ({lost.id} gone)"
            assert refresh.state.resources["fleet.burst"].status == "degraded"
            assert change.placement is not None and change.placement.offer is not None
            assert change.placement.offer.count == 1
            async with project.locked("apply"):
                again = await project.apply(plan)
            assert again.ok, [(r.address, r.message) for r in again.failed]
            (made,) = CloudFleetRecord.of(
                project.backend.read().state.resources["fleet.burst"]
            ).instances
            assert made.id != lost.id
            assert made.hostname in {ssh_hosts["h2"].address, ssh_hosts["h3"].address}
            settled, _ = await project.plan(PlanOptions())
            assert not settled.has_changes
        finally:
            await _destroy(project)

    asyncio.run(scenario())
    assert tagged(ec2, env) == {}


def test_a_spot_machine_taken_back_fails_its_jobs_as_interrupted_for_the_retry_policy(
    env: Path,
    ec2: Any,  # noqa: F811
    ssh_hosts: SSHTestHosts,
    agent_dir: Path,
) -> None:
    (env / "fleet.dstack.yml").write_text(FLEET.format(nodes=1))
    (env / "job.dstack.yml").write_text(JOB)

    async def apply_all() -> None:
        project = Project(env, agent_dir=agent_dir)
        try:
            _, report, _ = await _plan_and_apply(project)
            assert report.ok, [(r.address, r.message) for r in report.failed]
        finally:
            await project.close()

    asyncio.run(apply_all())
    entry = Project(env).backend.read().state.resources
    (machine,) = CloudFleetRecord.of(entry["fleet.burst"]).instances
    assert machine.spot and machine.hostname == ssh_hosts["h2"].address
    # the cloud takes the machine back: it no longer answers, and EC2 no longer lists it
    ec2.terminate_instances(InstanceIds=[machine.id])
    ssh_hosts.stop("h2")
    now = time.time()
    try:
        tick(env, agent_dir, now)
    finally:
        ssh_hosts.start("h2")
    resources = Project(env).backend.read().state.resources
    assert CloudFleetRecord.of(resources["fleet.burst"]).instances == ()
    assert resources["fleet.burst"].attributes["hosts"] == []
    run = resources["task.job"]
    (job,) = run.attributes["jobs"]
    assert (job["status"], job["reason"]) == ("failed", "interrupted_by_no_capacity")
    # failed at once (no 2 minutes' unreachable grace), and the retry policy took it
    retry = run.attributes["retry"]
    assert (retry["last_event"], retry["last_reason"]) == (
        "interruption",
        "interrupted_by_no_capacity",
    )
    assert retry["first_failure_at"] == now and retry["next_attempt_at"] > now
    # the next plan replaces the machine: the fleet is short of its node count
    plan, _ = asyncio.run(Project(env, agent_dir=agent_dir).plan(PlanOptions()))
    fleet = next(c for c in plan.changes if c.address == "fleet.burst")
    assert fleet.action is Action.UPDATE
    assert fleet.reason == "drift: 0 of 1 machine left"
    assert tagged(ec2, env) == {}


def test_a_fleet_whose_backend_was_removed_is_kept_until_its_machines_can_be_terminated(
    env: Path,
    ec2: Any,  # noqa: F811
) -> None:
    (env / "fleet.dstack.yml").write_text(FLEET.format(nodes=1))
    backends = env / ".dstack" / "backends.yml"

    async def scenario() -> None:
        project = Project(env)
        try:
            _, report, _ = await _plan_and_apply(project)
            assert report.ok, [(r.address, r.message) for r in report.failed]
        finally:
            await project.close()
        saved = backends.read_text()
        backends.unlink()
        blind = Project(env)
        try:
            plan, _ = await blind.plan(PlanOptions(destroy=True))  # refresh trusts the state
            async with blind.locked("apply"):
                report = await blind.apply(plan)
        finally:
            await blind.close()
        (failed,) = report.failed
        assert "cannot terminate 1 machine: the backend is no longer configured" in (
            failed.message or ""
        )
        assert "fleet.burst" in Project(env).backend.read().state.resources
        assert len(tagged(ec2, env)) == 1
        backends.write_text(saved)
        assert (await _destroy(Project(env)))[1].ok

    asyncio.run(scenario())
    assert tagged(ec2, env) == {}
