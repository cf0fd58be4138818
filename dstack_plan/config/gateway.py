"""`type: gateway` — a reverse proxy in front of services."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field

from dstack_plan.config.base import DEFERRED, Described, ResourceSpec, Strict


class LetsEncrypt(Strict):
    model_config = DEFERRED
    _described: ClassVar[Described] = Described("a mapping {type: lets-encrypt}")
    type: Literal["lets-encrypt"] = "lets-encrypt"


class ACMCertificate(Strict):
    model_config = DEFERRED
    _described: ClassVar[Described] = Described("a mapping {type: acm, arn}")
    type: Literal["acm"] = "acm"
    arn: str


def _certificate(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "acm":
        return ACMCertificate.model_validate(value)
    return value


class GatewaySpec(ResourceSpec):
    type: Literal["gateway"] = "gateway"
    backend: Literal["aws", "azure", "gcp", "kubernetes", "local"]
    region: str
    domain: str | None = None
    """Wildcard domain; a service is served at `<run>.<domain>`."""
    default: bool | None = None
    public_ip: bool = True
    # dstack refuses a null public_ip; `certificate: null` turns certificates off
    null_kept: ClassVar[frozenset[str]] = frozenset({"public_ip", "certificate"})
    certificate: Annotated[LetsEncrypt | ACMCertificate | None, BeforeValidator(_certificate)] = (
        LetsEncrypt()
    )
    instance_type: str | None = None
    replicas: int = Field(default=1, ge=1)
    """At most 3 (a server-side limit: the plan checks it, plan/limits.py)."""
    tags: dict[str, str] | None = None

    @property
    def provider(self) -> str:
        """The provider that holds it: its backend."""
        return self.backend
