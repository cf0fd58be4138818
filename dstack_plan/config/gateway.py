"""`type: gateway` — a reverse proxy in front of services."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from dstack_plan.config.base import DEFERRED, ResourceSpec, Strict
from dstack_plan.config.described import Described
from dstack_plan.config.interpolation import parse_references

PROJECT_NAME = ("run", "project_name")
"""The one reference a gateway's domain may hold: the name of the project it serves."""


class LetsEncrypt(Strict):
    model_config = DEFERRED
    _described: ClassVar[Described] = Described("a mapping {type: lets-encrypt}")
    type: Literal["lets-encrypt"] = "lets-encrypt"


class ACMCertificate(Strict):
    model_config = DEFERRED
    _described: ClassVar[Described] = Described("a mapping {type: acm, arn}")
    type: Literal["acm"] = "acm"
    arn: str


class FileCertificate(Strict):
    """An extension: a certificate and key the user has (PEM files, paths relative to the
    configuration's directory), uploaded to the gateway's host."""

    model_config = DEFERRED
    _described: ClassVar[Described] = Described("a mapping {type: file, cert, key}")
    type: Literal["file"] = "file"
    cert: str
    """The certificate chain (PEM) for `*.<domain>` (or each service's name)."""
    key: str
    """Its private key (PEM); never in state, plans or logs."""


def _certificate(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "acm":
        return ACMCertificate.model_validate(value)
    if isinstance(value, dict) and value.get("type") == "file":
        return FileCertificate.model_validate(value)
    return value


class GatewaySpec(ResourceSpec):
    type: Literal["gateway"] = "gateway"
    backend: Literal["aws", "azure", "gcp", "kubernetes", "local", "ssh"]
    """`ssh` (an extension): a host of a fleet of this project, reached over SSH (`fleet`,
    `host`): an SSH fleet's, or the machine of a one-node cloud fleet."""
    region: str | None = None
    """Required, except for `backend: ssh`."""
    fleet: str | None = None
    """`backend: ssh`: the fleet whose host serves the gateway (SSH, or cloud)."""
    host: str | None = None
    """`backend: ssh`: which host of `fleet` (its `hostname`); the fleet's first by default."""
    port: int = Field(default=443, ge=1, le=65535)
    """`backend: ssh`: the port the gateway listens on, on every address of its host."""
    domain: str | None = None
    """Wildcard domain; a service is served at `<run>.<domain>`. It may hold
    `${{ run.project_name }}` (dstack's), which each project serving through the gateway (an
    exported one) fills in with its name: `${{ run.project_name }}.example.com`."""
    default: bool | None = None
    public_ip: bool = True
    # dstack refuses a null public_ip; `certificate: null` turns certificates off
    null_kept: ClassVar[frozenset[str]] = frozenset({"public_ip", "certificate"})
    certificate: Annotated[
        LetsEncrypt | ACMCertificate | FileCertificate | None, BeforeValidator(_certificate)
    ] = LetsEncrypt()
    instance_type: str | None = None
    replicas: int = Field(default=1, ge=1)
    """At most 3 (a server-side limit: the plan checks it, plan/limits.py)."""
    tags: dict[str, str] | None = None

    @model_validator(mode="after")
    def _backend_fields(self) -> GatewaySpec:
        if self.backend != "ssh":
            if self.region is None:
                raise ValueError("missing required key 'region' (only backend: ssh has none)")
            if self.fleet is not None or self.host is not None:
                raise ValueError("fleet and host are for a gateway with backend: ssh")
            return self
        if self.fleet is None:
            raise ValueError("a gateway with backend: ssh needs `fleet`: the SSH fleet it runs on")
        if self.domain is None:
            raise ValueError("a gateway with backend: ssh needs a `domain` to serve services at")
        if isinstance(self.certificate, LetsEncrypt | ACMCertificate):
            raise ValueError(_ssh_certificate(self.certificate.type))
        return self

    @field_validator("domain")
    @classmethod
    def _domain_references(cls, value: str | None) -> str | None:
        if value is not None:
            refs = parse_references(value)
            others = sorted({str(r) for r in refs if (r.namespace, r.name) != PROJECT_NAME})
            if others:
                raise ValueError(
                    "a gateway's domain may only hold ${{ run.project_name }}, not "
                    + ", ".join(others)
                )
        return value

    @field_validator("certificate")
    @classmethod
    def _ssh_certificate(cls, value: Any, info: ValidationInfo) -> Any:
        # said here too, so that the error points at the certificate given
        if info.data.get("backend") == "ssh" and isinstance(value, LetsEncrypt | ACMCertificate):
            raise ValueError(_ssh_certificate(value.type))
        return value

    @property
    def provider(self) -> str:
        """The provider that holds it: its backend."""
        return self.backend


def _ssh_certificate(kind: str) -> str:
    return (
        f"a gateway with backend: ssh cannot get a {kind} certificate in this version: give "
        "`certificate: {type: file, cert: PATH, key: PATH}` (or `certificate: null` for plain "
        "HTTP)"
    )
