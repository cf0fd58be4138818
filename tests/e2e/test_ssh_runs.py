"""Runs on SSH fleets: placement over the hosts' facts, multi-node wiring, gang failure.

The hosts are network namespaces with their own addresses (tests/infra/ssh_hosts.py); a job
without an image runs as a process of the host's agent, so it sees the host's network and
hostname, as a job on a real server does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_ssh_fleet import agents_running, remote  # noqa: F401 - fixture
from tests.infra.ssh_hosts import SSHTestHosts

pytestmark = pytest.mark.ssh

PRINT_WIRING = (
    'echo "rank=$DSTACK_NODE_RANK of=$DSTACK_NODES_NUM master=$DSTACK_MASTER_NODE_IP'
    " ips=$(echo $DSTACK_NODES_IPS | tr ' ' ,) gpus=$DSTACK_GPUS_NUM host=$(hostname)\""
)


def fleet(hosts: SSHTestHosts, *names: str) -> str:
    listed = "\n".join(f"    - {hosts[n].address}" for n in names)
    return (
        "type: fleet\nname: onprem\nplacement: cluster\nssh_config:\n  user: root\n"
        f"  identity_file: {hosts.client_key}\n  hosts:\n{listed}\n"
    )


def task(name: str, nodes: int, commands: list[str], extra: str = "") -> str:
    return (
        f"type: task\nname: {name}\nnodes: {nodes}\nfleets: [onprem]\n"
        f"commands: {json.dumps(commands)}\nstop_duration: 1s\n{extra}"
    )


def test_a_three_node_task_gets_its_ranks_and_the_hosts_addresses(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    names = ("h1", "h2", "h3")
    addresses = [ssh_hosts[n].address for n in names]
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, *names))
    (project / "ranks.dstack.yml").write_text(task("ranks", 3, [PRINT_WIRING]))

    # the fleet is created by the same apply: the plan cannot know its machines yet
    planned = dstack("plan")
    assert planned.returncode == 0, planned.stderr
    assert "machines known after apply" in planned.stdout

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.ranks", {"done"}, timeout=60)
    jobs = state(project)["resources"]["task.ranks"]["attributes"]["jobs"]
    assert [(j["node"], j["host"]) for j in jobs] == list(enumerate(addresses))
    ips = ",".join(addresses)
    for node, name in enumerate(names):
        logs = dstack("logs", "ranks", "--job", str(node))
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == (
            f"rank={node} of=3 master={addresses[0]} ips={ips} gpus=0 host={name}\n"
        )
    assert agents_running(remote) == set(names)

    # with the fleet in state, the plan places a new run on the hosts' real facts
    (project / "big.dstack.yml").write_text(task("big", 4, ["true"]))
    refused = dstack("plan")
    assert refused.returncode == 1
    assert "task.big cannot run on any fleet: needs 4 machines, eligible fleets have 3" in (
        refused.stderr
    )
    (project / "big.dstack.yml").write_text(task("big", 2, ["true"]))
    placed = dstack("plan", "--json")
    assert placed.returncode == 0, placed.stderr
    big = next(
        c for c in json.loads(placed.stdout)["resource_changes"] if c["address"] == "task.big"
    )
    assert big["placement"]["hosts"] == addresses[:2]

    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert agents_running(remote) == set()


def test_one_failing_node_fails_the_run_and_stops_the_others(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, "h1", "h2", "h3"))
    script = 'if [ "$DSTACK_NODE_RANK" = 1 ]; then sleep 1; exit 3; fi; sleep 300'
    (project / "gang.dstack.yml").write_text(task("gang", 3, [script]))

    attached = dstack("apply", "-y", "--attach")
    assert attached.returncode == 1, attached.stdout + attached.stderr
    assert "task.gang: node 1 failed: the other nodes are stopped" in attached.stdout
    row = wait_for_status(dstack, "task.gang", {"failed"}, timeout=30)
    statuses = {j["node"]: j["status"] for j in row["jobs"]}
    assert statuses[1] == "failed"
    assert statuses[0] != "running" and statuses[2] != "running"
    assert dstack("destroy", "-y").returncode == 0


def test_files_reach_the_job_and_a_changed_file_changes_the_plan(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, "h1"))
    (project / "src").mkdir()
    (project / "src" / "train.py").write_text("print('v1')\n")
    (project / "src" / "cache.bin").write_text("never sent\n")
    (project / "src" / ".dstackignore").write_text("*.bin\n")
    files = 'files: ["src:code"]\n'
    (project / "code.dstack.yml").write_text(
        task("code", 1, ["cat code/train.py", "ls code"], extra=files)
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.code", {"done"}, timeout=60)
    logs = dstack("logs", "code")
    assert logs.stdout == "print('v1')\ntrain.py\n"

    unchanged = dstack("plan", "--detailed-exitcode")
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    (project / "src" / "train.py").write_text("print('v2')\n")
    changed = dstack("plan", "--detailed-exitcode")
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert "code.sha256" in changed.stdout
    again = dstack("apply", "-y")
    assert again.returncode == 0, again.stdout + again.stderr
    wait_for_status(dstack, "task.code", {"done"}, timeout=60)
    assert dstack("logs", "code").stdout == "print('v2')\ntrain.py\n"
    assert dstack("destroy", "-y").returncode == 0


def test_removing_a_host_that_runs_jobs_needs_force_and_drains_it(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
) -> None:
    project = tmp_path / "project"
    h1 = ssh_hosts["h1"].address
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, "h1", "h2"))
    (project / "sleeper.dstack.yml").write_text(task("sleeper", 1, ["sleep 300"]))
    assert dstack("apply", "-y").returncode == 0
    row = wait_for_status(dstack, "task.sleeper", {"running"}, timeout=30)
    assert row["hosts"] == [h1]

    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, "h2"))
    # the plan says beforehand what apply will refuse (from state: no host is asked)
    planned = dstack("plan")
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert (
        f"Warning: fleet.onprem: hosts leaving the fleet still run jobs ({h1}: task.sleeper): "
        "apply refuses to remove them"
    ) in planned.stdout, planned.stdout
    refused = dstack("apply", "-y")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"removed hosts still run jobs ({h1}: sleeper)" in refused.stdout + refused.stderr
    assert "apply with --force to drain the hosts" in refused.stdout + refused.stderr
    assert wait_for_status(dstack, "task.sleeper", {"running"})["hosts"] == [h1]
    assert "h1" in agents_running(remote)  # nothing was touched

    drained = dstack("apply", "-y", "--force")
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert agents_running(remote) == {"h2"}
    # ps still lists the fleet's runs: only the run whose host left says why it is not
    # refreshed; a run on the host that stays is asked as before
    (project / "other.dstack.yml").write_text(task("other", 1, ["sleep 300"]))
    assert dstack("apply", "-y", "-f", "other.dstack.yml").returncode == 0
    rows = {r["address"]: r for r in json.loads(dstack("ps", "--json").stdout)}
    assert rows["task.other"]["hosts"] == [ssh_hosts["h2"].address]
    assert (rows["task.other"]["status"], rows["task.other"]["error"]) == ("running", None)
    assert f"fleet 'onprem' has no host '{h1}' (removed from it" in rows["task.sleeper"]["error"]
    # the run's jobs went with the host: the next plan starts it again on the fleet as it is
    replan = dstack("plan", "--detailed-exitcode")
    assert replan.returncode == 2, replan.stdout + replan.stderr
    assert "task.sleeper" in replan.stdout
    assert dstack("destroy", "-y").returncode == 0


@pytest.mark.parametrize("image", [True, False])
def test_the_fleets_preflight_checks_docker_only_when_its_runs_use_images(
    dstack: Dstack,
    tmp_path: Path,
    ssh_hosts: SSHTestHosts,
    remote: Path,  # noqa: F811
    image: bool,
) -> None:
    project = tmp_path / "project"
    (project / "fleet.dstack.yml").write_text(fleet(ssh_hosts, "bare"))
    extra = "image: busybox\n" if image else ""
    (project / "t.dstack.yml").write_text(task("probe", 1, ["true"], extra=extra))
    failed = dstack("apply", "-y")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    output = failed.stdout + failed.stderr
    bare = ssh_hosts["bare"].address
    assert f"{bare}: pre-flight failed: python3 is not on the PATH" in output
    assert ("Docker is not installed and this fleet's runs need containers" in output) == image
    assert "Traceback" not in output
