"""`type: kubernetes` in `.dstack/backends.yml`: Kubernetes clusters runs become pods on.

    backends:
      - type: kubernetes
        clusters:
          - name: k8s                        # the fleet's region; runs name it in `regions:`
            kubeconfig: ~/.kube/config       # a path; dstack's {filename: PATH} is read too
            context: prod                    # optional: else the kubeconfig's current-context
            namespace: ml                    # where pods go (default: default)
            default_image: python:3.12-slim  # the image of runs that name none
            gpu_label: nvidia.com/gpu.product  # the node label naming each node's GPU model
            image_pull_secret: regcred       # optional: an existing Secret for private images

dstack's own single-cluster form is accepted as written: `kubeconfig: {filename: PATH}` (and
`namespace:`) at the top of the entry, without `clusters:`, is one cluster named `kubernetes`.
Credentials stay in the kubeconfig file the entry names: an inline kubeconfig (`data:`) is
refused, as the project never holds a secret. dstack's `proxy_jump` is refused too (not
supported yet): the kubeconfig's API server must be reachable from where dstack runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from dstack_plan.config.base import FieldConflict, ItemError, Strict
from dstack_plan.config.named_clusters import named, unique_names
from dstack_plan.config.validation_errors import issues_from_validation

SINGLE_CLUSTER = "kubernetes"
"""The name of the one cluster of dstack's single-cluster form."""
DEFAULT_KUBECONFIG = "~/.kube/config"
_CLUSTER = re.compile(r"^[a-z][a-z0-9-]{0,40}$")  # as a Slurm cluster's: `regions:` names it
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS-1123 label
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_PREFIX = re.compile(_DNS_SUBDOMAIN)
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_PROXY_JUMP = (
    "proxy_jump is not supported yet: use a kubeconfig whose API server is reachable from "
    "where dstack runs (over a VPN, or an SSH tunnel of your own)"
)


class KubernetesCluster(Strict):
    """One cluster, reached through a context of a kubeconfig file."""

    name: str
    """How fleets and plans name the cluster (lowercase, digits, '-')."""
    kubeconfig: str = Field(default=DEFAULT_KUBECONFIG, min_length=1)
    """The kubeconfig file's path (`~` is the user's home). dstack's `{filename: PATH}` is
    read as PATH; its `{data: ...}` (the kubeconfig inline) is refused."""
    context: str | None = Field(default=None, min_length=1)
    """The kubeconfig context to use; None: the file's current-context."""
    namespace: str = "default"
    """The namespace pods are created in: it must exist."""
    default_image: str = Field(default="python:3.12-slim", min_length=1)
    """The image of runs that name none: a pod needs one."""
    gpu_label: str = "nvidia.com/gpu.product"
    """The node label whose value names each node's GPU model (NVIDIA's GPU feature
    discovery sets this one); pods asking a model select nodes by it."""
    image_pull_secret: str | None = Field(default=None, max_length=253, pattern=_DNS_SUBDOMAIN)
    """The name of an existing Secret (of `namespace`) to pull private images with."""

    @model_validator(mode="before")
    @classmethod
    def _no_proxy_jump(cls, data: Any) -> Any:
        if isinstance(data, dict) and "proxy_jump" in data:
            raise FieldConflict(_PROXY_JUMP, "proxy_jump")
        return data

    @field_validator("kubeconfig", mode="before")
    @classmethod
    def _kubeconfig_file(cls, value: Any) -> Any:
        # dstack writes `kubeconfig: {filename: PATH}`: the path is all we keep
        if not isinstance(value, dict):
            return value
        if "data" in value:
            # the kubeconfig's credentials would be committed with the project
            raise ItemError(
                "an inline kubeconfig (data:) is refused: credentials never go in the "
                "project; save it to a file and give its path (kubeconfig: PATH)",
                "data",
            )
        if set(value) != {"filename"}:
            raise ValueError("expected a path, or {filename: PATH} as dstack writes it")
        return value["filename"]

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _CLUSTER.fullmatch(value):
            raise ValueError(
                f"invalid cluster name {value!r}: lowercase letters, digits and '-', "
                "starting with a letter"
            )
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _NAMESPACE.fullmatch(value):
            raise ValueError(
                f"invalid namespace {value!r}: at most 63 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit"
            )
        return value

    @field_validator("gpu_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        prefix, slash, name = value.rpartition("/")
        good_prefix = not slash or (len(prefix) <= 253 and _LABEL_PREFIX.fullmatch(prefix))
        if not good_prefix or not _LABEL_NAME.fullmatch(name):
            raise ValueError(
                f"invalid label key {value!r}: [PREFIX/]NAME, NAME at most 63 letters, digits, "
                "'-', '_' or '.', PREFIX a DNS subdomain (nvidia.com/gpu.product)"
            )
        return value

    @property
    def kubeconfig_path(self) -> Path:
        """The kubeconfig file, `~` expanded."""
        return Path(self.kubeconfig).expanduser()


_CLUSTER_FIELDS = frozenset(KubernetesCluster.model_fields) - {"name"} | {"proxy_jump"}
"""What dstack's single-cluster form may hold at the top of the entry."""


class KubernetesBackend(Strict):
    """Kubernetes clusters: runs become pods in a namespace of each cluster."""

    type: Literal["kubernetes"]
    clusters: list[KubernetesCluster] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _single_cluster(cls, data: Any) -> Any:
        # dstack's form: one cluster's fields at the top, no `clusters:`
        if not isinstance(data, dict):
            return data
        single = {k: v for k, v in data.items() if k in _CLUSTER_FIELDS}
        if not single:
            return data
        first = next(iter(single))
        if "clusters" in data:
            raise FieldConflict(
                f"{first}: one cluster's fields go at the top only without clusters: "
                "(dstack's form); with clusters:, put it in a cluster",
                first,
            )
        cluster = {"name": SINGLE_CLUSTER, **single}
        try:
            KubernetesCluster.model_validate(cluster)
        except ValidationError as e:
            # checked here, where the entry's own keys locate the problem: once moved into
            # `clusters`, its path would name keys the file does not have
            raise _relayed(e, cluster) from None
        rest = {k: v for k, v in data.items() if k not in single}
        return {**rest, "clusters": [cluster]}

    @field_validator("clusters")
    @classmethod
    def _unique(cls, value: list[KubernetesCluster]) -> list[KubernetesCluster]:
        return unique_names(value)

    def cluster(self, name: str | None) -> KubernetesCluster | None:
        """The cluster `name` (None: the first); None when there is no such cluster."""
        return named(self.clusters, name)


def _relayed(error: ValidationError, cluster: dict[str, Any]) -> ValueError:
    """The first problem of the single-cluster form's `cluster`, as an error locating it
    below the entry (the keys are the entry's own)."""
    issue = next(issues_from_validation(error, 0, cluster, KubernetesCluster))
    if issue.target == "key" and len(issue.path) == 1:
        # about the key itself (proxy_jump): its message names it already
        return FieldConflict(issue.message, str(issue.path[0]))
    where = ".".join(str(p) for p in issue.path)
    message = issue.message.removeprefix(f"{where}: ") if where else issue.message
    return ItemError(message, tuple(p for p in issue.path if isinstance(p, (str, int))))


def cluster_from_flags(
    name: str,
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    default_image: str | None = None,
) -> KubernetesCluster:
    """The cluster `dstack init --backend kubernetes` describes (a flag not given: the
    default). pydantic's ValidationError saying which field is wrong."""
    fields = {
        "kubeconfig": kubeconfig,
        "context": context,
        "namespace": namespace,
        "default_image": default_image,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    return KubernetesCluster.model_validate({"name": name, **given})


def with_cluster(
    backend: KubernetesBackend | None, cluster: KubernetesCluster
) -> KubernetesBackend:
    """`backend` with `cluster` added, or in place of its cluster of the same name."""
    kept = [c for c in backend.clusters if c.name != cluster.name] if backend else []
    return KubernetesBackend(type="kubernetes", clusters=[*kept, cluster])


class MissingContext(ValueError):
    """The kubeconfig file is there but lacks the context asked for (or a current one)."""


def kubeconfig_context(cluster: KubernetesCluster) -> str:
    """The context `cluster` uses, as its kubeconfig file names it: `context`, else the
    file's current-context. ValueError saying what is wrong with the file (missing, not
    YAML), MissingContext when the context is not there (with those the file has). Only the
    context names are looked at: the credentials stay where they are."""
    path = cluster.kubeconfig_path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"kubeconfig {cluster.kubeconfig}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"kubeconfig {cluster.kubeconfig}: cannot read it ({e})") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ValueError(f"kubeconfig {cluster.kubeconfig}: not YAML") from None
    if not isinstance(document, dict):
        raise ValueError(f"kubeconfig {cluster.kubeconfig}: not a kubeconfig (no mapping)")
    entries = document.get("contexts")
    names = [
        str(c["name"])
        for c in (entries if isinstance(entries, list) else [])
        if isinstance(c, dict) and c.get("name") is not None
    ]
    has = f"it has {', '.join(names)}" if names else "it has none"
    wanted = cluster.context or document.get("current-context")
    if not wanted:
        raise MissingContext(
            f"kubeconfig {cluster.kubeconfig}: no current-context; name a context ({has})"
        )
    if str(wanted) not in names:
        raise MissingContext(f"kubeconfig {cluster.kubeconfig}: no context {wanted!r} ({has})")
    return str(wanted)
