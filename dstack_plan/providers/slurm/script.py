"""What a run asks Slurm for, and the scripts that run it there (pure: no I/O).

A run is one Slurm job, whatever its node count: `sbatch` allocates every node at once (a
gang, as Slurm schedules it), and the batch script starts one task per node with `srun`. Each
node's task runs `node.sh`, which derives the `DSTACK_*` variables from Slurm's
(`SLURM_NODEID` is the node rank, `SLURM_JOB_NODELIST` the nodes, in rank order) and runs the
run's commands: directly on the node (process jobs), or in the run's image through the site's
container support (`containers: pyxis` or `apptainer`).

The job's directory on the login node (`<work_dir>/<job key>/`, on a filesystem the compute
nodes share) holds:

    job.sbatch   the batch script (`#SBATCH` lines say what is asked)
    env.sh       the job's environment, secrets included: mode 0600, removed with the job
    node.sh      what each node runs
    node-N.log   node N's output (stdout and stderr)
    exit-N       node N's exit code, written when its commands end
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dstack_plan.errors import PlanError

SCRIPT = "job.sbatch"
ENV = "env.sh"
NODE = "node.sh"
LOG = "node-{node}.log"
EXIT = "exit-{node}"

PER_NODE_VARS = ("DSTACK_NODE_RANK", "DSTACK_JOB_ID", "DSTACK_MASTER_NODE_IP", "DSTACK_NODES_IPS")
"""What `node.sh` sets from Slurm's variables, whatever the job's env says."""


@dataclass(frozen=True)
class SlurmRequest:
    """What one run asks of Slurm: `sbatch`'s options."""

    partition: str
    job_name: str = ""
    """Set by the engine when it submits: `dstack-plan.<the job's key>`."""
    nodes: int = 1
    cpus_per_task: int | None = None
    mem_mb: int | None = None
    """Per node; None: the partition's default."""
    gres: str | None = None
    """`gpu:2`, `gpu:a100:2`: per node."""
    time_minutes: int | None = None
    """The time limit (`max_duration`); None: the partition's."""
    stop_seconds: int = 0
    """The grace before the time limit: SIGTERM this long before Slurm kills the job."""
    account: str | None = None
    qos: str | None = None
    comment: str | None = None
    """Who submitted it: the project and run, for `squeue -o %k` and the site's admins."""

    def options(self) -> list[str]:
        """`sbatch`'s options for this request (no values that need a shell's quoting)."""
        found = [
            *([f"--job-name={self.job_name}"] if self.job_name else []),
            f"--partition={self.partition}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            # a node lost mid-run fails the run with Slurm's reason; `retry` decides what
            # then, as on every fleet (Slurm's requeue would start it again unasked)
            "--no-requeue",
        ]
        if self.cpus_per_task is not None:
            found.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.mem_mb is not None:
            found.append(f"--mem={self.mem_mb}M")
        if self.gres is not None:
            found.append(f"--gres={self.gres}")
        if self.time_minutes is not None:
            found.append(f"--time={self.time_minutes}")
            if self.stop_seconds > 0:
                # B: the batch shell gets it, and passes it on to the nodes' tasks (srun)
                found.append(f"--signal=B:TERM@{max(self.stop_seconds, 1)}")
        if self.account is not None:
            found.append(f"--account={self.account}")
        if self.qos is not None:
            found.append(f"--qos={self.qos}")
        return found


def time_minutes(seconds: float | None) -> int | None:
    """Slurm's time limit for `max_duration` seconds: whole minutes, rounded up."""
    if seconds is None:
        return None
    return max(1, math.ceil(seconds / 60))


@dataclass(frozen=True)
class Container:
    """How the nodes run the job's image: the site's container tool and the image."""

    tool: str
    """`pyxis` or `apptainer`."""
    image: str
    gpus: bool = False


def container_command(container: Container, node_script: str) -> list[str]:
    """The command each node's task runs `node_script` with, inside `container`.

    pyxis takes the image as srun options (`--container-image`, enroot's `docker://` form for
    a registry image); Apptainer runs `apptainer exec`, `--nv` giving it the node's GPUs."""
    if container.tool == "pyxis":
        return [
            f"--container-image={enroot_image(container.image)}",
            f"--container-mounts={_dirname(node_script)}",
            "/bin/bash",
            node_script,
        ]
    if container.tool == "apptainer":
        nv = ["--nv"] if container.gpus else []
        return ["apptainer", "exec", *nv, f"docker://{container.image}", "/bin/bash", node_script]
    raise PlanError(f"unknown container tool {container.tool!r}: expected pyxis or apptainer")


def batch_script(request: SlurmRequest, job_dir: str, container: Container | None) -> str:
    """The batch script: its `#SBATCH` lines, then one `srun` task per node running
    `node.sh`. The batch shell waits for srun and passes SIGTERM on to it (a stop's grace
    signal, or the time limit's), so each node's commands see it."""
    log = f"{job_dir}/{LOG.format(node='%n')}"
    lines = ["#!/bin/bash", *(f"#SBATCH {o}" for o in request.options())]
    lines.append(f"#SBATCH --output={job_dir}/batch.log")
    if request.comment is not None:
        lines.append(f"#SBATCH --comment={shlex.quote(request.comment)}")
    node = f"{job_dir}/{NODE}"
    task = ["/bin/bash", node] if container is None else container_command(container, node)
    srun = [
        "srun",
        f"--nodes={request.nodes}",
        f"--ntasks={request.nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        f"--output={log}",
        *task,
    ]
    lines += [
        "trap 'kill -TERM $task 2>/dev/null' TERM",
        f"{shlex.join(srun)} &",
        "task=$!",
        # a trapped signal ends the first wait: the second waits for srun to end
        'wait "$task"; code=$?',
        'if kill -0 "$task" 2>/dev/null; then wait "$task"; code=$?; fi',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def env_script(env: Mapping[str, str]) -> str:
    """`env.sh`: the job's variables as `export` lines, each value quoted for the shell."""
    lines = [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    return "\n".join(lines) + "\n"


def node_script(
    job_dir: str,
    commands: Sequence[str],
    job_ids: Sequence[str],
    gpus_per_node: int,
    working_dir: str | None,
) -> str:
    """`node.sh`: one node's part of the run. It reads `env.sh`, sets the `DSTACK_*`
    variables Slurm decides (the node's rank, the nodes' addresses in rank order, the
    master's), runs the commands as the agent does (`sh -c` of them joined with `&&`) and
    writes their exit code to `exit-<rank>`."""
    ids = " ".join(shlex.quote(i) for i in job_ids)
    workdir = shlex.quote(working_dir) if working_dir else shlex.quote(job_dir)
    command = " && ".join(commands) if commands else "true"
    return (
        "\n".join(
            [
                "#!/bin/bash",
                f". {shlex.quote(job_dir)}/{ENV}",
                "rank=${SLURM_NODEID:-0}",
                f"ids=({ids})",
                "addresses=()",
                'for name in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
                # the node's address as Slurm reaches it (NodeAddr), else its name
                '  address=$(scontrol show node -o "$name" | tr " " "\\n" |'
                ' sed -n "s/^NodeAddr=//p")',
                '  addresses+=("${address:-$name}")',
                "done",
                "export DSTACK_NODE_RANK=$rank",
                'export DSTACK_JOB_ID="${ids[$rank]}"',
                'export DSTACK_NODES_NUM="${SLURM_JOB_NUM_NODES:-1}"',
                'export DSTACK_MASTER_NODE_IP="${addresses[0]}"',
                'export DSTACK_NODES_IPS="$(printf "%s\\n" "${addresses[@]}")"',
                f"export DSTACK_GPUS_PER_NODE={gpus_per_node}",
                f"export DSTACK_GPUS_NUM=$(({gpus_per_node} * DSTACK_NODES_NUM))",
                f"mkdir -p {workdir} && cd {workdir} || exit 1",
                f"/bin/sh -c {shlex.quote(command)} &",
                "child=$!",
                "trap 'kill -TERM $child 2>/dev/null' TERM",
                'wait "$child"; code=$?',
                'if kill -0 "$child" 2>/dev/null; then wait "$child"; code=$?; fi',
                f'echo "$code" > {shlex.quote(job_dir)}/exit-$rank',
                'exit "$code"',
            ]
        )
        + "\n"
    )


def enroot_image(image: str) -> str:
    """`image` as pyxis (enroot) names it: a registry host is set off by `#`, not `/`
    (`nvcr.io/nvidia/pytorch:24.01` -> `nvcr.io#nvidia/pytorch:24.01`)."""
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return image


def _dirname(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"
