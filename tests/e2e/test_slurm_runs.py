"""A Slurm fleet end to end, through the CLI, on a real cluster (tests/infra/slurm_cluster.py):
plan shows the partition and what is asked of Slurm, apply submits through the login node,
`ps` and `logs` read the jobs, destroy leaves nothing in squeue."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx

from dstack_plan.clock import FakeClock
from dstack_plan.project import Project
from dstack_plan.watch.loop import Watcher
from tests.e2e.conftest import Dstack
from tests.e2e.test_local_flow import state, wait_for_status
from tests.e2e.test_service_proxy import until, watching  # noqa: F401 - fixture
from tests.e2e.test_watch_retry import _tick_and_close
from tests.infra.slurm_cluster import SlurmTestCluster

PRINT_WIRING = (
    'echo "rank=$DSTACK_NODE_RANK of=$DSTACK_NODES_NUM master=$DSTACK_MASTER_NODE_IP'
    ' ips=$(echo $DSTACK_NODES_IPS | tr " " ,) gpus=$DSTACK_GPUS_PER_NODE host=$(hostname)"'
)


def backends(cluster: SlurmTestCluster, work: Path) -> str:
    return (
        "backends:\n"
        "  - type: slurm\n"
        "    clusters:\n"
        "      - name: hpc\n"
        f"        hostname: {cluster.login_address}\n"
        "        user: root\n"
        f"        identity_file: {cluster.client_key}\n"
        "        gpu_partitions:\n"
        "          - gpu: A100\n"
        "            partitions: [gpu]\n"
        "        cpu_partitions: [cpu]\n"
        f"        work_dir: {work}\n"
    )


FLEET = "type: fleet\nname: cluster\nbackends: [slurm]\n"
SMALL = "{cpu: 1.., memory: 0.2GB..}"


def task(name: str, nodes: int, commands: list[str], resources: str) -> str:
    return (
        f"type: task\nname: {name}\nnodes: {nodes}\nfleets: [cluster]\n"
        f"commands: {json.dumps(commands)}\nstop_duration: 2s\nresources: {resources}\n"
    )


def slurm_project(tmp_path: Path, cluster: SlurmTestCluster) -> Path:
    """A project whose backend is the test cluster, with a Slurm fleet `cluster`."""
    project = tmp_path / "project"
    (project / ".dstack").mkdir(parents=True)
    (project / ".dstack" / "backends.yml").write_text(backends(cluster, tmp_path / "work"))
    (project / "fleet.dstack.yml").write_text(FLEET)
    return project


def squeued(cluster: SlurmTestCluster) -> str:
    return cluster.run("squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%j").stdout


def test_a_two_node_task_and_a_gpu_task_on_a_slurm_fleet(
    dstack: Dstack, tmp_path: Path, slurm_cluster: SlurmTestCluster
) -> None:
    project = slurm_project(tmp_path, slurm_cluster)
    small = SMALL
    (project / "ranks.dstack.yml").write_text(task("ranks", 2, [PRINT_WIRING], small))

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    row = wait_for_status(dstack, "task.ranks", {"done", "failed"}, timeout=120)
    assert row["status"] == "done", row
    resources = state(project)["resources"]
    fleet = resources["fleet.cluster"]
    assert fleet["provider"] == "slurm" and fleet["status"] == "active"
    assert [p["name"] for p in fleet["attributes"]["partitions"]] == ["gpu", "cpu"]
    assert [(j["node"], j["host"]) for j in resources["task.ranks"]["attributes"]["jobs"]] == [
        (0, "hpc"),
        (1, "hpc"),
    ]
    subnet = slurm_cluster.login_address.rsplit(".", 1)[0]
    ips = f"{subnet}.11,{subnet}.12"
    for node, host in enumerate(("cpu1", "cpu2")):
        logs = dstack("logs", "ranks", "--job", str(node))
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == (
            f"rank={node} of=2 master={subnet}.11 ips={ips} gpus=0 host={host}\n"
        )

    # `dstack offer` lists the partitions: what one node has, how many nodes are idle
    offered = dstack("offer", "--gpu", "A100:2", "--cpu", "1..", "--memory", "0.2GB..", "--json")
    assert offered.returncode == 0, offered.stderr
    view = json.loads(offered.stdout)
    slurm = [r for r in view["offers"] if r["provider"] == "slurm"]
    assert [(r["fleet"], r["host"], r["availability"]) for r in slurm] == [
        ("cluster", "hpc/gpu (2 of 2 nodes idle)", "idle")
    ]
    assert [g["name"] for g in slurm[0]["gpus"]] == ["A100", "A100"]
    assert {
        "fleet": "cluster",
        "host": "hpc/cpu",
        "reason": "a CPU partition: its nodes have no GPUs",
    } in (view["unmatched"])
    only = dstack("offer", "--backend", "slurm", "--cpu", "1..", "--memory", "0.2GB..", "--json")
    rows = json.loads(only.stdout)["offers"]
    # the cpu partition alone: a run without GPUs never takes a GPU partition's nodes
    assert [(r["provider"], r["host"]) for r in rows] == [("slurm", "hpc/cpu (2 of 2 nodes idle)")]

    # with the fleet in state, the plan says where a run goes and what Slurm is asked
    gpu_task = task("gpus", 1, ["sleep 300"], "{cpu: 1.., memory: 0.2GB.., gpu: A100:2}")
    (project / "gpus.dstack.yml").write_text(gpu_task)
    planned = dstack("plan")
    assert planned.returncode == 0, planned.stderr
    assert "partition gpu: sbatch --partition=gpu --nodes=1" in planned.stdout
    assert "--gres=gpu:2" in planned.stdout
    (project / "big.dstack.yml").write_text(task("big", 3, ["true"], small))
    refused = dstack("plan")
    assert refused.returncode == 1
    assert "task.big cannot run on fleet cluster" in refused.stderr
    assert "cpu: has 2 usable node(s), the run needs 3" in refused.stderr
    (project / "big.dstack.yml").unlink()

    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.gpus", {"running"}, timeout=120)
    assert "gpus-0-0-" in squeued(slurm_cluster)
    # both GPU nodes for a run while one is taken: Slurm would queue it, and says until when
    wide = task("wide", 2, ["true"], "{cpu: 1.., memory: 0.2GB.., gpu: A100:2}")
    (project / "wide.dstack.yml").write_text(wide)
    queued = dstack("plan")
    assert queued.returncode == 0, queued.stderr
    assert "partition gpu: sbatch --partition=gpu --nodes=2" in queued.stdout
    assert "Slurm queues it (sbatch: Job" in queued.stdout
    (project / "wide.dstack.yml").unlink()

    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert squeued(slurm_cluster).strip() == ""
    assert list((tmp_path / "work").iterdir()) == []


def test_watch_retries_a_failed_slurm_run_and_keeps_the_first_attempts_log(
    dstack: Dstack, tmp_path: Path, agent_dir: Path, slurm_cluster: SlurmTestCluster
) -> None:
    project = slurm_project(tmp_path, slurm_cluster)
    marker = tmp_path / "work" / "failed-once"  # on the filesystem the nodes share
    command = f"test -f {marker} || {{ touch {marker}; echo first try; exit 3; }}; echo second try"
    (project / "flaky.dstack.yml").write_text(
        f"type: task\nname: flaky\nfleets: [cluster]\ncommands: [{json.dumps(command)}]\n"
        f"retry: {{on_events: [error], duration: 1h}}\nresources: {SMALL}\n"
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.flaky", {"failed"}, timeout=120)
    first = state(project)["resources"]["task.flaky"]["attributes"]["jobs"][0]

    ticked = dstack("watch", "--once")  # pending: submitted again 15 s later, on watch's clock
    assert ticked.returncode == 0, ticked.stdout + ticked.stderr
    later = FakeClock(time.time() + 16)
    asyncio.run(_tick_and_close(Watcher(Project(project, agent_dir=agent_dir, clock=later))))
    second = state(project)["resources"]["task.flaky"]["attributes"]["jobs"][0]["id"]
    assert second != first["id"]
    wait_for_status(dstack, "task.flaky", {"done"}, timeout=120)

    assert dstack("logs", "flaky", "--attempt", "1").stdout == "first try\n"
    assert dstack("logs", "flaky").stdout == "second try\n"
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["failed-once"]


def test_a_login_node_that_does_not_answer_leaves_the_runs_as_they_were(
    dstack: Dstack, tmp_path: Path, slurm_cluster: SlurmTestCluster
) -> None:
    project = slurm_project(tmp_path, slurm_cluster)
    (project / "long.dstack.yml").write_text(task("long", 1, ["sleep 600"], SMALL))
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "task.long", {"running"}, timeout=120)

    slurm_cluster.stop_login()
    try:
        # nothing is concluded from a cluster that cannot be asked: no change, exit 0
        planned = dstack("plan", "--detailed-exitcode")
        assert planned.returncode == 0, planned.stdout + planned.stderr
        (row,) = json.loads(dstack("ps", "--json").stdout)
        recorded = state(project)["resources"]["task.long"]["status"]
        assert (row["address"], row["status"]) == ("task.long", recorded)  # as last recorded
        assert "cannot reach the cluster" in row["error"]
        assert "long-0-0-" in squeued(slurm_cluster)  # and Slurm ran it on meanwhile
    finally:
        slurm_cluster.start_login()
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert squeued(slurm_cluster).strip() == ""


def test_a_service_on_slurm_is_served_by_watchs_proxy_through_the_login_node(
    dstack: Dstack,
    tmp_path: Path,
    slurm_cluster: SlurmTestCluster,
    watching: Any,  # noqa: F811
) -> None:
    project = slurm_project(tmp_path, slurm_cluster)
    (project / "web.dstack.yml").write_text(
        "type: service\nname: web\nfleets: [cluster]\nport: 8000\nreplicas: 2\n"
        "stop_duration: 1s\nauth: false\nresources: {cpu: 2, memory: 0.2GB..}\n"
        "commands:\n  - mkdir -p www && echo served-by-$(hostname) > www/index.html\n"
        "  - exec python3 -m http.server 8000 --directory www\n"
    )
    applied = dstack("apply", "-y")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_for_status(dstack, "service.web", {"running"}, timeout=120)
    # two replicas, each a Slurm job of its own (2 CPUs each: one per node)
    assert sorted(squeued(slurm_cluster).split()) == sorted(
        f"dstack-plan.{j['id']}"
        for j in state(project)["resources"]["service.web"]["attributes"]["jobs"]
    )
    url = f"{watching()}/proxy/services/web/"

    def answers() -> set[str]:
        return {httpx.get(url, timeout=10).text.strip() for _ in range(8)}

    assert until(lambda: answers() == {"served-by-cpu1", "served-by-cpu2"}, timeout=90)
    watching.stop()
    destroyed = dstack("destroy", "-y")
    assert destroyed.returncode == 0, destroyed.stdout + destroyed.stderr
    assert squeued(slurm_cluster).strip() == ""
