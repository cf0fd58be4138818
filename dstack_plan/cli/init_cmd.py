"""`dstack init`: prepare a project directory, choose where its state lives
(`--backend local|s3`: .dstack/backend.yml), which clouds it uses
(`--backend aws|gcp|azure`: .dstack/backends.yml) and which Slurm and Kubernetes clusters
(`--backend slurm|kubernetes`: .dstack/backends.yml)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dstack_plan.cli import common

if TYPE_CHECKING:
    from dstack_plan.config.backends import CloudBackend


def init(
    directory: Path = common.DirArg,
    backend: str = typer.Option(
        None,
        "--backend",
        help="local or s3: where the state lives (writes .dstack/backend.yml). aws, gcp or "
        "azure: a cloud to create instances in; slurm: a Slurm cluster to submit runs to; "
        "kubernetes: a Kubernetes cluster to run pods on (adds it to .dstack/backends.yml).",
    ),
    cluster: str = typer.Option(None, "--cluster", help="slurm, kubernetes: the cluster's name."),
    login: str = typer.Option(
        None, "--login", help="slurm: the login node, USER@HOST or USER@HOST:PORT."
    ),
    identity_file: str = typer.Option(
        None, "--identity-file", help="slurm: the private key to log in with."
    ),
    gpu_partition: list[str] = typer.Option(
        None, "--gpu-partition", help="slurm: MODEL=PARTITION[,PARTITION] (repeatable)."
    ),
    cpu_partition: list[str] = typer.Option(
        None, "--cpu-partition", help="slurm: a partition without GPUs (repeatable)."
    ),
    account: str = typer.Option(None, "--account", help="slurm: sbatch --account."),
    qos: str = typer.Option(None, "--qos", help="slurm: sbatch --qos."),
    kubeconfig: str = typer.Option(
        None, "--kubeconfig", help="kubernetes: the kubeconfig file (default ~/.kube/config)."
    ),
    context: str = typer.Option(
        None, "--context", help="kubernetes: the kubeconfig context (default: its current one)."
    ),
    namespace: str = typer.Option(
        None, "--namespace", help="kubernetes: the namespace pods go in (default: default)."
    ),
    default_image: str = typer.Option(
        None, "--default-image", help="kubernetes: the image of runs that name none."
    ),
    project_id: str = typer.Option(None, "--project-id", help="gcp: the GCP project id."),
    subscription_id: str = typer.Option(
        None, "--subscription-id", help="azure: the Azure subscription id."
    ),
    bucket: str = typer.Option(None, "--bucket", help="s3: the bucket."),
    key: str = typer.Option(None, "--key", help="s3: the state object's key, e.g. a/state.json"),
    region: str = typer.Option(
        None, "--region", help="s3: the bucket's region; aws, gcp, azure: the one region to use."
    ),
    endpoint_url: str = typer.Option(
        None, "--endpoint-url", help="s3: an S3-compatible endpoint."
    ),
    profile: str = typer.Option(
        None, "--profile", help="s3, aws: an AWS profile (~/.aws/config)."
    ),
    kms_key_id: str = typer.Option(
        None, "--kms-key-id", help="s3: encrypt with this KMS key (SSE-KMS) instead of SSE-S3."
    ),
    path: str = typer.Option(
        None, "--path", help="local: the state file, relative to DIR (default .dstack/state.json)."
    ),
) -> None:
    """Create the private .dstack/ directory (state, secrets) and keep it out of git.

    With --backend, also write .dstack/backend.yml: `--backend s3 --bucket B --key K
    --region R` for a state a team shares (credentials come from boto3's own chain, never
    from the project), `--backend local` for a file. Refused when the local state it would
    leave holds resources: `dstack state migrate --to ...` copies them over first.

    `--backend aws [--region R] [--profile P]`, `--backend gcp --project-id P [--region R]` and
    `--backend azure --subscription-id S [--region R]` instead add that cloud to
    .dstack/backends.yml (replacing its entry, keeping the others): see docs/backends.md.
    `--backend slurm --cluster NAME --login USER@HOST [--identity-file F] --gpu-partition
    A100=gpu --cpu-partition cpu [--account A] [--qos Q]` adds a Slurm cluster (replacing
    the one of that name): see docs/slurm.md. `--backend kubernetes --cluster NAME
    [--kubeconfig F] [--context C] [--namespace N] [--default-image I]` adds a Kubernetes
    cluster the same way (its kubeconfig must name the context).
    """
    from dstack_plan.cli.output import print_lines
    from dstack_plan.inspect.workspace import init_workspace

    if backend is not None and backend not in ("local", "s3", *_ENGINES, *_CLOUDS):
        from dstack_plan.errors import DstackPlanError

        raise DstackPlanError(
            f"--backend: expected local or s3 (state), aws, gcp or azure (a cloud), or slurm "
            f"or kubernetes (a cluster), got {backend!r}"
        )
    slurm_flags = {
        "--login": login,
        "--identity-file": identity_file,
        "--gpu-partition": gpu_partition or None,
        "--cpu-partition": cpu_partition or None,
        "--account": account,
        "--qos": qos,
    }
    kubernetes_flags = {
        "--kubeconfig": kubeconfig,
        "--context": context,
        "--namespace": namespace,
        "--default-image": default_image,
    }
    _only_for({"slurm": slurm_flags, "kubernetes": kubernetes_flags}, backend)
    if backend == "slurm":
        print_lines(_init_slurm(directory, {"--cluster": cluster, **slurm_flags}))
        return
    if backend == "kubernetes":
        print_lines(_init_kubernetes(directory, {"--cluster": cluster, **kubernetes_flags}))
        return
    if cluster:
        from dstack_plan.errors import DstackPlanError

        raise DstackPlanError("--cluster: only for --backend slurm or kubernetes")
    if backend in _CLOUDS:
        cloud = _cloud_backend(
            backend,
            region=region,
            project_id=project_id,
            subscription_id=subscription_id,
            profile=profile,
            others={
                "--bucket": bucket,
                "--key": key,
                "--endpoint-url": endpoint_url,
                "--kms-key-id": kms_key_id,
                "--path": path,
            },
        )
        from dstack_plan.config.backends import BACKENDS_FILE, save_backend

        done = init_workspace(directory)
        save_backend(directory, cloud)
        lines = [f"{d[0].upper()}{d[1:]}." for d in done]
        regions = f" in {', '.join(cloud.regions)}" if cloud.regions else ""
        lines.append(f"Wrote {BACKENDS_FILE}: the {backend} backend{regions}.")
        print_lines(lines)
        return
    given = [
        n for n, v in (("--project-id", project_id), ("--subscription-id", subscription_id)) if v
    ]
    if given:
        from dstack_plan.errors import DstackPlanError

        raise DstackPlanError(f"{', '.join(given)}: only for --backend gcp or azure")
    config = None
    if backend is not None or any((bucket, key, region, endpoint_url, profile, kms_key_id, path)):
        from dstack_plan.inspect.state_init import backend_config_from_flags, check_switch

        config = backend_config_from_flags(
            backend,
            bucket=bucket,
            key=key,
            region=region,
            endpoint_url=endpoint_url,
            profile=profile,
            kms_key_id=kms_key_id,
            path=path,
        )
        check_switch(directory, config)
    done = init_workspace(directory)
    lines = [f"{d[0].upper()}{d[1:]}." for d in done]
    if config is not None:
        from dstack_plan.inspect.state_init import save

        lines.append(save(directory, config))
    print_lines(lines or ["Already initialised: nothing to do."])


_CLOUDS = ("aws", "gcp", "azure")
_ENGINES = ("slurm", "kubernetes")


def _only_for(flags: dict[str, dict[str, Any]], backend: str | None) -> None:
    """DstackPlanError naming the flags given that belong to another backend than `backend`
    (`flags`: each backend's own)."""
    for owner, owned in flags.items():
        given = [flag for flag, value in owned.items() if value]
        if given and owner != backend:
            from dstack_plan.errors import DstackPlanError

            raise DstackPlanError(f"{', '.join(given)}: only for --backend {owner}")


def _init_slurm(directory: Path, flags: dict[str, Any]) -> list[str]:
    """Add the cluster the flags describe to .dstack/backends.yml (replacing the one of its
    name); the lines to print."""
    from dstack_plan.config.backends import BACKENDS_FILE, backend_config, save_backend
    from dstack_plan.config.slurm_backend import SlurmBackend, cluster_from_flags, with_cluster
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.inspect.workspace import init_workspace

    missing = [f for f in ("--cluster", "--login") if not flags[f]]
    if missing or not (flags["--gpu-partition"] or flags["--cpu-partition"]):
        raise DstackPlanError(
            "--backend slurm needs --cluster NAME, --login USER@HOST and at least one "
            "--gpu-partition MODEL=PARTITION or --cpu-partition PARTITION"
        )
    try:
        found = cluster_from_flags(
            flags["--cluster"],
            flags["--login"],
            identity_file=flags["--identity-file"],
            gpu_partitions=flags["--gpu-partition"] or (),
            cpu_partitions=flags["--cpu-partition"] or (),
            account=flags["--account"],
            qos=flags["--qos"],
        )
    except ValueError as e:  # pydantic's ValidationError is one
        raise DstackPlanError(f"--backend slurm: {_first_error(e)}") from None
    done = init_workspace(directory)
    current = backend_config(directory, "slurm")
    save_backend(
        directory, with_cluster(current if isinstance(current, SlurmBackend) else None, found)
    )
    lines = [f"{d[0].upper()}{d[1:]}." for d in done]
    lines.append(
        f"Wrote {BACKENDS_FILE}: Slurm cluster {found.name} through "
        f"{found.user}@{found.hostname}, partitions {', '.join(found.partitions)}."
    )
    return lines


def _init_kubernetes(directory: Path, flags: dict[str, Any]) -> list[str]:
    """Add the cluster the flags describe to .dstack/backends.yml (replacing the one of its
    name), once its kubeconfig is found to name the context; the lines to print."""
    from dstack_plan.config.backends import BACKENDS_FILE, backend_config, save_backend
    from dstack_plan.config.kubernetes_backend import (
        KubernetesBackend,
        MissingContext,
        cluster_from_flags,
        kubeconfig_context,
        with_cluster,
    )
    from dstack_plan.errors import DstackPlanError
    from dstack_plan.inspect.workspace import init_workspace

    if not flags["--cluster"]:
        raise DstackPlanError(
            "--backend kubernetes needs --cluster NAME (and --kubeconfig FILE unless it is "
            "~/.kube/config, --context CONTEXT unless it is the file's current one)"
        )
    try:
        found = cluster_from_flags(
            flags["--cluster"],
            kubeconfig=flags["--kubeconfig"],
            context=flags["--context"],
            namespace=flags["--namespace"],
            default_image=flags["--default-image"],
        )
    except ValueError as e:  # pydantic's ValidationError is one
        raise DstackPlanError(f"--backend kubernetes: {_first_error(e)}") from None
    try:
        # a typo in a path or a context would only show when a run is first placed
        used = kubeconfig_context(found)
    except ValueError as e:
        hint = " (choose one with --context)" if isinstance(e, MissingContext) else ""
        raise DstackPlanError(f"--backend kubernetes: {e}{hint}") from None
    done = init_workspace(directory)
    current = backend_config(directory, "kubernetes")
    save_backend(
        directory,
        with_cluster(current if isinstance(current, KubernetesBackend) else None, found),
    )
    lines = [f"{d[0].upper()}{d[1:]}." for d in done]
    which = used if found.context else f"{used} (the current one)"
    lines.append(
        f"Wrote {BACKENDS_FILE}: Kubernetes cluster {found.name} through context {which} of "
        f"{found.kubeconfig}, namespace {found.namespace}."
    )
    return lines


def _first_error(error: ValueError) -> str:
    from pydantic import ValidationError

    if isinstance(error, ValidationError):
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        # a validator's own ValueError: its message says it all, pydantic's prefix nothing
        message = str(first["msg"]).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return str(error)


def _cloud_backend(
    backend: str,
    *,
    region: str | None,
    project_id: str | None,
    subscription_id: str | None,
    profile: str | None,
    others: dict[str, str | None],
) -> CloudBackend:
    """The backends.yml entry `--backend aws|gcp|azure` asks for; DstackPlanError for a flag
    that does not go with it or a missing one."""
    from dstack_plan.config.backends import AWSBackend, AzureBackend, GCPBackend
    from dstack_plan.errors import DstackPlanError

    wrong = [n for n, v in others.items() if v is not None]
    if project_id is not None and backend != "gcp":
        wrong.append("--project-id")
    if subscription_id is not None and backend != "azure":
        wrong.append("--subscription-id")
    if profile is not None and backend != "aws":
        wrong.append("--profile")
    if wrong:
        raise DstackPlanError(f"{', '.join(wrong)}: not for --backend {backend}")
    regions = [region] if region else None
    if backend == "aws":
        return AWSBackend(type="aws", regions=regions, profile=profile)
    if backend == "gcp":
        if not project_id:
            raise DstackPlanError("--backend gcp needs --project-id (the GCP project's id)")
        return GCPBackend(type="gcp", project_id=project_id, regions=regions)
    if not subscription_id:
        raise DstackPlanError("--backend azure needs --subscription-id (the Azure subscription)")
    return AzureBackend(type="azure", subscription_id=subscription_id, regions=regions)
