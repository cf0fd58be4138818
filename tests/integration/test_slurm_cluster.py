"""The Slurm test cluster itself (tests/infra/slurm_cluster.py): what product tests rely on."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _jobs_dir(cluster, name: str) -> Path:
    """Where a test's jobs write their output: the cluster's directory is on the filesystem
    every host shares, as a cluster's shared home is."""
    directory = cluster.directory / "jobs" / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _ssh_login(cluster, tmp_path: Path, command: str) -> subprocess.CompletedProcess[str]:
    """`command` on the login node over real SSH, checking its host key against
    `login_host_key()` (StrictHostKeyChecking=yes)."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"{cluster.login_address} ssh-ed25519 {cluster.login_host_key()}\n")
    return subprocess.run(
        [
            "ssh", "-F", "/dev/null", "-i", str(cluster.client_key),
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "ConnectTimeout=30",
            f"root@{cluster.login_address}", command,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


def test_sinfo_lists_four_idle_nodes_in_two_partitions(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %P %t %G").stdout
    assert sorted(out.splitlines()) == [
        "cpu1 cpu* idle (null)",
        "cpu2 cpu* idle (null)",
        "gpu1 gpu idle gpu:2",
        "gpu2 gpu idle gpu:2",
    ]
    assert slurm_cluster.run("hostname", host="cpu2").stdout.strip() == "cpu2"


def test_two_node_job_over_ssh_runs_a_step_on_each_node(slurm_cluster, tmp_path):
    jobs = _jobs_dir(slurm_cluster, "two-node")
    login = _ssh_login(
        slurm_cluster,
        tmp_path,
        f"hostname && echo SLURM_CONF=$SLURM_CONF && sbatch --wait --nodes=2 -p cpu "
        f"-o {jobs}/out-%j.txt --wrap 'srun hostname'",
    )
    assert login.returncode == 0, login.stderr
    lines = login.stdout.splitlines()
    assert lines[0] == "login"
    assert lines[1] == f"SLURM_CONF={slurm_cluster.conf}"
    assert lines[2].startswith("Submitted batch job ")
    job_id = lines[2].split()[-1]
    output = (jobs / f"out-{job_id}.txt").read_text()
    assert sorted(output.split()) == ["cpu1", "cpu2"]
    shown = slurm_cluster.scontrol("show", "job", job_id).stdout
    assert "JobState=COMPLETED" in shown
    assert "NodeList=cpu[1-2]" in shown


def test_gpu_job_gets_the_nodes_counted_gpus(slurm_cluster):
    jobs = _jobs_dir(slurm_cluster, "gpu")
    sbatch = slurm_cluster.run(
        "sbatch", "--parsable", "--wait", "-p", "gpu", "--gres=gpu:2",
        "-o", f"{jobs}/out-%j.txt", "--wrap", "env; srun env | sed 's/^/step: /'",
    )  # fmt: skip
    job_id = sbatch.stdout.strip()
    env = (jobs / f"out-{job_id}.txt").read_text().splitlines()
    batch = dict(line.split("=", 1) for line in env if "=" in line and not line.startswith("step"))
    assert batch["SLURM_JOB_PARTITION"] == "gpu"
    assert batch["SLURMD_NODENAME"] in ("gpu1", "gpu2")
    assert batch["SLURM_GPUS_ON_NODE"] == "2"
    assert batch["SLURM_JOB_GPUS"] == "0,1"
    assert batch["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "step: CUDA_VISIBLE_DEVICES=0,1" in env
    assert "step: SLURM_STEP_GPUS=0,1" in env
    # more GPUs than any node has: refused at submission
    too_many = slurm_cluster.run(
        "sbatch", "-p", "gpu", "--gres=gpu:3", "--wrap", "true", check=False
    )
    assert too_many.returncode != 0
    assert "Requested node configuration is not available" in too_many.stderr


def test_node_set_down_stays_down_until_resumed(slurm_cluster):
    try:
        slurm_cluster.set_node_state("cpu2", "down", "test")
        shown = slurm_cluster.scontrol("show", "node", "cpu2").stdout
        assert "State=DOWN" in shown
        assert "Reason=test " in shown
        assert slurm_cluster.node_states()["cpu2"] == "down"
    finally:
        slurm_cluster.resume("cpu2")
    slurm_cluster.wait_nodes_idle()
    assert slurm_cluster.node_states()["cpu2"] == "idle"
    assert "Reason=" not in slurm_cluster.scontrol("show", "node", "cpu2").stdout


def test_restarted_node_runs_jobs(slurm_cluster):
    slurm_cluster.restart_node("gpu2")
    step = slurm_cluster.run("srun", "-p", "gpu", "-w", "gpu2", "hostname")
    assert step.stdout.strip() == "gpu2"
