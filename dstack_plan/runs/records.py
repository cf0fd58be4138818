"""What a run's state entry records: the one place that writes and reads those attributes.

`RunHandler.create` and `update` write a `RunRecord`; refresh, delete and the read side
(`ps`, `logs`, `stop`) read it back with `RunRecord.of`. State holds it as plain JSON, so a
record written by an older version (fields missing) or edited by hand (fields of the wrong
type) reads as far as it can: a job without an id is dropped, other odd fields take their
defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from dstack_plan.agent.api_models import JobInfo, PublishedPort
from dstack_plan.config.quotas import DEFAULT_NAMESPACE
from dstack_plan.providers.local import LOCAL_FLEET
from dstack_plan.state.events import span_id
from dstack_plan.state.identity_memo import IdentityMemo
from dstack_plan.state.model import ResourceState


class JobRecord(NamedTuple):
    """One job of a run, as state remembers it (the agent is asked for the rest)."""

    id: str
    replica: int = 0
    node: int = 0
    status: str = "unknown"
    """The job's status when the record was last refreshed."""
    host: str = "localhost"
    """The machine it runs on, as its fleet names it (`Machine.host`); on the local fleet,
    older records say `localhost`."""
    runtime: str | None = None
    ports: tuple[PublishedPort, ...] = ()
    """Where the job's ports listen on its host, once the agent said so."""
    spec_hash: str | None = None
    """What the job runs (`apply.rollout.job_spec_hash`); None: the entry's spec, as when it
    was created (a rolling update stamps the old jobs before it changes the spec)."""
    reason: str | None = None
    """Why it ended, once it has (`container_exited_with_error: exited with code 3`): the
    agent's termination reason and message, for events and `ps`."""
    gpus: float | None = None
    """The GPUs it holds while it runs, a shared GPU as its fraction (quota usage); None in
    records that predate it (usage then reads them from the run's spec)."""
    started_at: float | None = None
    """Epoch seconds, from its agent, once it started running."""
    finished_at: float | None = None
    """Epoch seconds, from its agent, once it ended."""

    @property
    def slot(self) -> tuple[int, int]:
        return (self.replica, self.node)

    @classmethod
    def of_job(
        cls,
        info: JobInfo,
        replica: int,
        node: int,
        host: str = "localhost",
        gpus: float | None = None,
    ) -> JobRecord:
        return cls(
            id=info.id,
            replica=replica,
            node=node,
            host=host,
            status=info.status.value,
            runtime=info.runtime,
            ports=tuple(info.ports),
            gpus=gpus,
            started_at=info.started_at,
            finished_at=info.finished_at,
        )

    def refreshed(self, info: JobInfo) -> JobRecord:
        """This record with what the agent says now (status, and ports once known)."""
        ports = tuple(info.ports) if info.ports else self.ports
        reason = self.reason
        if info.termination_reason is not None:
            reason = info.termination_reason.value
            if info.termination_message:
                reason += f": {info.termination_message}"
        return self._replace(
            status=info.status.value,
            ports=ports,
            reason=reason,
            started_at=info.started_at if info.started_at is not None else self.started_at,
            finished_at=info.finished_at if info.finished_at is not None else self.finished_at,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "replica": self.replica,
            "node": self.node,
            "status": self.status,
            "runtime": self.runtime,
            "ports": [p.model_dump(mode="json") for p in self.ports],
            **({"spec_hash": self.spec_hash} if self.spec_hash is not None else {}),
            **({"reason": self.reason} if self.reason is not None else {}),
            **({"gpus": self.gpus} if self.gpus is not None else {}),
            **({"started_at": self.started_at} if self.started_at is not None else {}),
            **({"finished_at": self.finished_at} if self.finished_at is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: object) -> JobRecord | None:
        if not isinstance(raw, dict) or "id" not in raw:
            return None
        runtime = raw.get("runtime")
        return cls(
            id=str(raw["id"]),
            replica=_int(raw.get("replica")),
            node=_int(raw.get("node")),
            status=str(raw.get("status", "unknown")),
            host=str(raw.get("host", "localhost")),
            runtime=None if runtime is None else str(runtime),
            ports=_ports(raw.get("ports")),
            spec_hash=str(raw["spec_hash"]) if raw.get("spec_hash") is not None else None,
            reason=str(raw["reason"]) if raw.get("reason") is not None else None,
            gpus=_float(raw.get("gpus")),
            started_at=_float(raw.get("started_at")),
            finished_at=_float(raw.get("finished_at")),
        )


class RunRecord(NamedTuple):
    """A run's attributes in state."""

    fleet: str = LOCAL_FLEET
    generation: int | None = None
    """The generation its create gave its jobs (ms since the epoch); None for an intent entry
    (a create that has not recorded anything yet)."""
    deployment: str | None = None
    """The deployment key its jobs carry (see `apply.deployment`)."""
    price_per_hour: float = 0.0
    jobs: tuple[JobRecord, ...] = ()
    namespace: str = DEFAULT_NAMESPACE
    """The namespace its quotas count it in (the run's `namespace:` when it started)."""
    user: str | None = None
    """Who applied it (`apply.user.current_user`); None in records older than quotas."""

    @classmethod
    def of(cls, run: ResourceState) -> RunRecord:
        """The record in `run`'s attributes, parsed once per entry (entries are immutable):
        a watch tick asks for each run's record a dozen times, which at 10,000 jobs was a
        third of its time."""
        return _PARSED.get_or_make(run, cls._parse)

    @classmethod
    def _parse(cls, run: ResourceState) -> RunRecord:
        attributes = run.attributes
        jobs = attributes.get("jobs")
        records = (
            tuple(r for r in map(JobRecord.from_json, jobs) if r is not None)
            if isinstance(jobs, list)
            else ()
        )
        generation = attributes.get("generation")
        deployment = attributes.get("deployment")
        price = attributes.get("price_per_hour")
        namespace = attributes.get("namespace")
        user = attributes.get("user")
        return cls(
            fleet=str(attributes.get("fleet", LOCAL_FLEET)),
            generation=generation if isinstance(generation, int) else None,
            deployment=deployment if isinstance(deployment, str) else None,
            price_per_hour=float(price) if isinstance(price, int | float) else 0.0,
            jobs=records,
            namespace=namespace if isinstance(namespace, str) and namespace else DEFAULT_NAMESPACE,
            user=user if isinstance(user, str) and user else None,
        )

    def with_jobs(self, jobs: Sequence[JobRecord]) -> RunRecord:
        return self._replace(jobs=tuple(jobs))

    def job_ids(self) -> list[str]:
        return [j.id for j in self.jobs]

    def to_json(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet,
            "generation": self.generation,
            "deployment": self.deployment,
            "price_per_hour": self.price_per_hour,
            "jobs": [j.to_json() for j in self.jobs],
            **({"namespace": self.namespace} if self.namespace != DEFAULT_NAMESPACE else {}),
            **({"user": self.user} if self.user is not None else {}),
        }


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _ports(raw: object) -> tuple[PublishedPort, ...]:
    if not isinstance(raw, list):
        return ()
    ports = []
    for port in raw:
        try:
            ports.append(PublishedPort.model_validate(port))
        except ValueError:
            continue  # a hand-edited record: keep the others
    return tuple(ports)


def run_span_id(run: ResourceState) -> str:
    """The span id every event and log line of this run object shares, from its submission
    to its end, retries and rolling updates included (`state.events.span_id` of its address
    and creation time: a run replaced under the same address starts a new span)."""
    return span_id(run.address, run.created_at)


_PARSED: IdentityMemo[ResourceState, RunRecord] = IdentityMemo()
"""`RunRecord.of`'s parsed records, by entry."""

RETRY_KEY = "retry"
"""The run's retry state in its attributes (`watch/retry_model.RetryState`)."""


def retry_due_at(attributes: Mapping[str, Any]) -> float | None:
    """When the retry policy resubmits the run next, while it waits to (else None)."""
    retry = attributes.get(RETRY_KEY)
    due = retry.get("next_attempt_at") if isinstance(retry, dict) else None
    return float(due) if isinstance(due, int | float) else None


SERVICE_URL_KEY = "service_url"
"""A service's URL on the proxy of the `dstack watch` that serves it (watch writes it)."""
SERVED_BY_KEY = "served_by"
"""The leader-lease holder id of the watch that serves it (`state/lease.py`)."""


def service_url(entry: ResourceState) -> str | None:
    """Where a service is served, as the watch that serves it recorded; None for others."""
    url = entry.attributes.get(SERVICE_URL_KEY) if entry.kind == "service" else None
    return url if isinstance(url, str) else None


def served_now(entry: ResourceState, leader: str | None) -> bool:
    """Whether the watch that recorded the service's URL still serves it, when the watch
    holding the lease now is `leader` (None: no watch leads). A record without the holder
    (an older watch) counts as served by whichever watch leads."""
    if leader is None:
        return False
    holder = entry.attributes.get(SERVED_BY_KEY)
    return holder is None or holder == leader
