"""Pydantic models of the agent API payloads, for the controller side (the daemon never imports
this: it validates with the standard library in `spec`)."""

from __future__ import annotations

import uuid
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from dstack_plan.agent import protocol as p


class JobStatus(str, Enum):
    SUBMITTED = p.SUBMITTED
    PULLING = p.PULLING
    RUNNING = p.RUNNING
    TERMINATING = p.TERMINATING
    DONE = p.DONE
    FAILED = p.FAILED
    TERMINATED = p.TERMINATED
    ABORTED = p.ABORTED

    @property
    def finished(self) -> bool:
        return self.value in p.FINISHED_STATUSES


class TerminationReason(str, Enum):
    DONE_BY_RUNNER = p.DONE_BY_RUNNER
    CONTAINER_EXITED_WITH_ERROR = p.CONTAINER_EXITED_WITH_ERROR
    CREATING_CONTAINER_ERROR = p.CREATING_CONTAINER_ERROR
    EXECUTOR_ERROR = p.EXECUTOR_ERROR
    TERMINATED_BY_USER = p.TERMINATED_BY_USER
    MAX_DURATION_EXCEEDED = p.MAX_DURATION_EXCEEDED
    ABORTED_BY_USER = p.ABORTED_BY_USER
    TERMINATED_BY_SERVER = p.TERMINATED_BY_SERVER
    SCALED_DOWN = p.SCALED_DOWN
    INACTIVITY_DURATION_EXCEEDED = p.INACTIVITY_DURATION_EXCEEDED
    TERMINATED_DUE_TO_UTILIZATION_POLICY = p.TERMINATED_DUE_TO_UTILIZATION_POLICY
    PREEMPTED = p.PREEMPTED


# Built on first use: a command validates two or three of these, and building all of them
# at import cost ~15 ms of every CLI start.
_REQUEST = ConfigDict(extra="forbid", frozen=True, defer_build=True)
_ANSWER = ConfigDict(extra="ignore", frozen=True, defer_build=True)  # newer agents add fields


class PortMapping(BaseModel):
    model_config = _REQUEST
    container_port: int = Field(ge=1, le=65535)
    host_port: int | None = Field(default=None, ge=1, le=65535)


class PublishedPort(BaseModel):
    """Where a job's port listens on its host, as the agent reports it once the job runs."""

    model_config = _ANSWER
    container_port: int
    host_port: int | None = None
    """None until known (the container has not started, or Docker published nothing)."""
    host_ip: str | None = None
    """The host address it is published on; None: every address (the host network)."""

    def __str__(self) -> str:
        """`127.0.0.1:49153 -> 8799`, or `8799` on the host network."""
        if self.host_port is None:
            return f"? -> {self.container_port}"
        if self.host_ip is None and self.host_port == self.container_port:
            return str(self.container_port)
        host = self.host_ip or "*"
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.host_port} -> {self.container_port}"


class VolumeMount(BaseModel):
    model_config = _REQUEST
    host_path: str
    container_path: str
    read_only: bool = False


class DiskMount(BaseModel):
    """A network disk attached to the machine, mounted into the job's container."""

    model_config = _REQUEST
    name: str
    """The volume's name."""
    devices: list[str]
    """Where the disk may appear on the machine, most specific first."""
    container_path: str
    read_only: bool = False


class RegistryCredentials(BaseModel):
    """Credentials for pulling a job's image from a private registry; both are secret."""

    model_config = _REQUEST
    username: SecretStr
    password: SecretStr


class SSHAccess(BaseModel):
    """`ssh` of a job spec: the agent starts an SSH server for the job (on the host's
    127.0.0.1 only) that lets the holder of `public_key` in (`agent/job_sshd.py`)."""

    model_config = _REQUEST
    public_key: str = Field(pattern=r"^(ssh|ecdsa|sk-)[^\n]+$")
    """One OpenSSH public key line (`ssh-ed25519 AAAA... comment`)."""


class SSHServerInfo(BaseModel):
    """Where a job's SSH server listens on its host and the host key it presents; `error`
    (and nothing else) when it could not be started."""

    model_config = _ANSWER
    port: int | None = None
    host_key: str | None = None
    """`<algorithm> <base64>`: what the client pins."""
    user: str | None = None
    """Who to log in as."""
    working_dir: str | None = None
    """Where a session starts (the container's or the process's working dir)."""
    error: str | None = None


class JobSpec(BaseModel):
    """What to run. Env values may be secrets (`pydantic.SecretStr`, or the config's `Secret`,
    anything with `reveal()`): they are sent to the agent, which keeps them in memory only, and
    never appear in its records, its logs or this model's repr. So are registry credentials."""

    model_config = _REQUEST
    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    run_name: str
    run_id: str | None = None
    image: str | None = None
    commands: list[str] = []
    entrypoint: list[str] | None = None
    env: dict[str, str | SecretStr] = {}
    secret_env: list[str] = []
    working_dir: str | None = None
    user: str | None = None
    ports: list[PortMapping] = []
    gpus: int | list[int] = 0
    """How many GPUs, or which indices."""
    gpu_share: int | None = Field(default=None, ge=1, le=999)
    """Thousandths of one GPU, shared with other jobs (`gpus` must be 1 or one index); None:
    whole GPUs, held alone."""
    cpus: float | None = None
    memory: int | None = None
    """Bytes."""
    shm_size: int | None = None
    """Bytes."""
    volumes: list[VolumeMount] = []
    disks: list[DiskMount] = []
    network_mode: Literal["host", "bridge"] = "host"
    labels: dict[str, str] = {}
    privileged: bool = False
    stop_timeout: float = p.DEFAULT_STOP_TIMEOUT
    max_duration: float | None = None
    """Seconds of running after which the agent stops the job."""
    registry_auth: RegistryCredentials | None = None
    code: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The sha256 of a code archive uploaded with `AgentClient.put_blob`: the agent unpacks
    it into the job's working dir (`wd/`), the user's home (`home/`) and `/` (`abs/`) before
    the job's commands start."""
    ssh: SSHAccess | None = None
    """An SSH server for the job (dev environments); left out of the request when unset, so
    agents that predate it accept the rest."""
    mask: list[SecretStr] = []
    """The bare values of the secrets its env uses inside larger values
    (`postgres://u:${{ secrets.PW }}@h`): the agent masks them in the job's output too, and
    keeps them in memory only. Left out of the request when empty."""

    @model_validator(mode="after")
    def _share_of_one_gpu(self) -> JobSpec:
        if (
            self.gpu_share is not None
            and self.gpus != 1
            and not (isinstance(self.gpus, list) and len(self.gpus) == 1)
        ):
            raise ValueError(
                f"gpu_share: a share of one GPU needs gpus 1 or one index, not {self.gpus}"
            )
        return self

    @field_validator("env", mode="before")
    @classmethod
    def _secrets_stay_wrapped(cls, env: Any) -> Any:
        # dstack_plan.config.secrets.Secret is duck-typed so this module needs no config import.
        if isinstance(env, dict):
            return {
                name: SecretStr(value.reveal())
                if callable(getattr(value, "reveal", None))
                else value
                for name, value in env.items()
            }
        return env

    def to_wire(self) -> dict[str, Any]:
        """The JSON body for `POST /jobs`: secret values unwrapped (env ones named in
        secret_env), registry credentials (if any) in clear."""
        data = self.model_dump(
            mode="json",
            exclude={
                "env", "secret_env", "registry_auth", "code", "gpu_share", "disks", "ssh", "mask"
            },
        )  # fmt: skip
        if self.mask:
            data["mask"] = [value.get_secret_value() for value in self.mask]
        if self.ssh is not None:
            data["ssh"] = self.ssh.model_dump(mode="json")
        if self.disks:  # left out when none, so agents that predate the field accept the rest
            data["disks"] = [d.model_dump(mode="json") for d in self.disks]
        if self.code is not None:  # left out when unset, as registry_auth below
            data["code"] = self.code
        if self.gpu_share is not None:
            data["gpu_share"] = self.gpu_share
        auth = self.registry_auth
        if auth is not None:  # left out when unset, so agents that predate the field accept it
            data["registry_auth"] = {
                "username": auth.username.get_secret_value(),
                "password": auth.password.get_secret_value(),
            }
        env: dict[str, str] = {}
        secret = list(self.secret_env)
        for name, value in self.env.items():
            if isinstance(value, SecretStr):
                env[name] = value.get_secret_value()
                if name not in secret:
                    secret.append(name)
            else:
                env[name] = value
        data["env"] = env
        data["secret_env"] = secret
        return data


class JobInfo(BaseModel):
    model_config = _ANSWER
    id: str
    run_name: str
    run_id: str | None = None
    runtime: Literal["docker", "process"]
    status: JobStatus
    termination_reason: TerminationReason | None = None
    termination_message: str | None = None
    exit_code: int | None = None
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    last_activity_at: float | None = None
    """When someone last used the job (its start, `dstack attach`, `dstack exec`); None from
    agents that predate it."""
    gpus: list[int] = []
    gpu_share: int | None = None
    """Thousandths of its one GPU the job holds; None: whole GPUs (or none)."""
    gpu_sharing: Literal["mps", "time-slicing"] | None = None
    """How the shared GPU is divided: NVIDIA MPS limits, or plain time-slicing (no limits:
    the jobs take turns); None for whole-GPU and GPU-less jobs."""
    container_id: str | None = None
    container_name: str | None = None
    pid: int | None = None
    ports: list[PublishedPort] = []
    log_size: int = 0
    """The offset the next log byte gets."""
    log_first_offset: int = 0
    """Offsets before this were discarded by log rotation."""
    logs_truncated: bool = False
    spec: dict[str, Any] = {}
    """The spec as the agent stores it: secret env values read `(redacted)`."""
    ssh: SSHServerInfo | None = None
    """The job's SSH server, for a spec with `ssh`: None while it starts (and after the job
    ended), or from agents that predate it."""

    @property
    def finished(self) -> bool:
        return self.status.finished

    @property
    def stop_timeout(self) -> float:
        """The graceful-stop window the job was submitted with (seconds)."""
        value = self.spec.get("stop_timeout")
        return float(value) if isinstance(value, int | float) else 0.0


class JobListing(BaseModel):
    """`GET /jobs`: every job the agent holds, oldest first. Validated from the body's bytes
    in one call: at 10,000 jobs that is about a third less than decoding the JSON and then
    validating each job."""

    model_config = _ANSWER
    jobs: tuple[JobInfo, ...]


class LogChunk(BaseModel):
    """Log bytes [offset, next_offset). Ask again from next_offset: nothing is lost or repeated."""

    model_config = _ANSWER
    job_id: str
    offset: int
    next_offset: int
    first_offset: int = 0
    size: int | None = None
    truncated: bool = False
    """The asked-for offset was already rotated away; data starts at `offset` instead."""
    complete: bool = False
    """The job has ended and this chunk reaches the end of its log."""
    times: list[tuple[int, float]] = []
    """(offset, epoch seconds) pairs, offsets ascending: each byte was appended at about the
    time of the last pair at or before it (within a second). Empty from an older agent."""
    data: bytes = b""


class GpuInfo(BaseModel):
    model_config = _ANSWER
    vendor: str
    name: str
    memory_mib: int
    index: int
    uuid: str


class DockerFacts(BaseModel):
    model_config = _ANSWER
    present: bool
    version: str | None = None
    api_version: str | None = None
    error: str | None = None


class MemoryFacts(BaseModel):
    model_config = _ANSWER
    total_bytes: int
    available_bytes: int


class DiskFacts(BaseModel):
    model_config = _ANSWER
    path: str
    total_bytes: int
    free_bytes: int


class Address(BaseModel):
    model_config = _ANSWER
    interface: str
    family: Literal["ipv4", "ipv6"]
    address: str


class HostFacts(BaseModel):
    model_config = _ANSWER
    hostname: str
    os: str
    kernel: str
    arch: str
    cpus: int
    memory: MemoryFacts
    disk: DiskFacts
    addresses: list[Address]
    python: str
    docker: DockerFacts
    gpus: list[GpuInfo]
    gpus_allocated: dict[int, str] = {}
    """GPU index -> job id (the job ids comma-joined for a GPU shared by several jobs)."""
    gpu_shares: dict[int, dict[str, int]] = {}
    """GPU index -> job id -> thousandths held (1000 for a whole GPU); empty from agents that
    predate shared GPUs."""


class Health(BaseModel):
    model_config = _ANSWER
    status: str
    version: str
    api_version: int
    agent_id: str
    uptime_seconds: float


class ConnectionInfo(BaseModel):
    """The agent's `agent.json`: where it listens and where its token is."""

    model_config = _ANSWER
    pid: int
    host: str
    port: int
    url: str
    token_file: str
    data_dir: str
    version: str
    agent_id: str
    started_at: float


class ProbeListener(BaseModel):
    """A bandwidth probe's receiving end, open on one host (`POST /bandwidth/listen`)."""

    model_config = _ANSWER
    id: str
    address: str
    """What it is bound to: the host's fleet address, or every address (`bound_all`)."""
    port: int
    bound_all: bool = False
    token: SecretStr
    """The one-shot token the sender presents first; only the sending agent gets it."""


class ProbeMeasure(BaseModel):
    """One side's measure of a probe: bytes moved, in how long, and the rate."""

    model_config = _ANSWER
    bytes: int = 0
    seconds: float = 0.0
    bytes_per_second: float | None = None
    status: str = "done"
    """The receiver's: `listening`, `receiving`, `done` or `failed`."""
    error: str | None = None
    peer: str | None = None


class HostClaim(BaseModel):
    """Who owns a host: the fleet that enrolled it, of which project and state
    (`agent/claims.py` keeps it on the host)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    lineage: str
    deployment: str
    """The deployment key of the owner's state: its jobs carry it (`runs/jobs.py`)."""
    project: str
    state: str
    """Where the owner's state lives: a path or an `s3://` URL."""
    fleet: str
    """The owning fleet's address."""
    claimed_at: float | None = None

    def describe(self) -> str:
        """`fleet.onprem of project platform (state s3://bucket/platform.json)`."""
        return f"{self.fleet} of project {self.project} (state {self.state})"


class ClaimAnswer(BaseModel):
    """The agent's answer to a claim: the claim recorded, and the one it replaced (a take-over
    of another project's)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    claim: HostClaim
    replaced: HostClaim | None = None


class ClaimRelease(BaseModel):
    """The agent's answer to a release: the claims left and the jobs not finished (of any
    project), which decide whether the agent may stop."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    claims: list[HostClaim] = Field(default_factory=list)
    unfinished_jobs: list[JobInfo] = Field(default_factory=list)
