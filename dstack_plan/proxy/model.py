"""What the proxy is told: services, their replicas (upstreams), auth, model and probe.

The caller (watch, a gateway) builds these from a service's spec and the replicas it runs;
the proxy never reads configs or state itself. `ServiceRoute.from_spec` does that mapping for
a `ServiceSpec`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dstack_plan.config.runs import ServiceSpec
from dstack_plan.config.secrets import Secret
from dstack_plan.config.service_fields import Probe

HttpMethod = Literal["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class Upstream(_Model):
    """One replica as the proxy reaches it: an HTTP base URL on loopback (in production a
    local SSH forward to the replica's port), e.g. `http://127.0.0.1:41234`."""

    replica_id: str = Field(min_length=1)
    url: str = Field(pattern=r"^http://[^/]+$")


class ProbeSettings(_Model):
    """How a replica is checked; times in seconds.

    `require_success`: a configured probe passes on a 2xx answer only (as dstack's probes
    do); the default check, used when a service has no probes, passes on any HTTP answer,
    i.e. once the replica's server accepts connections and speaks HTTP.
    """

    path: str = "/"
    method: HttpMethod = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: str | None = None
    interval: float = Field(default=5.0, gt=0)
    timeout: float = Field(default=5.0, gt=0)
    ready_after: int = Field(default=1, ge=1)
    require_success: bool = False

    @classmethod
    def from_probe(cls, probe: Probe) -> ProbeSettings:
        headers = tuple((k, v) for h in probe.headers for k, v in h.items())
        return cls(
            path=probe.url,
            method=probe.method.upper(),  # type: ignore[arg-type]  # Probe's methods are ours
            headers=headers,
            body=probe.body,
            interval=float(probe.interval),
            timeout=float(probe.timeout),
            ready_after=probe.ready_after,
            require_success=True,
        )


class ServiceRoute(_Model):
    """One service: where its replicas are and what a request needs to reach them.

    `token`: the bearer token a request must carry, None when the service has `auth: false`.
    `model`: the OpenAI model name it serves (`/v1/...` requests are routed by it), served
    upstream under `model_prefix`.
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    upstreams: tuple[Upstream, ...] = ()
    token: Secret | None = None
    model: str | None = None
    model_prefix: str = "/v1"
    probe: ProbeSettings = ProbeSettings()
    hostname: str | None = None
    """The name a gateway serves it at (`web.example.com`): a request whose `Host` is that
    name goes to this service, its path as it is."""

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, value: str | None) -> str | None:
        return value.lower().rstrip(".") if value else None

    @field_validator("token", mode="before")
    @classmethod
    def _secret(cls, value: Any) -> Any:
        return Secret(value) if isinstance(value, str) else value

    @field_validator("upstreams")
    @classmethod
    def _unique(cls, value: tuple[Upstream, ...]) -> tuple[Upstream, ...]:
        ids = [u.replica_id for u in value]
        if len(ids) != len(set(ids)):
            raise ValueError("upstream replica ids must be unique within a service")
        return value

    @classmethod
    def from_spec(
        cls,
        name: str,
        spec: ServiceSpec,
        upstreams: Sequence[Upstream],
        token: Secret | str | None,
        hostname: str | None = None,
    ) -> ServiceRoute:
        """The route of a service: `token` is used only when the spec has `auth: true`; the
        first probe, if any, is the health check (the default check otherwise)."""
        probe = ProbeSettings.from_probe(spec.probes[0]) if spec.probes else ProbeSettings()
        if isinstance(token, str):
            token = Secret(token)
        return cls(
            name=name,
            upstreams=tuple(upstreams),
            token=token if spec.auth else None,
            model=spec.model.name if spec.model else None,
            model_prefix=spec.model.prefix.rstrip("/") if spec.model else "/v1",
            probe=probe,
            hostname=hostname,
        )
