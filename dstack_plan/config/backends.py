"""`.dstack/backends.yml`: the cloud providers a project may create instances in, the Slurm
clusters it may submit runs to (`config/slurm_backend.py`) and the Kubernetes clusters it may
run pods on (`config/kubernetes_backend.py`).

    backends:
      - type: aws
        regions: [eu-west-1]
        profile: ci              # optional: else boto3's default chain
      - type: gcp
        project_id: my-project
      - type: azure
        subscription_id: 00000000-0000-0000-0000-000000000000
        client_secret_env: AZURE_CLIENT_SECRET   # the NAME of a variable, never its value

Not to be confused with `.dstack/backend.yml` (`dstack_plan.state.backend_config`), which says
where the *state* lives. Credentials are by reference only (a profile, a service-account file
path, a kubeconfig's path, an environment variable's name): the project never holds a secret,
so the file can be committed. Problems are ConfigErrors located FILE:LINE:COL. See
docs/backends.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from dstack_plan.config.atomic import write_private_atomic
from dstack_plan.config.base import FieldConflict, ItemError, Strict
from dstack_plan.config.kubernetes_backend import KubernetesBackend
from dstack_plan.config.settings_file import read_mapping, read_settings_text
from dstack_plan.config.slurm_backend import SlurmBackend
from dstack_plan.config.validation_errors import PendingIssue, issues_from_validation
from dstack_plan.config.yaml_limits import MAX_ISSUES, shorten

if TYPE_CHECKING:
    from dstack_plan.config.locate import Target

BACKENDS_FILE = ".dstack/backends.yml"
BACKEND_TYPES = ("aws", "gcp", "azure", "slurm", "kubernetes")
"""Every `type:` a backend may have."""
_GCP_LABEL = re.compile(r"^[a-z0-9_-]{1,63}$")
_GCP_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_KEY_ERROR = "invalid GCP label key "
_CREDENTIALS = {
    "aws": "boto3's own chain (environment, ~/.aws and `profile`, instance role)",
    "gcp": "`credentials_file` (service-account JSON) or application default ones",
    "azure": "DefaultAzureCredential, or client_id and the variable client_secret_env names",
    "slurm": "each cluster's identity_file, else the SSH agent's keys",
    "kubernetes": "each cluster's kubeconfig (its context's credentials)",
}
"""Where each provider's credentials come from, for the comment `render_backend` writes."""


class AWSBackend(Strict):
    """EC2 instances; credentials from boto3's chain (`AWS_ENDPOINT_URL` is honoured by boto3)."""

    type: Literal["aws"]
    regions: list[str] | None = None
    """Where to look for offers; None: every region of the catalogue."""
    profile: str | None = None
    """A profile of ~/.aws/config; None: boto3's default chain."""
    vpc_id: str | None = None
    """The VPC to create instances in; None: the region's default VPC."""
    subnet_ids: list[str] | None = None
    """Subnets to use; None: those of the VPC."""
    public_ips: bool = True
    """Reach instances on their public address; False: on their private one."""
    ssh_user: str = Field(default="ubuntu", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    """The user its machines' image logs in as over SSH."""
    tags: dict[str, str] = {}
    """Added to every resource created."""


class GCPBackend(Strict):
    """Compute Engine instances; credentials from a service-account file or ADC."""

    type: Literal["gcp"]
    project_id: str
    regions: list[str] | None = None
    """Where to look for offers; None: every region of the catalogue."""
    credentials_file: str | None = None
    """A service-account JSON key's path; None: application default credentials."""
    network: str | None = None
    """The VPC network to create instances in; None: the project's `default` network."""
    subnetwork: str | None = None
    """A subnetwork of `network` (its name); None: the network's own in each region."""
    endpoint: str | None = None
    """The Compute Engine API's base URL; None: https://compute.googleapis.com. Set it to
    reach the API through Private Service Connect."""
    billing_endpoint: str | None = None
    """The Cloud Billing API's base URL `dstack catalog refresh` reads prices from; None:
    https://cloudbilling.googleapis.com (a mirror or proxy goes here)."""
    public_ips: bool = True
    """Reach instances on their public address; False: on their private one."""
    ssh_user: str = Field(default="ubuntu", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    """The user its machines' image logs in as over SSH."""
    tags: dict[str, str] = {}
    """GCP labels added to every resource created (lowercase keys and values)."""

    @field_validator("tags")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        # GCP refuses such labels only when creating an instance: say so at plan time instead
        for key, label in value.items():
            if not _GCP_LABEL.fullmatch(key):
                raise ItemError(
                    f"invalid GCP label key {key!r}: use 1-63 lowercase letters, digits, "
                    "'_' or '-'",
                    key,
                )
            if not _GCP_LABEL_VALUE.fullmatch(label):
                raise ItemError(
                    f"invalid GCP label value {label!r}: use at most 63 lowercase letters, "
                    "digits, '_' or '-'",
                    key,
                )
        return value


class AzureBackend(Strict):
    """Azure VMs; credentials from DefaultAzureCredential or a service principal."""

    type: Literal["azure"]
    subscription_id: str
    tenant_id: str | None = None
    resource_group: str | None = None
    """The resource group to create resources in; None: the provider chooses."""
    regions: list[str] | None = None
    """Where to look for offers; None: every region of the catalogue."""
    client_id: str | None = None
    """A service principal's application id; None: DefaultAzureCredential."""
    client_secret_env: str | None = None
    """The NAME of the environment variable holding the client secret. Its value is read only
    when the provider connects, and never stored."""
    public_ips: bool = True
    """Reach instances on their public address; False: on their private one."""
    ssh_user: str = Field(default="ubuntu", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    """The user its machines' image logs in as over SSH."""
    tags: dict[str, str] = {}
    """Added to every resource created."""
    arm_endpoint: str | None = None
    """The Azure Resource Manager URL; None: public Azure (https://management.azure.com).
    Set it for a sovereign cloud (https://management.chinacloudapi.cn, ...)."""
    prices_endpoint: str | None = None
    """The Azure Retail Prices API's URL `dstack catalog refresh` reads; None:
    https://prices.azure.com (a mirror or proxy goes here)."""

    @model_validator(mode="before")
    @classmethod
    def _no_secret_value(cls, data: Any) -> Any:
        if isinstance(data, dict) and "client_secret" in data:
            # a secret in a file the team commits would leak: only its variable's name goes here
            raise FieldConflict(
                "client_secret: secrets never go in the project; put the secret in an "
                "environment variable and name it with client_secret_env",
                "client_secret",
            )
        return data


CloudBackend = AWSBackend | GCPBackend | AzureBackend
"""A backend that creates machines (a Slurm or Kubernetes backend runs jobs instead)."""
AnyBackend = CloudBackend | SlurmBackend | KubernetesBackend
Backend = Annotated[AnyBackend, Field(discriminator="type")]


class BackendsFile(Strict):
    """The project's backends file: at most one entry per type."""

    backends: list[Backend] = []

    @field_validator("backends")
    @classmethod
    def _one_per_type(cls, value: list[AnyBackend]) -> list[AnyBackend]:
        seen: set[str] = set()
        for index, backend in enumerate(value):
            if backend.type in seen:
                raise ItemError(
                    f"a second {backend.type} backend: at most one entry per type",
                    (index, "type"),
                )
            seen.add(backend.type)
        return value

    def get(self, type_: str) -> AnyBackend | None:
        """The entry of type `type_`; None when there is none."""
        return next((b for b in self.backends if b.type == type_), None)


def backends_path(project_dir: str | Path) -> Path:
    """`<project_dir>/.dstack/backends.yml`."""
    return Path(project_dir) / BACKENDS_FILE


def load_backends(project_dir: str | Path) -> BackendsFile:
    """The project's backends: empty when it has no backends file; ConfigError locating every
    problem (FILE:LINE:COL) when the file is invalid."""
    text = read_settings_text(project_dir, BACKENDS_FILE)
    return BackendsFile(backends=[]) if text is None else parse_backends(text)


def parse_backends(text: str, display: str = BACKENDS_FILE) -> BackendsFile:
    """The backends in `text` (a backends file's content); ConfigError as `load_backends`."""
    document = read_mapping(text, display, "backends", required=False)
    if document is None:
        return BackendsFile(backends=[])
    data = document.data
    # each entry is checked against its own type's model: errors that go through the
    # discriminated union would otherwise name every model instead of the one meant
    result = document.validate(
        BackendsFile,
        lambda e: (
            _entry_issues(data)
            or list(issues_from_validation(e, 0, data, BackendsFile, 20 * MAX_ISSUES))
        ),
    )
    document.raise_issues()
    return result


_MODELS: dict[str, type[AnyBackend]] = {
    "aws": AWSBackend,
    "gcp": GCPBackend,
    "azure": AzureBackend,
    "slurm": SlurmBackend,
    "kubernetes": KubernetesBackend,
}


def _entry_issues(data: dict[str, Any]) -> list[PendingIssue]:
    """The problems of each entry of `backends`, with paths from the top of the file."""
    entries = data.get("backends")
    if not isinstance(entries, list):
        return []
    found: list[PendingIssue] = []
    for index, entry in enumerate(entries):
        where = f"backends.{index}"
        if not isinstance(entry, dict):
            continue
        kind = entry.get("type")
        model = _MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            # pydantic's tag message does not say which types exist
            found.append(_unknown_type(index, kind))
            continue
        try:
            model.model_validate(entry)
        except ValidationError as e:
            for issue in issues_from_validation(e, 0, entry, model, 20 * MAX_ISSUES):
                inner = ".".join(str(p) for p in issue.path)
                message = issue.message
                if inner and message.startswith(f"{inner}: "):
                    message = message[len(inner) + 2 :]
                if inner and message is issue.message:
                    pass  # unprefixed (an unknown key): the position says where
                else:
                    message = f"{'.'.join((where, inner)) if inner else where}: {message}"
                # a bad label key is about the key, not its value
                target: Target = "key" if _KEY_ERROR in message else issue.target
                found.append(
                    issue._replace(
                        path=("backends", index, *issue.path),
                        message=message,
                        target=target,
                    )
                )
    return found


def _unknown_type(index: int, kind: object) -> PendingIssue:
    types = ", ".join(BACKEND_TYPES)
    if kind is None:
        message = f"backends.{index}: missing required key 'type' ({types})"
        return PendingIssue(0, ("backends", index), message)
    message = (
        f"backends.{index}.type: unknown backend type {shorten(repr(kind), 80)}: "
        f"expected one of {types}"
    )
    return PendingIssue(0, ("backends", index, "type"), message)


def backend_config(project_dir: str | Path, type_: str) -> AnyBackend | None:
    """The project's backend of type `type_` (aws, gcp, azure, slurm or kubernetes); None
    when it has none."""
    return load_backends(project_dir).get(type_)


def _fields(backend: AnyBackend) -> dict[str, Any]:
    # minimal: only what differs from the defaults, `type` first
    fields: dict[str, Any] = backend.model_dump(exclude_defaults=True)
    return {"type": backend.type, **fields}


def render_backend(backend: AnyBackend) -> str:
    """The YAML text `dstack init` writes for one backend: a list item of `backends:`,
    with a comment line saying where its credentials come from."""
    comment = f"  # credentials: {_CREDENTIALS[backend.type]}\n"
    body = yaml.safe_dump([_fields(backend)], sort_keys=False, default_flow_style=False)
    indented = "".join(f"  {line}\n" for line in body.splitlines())
    return comment + indented


def render_backends(backends: BackendsFile) -> str:
    """The whole backends file's text for `backends`."""
    header = (
        "# dstack-plan: backends (dstack init --backend aws|gcp|azure|slurm|kubernetes); "
        "commit it\n"
    )
    if not backends.backends:
        return header + "backends: []\n"
    return header + "backends:\n" + "".join(render_backend(b) for b in backends.backends)


def save_backend(project_dir: str | Path, backend: AnyBackend) -> Path:
    """Add `backend` to the project's backends file, replacing the entry of its type (the other
    entries are kept; comments in the file are not). Written atomically; returns the path."""
    current = load_backends(project_dir)  # refuse to rewrite a broken file: say where first
    kept = [b for b in current.backends if b.type != backend.type]
    order = {t: i for i, t in enumerate(BACKEND_TYPES)}
    merged = BackendsFile(backends=sorted([*kept, backend], key=lambda b: order[b.type]))
    path = backends_path(project_dir)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private_atomic(path, render_backends(merged).encode("utf-8"))
    return path
