"""What a run asks Slurm for, and what Slurm's answers mean (the pure half of the backend)."""

from __future__ import annotations

import json
import shlex
from datetime import datetime

import pytest

from dstack_plan.agent.api_models import JobStatus, TerminationReason
from dstack_plan.providers.slurm.engine import _estimate
from dstack_plan.providers.slurm.listing import listing_command, parse_listing
from dstack_plan.providers.slurm.script import (
    Container,
    SlurmRequest,
    batch_script,
    container_command,
    enroot_image,
    env_script,
    time_minutes,
)
from dstack_plan.providers.slurm.states import (
    QueuedJob,
    expand_hostlist,
    node_outcome,
    parse_squeue,
)


def test_a_request_becomes_sbatchs_options() -> None:
    request = SlurmRequest(
        partition="gpu",
        job_name="dstack-plan.train-0-0-1-abc",
        nodes=2,
        cpus_per_task=8,
        mem_mb=16384,
        gres="gpu:a100:4",
        time_minutes=90,
        stop_seconds=30,
        account="ml",
        qos="high",
    )
    assert request.options() == [
        "--job-name=dstack-plan.train-0-0-1-abc",
        "--partition=gpu",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--no-requeue",
        "--cpus-per-task=8",
        "--mem=16384M",
        "--gres=gpu:a100:4",
        "--time=90",
        "--signal=B:TERM@30",
        "--account=ml",
        "--qos=high",
    ]


def test_a_request_without_limits_leaves_them_to_the_partition() -> None:
    assert SlurmRequest(partition="cpu").options() == [
        "--partition=cpu",
        "--nodes=1",
        "--ntasks-per-node=1",
        "--no-requeue",
    ]


@pytest.mark.parametrize(
    ("seconds", "minutes"), [(None, None), (1, 1), (60, 1), (61, 2), (7200, 120)]
)
def test_max_duration_rounds_up_to_whole_minutes(
    seconds: float | None, minutes: int | None
) -> None:
    assert time_minutes(seconds) == minutes


def test_the_batch_script_starts_one_task_per_node_and_forwards_sigterm() -> None:
    text = batch_script(SlurmRequest(partition="cpu", nodes=3, comment="proj/run"), "/w/k", None)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --nodes=3" in lines and "#SBATCH --comment=proj/run" in lines
    srun = next(line for line in lines if line.startswith("srun "))
    assert shlex.split(srun.removesuffix(" &")) == [
        "srun",
        "--nodes=3",
        "--ntasks=3",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--output=/w/k/node-%n.log",
        "/bin/bash",
        "/w/k/node.sh",
    ]
    assert "trap 'kill -TERM $task 2>/dev/null' TERM" in lines


def test_pyxis_gets_the_image_as_srun_options_in_enroots_form() -> None:
    container = Container("pyxis", "nvcr.io/nvidia/pytorch:24.01-py3", gpus=True)
    assert container_command(container, "/w/k/node.sh") == [
        "--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-mounts=/w/k",
        "/bin/bash",
        "/w/k/node.sh",
    ]
    script = batch_script(SlurmRequest(partition="gpu"), "/w/k", container)
    assert "--container-image=nvcr.io#nvidia/pytorch:24.01-py3" in script


def test_apptainer_runs_the_node_script_in_the_image() -> None:
    with_gpus = Container("apptainer", "python:3.12", gpus=True)
    assert container_command(with_gpus, "/w/n.sh") == [
        "apptainer", "exec", "--nv", "docker://python:3.12", "/bin/bash", "/w/n.sh"
    ]  # fmt: skip
    assert "--nv" not in container_command(Container("apptainer", "python:3.12"), "/w/n.sh")


@pytest.mark.parametrize(
    ("image", "enroot"),
    [
        ("ubuntu:22.04", "ubuntu:22.04"),
        ("library/ubuntu", "library/ubuntu"),
        ("ghcr.io/org/img:1", "ghcr.io#org/img:1"),
        ("localhost:5000/img", "localhost:5000#img"),
    ],
)
def test_enroot_image_names(image: str, enroot: str) -> None:
    assert enroot_image(image) == enroot


def test_env_values_are_quoted_for_the_shell() -> None:
    text = env_script({"B": "it's $HOME", "A": "plain"})
    assert text == "export A=plain\nexport B='it'\"'\"'s $HOME'\n"


def test_squeue_lines_and_slurms_host_lists() -> None:
    jobs = parse_squeue(
        "41|RUNNING|None|cpu[1-2]|2026-12-07T10:00:00|2026-12-07T11:00:00\n"
        "42|PENDING|Resources|(null)|2026-12-07T11:00:00|N/A\n"
        "garbage\n"
    )
    assert jobs["41"].nodes == ("cpu1", "cpu2") and jobs["41"].reason == ""
    assert jobs["41"].start == datetime.fromisoformat("2026-12-07T10:00:00").timestamp()
    assert jobs["42"].nodes == () and jobs["42"].reason == "Resources"
    assert jobs["42"].end is None and not jobs["42"].ended
    assert expand_hostlist("gpu[01-03,7],cpu1,n[1-2]x") == [
        "gpu01", "gpu02", "gpu03", "gpu7", "cpu1", "n1x", "n2x"
    ]  # fmt: skip


def _queued(state: str, reason: str = "", nodes: tuple[str, ...] = ("cpu1",)) -> QueuedJob:
    return QueuedJob("7", state, reason, nodes, None, None)


def test_a_running_job_runs_whatever_a_node_left() -> None:
    assert node_outcome(_queued("RUNNING"), 0, False, {}).status is JobStatus.RUNNING
    assert node_outcome(_queued("PENDING"), None, False, {}).status is JobStatus.SUBMITTED
    assert node_outcome(_queued("COMPLETING"), 0, False, {}).status is JobStatus.TERMINATING


def test_a_nodes_exit_code_decides_once_slurm_is_done() -> None:
    done = node_outcome(_queued("COMPLETED"), 0, False, {})
    assert (done.status, done.reason) == (JobStatus.DONE, TerminationReason.DONE_BY_RUNNER)
    failed = node_outcome(_queued("FAILED"), 3, False, {})
    assert (failed.status, failed.exit_code) == (JobStatus.FAILED, 3)
    assert failed.message == "exited with code 3"
    # Slurm forgot the job (MinJobAge): the exit file still tells
    assert node_outcome(None, 0, False, {}).status is JobStatus.DONE
    lost = node_outcome(None, None, False, {})
    assert lost.status is JobStatus.FAILED and "no longer knows" in (lost.message or "")


def test_a_stopped_job_is_terminated_by_the_user() -> None:
    stopped = node_outcome(_queued("CANCELLED"), 143, True, {})
    assert stopped.status is JobStatus.TERMINATED
    assert stopped.reason is TerminationReason.TERMINATED_BY_USER


def test_a_lost_node_fails_the_job_with_slurms_reason_for_it() -> None:
    outcome = node_outcome(
        _queued("NODE_FAIL", nodes=("cpu1", "cpu2")), None, False, {"cpu2": "disk on fire"}
    )
    assert outcome.status is JobStatus.FAILED
    assert outcome.message == "Slurm ended the job (NODE_FAIL): cpu2: disk on fire"


def test_slurms_limits_end_a_job_as_ours_do() -> None:
    timeout = node_outcome(_queued("TIMEOUT"), None, False, {})
    assert timeout.reason is TerminationReason.MAX_DURATION_EXCEEDED
    preempted = node_outcome(_queued("PREEMPTED"), None, False, {})
    assert preempted.reason is TerminationReason.PREEMPTED


def test_the_listing_command_is_parsed_back() -> None:
    assert "squeue --me -t all" in listing_command("~/.dstack-plan/slurm")
    meta = {"ids": ["t-0-0-1-d", "t-0-1-1-d"], "run_name": "t", "submitted_at": 5.0}
    text = "\n".join(
        [
            "@@squeue",
            "dstack-plan.t-0-0-1-d|12|RUNNING|None|cpu[1-2]|2026-12-07T10:00:00|N/A",
            "dstack-plan.t-0-0-1-d|9|CANCELLED|None|cpu1|N/A|N/A",
            "someone-else|13|RUNNING|None|gpu1|N/A|N/A",
            "@@down",
            "gpu2|maintenance",
            "@@jobs",
            "@job t-0-0-1-d",
            json.dumps(meta),
            "@exit 1 0",
            "@log 0 120",
            "@log 1 7",
            "@job half-written",
            "{not json",
            "@stopped",
        ]
    )
    listing = parse_listing(text)
    assert set(listing.queued) == {"t-0-0-1-d"}
    assert listing.queued["t-0-0-1-d"].slurm_id == "12"  # the newest submission of the name
    assert listing.down == {"gpu2": "maintenance"}
    job = listing.jobs["t-0-0-1-d"]
    assert job.job_ids == ["t-0-0-1-d", "t-0-1-1-d"]
    assert (job.exits, job.log_sizes, job.stopped) == ({1: 0}, {0: 120, 1: 7}, False)
    assert "half-written" not in listing.jobs


def test_squeue_failing_is_told_apart_from_no_jobs() -> None:
    failed = parse_listing("@@squeue\nslurm_load_jobs error: Unable to contact slurm controller\n")
    assert failed.squeue_error is not None and "Unable to contact" in failed.squeue_error
    assert parse_listing("@@squeue\n@@down\n@@jobs\n").squeue_error is None


def test_sbatch_test_only_answer() -> None:
    said = (
        "sbatch: Job 1234 to start at 2026-12-07T10:05:00 using 2 processors on nodes "
        "cpu[1-2] in partition cpu"
    )
    estimate = _estimate(said)
    assert estimate.start == datetime.fromisoformat("2026-12-07T10:05:00").timestamp()
    assert estimate.nodes == "cpu[1-2]"
