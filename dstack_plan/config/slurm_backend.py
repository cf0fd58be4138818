"""`type: slurm` in `.dstack/backends.yml`: Slurm clusters runs are submitted to.

    backends:
      - type: slurm
        clusters:
          - name: hpc                        # the fleet's region; runs name it in `regions:`
            hostname: login.hpc.example.org  # the login node, reached over SSH
            user: alice
            identity_file: ~/.ssh/id_ed25519
            gpu_partitions:
              - gpu: A100                    # the GPU model the partition's nodes have
                partitions: [a100]
            cpu_partitions: [cpu]
            account: ml-team                 # optional: sbatch --account
            qos: normal                      # optional: sbatch --qos

The form is dstack's (`clusters`, `gpu_partitions`, `cpu_partitions`), so a dstack user's
backend entry is accepted as written. The cluster's own scheduler decides when and where a run
starts: we never log in to compute nodes. See docs/slurm.md.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dstack_plan.config.base import FieldConflict, ItemError, Strict
from dstack_plan.config.fleet import ProxyJump
from dstack_plan.config.named_clusters import named, unique_names

_PARTITION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CLUSTER = re.compile(r"^[a-z][a-z0-9-]{0,40}$")


def _partition_names(names: list[str]) -> list[str]:
    # partition names go into sbatch's command line: only Slurm's own characters
    for index, name in enumerate(names):
        if not _PARTITION.fullmatch(name):
            raise ItemError(
                f"invalid partition name {name!r}: letters, digits, '_', '.' or '-'", index
            )
    return names


class GPUPartitions(Strict):
    """Partitions whose nodes have GPUs of one model."""

    gpu: str = Field(min_length=1, max_length=64)
    """The GPU model (`A100`, `H100`, `MI300X`): what a run's `gpu:` is matched against."""
    partitions: list[str] = Field(min_length=1)
    vendor: Literal["nvidia", "amd"] = "nvidia"
    gres: str = Field(default="gpu", pattern=r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?$")
    """The GRES name the site counts these GPUs under, with its type when the site types
    them (`gpu:a100`): a job asks `--gres=<gres>:<count>`."""

    @field_validator("partitions")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        return _partition_names(value)


class SlurmCluster(Strict):
    """One cluster, reached through its login node."""

    name: str
    """How fleets and plans name the cluster (lowercase, digits, '-')."""
    hostname: str = Field(min_length=1)
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
    identity_file: str | None = None
    """The private key to log in with; None: the SSH agent's keys."""
    proxy_jump: ProxyJump | None = None
    gpu_partitions: list[GPUPartitions] = []
    cpu_partitions: list[str] = []
    account: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    qos: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    work_dir: str = Field(default=".dstack-plan/slurm", pattern=r"^[A-Za-z0-9_./~-]+$")
    """Where job scripts, env files and output go on the login node (relative: from the
    user's home). It must be on a filesystem every compute node mounts at the same path
    (a home directory on NFS or Lustre, as on most sites)."""
    containers: Literal["none", "pyxis", "apptainer"] = "none"
    """How a run's `image:` runs: `none` refuses runs with an image at plan time; `pyxis`
    (srun --container-image, enroot) and `apptainer` (apptainer exec docker://...)."""

    @field_validator("cpu_partitions")
    @classmethod
    def _cpu_names(cls, value: list[str]) -> list[str]:
        return _partition_names(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _CLUSTER.fullmatch(value):
            raise ValueError(
                f"invalid cluster name {value!r}: lowercase letters, digits and '-', "
                "starting with a letter"
            )
        return value

    @model_validator(mode="after")
    def _some_partition(self) -> SlurmCluster:
        if not self.gpu_partitions and not self.cpu_partitions:
            raise FieldConflict(
                "a cluster needs gpu_partitions or cpu_partitions: the partitions runs may use",
                "gpu_partitions",
            )
        named = [p for g in self.gpu_partitions for p in g.partitions] + self.cpu_partitions
        twice = sorted({p for p in named if named.count(p) > 1})
        if twice:
            raise FieldConflict(
                f"partition {twice[0]!r} is listed twice: each partition has one GPU model",
                "gpu_partitions",
            )
        return self

    @property
    def partitions(self) -> list[str]:
        """Every partition runs may use, GPU ones first, in the order given."""
        return [p for g in self.gpu_partitions for p in g.partitions] + self.cpu_partitions

    def gpu_of(self, partition: str) -> GPUPartitions | None:
        """The GPU entry `partition` belongs to; None for a CPU partition."""
        return next((g for g in self.gpu_partitions if partition in g.partitions), None)


class SlurmBackend(Strict):
    """Slurm clusters: runs become Slurm jobs submitted through each cluster's login node."""

    type: Literal["slurm"]
    clusters: list[SlurmCluster] = Field(min_length=1)

    @field_validator("clusters")
    @classmethod
    def _unique(cls, value: list[SlurmCluster]) -> list[SlurmCluster]:
        return unique_names(value)

    def cluster(self, name: str | None) -> SlurmCluster | None:
        """The cluster `name` (None: the first); None when there is no such cluster."""
        return named(self.clusters, name)


def cluster_from_flags(
    name: str,
    login: str,
    *,
    identity_file: str | None = None,
    gpu_partitions: Sequence[str] = (),
    cpu_partitions: Sequence[str] = (),
    account: str | None = None,
    qos: str | None = None,
) -> SlurmCluster:
    """The cluster `dstack init --backend slurm` describes: `login` as `USER@HOST[:PORT]`,
    each GPU partition flag as `MODEL=PART[,PART...]`. ValueError (or pydantic's) saying
    which flag is wrong."""
    user, at, host = login.partition("@")
    if not at or not user or not host:
        raise ValueError(f"--login {login!r}: expected USER@HOST or USER@HOST:PORT")
    hostname, colon, port = host.rpartition(":") if ":" in host else (host, "", "22")
    if colon and not port.isdigit():
        raise ValueError(f"--login {login!r}: the port must be a number")
    gpus = []
    for flag in gpu_partitions:
        model, eq, parts = flag.partition("=")
        if not eq or not model or not parts:
            raise ValueError(f"--gpu-partition {flag!r}: expected MODEL=PARTITION[,PARTITION]")
        gpus.append({"gpu": model, "partitions": parts.split(",")})
    return SlurmCluster.model_validate(
        {
            "name": name,
            "hostname": hostname,
            "port": int(port),
            "user": user,
            "identity_file": identity_file,
            "gpu_partitions": gpus,
            "cpu_partitions": [p for flag in cpu_partitions for p in flag.split(",")],
            "account": account,
            "qos": qos,
        }
    )


def with_cluster(backend: SlurmBackend | None, cluster: SlurmCluster) -> SlurmBackend:
    """`backend` with `cluster` added, or in place of its cluster of the same name."""
    kept = [c for c in backend.clusters if c.name != cluster.name] if backend else []
    return SlurmBackend(type="slurm", clusters=[*kept, cluster])
