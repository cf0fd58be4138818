"""`dstack init`: prepare a project directory, and choose where its state lives."""

from __future__ import annotations

from pathlib import Path

import typer

from dstack_plan.cli import common


def init(
    directory: Path = common.DirArg,
    backend: str = typer.Option(
        None, "--backend", help="Where state lives: local or s3 (writes .dstack/backend.yml)."
    ),
    bucket: str = typer.Option(None, "--bucket", help="s3: the bucket."),
    key: str = typer.Option(None, "--key", help="s3: the state object's key, e.g. a/state.json"),
    region: str = typer.Option(None, "--region", help="s3: the bucket's region."),
    endpoint_url: str = typer.Option(
        None, "--endpoint-url", help="s3: an S3-compatible endpoint."
    ),
    profile: str = typer.Option(None, "--profile", help="s3: an AWS profile (~/.aws/config)."),
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
    """
    from dstack_plan.cli.output import print_lines
    from dstack_plan.inspect.workspace import init_workspace

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
