"""One job's state as the agent tracks it, and its on-disk record (never holding secrets)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dstack_plan.agent.job_sshd import SSHServer
from dstack_plan.agent.logstore import LogStore, MaskedLog
from dstack_plan.agent.protocol import FINISHED_STATUSES, SUBMITTED
from dstack_plan.agent.spec import JobSpec, parse_job_spec

RECORD_FORMAT = 1


@dataclass
class StopRequest:
    """Why and how a job is being stopped; the termination reason it will end with."""

    reason: str
    timeout: float
    requested_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "timeout": self.timeout, "requested_at": self.requested_at}


@dataclass
class Job:
    """Mutable job state; the manager's lock guards every change."""

    spec: JobSpec
    runtime: str
    logs: LogStore
    status: str = SUBMITTED
    termination_reason: str | None = None
    termination_message: str | None = None
    exit_code: int | None = None
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    last_activity_at: float | None = None
    """The last time someone used the job (its start, or a touch: `dstack attach`, `exec`)."""
    gpus: list[int] = field(default_factory=list)
    gpu_vendor: str | None = None
    gpu_sharing: str | None = None
    """`mps` or `time-slicing` for a job sharing its GPU (chosen at submit), else None."""
    gpu_share_env: dict[str, str] = field(default_factory=dict)
    """What the share adds to the job's env (`gpushare.share_env`), kept so a re-adopted job
    is described as it was started."""
    container_id: str | None = None
    container_name: str | None = None
    pid: int | None = None
    pid_start: int | None = None
    ports: list[dict[str, Any]] = field(default_factory=list)
    stop: StopRequest | None = None
    started: bool = False
    """The workload was started (a stop must go through the runtime, not just end the job)."""
    secrets_lost: bool = False
    """Loaded from disk after a restart: secret env values are gone."""
    sshd: SSHServer | None = None
    """The job's SSH server (`job_sshd`), once started, for a spec with `ssh`."""
    activity_saved_at: float = 0.0
    """When activity an SSH session made was last written to the record (not recorded)."""
    output: MaskedLog = field(init=False, repr=False, compare=False)
    """Where the runtime writes the job's output: into `logs`, with its secret values masked
    (none after a restart until the runtime reads them back from the workload)."""

    def __post_init__(self) -> None:
        self.output = MaskedLog(self.logs, () if self.secrets_lost else self.spec.secret_values())

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    def _common(self) -> dict[str, Any]:
        """Fields both the disk record and the API view carry."""
        return {
            "spec": self.spec.to_dict(redact=True),
            "runtime": self.runtime,
            "status": self.status,
            "termination_reason": self.termination_reason,
            "termination_message": self.termination_message,
            "exit_code": self.exit_code,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "last_activity_at": self.last_activity_at,
            "gpus": list(self.gpus),
            "gpu_share": self.spec.gpu_share,
            "gpu_sharing": self.gpu_sharing,
            "container_id": self.container_id,
            "container_name": self.container_name,
            "pid": self.pid,
            "ports": list(self.ports),
        }

    def record(self) -> dict[str, Any]:
        """What goes to disk: the spec without secret values, plus state and runtime handles."""
        return {
            "format": RECORD_FORMAT,
            **self._common(),
            "gpu_vendor": self.gpu_vendor,
            "gpu_share_env": dict(self.gpu_share_env),
            "pid_start": self.pid_start,
            "stop": None if self.stop is None else self.stop.to_dict(),
            "started": self.started,
            **({} if self.sshd is None else {"sshd": self.sshd.record()}),
        }

    def info(self) -> dict[str, Any]:
        """The API view of the job."""
        return {
            "id": self.id,
            "run_name": self.spec.run_name,
            "run_id": self.spec.run_id,
            **self._common(),
            "log_size": self.logs.end,
            "log_first_offset": self.logs.first_offset,
            "logs_truncated": self.logs.first_offset > 0,
            **self._ssh_info(),
        }

    def _ssh_info(self) -> dict[str, Any]:
        """`ssh`: how to reach the job's SSH server (`{port, host_key, user, working_dir}`,
        or `{error}`), null while it starts; absent for a job that asked for none."""
        if self.spec.ssh is None:
            return {}
        return {"ssh": None if self.sshd is None else self.sshd.info()}

    @classmethod
    def from_record(cls, record: dict[str, Any], logs: LogStore) -> Job:
        """Rebuild a job after a restart; secret env values read back as the redaction marker."""
        stop = record.get("stop")
        return cls(
            spec=parse_job_spec(record["spec"]),
            runtime=record["runtime"],
            logs=logs,
            status=record["status"],
            termination_reason=record.get("termination_reason"),
            termination_message=record.get("termination_message"),
            exit_code=record.get("exit_code"),
            submitted_at=record["submitted_at"],
            started_at=record.get("started_at"),
            finished_at=record.get("finished_at"),
            last_activity_at=record.get("last_activity_at"),
            gpus=list(record.get("gpus") or []),
            gpu_vendor=record.get("gpu_vendor"),
            gpu_sharing=record.get("gpu_sharing"),
            gpu_share_env=dict(record.get("gpu_share_env") or {}),
            container_id=record.get("container_id"),
            container_name=record.get("container_name"),
            pid=record.get("pid"),
            pid_start=record.get("pid_start"),
            ports=list(record.get("ports") or []),
            stop=None if not stop else StopRequest(**stop),
            started=bool(record.get("started")),
            secrets_lost=True,
            sshd=SSHServer.from_record(record.get("sshd")),
        )
